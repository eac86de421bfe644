#!/usr/bin/env bash
# Part of scripts/oracle-setup.sh: the real offload-tier code for the tier differential tests (LMCache and what vLLM and SGLang offloading import), in the oracle venv.
#   usage: scripts/oracle-setup-offload.sh VENV_DIR
# vLLM's OffloadingConnector and SGLang's HiCache need nothing beyond the engines' own
# environment (einops is already there for vLLM's ModelConfig). LMCache 0.5.6 pins GPU
# packages (cupy, nvtx, cufile, numpy<=2.2.6), so it goes in with --no-deps plus the CPU
# packages its engine and local storage import at load time. The part is optional: if it
# cannot be installed this prints a WARNING and exits 0, and the LMCache tests skip.
set -uo pipefail
VENV="$1"
PY="$VENV/bin/python"
PROBE='import warnings; warnings.filterwarnings("ignore")
import einops
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector
import lmcache; print(lmcache.__version__ if hasattr(lmcache, "__version__") else "lmcache")'
probe() { "$PY" -c "$PROBE" >/dev/null 2>&1; }
# cheap check when already installed: the distributions are there at the pinned version
QUICK='import importlib.metadata as m, importlib.util as u, sys
ok = m.version("lmcache") == "0.5.6" and all(u.find_spec(n) for n in
     ("einops", "numba", "blake3", "sortedcontainers", "aiofile", "caio", "cryptography"))
sys.exit(0 if ok else 1)'
quick() { "$PY" -c "$QUICK" >/dev/null 2>&1; }
if [ ! -x "$PY" ]; then
  echo "WARNING: $PY missing; offload-tier oracle part skipped"; exit 0
fi
if quick; then echo "offload tiers ready (cached): $VENV"; exit 0; fi
PKGS=("lmcache==0.5.6" einops numba llvmlite blake3 sortedcontainers aiofile caio cryptography cffi pycparser)
# Another part may be installing into the same venv at this moment: retry a few times.
for attempt in 1 2 3 4 5; do
  if "$VENV/bin/pip" install -q --no-deps "${PKGS[@]}" 2>/tmp/kvsim-offload-pip.$$; then break; fi
  echo "offload tiers: pip attempt $attempt failed ($(tail -1 /tmp/kvsim-offload-pip.$$)); retrying" >&2
  sleep $((attempt * 5))
done
rm -f /tmp/kvsim-offload-pip.$$
if probe; then
  echo "offload tiers ready: $VENV (lmcache 0.5.6, vLLM OffloadingConnector, SGLang HiCache)"
else
  echo "WARNING: the offload-tier oracle (LMCache 0.5.6 / OffloadingConnector / HiCache) does not import in $VENV;"
  echo "WARNING: its differential tests will be skipped. Probe output:"
  "$PY" -c "$PROBE" 2>&1 | grep -v INFO | tail -3 | sed 's/^/WARNING:   /'
fi
exit 0

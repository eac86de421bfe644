#!/usr/bin/env bash
# Build the oracle environment: a CPU-only venv holding the REAL vLLM 0.33.0 and
# SGLang 0.5.23 prefix-cache code, which kvsim's differential tests drive side by side
# with kvsim's own models (tests/oracle/).
#   usage: scripts/oracle-setup.sh [VENV_DIR]      (default: .oracle-venv)
# Only the engines' cache and scheduler modules are needed, so they are installed with
# --no-deps plus the handful of packages those modules import at load time.
set -euo pipefail
VENV="${1:-.oracle-venv}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The routers (fleets) and the offload tiers have their own parts, each skipped when present.
extras() {
  "$ROOT/scripts/oracle-setup-routers.sh" "$VENV"
  "$ROOT/scripts/oracle-setup-offload.sh" "$VENV"
}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm.v1.core.kv_cache_manager, sglang.srt.mem_cache.radix_cache, einops, setproctitle, uvicorn, click" 2>/dev/null; then
  echo "oracle ready (cached): $VENV"; extras; exit 0
fi
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip >/dev/null 2>&1 || true
# torch 2.13.0: the CPU build these machines serve from local disk
"$PIP" install -q "torch==2.13.0" numpy
"$PIP" install -q --no-deps "vllm==0.33.0" "sglang==0.5.23"
"$PIP" install -q --no-deps \
  packaging psutil pyzmq urllib3 regex msgspec pydantic pydantic_core typing_inspection \
  annotated_types cbor2 transformers huggingface-hub tqdm httpx2 idna pyyaml httpcore2 truststore h11 \
  safetensors tokenizers filelock fsspec certifi anyio sniffio apache-tvm-ffi xgrammar starlette \
  annotated-doc opentelemetry-api partial-json-parser llguidance orjson fastapi openai openai-harmony \
  cachetools cloudpickle compressed-tensors dill gguf jinja2 markupsafe loguru sentencepiece \
  prometheus-client pillow sympy mpmath networkx ipython traitlets pygments uvloop aiohttp \
  aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl typing-extensions setuptools \
  py-cpuinfo pybase64 triton requests charset-normalizer
# The scheduler differential tests build the engines' real schedulers: vLLM's ModelConfig
# inspects the model class, whose layers import einops; SGLang's scheduler module imports
# setproctitle, uvicorn and click at load time.
"$PIP" install -q --no-deps einops setproctitle uvicorn click
# SGLang's config package imports torchvision at load time; the cache never uses it.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/torchvision"
cp -r "$ROOT/tests/oracle/torchvision_stub" "$SITE/torchvision"
"$VENV/bin/python" - <<'PY'
import warnings; warnings.filterwarnings("ignore")
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
from sglang.srt.mem_cache.radix_cache import RadixCache    # noqa: F401
import vllm, sglang
print(f"oracle ready: vllm {vllm.__version__}, sglang {sglang.__version__}")
PY
extras

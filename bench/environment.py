"""Find what the benchmarks need the way ./test.sh does, so each runs from its documented command alone.

    from bench.environment import use_test_environment
    use_test_environment(engine=True)    # QWENCHAT_CONFIG, and QWENCHAT_ENGINE_PYTHON, when unset
    use_test_environment(engine=True, test_models=True)    # and QWENCHAT_TEST_MODELS
    use_test_environment(engine=False)   # a benchmark that starts nothing needing the engine environment

    use_test_python()                    # python -m bench… does it first (bench/__init__.py)

The folders come from ``scripts/env.sh`` itself (``qc_test_dir``, ``qc_engine_dir cpu``: the hash of the requirement
files), never from a copy of its rule. Nothing is installed here: a benchmark started with another python than the
app test environment's is told the command to run instead, and a missing piece stops it with the one command that
builds it (``./test.sh``, which also builds the embedded model).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_TEST_SH = "run ./test.sh once, then this benchmark again"
#: Benchmarks that run with any python 3 (standard library only): the cold start builds the environments itself.
ANY_PYTHON = {"bench.start"}


def _from_env_sh(expression: str) -> str:
    """One value computed by scripts/env.sh (the same bootstrap ./test.sh and ./start.sh source)."""
    script = f'source "{ROOT}/scripts/env.sh" && {expression}'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip()


def use_test_environment(*, engine: bool, test_models: bool = False) -> None:
    """Set the variables ./test.sh sets for the tests, those not set already: the test config; with ``engine`` the engine environment's python (the product's launcher
    wants it even in external mode); with ``test_models`` the test models' folder. Exits with the fix when a piece
    is missing."""
    os.environ.setdefault("QWENCHAT_CONFIG", str(ROOT / "tests" / "config.toml"))
    if engine and not os.environ.get("QWENCHAT_ENGINE_PYTHON"):
        folder = Path(_from_env_sh("qc_engine_dir cpu"))
        if not (folder / ".complete").exists():
            sys.exit(f"the engine environment is not built ({folder}): {RUN_TEST_SH}")
        os.environ["QWENCHAT_ENGINE_PYTHON"] = str(folder / "bin" / "python")
    if test_models and not os.environ.get("QWENCHAT_TEST_MODELS"):
        models = Path(_from_env_sh('echo "$QWENCHAT_HOME"')) / "test-models"
        if not (models / "tiny-qwen3").is_dir():
            sys.exit(f"the test models are not built ({models}): {RUN_TEST_SH}")
        os.environ["QWENCHAT_TEST_MODELS"] = str(models)


def use_test_python() -> None:
    """Exit, saying the command to run instead, unless this python is the app test environment ./test.sh builds
    (``python -m bench…`` checks it first: bench/__init__.py)."""
    argv = sys.orig_argv
    at = argv.index("-m") if "-m" in argv else -1
    module, args = (argv[at + 1], argv[at + 2 :]) if 0 <= at < len(argv) - 1 else ("bench", sys.argv[1:])
    if module in ANY_PYTHON:
        return
    folder = Path(_from_env_sh("qc_test_dir"))
    if Path(sys.prefix).resolve() == folder.resolve():
        return
    if not (folder / ".complete").exists():
        sys.exit(f"the app test environment is not built ({folder}): {RUN_TEST_SH}")
    command = shlex.join([str(folder / "bin" / "python"), "-m", module, *args])
    sys.exit(f"the benchmarks run in the app test environment, not {sys.prefix}: {command}")

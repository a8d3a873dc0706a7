"""Find what the benchmarks need the way ./test.sh does, so each runs from its documented command alone.

    from bench.environment import use_test_environment
    use_test_environment()     # sets QWENCHAT_ENGINE_PYTHON, QWENCHAT_TEST_MODELS, QWENCHAT_CONFIG when unset

The engine environment's folder comes from ``scripts/env.sh`` itself (``qc_engine_dir cpu``: the hash of the
requirement files), never from a copy of its rule. Nothing is installed here: a missing piece stops the benchmark
with the one command that builds it (``./test.sh``, or ``./start.sh`` for the embedded model).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _from_env_sh(expression: str) -> str:
    """One value computed by scripts/env.sh (the same bootstrap ./test.sh and ./start.sh source)."""
    script = f'source "{ROOT}/scripts/env.sh" && {expression}'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip()


def use_test_environment(*, engine: bool = True) -> None:
    """Set the variables ./test.sh sets for the tests, for those not set already; exit with the fix if a piece is
    missing. ``engine=False``: a benchmark that needs no engine (only the test config)."""
    os.environ.setdefault("QWENCHAT_CONFIG", str(ROOT / "tests" / "config.toml"))
    if not engine:
        return
    if not os.environ.get("QWENCHAT_ENGINE_PYTHON"):
        folder = Path(_from_env_sh("qc_engine_dir cpu"))
        if not (folder / ".complete").exists():
            sys.exit(f"the engine environment is not built ({folder}): run ./test.sh once, then this benchmark again")
        os.environ["QWENCHAT_ENGINE_PYTHON"] = str(folder / "bin" / "python")
    if not os.environ.get("QWENCHAT_TEST_MODELS"):
        models = Path(_from_env_sh('echo "$QWENCHAT_HOME"')) / "test-models"
        if not (models / "tiny-qwen3").is_dir():
            sys.exit(f"the test models are not built ({models}): run ./test.sh once, then this benchmark again")
        os.environ["QWENCHAT_TEST_MODELS"] = str(models)

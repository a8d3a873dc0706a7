"""The benchmarks run from their documented command alone (bench/environment.py, bench/__init__.py): started with
another python than the app test environment's, or before ./test.sh built it, they say the one command to run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import need_env

ROOT = Path(__file__).resolve().parents[2]


def run(python: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    return subprocess.run(
        [python, "-m", *args], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_env_sh_names_the_app_test_environment_these_tests_run_in() -> None:
    out = subprocess.run(
        ["bash", "-c", 'source scripts/env.sh && qc_test_dir && echo "$QWENCHAT_HOME"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    folder, home = out.stdout.split()
    assert Path(folder).resolve() == Path(sys.prefix).resolve()  # ./test.sh runs pytest with qc_test_env's python
    assert Path(folder).parent == Path(home) / "envs"


def test_a_benchmark_started_with_another_python_says_the_command_to_run_instead() -> None:
    other = need_env("QWENCHAT_ENGINE_PYTHON")  # a python 3.11 that is not the app test environment
    out = run(other, "bench.budget", "--tokens", "1000", QWENCHAT_HOME=os.environ.get("QWENCHAT_HOME", ""))
    expected = f"{Path(sys.prefix) / 'bin' / 'python'} -m bench.budget --tokens 1000"
    assert out.returncode == 1 and "the benchmarks run in the app test environment" in out.stderr, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr


def test_before_test_sh_built_the_environment_a_benchmark_says_to_run_it(tmp_path: Path) -> None:
    for args in (["bench.concurrency", "--sessions", "2"], ["bench", "--list"]):
        out = run(sys.executable, *args, QWENCHAT_HOME=str(tmp_path))
        assert out.returncode == 1, out.stderr
        assert f"the app test environment is not built ({tmp_path}/envs/app-test-" in out.stderr
        assert out.stderr.rstrip().endswith("run ./test.sh once, then this benchmark again")


def test_the_cold_start_benchmark_runs_with_any_python(tmp_path: Path) -> None:
    out = run(need_env("QWENCHAT_ENGINE_PYTHON"), "bench.start", "--help", QWENCHAT_HOME=str(tmp_path))
    assert out.returncode == 0 and "--fresh" in out.stdout, out.stderr

"""test.sh: what it keeps from the caller's environment and what it drops."""

from __future__ import annotations

import subprocess

from backend.settings import ROOT


def test_test_sh_keeps_the_bootstrap_variables_and_drops_the_rest():
    """The README tells users to set QWENCHAT_TORCH_INDEX / QWENCHAT_BOOTSTRAP_PYTHON for the bootstrap;
    test.sh bootstraps too, so it must keep them while dropping everything that would change a test."""
    script = (ROOT / "test.sh").read_text()
    start = script.index("for var in $(env")
    loop = script[start : script.index("\ndone", start) + len("\ndone")]
    env = {
        "PATH": "/usr/bin:/bin",
        "QWENCHAT_HOME": "/h",
        "QWENCHAT_TORCH_INDEX": "https://download.pytorch.org/whl/cpu",
        "QWENCHAT_BOOTSTRAP_PYTHON": "/opt/py311/bin/python3",
        "QWENCHAT_SOAK": "long",
        "QWENCHAT_MODEL_PATH": "/models/x",
        "QWENCHAT_CONFIG": "/elsewhere.toml",
        "OPENAI_BASE_URL": "http://gpu-box:8000/v1",
    }
    out = subprocess.run(["bash", "-c", f"set -euo pipefail\n{loop}\nenv"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    left = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    for kept in ("QWENCHAT_HOME", "QWENCHAT_TORCH_INDEX", "QWENCHAT_BOOTSTRAP_PYTHON", "QWENCHAT_SOAK"):
        assert left.get(kept) == env[kept], kept
    for dropped in ("QWENCHAT_MODEL_PATH", "QWENCHAT_CONFIG", "OPENAI_BASE_URL"):
        assert dropped not in left, dropped


def test_quick_leaves_out_every_marker_of_what_a_module_starts_and_soak_makes_the_soaks_long():
    """--quick deselects by the markers tests/support/marks.py checks (each registered in pytest.ini); --soak runs
    the soaks with QWENCHAT_SOAK=long, which the environment loop above no longer drops."""
    import configparser

    from tests.support import marks

    script = (ROOT / "test.sh").read_text()
    quick = script.split("quick) select=(-m ", 1)[1].split(")", 1)[0].strip('"')
    assert quick == " and ".join(f"not {kind}" for kind in marks.KINDS), quick
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    registered = {line.split(":", 1)[0].strip() for line in ini["pytest"]["markers"].splitlines() if line.strip()}
    assert set(marks.KINDS) <= registered, set(marks.KINDS) - registered
    assert '[ "$mode" = soak ] && export QWENCHAT_SOAK=long' in script
    assert "soak) select=(-m soak)" in script


def test_without_arguments_the_tests_run_on_two_workers_with_the_lanes_scheduler_and_with_arguments_in_one():
    """tests/support/lanes.py's scheduler takes over pytest-xdist's ``loadscope`` only: test.sh must ask for it."""
    script = (ROOT / "test.sh").read_text()
    assert "if [ $# -eq 0 ]; then set -- -n 2 --dist loadscope tests; fi" in script
    run = script[script.index("if [ $# -eq 0 ]") :]
    assert '-m pytest "${select[@]}" "$@"' in run.splitlines()[1]

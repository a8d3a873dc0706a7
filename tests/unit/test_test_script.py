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
        "QWENCHAT_MODEL_PATH": "/models/x",
        "QWENCHAT_CONFIG": "/elsewhere.toml",
        "OPENAI_BASE_URL": "http://gpu-box:8000/v1",
    }
    out = subprocess.run(["bash", "-c", f"set -euo pipefail\n{loop}\nenv"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    left = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    for kept in ("QWENCHAT_HOME", "QWENCHAT_TORCH_INDEX", "QWENCHAT_BOOTSTRAP_PYTHON"):
        assert left.get(kept) == env[kept], kept
    for dropped in ("QWENCHAT_MODEL_PATH", "QWENCHAT_CONFIG", "OPENAI_BASE_URL"):
        assert dropped not in left, dropped

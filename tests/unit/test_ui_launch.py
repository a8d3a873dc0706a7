"""backend/ui/launch.py: `chainlit run` without nest_asyncio's pure-Python tasks, futures and loop step."""

from __future__ import annotations

import subprocess
import sys

from backend.settings import ROOT

PROBE = """
import asyncio, sys
{load}
print(asyncio.Task.__module__, asyncio.Future.__module__, hasattr(asyncio, "_nest_patched"))
"""


def _asyncio_after(load: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(load=load)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[-2]


def test_chainlits_command_line_keeps_asyncios_c_tasks_and_futures():
    ours = "from backend.ui import launch\ntry:\n    launch.main(['--version'])\nexcept SystemExit:\n    pass"
    assert _asyncio_after(ours) == "_asyncio _asyncio False"
    # what `chainlit run` itself does, so that the check above can fail
    assert _asyncio_after("import chainlit.cli") == "asyncio.tasks asyncio.futures True"

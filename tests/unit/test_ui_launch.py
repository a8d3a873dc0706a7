"""backend/ui/launch.py: `chainlit run` without nest_asyncio's pure-Python tasks, futures and loop step, and without
uvicorn's websocket keepalive."""

from __future__ import annotations

import subprocess
import sys

from backend.settings import ROOT

PROBE = """
import asyncio, sys
{load}
print(asyncio.Task.__module__, asyncio.Future.__module__, hasattr(asyncio, "_nest_patched"))
"""
# the UI's command, up to the point where Chainlit would start its server
OURS = "from backend.ui import launch\ntry:\n    launch.main(['--version'])\nexcept SystemExit:\n    pass"


def _printed_after(load: str, probe: str = PROBE) -> str:
    out = subprocess.run(
        [sys.executable, "-c", probe.format(load=load)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[-2]


def test_chainlits_command_line_keeps_asyncios_c_tasks_and_futures():
    assert _printed_after(OURS) == "_asyncio _asyncio False"
    # what `chainlit run` itself does, so that the check above can fail
    assert _printed_after("import chainlit.cli") == "asyncio.tasks asyncio.futures True"


KEEPALIVE = """
import uvicorn
{load}
config = uvicorn.Config("app:app", ws="wsproto")  # as chainlit.cli builds it: no keepalive argument
print(config.ws_ping_interval, config.ws_ping_timeout, uvicorn.Config("app:app", ws_ping_interval=5).ws_ping_interval)
"""


def test_the_ui_server_leaves_the_heartbeat_to_engine_io():
    """uvicorn's websocket keepalive (20 s for a pong, then code 1011) would close a socket engine.io's 120 s keep;
    tests/soak/test_long_answers.py shows it on the live server."""
    assert _printed_after(OURS, KEEPALIVE) == "None None 5"
    assert _printed_after("", KEEPALIVE) == "20.0 20.0 5"  # uvicorn's defaults, so that the check above can fail

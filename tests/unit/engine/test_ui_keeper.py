"""The UI process kept alive (issue #20): a UI that dies is started again with the engine's restart budget, says why
(the signal, or the exit code) and writes it to ui-status.json; past the budget the launcher gives up, saying so."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from backend import contract
from backend.launcher.command import Command
from backend.launcher.supervisor import start_process, stop_process_group
from backend.launcher.ui_keeper import UiKeeper, exit_cause
from backend.settings import Settings, SupervisionSettings
from backend.text import Text

pytestmark = pytest.mark.asyncio

SLEEPER = Command((sys.executable, "-c", "import time; time.sleep(60)"))


async def no_wait(_: float) -> None:
    return None


def dead(cmd: Command, log_dir, how: int | None) -> subprocess.Popen[bytes]:
    """A UI process that died: killed by signal ``how``, or exited (``how`` None: exit code 3)."""
    proc = start_process(cmd if how else Command((sys.executable, "-c", "raise SystemExit(3)")), log_dir / "ui.log")
    if how:
        os.kill(proc.pid, how)
    proc.wait(10)
    return proc


@pytest.mark.parametrize(
    ("rc", "cause", "said"),
    [(-9, "killed", "the UI was killed (SIGKILL); if nobody killed it"), (3, "exited", "the UI exited with code 3")],
)
async def test_the_cause_names_the_signal_or_the_exit_code(rc, cause, said):
    reason, code = exit_cause(rc)
    en, zh = reason.in_("en"), reason.in_("zh-CN")
    assert code == cause and en.startswith(said) and zh and zh != en


async def test_a_killed_ui_is_started_again_and_its_status_file_says_why(tmp_path):
    settings = Settings(supervision=SupervisionSettings(restart_attempts=2, restart_window_min=10))
    keeper = UiKeeper(settings, SLEEPER, tmp_path, sleep=no_wait)
    lines: list[str] = []
    proc = dead(SLEEPER, tmp_path, signal.SIGKILL)
    new = await keeper.revive(proc, lines.append)
    try:
        assert new is not None and new.poll() is None and new.pid != proc.pid
        status = contract.EngineStatus.read(tmp_path / contract.UI_STATUS_FILE_NAME)
        assert status is not None and status.cause == "killed" and status.attempt == 1 and status.pid == new.pid
        assert status.reason == Text("ui_keeper.killed", {"signal": "SIGKILL"}) and "SIGKILL" in str(status.reason)
        assert lines == [status.message] and "restarting — attempt 1 of 2 (the engine keeps running)" in lines[0]
    finally:
        if new is not None:
            stop_process_group(new, 2)


async def test_past_the_budget_the_launcher_gives_up_saying_so(tmp_path):
    settings = Settings(supervision=SupervisionSettings(restart_attempts=2, restart_window_min=10))
    keeper = UiKeeper(settings, SLEEPER, tmp_path, sleep=no_wait)
    lines: list[str] = []
    for _ in range(2):
        new = await keeper.revive(dead(SLEEPER, tmp_path, None), lines.append)
        assert new is not None
        stop_process_group(new, 2)
    assert await keeper.revive(dead(SLEEPER, tmp_path, None), lines.append) is None
    status = contract.EngineStatus.read(tmp_path / contract.UI_STATUS_FILE_NAME)
    assert status is not None and status.state is contract.SupervisorState.DOWN
    assert "gave up after 2 restarts in 10 min" in lines[-1] and "ui.log" in lines[-1]


async def test_the_backoff_doubles_from_one_second(tmp_path):
    settings = Settings(supervision=SupervisionSettings(restart_attempts=5, restart_window_min=10))
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    keeper = UiKeeper(settings, SLEEPER, tmp_path, sleep=record)
    for _ in range(3):
        new = await keeper.revive(dead(SLEEPER, tmp_path, None), lambda _: None)
        assert new is not None
        stop_process_group(new, 2)
    assert [round(w) for w in waits] == [1, 2, 4]  # minus the clean-up time, which is short here


async def test_a_new_launch_forgets_an_older_launchs_restarts(tmp_path):
    (tmp_path / contract.UI_STATUS_FILE_NAME).write_text('{"state": "restarting", "attempt": 3}')
    UiKeeper(Settings(), SLEEPER, tmp_path, sleep=no_wait)
    assert not (tmp_path / contract.UI_STATUS_FILE_NAME).exists()
    await asyncio.sleep(0)

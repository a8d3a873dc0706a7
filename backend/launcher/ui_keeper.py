"""The UI process kept alive by the launcher (issue #20), as the supervisor keeps the engine alive.

    keeper = UiKeeper(settings, ui_cmd, log_dir)
    proc = await keeper.revive(proc)     # after the UI exited: started again, or None once the budget is spent

A UI that dies (``kill -9``, the kernel's OOM killer after a huge paste, a crash) used to stop the whole product,
the engine included. Now it is started again with the engine's restart budget (``[supervision] restart_attempts`` within
``restart_window_min`` minutes, backoff 1, 2, 4 … 30 s), its causes (killed by a signal, and which; an exit code) and
log lines of the same shape, while the engine keeps running (its pid unchanged). What happened goes to
``logs/ui-status.json`` (``contract.UI_STATUS_FILE_NAME``, an ``EngineStatus``) for the new UI to show. A first start
that fails is not retried: that is a configuration problem (the launcher says so with the log's tail).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from backend.contract import UI_STATUS_FILE_NAME, EngineStatus, SupervisorState
from backend.launcher.command import Command
from backend.launcher.supervisor import start_process, stop_process_group
from backend.settings import Settings
from backend.text import Text

logger = logging.getLogger(__name__)


def exit_cause(rc: int | None) -> tuple[Text, str]:
    """(the catalog text, cause code) for a UI process that ended with ``rc``."""
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return Text("ui_keeper.killed", {"signal": name}), "killed"
    return Text("ui_keeper.exited", {"rc": rc}), "exited"


class UiKeeper:
    """Restarts of one UI process; ``sleep`` is there for tests."""

    def __init__(
        self,
        settings: Settings,
        cmd: Command,
        log_dir: Path,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cmd = cmd
        self.log_path = log_dir / "ui.log"
        self.status_path = log_dir / UI_STATUS_FILE_NAME
        self.attempts = settings.supervision.restart_attempts
        self.window_s = settings.supervision.restart_window_min * 60
        self._sleep = sleep
        self._restarts: list[float] = []
        self.status_path.unlink(missing_ok=True)  # an older launch's restarts are not this one's

    async def revive(
        self, proc: subprocess.Popen[bytes], say: Callable[[str], None] = print
    ) -> subprocess.Popen[bytes] | None:
        """``proc`` (the UI) has exited: clean up its group, wait the backoff, start it again; None (and a line
        saying why) once ``restart_attempts`` restarts fell within the window."""
        reason, cause = exit_cause(proc.returncode)
        now = time.time()
        self._restarts = [t for t in self._restarts if now - t < self.window_s] + [now]
        attempt = len(self._restarts)
        if attempt > self.attempts:
            message = f"the UI: {reason}; gave up after {self.attempts} restarts in {self.window_s / 60:g} min"
            self._write(SupervisorState.DOWN, reason, cause, attempt - 1, message, proc.pid)
            say(f"{message}; see {self.log_path}")
            return None
        message = f"{reason}; restarting — attempt {attempt} of {self.attempts} (the engine keeps running)"
        logger.warning("UI %s", message)
        say(message)
        self._write(SupervisorState.RESTARTING, reason, cause, attempt, message, proc.pid)
        t0 = time.monotonic()
        # Its own children (none today; a future worker would be) go with it; the leader is already gone.
        await asyncio.to_thread(stop_process_group, proc, 2)
        delay = min(30.0, 2.0 ** (attempt - 1))
        await self._sleep(max(0.0, delay - (time.monotonic() - t0)))
        new = start_process(self.cmd, self.log_path)
        self._write(SupervisorState.RUNNING, reason, cause, attempt, message, new.pid)
        return new

    def _write(self, state: SupervisorState, reason: Text, cause: str, attempt: int, message: str, pid: int) -> None:
        EngineStatus(
            state=state,
            pid=pid,
            attempt=attempt,
            max_attempts=self.attempts,
            reason=reason,
            cause=cause,
            message=message,
            log_path=str(self.log_path),
            since=time.time(),
        ).write(self.status_path)

"""Watching a supervised engine the way the app does, and its process group, for the supervisor tests.

``Running`` drives ``Supervisor.run()`` on an event loop in a thread and records every distinct status
written to ``engine-status.json`` (what the app's health poller reads), by reading the file.
``group_members`` / ``wait_group_empty`` look for processes left in a process group, from /proc;
``engine_core_pid`` finds the newest launch's EngineCore child in the engine log.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from backend.launcher.log_diagnosis import ATTEMPT_MARKER
from backend.launcher.supervisor import Supervisor, read_tail


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def engine_core_pid(log_path: Path) -> int:
    """vLLM prefixes EngineCore's log lines with its pid; read it from the newest launch."""
    text = read_tail(log_path, 10_000_000)
    text = text[text.rindex(ATTEMPT_MARKER) :]
    pids = re.findall(r"\(EngineCore(?:_DP\d+)? pid=(\d+)\)", text)
    assert pids, f"no EngineCore pid in the engine log:\n{text[-3000:]}"
    return int(pids[-1])


def wait_group_empty(pgid: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class Running:
    """``Supervisor.run()`` on its own event loop in a thread, and a watcher recording every
    distinct status written to the status file."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.seen: list[tuple[float, dict]] = []  # (monotonic, status)
        self._watching = True
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        self.future = asyncio.run_coroutine_threadsafe(sup.run(), self.loop)

    def _watch(self) -> None:
        last = None
        while self._watching:
            try:
                st = json.loads(self.sup.status_path.read_text())
            except (OSError, ValueError):
                st = None
            if st is not None:
                key = (st.get("state"), st.get("pid"), st.get("attempt"), st.get("reason"))
                if key != last:
                    self.seen.append((time.monotonic(), st))
                    last = key
            time.sleep(0.05)

    def states(self) -> list[str]:
        return [st["state"] for _, st in self.seen]

    def history(self) -> str:
        return "\n".join(
            f"  {st['state']:<10} pid={st.get('pid')} attempt={st.get('attempt')} {st.get('message')}"
            for _, st in self.seen
        )

    def wait_for(self, what: str, pred, timeout: float, after: float = 0.0) -> tuple[float, dict]:
        """The first status recorded after ``after`` (monotonic) that satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, st in list(self.seen):
                if t >= after and pred(st):
                    return t, st
            if self.future.done() and not any(t >= after and pred(st) for t, st in self.seen):
                break
            time.sleep(0.1)
        tail = read_tail(self.sup.log_path, 5000)
        pytest.fail(
            f"no status '{what}' within {timeout:.0f} s; statuses seen:\n{self.history()}\n"
            f"run() done: {self.future.done()}\nengine log tail:\n{tail}"
        )

    def current(self, state: str, timeout: float) -> dict:
        """Wait until the newest status is ``state``; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.seen and self.seen[-1][1]["state"] == state:
                return self.seen[-1][1]
            time.sleep(0.1)
        pytest.fail(f"the status is not '{state}' after {timeout:.0f} s; statuses seen:\n{self.history()}")

    def finished(self, timeout: float) -> dict:
        """Wait for run() to return by itself; the status it left (before stop() writes "stopped")."""
        self.future.result(timeout=timeout)
        final = json.loads(self.sup.status_path.read_text())
        if not self.seen or self.seen[-1][1] != final:
            self.seen.append((time.monotonic(), final))
        return final

    def stop(self) -> None:
        async def _stop() -> None:
            self.sup.stop()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(timeout=60)
            try:
                self.future.result(timeout=30)
            finally:
                self._watching = False
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=10)
                self.watcher.join(timeout=5)
                self._record_final()

    def _record_final(self) -> None:
        """The status run() left, recorded by reading the file once the watcher is gone: a watcher given "a moment"
        to see it may not have been scheduled at all in that moment on a loaded machine."""
        try:
            final = json.loads(self.sup.status_path.read_text())
        except (OSError, ValueError):
            return
        if not self.seen or self.seen[-1][1] != final:
            self.seen.append((time.monotonic(), final))


def launches(log_path: Path) -> int:
    return read_tail(log_path, 10_000_000).count(ATTEMPT_MARKER)

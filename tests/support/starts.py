"""Counts the vLLM and Chromium processes a test run starts, per test module (a pytest plugin, opt-in).

    ./test.sh tests/e2e -p tests.support.starts

A thread reads /proc four times a second and notes each new vLLM API server (the engine's
``-m vllm.entrypoints.openai.api_server``, started by a fixture, the launcher or the supervisor) and each new
Chromium browser (its main process: no ``--type=``), with the test that was running when it appeared; the
terminal summary lists them per module. Only this pytest process's descendants count (not another run's). A start
lasts far longer than a quarter of a second (vLLM: 30-60 s, Chromium: until its browser is closed): none is missed.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

import pytest

VLLM = "vllm"
CHROMIUM = "chromium"


def kind(argv: list[bytes]) -> str | None:
    """``vllm`` for an engine's API server, ``chromium`` for a browser's main process, else None."""
    if b"vllm.entrypoints.openai.api_server" in argv and b"-m" in argv:
        return VLLM
    browser = argv and Path(argv[0].decode(errors="replace")).name in ("chromium", "chrome", "chromium-browser")
    if browser and not any(a.startswith(b"--type=") for a in argv):
        return CHROMIUM
    return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is ``pid``'s parent, grandparent, ... (from /proc: another run's processes are not ours)."""
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(status.split("PPid:", 1)[1].split()[0])
        if pid == ancestor:
            return True
    return False


class Counter:
    def __init__(self) -> None:
        self.current = "(collection)"
        self.seen: dict[int, tuple[str, str]] = {}  # pid -> (kind, test)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="starts-counter", daemon=True)

    def start(self) -> None:
        self._scan()  # what was running before the session is not counted as its own
        self.seen = {pid: (k, "(before the session)") for pid, (k, _) in self.seen.items()}
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._scan()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._scan()

    def _scan(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.seen:
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found = kind(argv)
            if found and descends_from(int(entry), os.getpid()):
                self.seen[int(entry)] = (found, self.current)

    def per_module(self) -> dict[str, collections.Counter[str]]:
        out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for k, test in self.seen.values():
            if test != "(before the session)":
                out[test.split("::")[0]][k] += 1
        return out


_counter = Counter()


def pytest_sessionstart(session: pytest.Session) -> None:
    _counter.start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _counter.current = nodeid


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    _counter.stop()
    modules = _counter.per_module()
    total: collections.Counter[str] = collections.Counter()
    terminalreporter.section("vLLM and Chromium starts (tests/support/starts.py)")
    for module in sorted(modules):
        total.update(modules[module])
        terminalreporter.write_line(f"{module}: vLLM {modules[module][VLLM]}, Chromium {modules[module][CHROMIUM]}")
    terminalreporter.write_line(f"total: vLLM {total[VLLM]}, Chromium {total[CHROMIUM]}")

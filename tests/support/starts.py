"""Counts the vLLM starts, product launches and browsers a test run starts (a pytest plugin, on by default:
pytest.ini's ``-p tests.support.starts``); the run ends with one line

    vLLM starts: N · product launches: M · browsers: K · launches refused at start: R

and, with ``--starts-per-module``, the same per test module (the test running when each appeared). A launch of the
product counts once it has started its UI (the launcher's ``-m backend.ui.launch`` child: what costs); one that
stopped before (a refused setting, a taken port: a second or so) counts as refused at start.

A thread reads /proc four times a second and notes each new process of ours (this pytest process's descendants, not
another run's) that is a vLLM API server (``-m vllm.entrypoints.openai.api_server``: started by a fixture, by the
launcher or by its supervisor, a restart included), a launch of the product (``-m backend serve`` that is not a dry
run, or ``-m chainlit run``: tests/support/marks.py ``kinds_of``) or a Chromium browser (its main process: no
``--type=``). Each lives far longer than a quarter of a second (vLLM: 30-60 s; the product: its Python imports
alone; Chromium: until its browser is closed): none is missed. A process with its parent's very command line is a
fork that has not exec'd yet (or never will): it is not another start, and is looked at again at the next scan.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import lanes, marks

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController

VLLM = "vllm"
PRODUCT = "product"
CHROMIUM = "chromium"
REFUSED = "refused"  # a launch of the product that never started its UI
SERVE = "serve"  # a launch of the product, until its UI is seen (then PRODUCT) or the run ends (then REFUSED)
UI = "ui"  # the launcher's UI child (not counted itself: it makes its parent a product launch)


def kind(argv: list[bytes]) -> str | None:
    """``vllm`` for an engine's API server, ``serve`` for a launch of the product, ``product`` for another Chainlit
    app's, ``ui`` for the product's UI process, ``chromium`` for a browser's main process, else None."""
    args = [a.decode(errors="replace") for a in argv if a]
    found = marks.kinds_of(args)
    if "engine" in found:
        return VLLM
    if "product" in found:
        return SERVE if "backend" in args else PRODUCT
    if "backend.ui.launch" in args and "-m" in args:
        return UI
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


def forked_unexeced(pid: int, argv: list[bytes]) -> bool:
    """Whether ``pid`` has its parent's very command line: a child forked and not yet exec'd (a launcher starting
    its UI, Chromium its zygote), or a worker forked for good. Neither is another start: counted as its parent's
    kind, a browser's helper read as a second browser and a launch's child as a launch refused at start."""
    try:
        return Path(f"/proc/{parent_of(pid)}/cmdline").read_bytes().split(b"\0") == argv
    except OSError:
        return False


def summary(counts: collections.Counter[str]) -> str:
    return (
        f"vLLM starts: {counts[VLLM]} · product launches: {counts[PRODUCT]} · browsers: {counts[CHROMIUM]}"
        f" · launches refused at start: {counts[REFUSED]}"
    )


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split("PPid:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):
        return 0


class Counter:
    def __init__(self) -> None:
        self.current = "(collection)"
        self.seen: dict[int, tuple[str, str]] = {}  # pid -> (kind, test)
        self.ui_parents: set[int] = set()  # the launches whose UI was seen
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
            if found and forked_unexeced(int(entry), argv):
                continue  # looked at again at the next scan, once it has exec'd what it runs
            if found and descends_from(int(entry), os.getpid()):
                self.seen[int(entry)] = (found, self.current)
                if found == UI:
                    self.ui_parents.add(parent_of(int(entry)))

    def per_module(self) -> dict[str, collections.Counter[str]]:
        out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for pid, (k, test) in self.seen.items():
            if test == "(before the session)" or k == UI:
                continue
            if k == SERVE:
                k = PRODUCT if pid in self.ui_parents else REFUSED
            out[test.split("::")[0]][k] += 1
        return out


_counter = Counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--starts-per-module",
        action="store_true",
        help="list the vLLM starts, product launches and browsers per test module (tests/support/starts.py)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    if not controller(session.config):
        _counter.start()


def controller(config: pytest.Config) -> bool:
    """Whether this is the controller of pytest-xdist's workers: each worker counts what it starts (its
    descendants) and sends it at its end; the controller adds them up (it runs no test itself)."""
    return lanes.distributed(config) and lanes.worker_output(config) is None


_from_workers: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


@pytest.hookimpl(trylast=True)  # before pytest-xdist's worker sends its output
def pytest_sessionfinish(session: pytest.Session) -> None:
    output = lanes.worker_output(session.config)
    if output is not None:
        _counter.stop()
        output["starts"] = {module: dict(counts) for module, counts in _counter.per_module().items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: WorkerController, error: object | None) -> None:
    for module, counts in dict(lanes.from_workers(node, "starts") or {}).items():
        _from_workers[module].update(counts)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _counter.current = nodeid


@pytest.hookimpl(trylast=True)  # after --durations: the line just above pytest's own summary line
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if controller(config):
        per_module = _from_workers
    else:
        _counter.stop()
        per_module = _counter.per_module()
    # A unit module starts nothing real (tests/support/marks.py); tests/unit/test_starts.py spawns look-alikes of
    # launches to test this counter, which this run's own count would catch or miss by a quarter second's chance.
    modules = {m: c for m, c in per_module.items() if not m.startswith("tests/unit/")}
    total: collections.Counter[str] = collections.Counter()
    for module in sorted(modules):
        total.update(modules[module])
    if config.getoption("starts_per_module"):
        terminalreporter.section("vLLM starts, product launches and browsers per module (tests/support/starts.py)")
        for module in sorted(modules):
            terminalreporter.write_line(f"{module}: {summary(modules[module])}")
    terminalreporter.write_line(summary(total))

"""CPU seconds per test module, the run's own and its processes' (a pytest plugin, opt-in).

    ./test.sh -p tests.support.cputime

Wall time on a shared 2-core machine says as much about the neighbours as about the tests; CPU time does not
depend much on them. After each test this adds up the CPU time (user + system) of this pytest process, of the
children it has waited for (which holds their own waited-for children), and of every live descendant (an engine,
a browser, a launched product) read from /proc; the growth is the test's. The terminal summary lists the modules by
CPU seconds beside their wall seconds (with ``-n``: each worker's, added up), and the whole run's share of CPU time
spent in descendants.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest

from tests.support import lanes

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields from "state" on (the name may hold spaces)


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root``, its waited-for children, and its live descendants."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        cpu[pid] = (utime + stime + cutime + cstime) / TICKS
    total = 0.0
    for pid, own in cpu.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 1)
        if p == root:
            total += own
    return total


class CpuTime:
    def __init__(self) -> None:
        self.cpu: collections.Counter[str] = collections.Counter()
        self.wall: collections.Counter[str] = collections.Counter()
        self.last_cpu = tree_cpu(os.getpid())
        self.last_wall = time.monotonic()
        self.start_cpu = self.last_cpu
        self.start_wall = self.last_wall

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
        yield
        now_cpu, now_wall = tree_cpu(os.getpid()), time.monotonic()
        module = item.nodeid.split("::")[0]
        # a descendant that ended without being waited for by one of ours takes its CPU along: never negative
        self.cpu[module] += max(0.0, now_cpu - self.last_cpu)
        self.wall[module] += now_wall - self.last_wall
        self.last_cpu, self.last_wall = now_cpu, now_wall

    @pytest.hookimpl(trylast=True)  # before pytest-xdist's worker sends its output
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = lanes.worker_output(session.config)
        if output is not None:
            output["cputime"] = (dict(self.cpu), dict(self.wall))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # type: ignore[no-untyped-def]
        """A worker's modules (with ``-n``: this controller runs none itself)."""
        cpu, wall = lanes.from_workers(node, "cputime") or ({}, {})
        self.cpu.update(cpu)
        self.wall.update(wall)

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        tr = terminalreporter
        cpu_total = sum(self.cpu.values())
        wall_total = time.monotonic() - self.start_wall
        tr.section("CPU seconds per module (this process and its processes)")
        tr.write_line(f"{'cpu s':>8} {'wall s':>8}  module")
        for module, seconds in self.cpu.most_common():
            tr.write_line(f"{seconds:8.1f} {self.wall[module]:8.1f}  {module}")
        by_dir: collections.Counter[str] = collections.Counter()
        wall_dir: collections.Counter[str] = collections.Counter()
        for module, seconds in self.cpu.items():
            d = "/".join(module.split("/")[:2])
            by_dir[d] += seconds
            wall_dir[d] += self.wall[module]
        for d, seconds in by_dir.most_common():
            tr.write_line(f"{seconds:8.1f} {wall_dir[d]:8.1f}  {d}/ (directory)")
        tr.write_line(
            f"{cpu_total:8.1f} {wall_total:8.1f}  the run: {cpu_total / max(wall_total, 1e-9):.2f} cores busy on average"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuTime(), "qwenchat-cputime")

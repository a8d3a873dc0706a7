"""How ./test.sh's two pytest-xdist workers (``-n 2 --dist loadscope``) share a run (a pytest plugin: pytest.ini).

One run of the tests on a 2-core machine kept 0.74 cores busy: an engine loading, a product starting or a test
waiting on an event leaves the other core idle. Two workers fill it. What goes where:

- **A module runs whole on one worker**, so its module fixtures start once (pytest-xdist's ``loadscope``).
- **The modules that share a kind run on one worker together** (a *lane*), so the kind starts once per run as
  before (tests/support/shared.py): modules are joined when they use a grouped kind in common, and so on
  transitively (``lanes``). The workers find the lanes at collection (what each module's tests use) and write them
  to a file the controller names (``publish``); its scheduler reads it to make each lane one unit of work
  (``scope``). pytest-xdist's own ``xdist_group`` cannot do this: with pytest 9 its group never reaches the node
  id the scheduler reads, and each test of a group went its own way.
- **Longest first.** The work queue is the collection's order (no reordering by test count): the lanes first,
  then the modules that start an engine, then those that launch the product, a browser or a soak, then the rest
  (tests/unit); within each, the order of before (``order``). Each worker takes the next unit when it is nearly
  done, so the short modules at the end fill whichever worker finishes first.

Without ``-n`` (``./test.sh`` with arguments runs one process) none of this applies.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import marks
from tests.support.shared import SHARED, module_of

if TYPE_CHECKING:
    from _pytest.nodes import Node
    from xdist.scheduler import LoadScopeScheduling
    from xdist.workermanage import WorkerController

LANES_FILE = "qwenchat_lanes_file"  # the key of the lanes file in each worker's ``workerinput``


def distributed(config: pytest.Config) -> bool:
    """Whether this run is pytest-xdist's (its controller or one of its workers)."""
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def skipped(item: pytest.Item) -> bool:
    """Whether ``item`` is skipped by a ``skip`` mark, or a ``skipif`` whose conditions are all true: it starts
    nothing (test_long_answers' long version uses the tiny engine only with QWENCHAT_SOAK=long)."""
    return any(True for _ in item.iter_markers("skip")) or any(
        m.args and all(a is True for a in m.args) for m in item.iter_markers("skipif")
    )


def lanes(items: list[pytest.Item]) -> dict[Node, str]:
    """Each module that uses a grouped kind in a test that runs, and its lane's name (the kinds its modules share,
    joined)."""
    kinds: dict[Node, set[str]] = {}
    for item in items:
        if not skipped(item):
            kinds.setdefault(module_of(item), set()).update(SHARED.grouped & SHARED.uses(item))
    lane_of: dict[str, set[str]] = {k: {k} for mk in kinds.values() for k in mk}  # kind -> its lane's kinds
    for mk in kinds.values():
        joined = set().union(*(lane_of[k] for k in mk)) if mk else set()
        for k in joined:
            lane_of[k] = joined
    return {m: "+".join(sorted(lane_of[next(iter(mk))])) for m, mk in kinds.items() if mk}


def order(items: list[pytest.Item], lane: dict[Node, str]) -> list[pytest.Item]:
    """``items`` (grouped by tests/support/shared.py) as the workers' queue: the lanes first (the one with the most
    modules first; in each, the modules sharing a kind next to each other, whatever their directory), then the
    modules that start an engine, then those that start the product, a browser or a soak, then the rest; otherwise
    in their order."""
    modules: dict[Node, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(module_of(item), []).append(item)
    names = list(dict.fromkeys(lane[m] for m in modules if m in lane))
    names.sort(key=lambda name: -sum(1 for m in modules if lane.get(m) == name))  # stable: first seen first on a tie
    out: list[pytest.Item] = []
    for name in names:
        out += SHARED.group_modules([i for m in modules if lane.get(m) == name for i in modules[m]], any_directory=True)

    def rank(m: Node) -> int:
        starts = marks.marked(modules[m][0]) & set(marks.KINDS)
        return 0 if "engine" in starts else 1 if starts else 2

    return out + [item for m in sorted((m for m in modules if m not in lane), key=rank) for item in modules[m]]


def publish(config: pytest.Config, lane: dict[Node, str]) -> None:
    """A worker's lanes ({module id: lane}) into the controller's file (each worker collects the same)."""
    path = getattr(config, "workerinput", {}).get(LANES_FILE)
    if path:
        tmp = f"{path}.{os.getpid()}"
        Path(tmp).write_text(json.dumps({m.nodeid: name for m, name in lane.items()}))
        os.replace(tmp, path)


def scope(nodeid: str, lane: dict[str, str]) -> str:
    """A test's unit of work: its module's lane, else its module."""
    module = nodeid.split("::", 1)[0]
    return lane.get(module, module)


_controller: dict[str, Path] = {}


def pytest_configure(config: pytest.Config) -> None:
    if distributed(config) and not hasattr(config, "workerinput"):
        _controller["dir"] = Path(tempfile.mkdtemp(prefix="qwenchat-lanes-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if "dir" in _controller:
        shutil.rmtree(_controller.pop("dir"), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    node.workerinput[LANES_FILE] = str(_controller["dir"] / "lanes.json")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByLane(LoadScopeScheduling):  # type: ignore[misc]  # pytest-xdist is untyped
        lane: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.lane is None:  # read once, when the workers have collected (and published)
                file = _controller["dir"] / "lanes.json"
                self.lane = json.loads(file.read_text()) if file.exists() else {}
            return scope(nodeid, self.lane)

    config.option.loadscopereorder = False  # the queue is the collection's order (``order``)
    return ByLane(config, log)


def worker_output(config: pytest.Config) -> dict[str, object] | None:
    """What a worker sends its controller at its end (pytest-xdist's ``workeroutput``); None outside a worker."""
    return getattr(config, "workeroutput", None)


def from_workers(node: WorkerController, key: str) -> object:
    return getattr(node, "workeroutput", {}).get(key)

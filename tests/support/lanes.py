"""How ./test.sh's two pytest-xdist workers (``-n 2 --dist loadgroup``) share a run (a pytest plugin: pytest.ini).

One run of the tests on a 2-core machine kept 0.74 cores busy: an engine loading, a product starting or a test
waiting on an event leaves the other core idle. Two workers fill it. What goes where:

- **A module runs whole on one worker**, so its module fixtures start once (``_split_scope``: the module, where
  pytest-xdist's ``loadgroup`` would send each test on its own).
- **The modules that share a kind run on one worker together** (a *lane*), so the kind starts once per run as
  before (tests/support/shared.py): modules are joined when they use a grouped kind in common, and so on
  transitively (``lanes``). The lane is their ``xdist_group``.
- **Longest first.** The work queue is the collection's order (no reordering by test count): the lanes first,
  then the modules that start an engine, then those that launch the product, a browser or a soak, then the rest
  (tests/unit); within each, the order of before. Each worker takes the next module when it is nearly done, so
  the short modules at the end fill whichever worker finishes first.

Without ``-n`` (``./test.sh`` with arguments runs one process) none of this applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support import marks
from tests.support.shared import SHARED, module_of

if TYPE_CHECKING:
    from _pytest.nodes import Node
    from xdist.scheduler import LoadGroupScheduling
    from xdist.workermanage import WorkerController

GROUP = "xdist_group"


def distributed(config: pytest.Config) -> bool:
    """Whether this run is pytest-xdist's (its controller or one of its workers)."""
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def lanes(items: list[pytest.Item]) -> dict[Node, str]:
    """Each module that shares a grouped kind with another, and its lane's name (its kinds, joined)."""
    kinds: dict[Node, set[str]] = {}
    for item in items:
        kinds.setdefault(module_of(item), set()).update(SHARED.grouped & SHARED.uses(item))
    lane_of: dict[str, set[str]] = {k: {k} for mk in kinds.values() for k in mk}  # kind -> its lane's kinds
    for mk in kinds.values():
        joined = set().union(*(lane_of[k] for k in mk)) if mk else set()
        for k in joined:
            lane_of[k] = joined
    return {m: "+".join(sorted(lane_of[next(iter(mk))])) for m, mk in kinds.items() if mk}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the xdist_group marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not distributed(config):
        return
    lane = lanes(items)
    for item in items:
        if module_of(item) in lane:
            item.add_marker(getattr(pytest.mark, GROUP)(lane[module_of(item)]))


def order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` (grouped by tests/support/shared.py) as the workers' queue: the lanes first (the one with the most
    modules first; in each, the modules sharing a kind next to each other, whatever their directory), then the
    modules that start an engine, then those that start the product, a browser or a soak, then the rest; otherwise
    in their order."""
    modules: dict[Node, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(module_of(item), []).append(item)
    lane: dict[Node, str] = {}
    for m, its in modules.items():
        mark = its[0].get_closest_marker(GROUP)
        if mark is not None:
            lane[m] = str(mark.args[0])
    names = list(dict.fromkeys(lane.values()))
    names.sort(key=lambda name: -sum(1 for v in lane.values() if v == name))  # stable: first seen first on a tie
    out: list[pytest.Item] = []
    for name in names:
        out += SHARED.group_modules([i for m in modules if lane.get(m) == name for i in modules[m]], any_directory=True)

    def rank(m: Node) -> int:
        starts = marks.marked(modules[m][0]) & set(marks.KINDS)
        return 0 if "engine" in starts else 1 if starts else 2

    return out + [item for m in sorted((m for m in modules if m not in lane), key=rank) for item in modules[m]]


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadGroupScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByModule(LoadGroupScheduling):  # type: ignore[misc]  # pytest-xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)
            return group if group != nodeid else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # the queue is the collection's order (``order``)
    return ByModule(config, log)


def worker_output(config: pytest.Config) -> dict[str, object] | None:
    """What a worker sends its controller at its end (pytest-xdist's ``workeroutput``); None outside a worker."""
    return getattr(config, "workeroutput", None)


def from_workers(node: WorkerController, key: str) -> object:
    return getattr(node, "workeroutput", {}).get(key)

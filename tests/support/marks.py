"""Every test module is marked by what it starts, so that ``./test.sh --quick`` can leave those out by marker.

    engine   a vLLM process (``tiny_engine``, ``start_engine``, a product launched on its own engine, a fleet), or
             the engine environment's own heavy work (a merge, a training run)
    product  ``python -m backend serve`` (or another Chainlit app process), external or on its own engine
    browser  Chromium (the ``browser`` fixture, ``e2e.browser_page`` / ``e2e.start_browser``)
    soak     tests/soak (long by ``QWENCHAT_SOAK=long``, ``./test.sh --soak``)

Checked twice (tests/conftest.py): at collection, a module whose tests use a fixture that starts one of them
(``FIXTURES``) or that lives in tests/soak fails the collection unless it carries the marker; while it runs, a
process a test module starts (seen at ``subprocess.Popen``, which every launch goes through, and at the browser's
start) fails that test's teardown unless its module carries the marker. A marker on a module that starts nothing of
its kind only leaves it out of ``--quick``.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

KINDS = ("engine", "product", "browser", "soak")
#: fixtures that start something, and what
FIXTURES = {
    "tiny_engine": {"engine"},
    "embedded_product": {"engine", "product"},
    "external_app": {"product"},
    "login_app": {"product"},
    "socket_app": {"product"},
    "pg_history_app": {"product"},
    "browser": {"browser"},
}

#: the test running now (its setup, call and teardown), and what each module started: module node id -> kinds
CURRENT: list[pytest.Item | None] = [None]
STARTED: dict[str, set[str]] = defaultdict(set)
SAID: dict[str, set[str]] = defaultdict(set)  # what was reported of each module (once, at the first teardown after)


def module_id(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def marked(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers()}


def needed_at_collection(item: pytest.Item) -> set[str]:
    need = {kind for name in getattr(item, "fixturenames", ()) for kind in FIXTURES.get(name, ())}
    if module_id(item).startswith("tests/soak/"):
        need.add("soak")
    return need


def unmarked(items: Iterable[pytest.Item]) -> list[str]:
    """One line per module that uses a starting fixture (or is a soak) without the marker for it."""
    missing: dict[str, set[str]] = defaultdict(set)
    for item in items:
        missing[module_id(item)] |= needed_at_collection(item) - marked(item)
    return [_say(module, kinds, "uses fixtures that start") for module, kinds in sorted(missing.items()) if kinds]


def note(*kinds: str) -> None:
    """Something of ``kinds`` was started, by the test running now (nothing outside a test)."""
    item = CURRENT[0]
    if item is not None:
        STARTED[module_id(item)].update(kinds)


def started_unmarked(item: pytest.Item) -> str:
    """What ``item``'s module started without the marker for it ("" when nothing, or when said already)."""
    kinds = STARTED.get(module_id(item), set()) - marked(item) - SAID[module_id(item)]
    SAID[module_id(item)] |= kinds
    return _say(module_id(item), kinds, "started") if kinds else ""


def _say(module: str, kinds: set[str], how: str) -> str:
    names = ", ".join(sorted(kinds))
    markers = ", ".join(f"pytest.mark.{k}" for k in sorted(kinds))
    return f"{module} {how} {names} but is not marked so: add {markers} to its pytestmark (tests/support/marks.py)"


def kinds_of(argv: Sequence[Any]) -> set[str]:
    """What a process started with ``argv`` is: vLLM, or a launch of the product (``backend serve``, not a dry run)
    or of another Chainlit app. (A product's own engine is its launcher's child, not seen here: a module launching
    the product on its own engine carries ``engine`` by hand, and its fixtures are checked at collection.)"""
    args = [str(a) for a in argv]
    module = {args[i + 1]: args[i + 2 : i + 3] for i in range(len(args) - 1) if args[i] == "-m"}  # -m NAME ARG
    if any(name.startswith("vllm.entrypoints") for name in module):
        return {"engine"}
    if (module.get("backend") == ["serve"] and "--dry-run" not in args) or module.get("chainlit") == ["run"]:
        return {"product"}
    return set()


def watch_popen() -> None:
    """Note every process a test starts through ``subprocess.Popen`` (every launch goes through it)."""
    original = subprocess.Popen.__init__
    if getattr(original, "_qwenchat_marks", False):
        return

    def init(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        found = kinds_of(argv)
        if found:
            note(*found)
        original(self, args, *a, **kw)

    init._qwenchat_marks = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = init  # type: ignore[method-assign]

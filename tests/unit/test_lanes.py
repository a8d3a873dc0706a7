"""tests/support/lanes.py: which modules share a worker, and the order the two workers take them in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import lanes
from tests.support.shared import SHARED


@dataclass(eq=False)
class Module:
    path: Path

    @property
    def nodeid(self) -> str:
        return str(self.path)


@dataclass(eq=False)
class Item:
    """What lanes.py reads of a pytest item: its module, its fixtures, its marks."""

    module: Module
    fixturenames: list[str]
    marks: list[pytest.Mark] = field(default_factory=list)
    name: str = "test"

    def getparent(self, cls: type) -> Module:
        return self.module

    def iter_markers(self, name: str | None = None) -> list[pytest.Mark]:
        return [m for m in self.marks if name is None or m.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def module(path: str, *fixtures: str, marked: tuple[str, ...] = (), tests: int = 1) -> list[Item]:
    mod = Module(Path(path))
    return [
        Item(mod, list(fixtures), [getattr(pytest.mark, k).mark for k in marked], f"{path}::t{i}") for i in range(tests)
    ]


@pytest.fixture(autouse=True)
def kinds(monkeypatch):
    monkeypatch.setattr(SHARED, "kinds", {"engine_a", "server_b", "product_c", "browser"})
    monkeypatch.setattr(SHARED, "grouped", {"engine_a", "server_b", "product_c"})


def test_modules_sharing_a_kind_directly_or_through_another_module_are_one_lane_and_the_browser_joins_none():
    a = module("tests/e2e/test_a.py", "engine_a", "browser")
    b = module("tests/soak/test_b.py", "engine_a", "server_b")
    c = module("tests/e2e/test_c.py", "server_b", "browser")
    d = module("tests/e2e/test_d.py", "product_c", "browser")
    e = module("tests/e2e/test_e.py", "browser")
    lane = lanes.lanes(a + b + c + d + e)  # type: ignore[arg-type]
    joined = "engine_a+server_b"
    assert lane == {a[0].module: joined, b[0].module: joined, c[0].module: joined, d[0].module: "product_c"}


def test_a_skipped_test_joins_no_lane_with_what_it_would_have_used():
    # test_long_answers: its long version (skipped unless QWENCHAT_SOAK=long) is the only user of the engine
    a = module("tests/integration/test_a.py", "engine_a")
    b = module("tests/soak/test_b.py", "server_b")
    b_long = Item(
        b[0].module, ["engine_a"], [pytest.mark.skipif(True, reason="long").mark], "tests/soak/test_b.py::long"
    )
    assert lanes.lanes([*a, *b, b_long]) == {a[0].module: "engine_a", b[0].module: "server_b"}  # type: ignore[list-item]
    b_long.marks = [pytest.mark.skipif(False, reason="long").mark]  # QWENCHAT_SOAK=long: it runs
    joined = "engine_a+server_b"
    assert lanes.lanes([*a, *b, b_long]) == {a[0].module: joined, b[0].module: joined}  # type: ignore[list-item]


def test_the_queue_is_the_lanes_largest_first_then_engine_modules_then_product_ones_then_the_rest_in_order():
    unit1 = module("tests/unit/test_1.py", tests=3)
    own_engine = module("tests/integration/test_own.py", marked=("engine",))
    product = module("tests/e2e/test_p.py", "browser", marked=("product", "browser"))
    small_lane = module("tests/e2e/test_d.py", "product_c", marked=("product",))
    big1 = module("tests/integration/test_x.py", "server_b", marked=("product",))
    big2 = module("tests/integration/test_y.py", "engine_a", marked=("engine",))
    big3 = module("tests/soak/test_z.py", "engine_a", "server_b", marked=("engine", "soak"))
    unit2 = module("tests/unit/test_2.py")
    items = unit1 + own_engine + product + small_lane + big1 + big2 + big3 + unit2
    queue = lanes.order(items, lanes.lanes(items))  # type: ignore[arg-type]
    modules = list(dict.fromkeys(str(i.module.path) for i in queue))
    # the big lane first, its modules by the kinds they share (server_b's users next to each other, the module
    # using both between them and engine_a's); then the one-module lane; then by what each starts
    assert modules == [
        "tests/integration/test_x.py",
        "tests/soak/test_z.py",
        "tests/integration/test_y.py",
        "tests/e2e/test_d.py",
        "tests/integration/test_own.py",
        "tests/e2e/test_p.py",
        "tests/unit/test_1.py",
        "tests/unit/test_2.py",
    ]
    assert len(queue) == len(items) and [i.name for i in queue if "test_1" in i.name] == [i.name for i in unit1]


def test_a_test_s_unit_of_work_is_its_module_s_lane_else_its_whole_module():
    lane = {"tests/e2e/test_c.py": "engine_a+server_b", "tests/soak/test_b.py": "engine_a+server_b"}
    assert lanes.scope("tests/e2e/test_c.py::test_x[a::b]", lane) == "engine_a+server_b"
    assert lanes.scope("tests/soak/test_b.py::TestA::test_y", lane) == "engine_a+server_b"
    assert lanes.scope("tests/unit/test_1.py::test_x", lane) == "tests/unit/test_1.py"
    assert lanes.scope("tests/unit/test_1.py::TestA::test_x[a-b]", lane) == "tests/unit/test_1.py"


def test_the_workers_lanes_reach_the_controller_s_scheduler(tmp_path):
    """What a worker publishes is what the scheduler's ``scope`` reads (module node ids as keys)."""
    items = module("tests/e2e/test_c.py", "server_b") + module("tests/soak/test_b.py", "server_b")
    items += module("tests/unit/test_1.py")
    file = tmp_path / "lanes.json"

    class Config:
        workerinput = {lanes.LANES_FILE: str(file)}

    lanes.publish(Config, lanes.lanes(items))  # type: ignore[arg-type]
    published = json.loads(file.read_text())
    assert published == {"tests/e2e/test_c.py": "server_b", "tests/soak/test_b.py": "server_b"}
    assert lanes.scope("tests/soak/test_b.py::test_y", published) == lanes.scope("tests/e2e/test_c.py::t", published)

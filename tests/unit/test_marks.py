"""tests/support/marks.py: what a started process is, and the modules found unmarked."""

from __future__ import annotations

import pytest

from tests.support import marks


@pytest.mark.parametrize(
    "argv, kinds",
    [
        (["/e/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], {"engine"}),
        (["/a/bin/python", "-m", "backend", "serve"], {"product"}),
        (["/a/bin/python", "-m", "backend", "serve", "--prepare"], {"product"}),
        (["/a/bin/python", "-m", "backend", "serve", "--dry-run"], set()),  # prints the plan, starts nothing
        (["/a/bin/python", "-m", "chainlit", "run", "bench/plain_chainlit_app.py"], {"product"}),
        (["/a/bin/python", "-m", "backend", "prepare"], set()),
        (["/a/bin/python", "-c", "print('python -m vllm.entrypoints.openai.api_server')"], set()),  # text, not a start
        (["sleep", "300"], set()),
    ],
)
def test_a_started_process_is_classified_by_its_module_not_by_words_in_its_arguments(argv, kinds):
    assert marks.kinds_of(argv) == kinds


class FakeItem:
    def __init__(self, nodeid: str, fixturenames: list[str], markers: list[str]) -> None:
        self.nodeid, self.fixturenames, self._markers = nodeid, fixturenames, markers

    def iter_markers(self):
        return [pytest.Mark(name, (), {}) for name in self._markers]


def test_a_module_using_a_starting_fixture_without_its_marker_is_named_with_the_markers_to_add():
    items = [
        FakeItem("tests/e2e/test_x.py::test_a", ["embedded_product", "browser"], ["e2e", "browser"]),
        FakeItem("tests/e2e/test_y.py::test_b", ["browser"], ["browser"]),
        FakeItem("tests/soak/test_z.py::test_c", [], []),
        FakeItem("tests/unit/test_w.py::test_d", ["tmp_path"], []),
    ]
    said = marks.unmarked(items)  # type: ignore[arg-type]
    assert said == [
        "tests/e2e/test_x.py uses fixtures that start engine, product but is not marked so: add pytest.mark.engine, "
        "pytest.mark.product to its pytestmark (tests/support/marks.py)",
        "tests/soak/test_z.py uses fixtures that start soak but is not marked so: add pytest.mark.soak to its "
        "pytestmark (tests/support/marks.py)",
    ]

"""The Chainlit patches' list: each names a test that exists, and another Chainlit refuses to start, saying why."""

from __future__ import annotations

import ast
from importlib.metadata import version
from pathlib import Path

import pytest

from backend.ui import chainlit_patches
from backend.ui.chainlit_patches import CHAINLIT_VERSION, PATCHES, ChainlitMismatch, check_chainlit

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_chainlit_is_the_one_the_patches_were_written_for() -> None:
    assert version("chainlit") == CHAINLIT_VERSION
    check_chainlit()


def test_another_chainlit_is_refused_with_the_version_and_the_fix() -> None:
    with pytest.raises(ChainlitMismatch, match=r"chainlit 2\.13\.0 is installed.*install chainlit==2\.12\.0"):
        check_chainlit("2.13.0")


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_names_its_reason_and_a_test_that_exists(patch: chainlit_patches.Patch) -> None:
    path, _, name = patch.test.partition("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert name in tests, f"{patch.name}: {patch.test} not found"
    assert patch.reason and (ROOT / patch.where.split(":")[0]).exists()

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


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patched_spot_has_the_shape_its_patch_expects_in_the_installed_chainlit(
    patch: chainlit_patches.Patch,
) -> None:
    assert patch.shape(), f"{patch.name}: the installed Chainlit changed where it is patched ({patch.where})"


def test_a_patched_spot_that_changed_shape_is_refused_naming_the_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    from chainlit.emitter import ChainlitEmitter

    monkeypatch.delattr(ChainlitEmitter, "_get_session_property")
    with pytest.raises(ChainlitMismatch, match=r"changed where this app patches it \(reconnect journal\)"):
        check_chainlit()


APPLIERS = ("server.patch(", "socket_guard.install(", "reconnect.install(", "without_websocket_keepalive()")


def test_the_patches_are_applied_from_chainlit_patches_only() -> None:
    """Each patch's installer is called in chainlit_patches.py and nowhere else in the product."""
    calls = {
        (str(p.relative_to(ROOT)), a)
        for p in sorted((ROOT / "backend").rglob("*.py"))
        for line in p.read_text(encoding="utf-8").splitlines()
        for a in APPLIERS
        if a in line and not line.lstrip().startswith(("def ", "#"))
    }
    assert {path for path, _ in calls} == {"backend/ui/chainlit_patches.py"}, calls
    assert {a for _, a in calls} == set(APPLIERS)


def test_the_shapes_still_hold_once_the_launch_patches_are_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The UI process checks after launch.py patched uvicorn.Config: the check reads uvicorn's own class."""
    import uvicorn

    from backend.ui import launch

    monkeypatch.setattr(uvicorn, "Config", uvicorn.Config)  # put back after the test
    launch.without_websocket_keepalive()
    assert uvicorn.Config is not uvicorn.config.Config  # patched
    check_chainlit()

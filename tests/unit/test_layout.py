"""The layout is the architecture: the chat side (backend/chat, webui/) never imports the engine side; backend/
never imports Chainlit or webui/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKEND = Path(__file__).resolve().parents[2] / "backend"


def _imports(path: Path) -> set[str]:
    """Absolute module names imported anywhere in ``path`` (also inside functions), relative ones resolved."""
    package = ".".join(path.relative_to(BACKEND.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _modules(folder: str) -> list[Path]:
    return sorted((BACKEND / folder).rglob("*.py")) if folder else sorted(BACKEND.rglob("*.py"))


@pytest.mark.parametrize("path", _modules("chat"), ids=lambda p: p.name)
def test_the_chat_side_never_imports_the_engine_side(path):
    engine = sorted(m for m in _imports(path) if m == "backend.engine" or m.startswith("backend.engine."))
    assert not engine, (
        f"{path.relative_to(BACKEND.parent)} imports {engine}: the Chainlit process must not need the launcher"
    )


@pytest.mark.parametrize("path", _modules(""), ids=lambda p: str(p.relative_to(BACKEND)))
def test_backend_never_imports_chainlit(path):
    chainlit = sorted(m for m in _imports(path) if m == "chainlit" or m.startswith("chainlit."))
    assert not chainlit, (
        f"{path.relative_to(BACKEND.parent)} imports {chainlit}: app.py and webui/ are the Chainlit code"
    )


@pytest.mark.parametrize("path", _modules(""), ids=lambda p: str(p.relative_to(BACKEND)))
def test_backend_never_imports_the_web_ui(path):
    webui = sorted(m for m in _imports(path) if m == "webui" or m.startswith("webui."))
    assert not webui, f"{path.relative_to(BACKEND.parent)} imports {webui}: webui/ renders what backend/ reports"


WEBUI = sorted((BACKEND.parent / "webui").rglob("*.py"))


@pytest.mark.parametrize("path", WEBUI, ids=lambda p: p.name)
def test_the_web_ui_never_imports_the_engine_side(path):
    """webui/ runs in the Chainlit process, as backend/chat does."""
    engine = sorted(m for m in _imports(path) if m == "backend.engine" or m.startswith("backend.engine."))
    assert not engine, (
        f"{path.relative_to(BACKEND.parent)} imports {engine}: the Chainlit process must not need the launcher"
    )


def test_the_web_ui_package_is_scanned():
    assert {p.name for p in WEBUI} >= {"__init__.py", "routes.py", "views.py", "compare_view.py"}


SHARED = [
    "settings.py",
    "errors.py",
    "text.py",
    "contract.py",
    "engine_http.py",
    "probe.py",
    "chatml.py",
    "packages.py",
]


@pytest.mark.parametrize("name", SHARED)
def test_shared_modules_import_neither_side(name):
    sides = sorted(
        m for m in _imports(BACKEND / name) if m.startswith(("backend.engine", "backend.chat", "backend.adapters"))
    )
    assert not sides, f"backend/{name} is shared by both sides but imports {sides}"


def test_the_import_scan_sees_relative_imports():
    """The scan itself can fail: a relative import of the engine side from chat/ is resolved and caught."""
    probe = BACKEND / "chat" / "_layout_probe.py"
    probe.write_text("from ..engine import supervisor\n")
    try:
        assert "backend.engine" in _imports(probe) and "backend.engine.supervisor" in _imports(probe)
    finally:
        probe.unlink()

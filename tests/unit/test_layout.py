"""The layout is the architecture: the Chainlit process's code (backend/chat, backend/ui) never imports the engine
side, the engine side never imports either; only backend/ui (and app.py, which installs it) imports Chainlit, and
backend/chat never imports backend/ui."""

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


def _under(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages))


def _name(path: Path) -> str:
    return str(path.relative_to(BACKEND.parent))


@pytest.mark.parametrize("path", _modules("chat") + _modules("ui"), ids=_name)
def test_the_chainlit_process_never_imports_the_engine_side(path):
    """backend/chat and backend/ui run in the Chainlit process, which must not need the launcher."""
    engine = _under(_imports(path), "backend.engine")
    assert not engine, f"{_name(path)} imports {engine}: the Chainlit process must not need the launcher"


@pytest.mark.parametrize("path", _modules("engine"), ids=_name)
def test_the_engine_side_never_imports_the_chat_side(path):
    chat = _under(_imports(path), "backend.chat", "backend.ui")
    assert not chat, f"{_name(path)} imports {chat}: the launcher must not need the Chainlit process's code"


ROOT = BACKEND.parent
# The plain Chainlit example the UI benchmarks compare against (docs/PERFORMANCE.md): not the product.
PLAIN_CHAINLIT = {ROOT / "bench" / "plain_chainlit_app.py", ROOT / "bench" / "plain_with_loopstats.py"}


def _product_files() -> list[Path]:
    """Every Python file but the tests': the top folder's and those of every folder in it (backend/, bench/, …)."""
    folders = [d for d in ROOT.iterdir() if d.is_dir() and d.name != "tests" and not d.name.startswith(".")]
    return sorted([*ROOT.glob("*.py"), *(p for d in folders for p in d.rglob("*.py"))])


OUTSIDE_UI = [
    p for p in _product_files() if BACKEND / "ui" not in p.parents and p != ROOT / "app.py" and p not in PLAIN_CHAINLIT
]


@pytest.mark.parametrize("path", OUTSIDE_UI, ids=_name)
def test_only_the_ui_package_imports_chainlit(path):
    chainlit = _under(_imports(path), "chainlit")
    assert not chainlit, f"{_name(path)} imports {chainlit}: backend/ui/ (and app.py) is the Chainlit code"


@pytest.mark.parametrize("path", [p for p in _modules("") if "ui" not in p.relative_to(BACKEND).parts[:1]], ids=_name)
def test_nothing_else_in_backend_imports_the_ui_package(path):
    ui = _under(_imports(path), "backend.ui")
    assert not ui, f"{_name(path)} imports {ui}: backend/ui/ shows what backend/chat reports, not the other way"


def test_app_py_only_installs_the_ui():
    """app.py is Chainlit's entry point: it builds the Service and installs backend/ui/, nothing more."""
    app = BACKEND.parent / "app.py"
    assert _imports(app) == {
        "__future__",
        "__future__.annotations",
        "backend.ui",
        "backend.chat.service",
        "backend.chat.service.Service",
    }
    assert len(app.read_text(encoding="utf-8").splitlines()) < 60


def test_the_ui_package_is_scanned():
    assert {p.name for p in _modules("ui")} >= {"__init__.py", "routes.py", "views.py", "chat.py", "installation.py"}
    assert not (BACKEND.parent / "webui").exists(), "webui/ moved to backend/ui/"


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
        m
        for m in _imports(BACKEND / name)
        if m.startswith(("backend.engine", "backend.chat", "backend.adapters", "backend.ui", "chainlit"))
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

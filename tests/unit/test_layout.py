"""The layout is the architecture: folder names say which process runs the code.

- The UI process (Chainlit's): ``backend/ui`` (the only Chainlit code), ``backend/chat`` (the chat itself),
  ``backend/storage`` (history, preferences, votes, shares), ``backend/web`` (the web edge: security middleware,
  login, metrics). It never imports the launcher, the engine plugins or the offline tools.
- The launcher (``python -m backend serve``): ``backend/launcher`` (launch, supervise, fleet, diagnose).
- Inside vLLM and vllm-router: ``backend/engine_plugins``; they import only the shared modules.
- Offline tools (a command, then exit): ``backend/tools`` (merge, model build, download).
- Both sides: ``backend/adapters`` and the top-level shared modules.
Only ``backend/ui`` (and app.py, which installs it) imports Chainlit; nothing imports ``backend/ui``."""

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


UI_PROCESS = ("chat", "storage", "web", "ui")
ENGINE_SIDE = ("launcher", "engine_plugins", "tools")


def test_every_backend_folder_has_its_process_rule():
    folders = {d.name for d in BACKEND.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))}
    assert folders - {"catalog", "data"} == {*UI_PROCESS, *ENGINE_SIDE, "adapters"}


@pytest.mark.parametrize("path", [p for f in UI_PROCESS for p in _modules(f)], ids=_name)
def test_the_ui_process_never_imports_the_engine_side(path):
    """The Chainlit process must not need the launcher, the engine plugins or the offline tools."""
    engine = _under(_imports(path), *(f"backend.{f}" for f in ENGINE_SIDE))
    assert not engine, f"{_name(path)} imports {engine}: the UI process must not need the engine side"


@pytest.mark.parametrize("path", [p for f in ENGINE_SIDE for p in _modules(f)], ids=_name)
def test_the_engine_side_never_imports_the_ui_process(path):
    chat = _under(_imports(path), *(f"backend.{f}" for f in UI_PROCESS))
    assert not chat, f"{_name(path)} imports {chat}: the engine side must not need the Chainlit process's code"


@pytest.mark.parametrize("path", _modules("engine_plugins"), ids=_name)
def test_the_engine_plugins_import_only_the_shared_modules(path):
    """They run inside vLLM and vllm-router, in the engine environment: nothing of the launcher or the tools."""
    ours = _under(_imports(path), *(f"backend.{f}" for f in ("launcher", "tools", "adapters")))
    assert not ours, f"{_name(path)} imports {ours}: code loaded into vLLM takes only the shared modules"


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
    "settings_sections.py",
    "settings_types.py",
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
        if m.startswith(tuple(f"backend.{f}" for f in (*UI_PROCESS, *ENGINE_SIDE, "adapters")) + ("chainlit",))
    )
    assert not sides, f"backend/{name} is shared by both sides but imports {sides}"


def test_the_import_scan_sees_relative_imports():
    """The scan itself can fail: a relative import of the engine side from chat/ is resolved and caught."""
    probe = BACKEND / "chat" / "_layout_probe.py"
    probe.write_text("from ..launcher import supervisor\n")
    try:
        assert "backend.launcher" in _imports(probe) and "backend.launcher.supervisor" in _imports(probe)
    finally:
        probe.unlink()

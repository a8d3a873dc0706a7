"""A ``_private`` name stays in its module: no product module imports one from another (a name shared between
modules is public, and named so). Dunder names (``__version__``) are not private."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def product_files() -> list[Path]:
    """backend/, app.py and scripts/: the product's own Python."""
    return sorted([ROOT / "app.py", *(ROOT / "backend").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str) -> bool:
    """A module of the product: relative, or under backend."""
    return module.startswith(".") or module == "backend" or module.startswith("backend.")


def private_imports(source: str) -> list[str]:
    """``module: name`` for each private name ``source`` imports (also inside functions), and for each private
    attribute it reads of a product module it imported (``history._json_dict``)."""
    tree = ast.parse(source)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [f"{module}: {a.name}" for a in node.names if _private(a.name)]
            if _ours(module):  # ``from . import history``: history may be a module
                modules.update({a.asname or a.name: f"{module.rstrip('.')}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            modules.update({a.asname or a.name: a.name for a in node.names if _ours(a.name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            found += [f"{modules[node.value.id]}: {node.attr}"] if _private(node.attr) else []
    return found


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_private_name_from_another(path: Path) -> None:
    found = private_imports(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} imports private names {found}: make them public where they are shared"


def test_the_scan_finds_private_names_in_every_import_form_and_not_public_or_dunder_ones() -> None:
    source = (
        "from .history import META_KEY, _json_dict\n"
        "from __future__ import annotations\n"
        "from pkg import __version__\n"
        "def f():\n    from ..supervisor import _die_with_parent as die\n"
        "from . import history\n"
        "import backend.text as text\n"
        "history._json_dict(x), history.META_KEY, text._CATALOG, self._lock, os._exit\n"
    )
    assert sorted(private_imports(source)) == [
        "..supervisor: _die_with_parent",
        ".history: _json_dict",
        ".history: _json_dict",
        "backend.text: _CATALOG",
    ]

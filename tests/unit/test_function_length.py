"""No function of the product is longer than 80 lines (from its ``def`` to its last line, docstring included) unless
its docstring says why, on a line of its own: ``Long because: …`` (docs: STYLE.md, "functions read top to bottom on
one screen"). The product is every .py file under backend/ (backend/ui included), scripts/, bench/ and webui/, and
app.py; tests/ is not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80
PRODUCT_DIRS = ("backend", "scripts", "bench", "webui")
REASON = re.compile(r"^\s*Long because: \S", re.MULTILINE)


def product_files() -> list[Path]:
    files = [path for d in PRODUCT_DIRS if (ROOT / d).is_dir() for path in sorted((ROOT / d).rglob("*.py"))]
    return files + [ROOT / "app.py"] if (ROOT / "app.py").is_file() else files


def too_long(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of each function over ``limit`` lines whose docstring gives no reason."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > limit and not REASON.search(ast.get_docstring(child) or ""):
                    found.append((prefix + child.name, child.lineno, lines))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_no_product_function_is_over_80_lines_without_a_reason_in_its_docstring() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} is {lines} lines"
        for path in product_files()
        for name, line, lines in too_long(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        f"functions over {LIMIT} lines: split them into named steps, or say why in the docstring on a line of its "
        "own ('Long because: …'):\n  " + "\n  ".join(offenders)
    )


def test_the_scan_covers_the_product_and_not_the_tests() -> None:
    names = {str(path.relative_to(ROOT)) for path in product_files()}
    assert {"app.py", "backend/chat/turn.py", "backend/adapters/doctor.py", "bench/fleet.py"} <= names
    assert any(name.startswith("scripts/") for name in names)
    assert not any(name.startswith("tests/") for name in names)


def _function(name: str, body_lines: int, docstring: str = "", indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    doc = f'{indent}    """{docstring}"""\n' if docstring else ""
    return f"{indent}def {name}():\n{doc}{body}"


def test_a_long_function_is_found_with_its_class_and_line_and_a_short_one_is_not() -> None:
    source = _function("short", 78) + "\n\nclass Box:\n" + _function("long", 80, indent="    ")
    assert too_long(source) == [("Box.long", 83, 81)]
    assert too_long(_function("edge", 79)) == []  # 80 lines: the limit itself


def test_a_reason_on_its_own_docstring_line_allows_a_long_function_and_a_mention_does_not() -> None:
    reason = "Parse the table.\n\n    Long because: one row per key, read top to bottom."
    assert too_long(_function("table", 90, reason)) == []
    assert too_long(_function("table", 90, "Parse the table (not long because: it is).")) == [("table", 1, 92)]
    assert too_long(_function("table", 90, "Parse the table.\n\n    Long because:")) == [("table", 1, 94)]


def test_nested_functions_count_on_their_own_and_inside_their_parent() -> None:
    inner = _function("inner", 85, indent="    ")
    source = "async def outer():\n" + inner + "    return inner\n"
    assert too_long(source) == [("outer", 1, 88), ("outer.inner", 2, 86)]

"""backend.text: the one catalog of user-facing strings is complete, consistent and the only place they live."""

from __future__ import annotations

import ast
import dataclasses
import re
import string
from pathlib import Path

import pytest

import backend.engine.merge  # noqa: F401  (MergeError subclasses QwenChatError outside errors.py)
from backend.errors import QwenChatError
from backend.settings import Settings
from backend.text import CATALOG

ROOT = Path(__file__).resolve().parents[2]
# Where code may name catalog keys: the backend and the Chainlit app. text.py only defines them
# (its docstring's examples are not uses).
CATALOG_FILE = ROOT / "backend" / "text.py"
CODE = sorted(p for p in (ROOT / "backend").rglob("*.py") if p != CATALOG_FILE) + [ROOT / "app.py"]
# Besides the catalog, Chinese is allowed only in counters.py: token-counting probe content, not UI text.
CHINESE_ALLOWED = {ROOT / "backend" / "chat" / "counters.py"}

_CALL_KEY = re.compile(r"""\b(?:t|both)\(\s*["']([^"'\n]+)["']""")
_TEXT_KEY = re.compile(r"""\btext_key\s*(?::\s*[\w\[\]]+\s*)?=\s*["']([^"'\n]+)["']""")
_FILE_SUFFIXES = {"json", "jsonl", "log", "py", "toml", "txt", "md", "js", "html", "css", "yaml", "yml", "lock", "pid"}
_CJK = re.compile("[\u4e00-\u9fff]")


def _fields(text: str) -> set[tuple[str, str, str]]:
    """(name, format spec, conversion) of every str.format placeholder."""
    parsed = string.Formatter().parse(text)
    return {(name, spec or "", conv or "") for _, name, spec, conv in parsed if name is not None}


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def _dotted_key(prefixes: set[str]) -> re.Pattern[str]:
    """A string literal shaped like a catalog key with a known prefix ("cause.lora_bias"), wherever it appears:
    keys handed to a helper (``_lora("cause.lora_bias")``) are checked too."""
    alternatives = "|".join(sorted(map(re.escape, prefixes)))
    return re.compile(rf"""["']((?:{alternatives})\.[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*)["']""")


def _keys_used_in_code() -> dict[str, set[str]]:
    """key -> files (relative) that name it. A prefix that is also a config section ("health": [health].probe_slow)
    is left to the t()/both() scan: its dotted literals are mostly setting names."""
    sections = {f.name for f in dataclasses.fields(Settings)}
    dotted = _dotted_key({key.split(".")[0] for key in CATALOG if "." in key} - sections)
    used: dict[str, set[str]] = {}
    for path in CODE:
        source = path.read_text(encoding="utf-8")
        keys = set(_CALL_KEY.findall(source)) | set(_TEXT_KEY.findall(source))
        keys |= {k for k in dotted.findall(source) if k.rsplit(".", 1)[-1] not in _FILE_SUFFIXES}
        for key in keys:
            used.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return used


def test_no_key_is_written_twice_in_the_catalog():
    """A dict literal keeps the last of two equal keys silently: the first text would vanish."""
    tree = ast.parse(CATALOG_FILE.read_text(encoding="utf-8"))
    literals = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "CATALOG"
    ]
    assert len(literals) == 1 and isinstance(literals[0], ast.Dict)
    keys = [k.value for k in literals[0].keys if isinstance(k, ast.Constant)]
    assert len(keys) == len(CATALOG)
    twice = sorted({k for k in keys if keys.count(k) > 1})
    assert not twice, f"written twice in backend/text.py CATALOG: {twice}"


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_every_catalog_key_has_an_english_and_a_chinese_text(key):
    entry = CATALOG[key]
    assert isinstance(entry, tuple) and len(entry) == 2, f"{key}: expected (English, Chinese), got {entry!r}"
    en, zh = entry
    assert isinstance(en, str) and en.strip(), f"{key}: English text is empty"
    assert isinstance(zh, str) and zh.strip(), f"{key}: Chinese text is empty"


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_both_languages_of_a_key_have_the_same_placeholders(key):
    en, zh = CATALOG[key]
    assert _fields(en) == _fields(zh), f"{key}: English {sorted(_fields(en))} != Chinese {sorted(_fields(zh))}"


def test_every_exception_class_names_a_text_that_is_in_the_catalog():
    classes = [QwenChatError, *_all_subclasses(QwenChatError)]
    assert any(c.__name__ == "MergeError" for c in classes)  # the walk reaches classes outside errors.py
    missing = {f"{c.__module__}.{c.__qualname__}": c.text_key for c in classes if c.text_key not in CATALOG}
    assert not missing, f"text_key not in backend/text.py CATALOG: {missing}"


def test_every_key_named_in_the_code_is_in_the_catalog():
    used = _keys_used_in_code()
    assert len(used) > 20, f"the scan found almost no keys ({sorted(used)}): has the call style changed?"
    missing = {key: sorted(files) for key, files in used.items() if key not in CATALOG}
    assert not missing, f"keys used in code but missing from backend/text.py CATALOG: {missing}"


def test_the_key_scan_catches_a_typo():
    source = 't("retyr", lang)\nboth("cause.lora_bais")\n    text_key = "error.conifg"\n_lora("cause.lora_nto_found")\n'
    dotted = _dotted_key({"cause", "error"})
    found = set(_CALL_KEY.findall(source)) | set(_TEXT_KEY.findall(source)) | set(dotted.findall(source))
    assert found == {"retyr", "cause.lora_bais", "error.conifg", "cause.lora_nto_found"}
    assert not found & set(CATALOG)


def _chinese_outside_the_catalog() -> dict[str, list[int]]:
    offenders: dict[str, list[int]] = {}
    for path in CODE:
        if path in CHINESE_ALLOWED:
            continue
        lines = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if _CJK.search(line)]
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    return offenders


def _listing(offenders: dict[str, list[int]]) -> str:
    where = "; ".join(f"{f} lines {lines}" for f, lines in sorted(offenders.items()))
    return f"Chinese text outside backend/text.py (move it into CATALOG): {where}"


def test_no_chinese_text_lives_outside_the_catalog():
    offenders = _chinese_outside_the_catalog()
    assert not offenders, _listing(offenders)

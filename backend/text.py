"""Every user-facing string, one JSON file per language in ``backend/catalog/``; one lookup.

    t("retry", "zh-CN")                                  # "重试"
    t("error.unreachable", "en-US", url=u, detail=d)     # named str.format parameters
    reason = Text("health.down_after", {"reason": Text("cause.engine_hung", {"seconds": 30}), "attempt": 3})
    reason.in_("zh-CN")                                  # made where it is shown, in the viewer's language
    str(reason)                                          # English: for logs

Files: ``backend/catalog/<language>.json`` (``en.json``, ``zh-CN.json``), each one object ``{key: text}``
with the same keys and the same ``{placeholders}``. **Adding a language is one new file** there (``fr.json``):
``pick_language`` picks it for a browser tag ``fr``/``fr-FR``; a key it lacks falls back to English. Every
``*.json`` of the folder is read once, on first use; ``use_catalog(folder)`` reads another folder instead
(tests, a deployment's own translations). ``tests/unit/test_text.py`` fails when a file lacks a key or a
placeholder differs from English.

Keys are grouped by prefix: ``error.<code>`` (one per exception class, see ``errors.py``), ``health.*`` (the
status line), ``cause.*`` (why the engine stopped, from its log), ``supervisor.*``, ``doctor.*`` (adapter
findings), and plain keys for the chat UI. Chainlit's own UI is translated in ``.chainlit/translations``.

A ``Text`` (key + parameters, parameters may be ``Text`` themselves) is what status objects, the supervisor's
status file and doctor findings carry: JSON-able (``to_json``/``from_json``), turned into words by the reader.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The product's catalog folder: one ``<language>.json`` per language.
CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
#: The language every other one is checked against, and the fallback for a tag no file matches.
DEFAULT_LANGUAGE = "en"

_lock = threading.Lock()
_folder = CATALOG_DIR
_catalog: dict[str, dict[str, str]] | None = None  # language -> key -> text, read on first use


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:  # json.loads would keep the last silently: the first text would vanish
        raise ValueError(f"key written twice: {', '.join(twice)}")
    return dict(pairs)


def load_catalog(folder: Path) -> dict[str, dict[str, str]]:
    """Every ``<language>.json`` in ``folder``: language (the file's stem) -> key -> text.

    Raises ValueError naming the file for a file that is not one object of strings, or writes a key twice."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_twice)
        except ValueError as exc:
            raise ValueError(f"catalog file {path}: {exc}; fix the file (one JSON object: key -> text)") from exc
        bad = [k for k, v in data.items() if not isinstance(v, str)] if isinstance(data, dict) else ["(not an object)"]
        if bad:
            raise ValueError(f"catalog file {path}: not text: {', '.join(bad[:5])}; every value must be a string")
        out[path.stem] = data
    if DEFAULT_LANGUAGE not in out:
        raise ValueError(f"catalog folder {folder} has no {DEFAULT_LANGUAGE}.json; every key needs English")
    return out


def catalog() -> dict[str, dict[str, str]]:
    """The catalog in use (read once): language -> key -> text."""
    global _catalog
    with _lock:
        if _catalog is None:
            _catalog = load_catalog(_folder)
        return _catalog


def use_catalog(folder: Path | None = None) -> Path:
    """Read the catalog from ``folder`` from now on (None: the product's own); returns the folder used before."""
    global _folder, _catalog
    with _lock:
        before, _folder, _catalog = _folder, Path(folder) if folder else CATALOG_DIR, None
    return before


def languages() -> list[str]:
    """The languages the catalog has ("en", "zh-CN", …), one per file."""
    return sorted(catalog())


def pick_language(tag: str | None) -> str:
    """The catalog language for a browser/Chainlit tag: the file named so ("zh-CN", any case), else one of the
    same primary language ("zh-TW", "zh" → "zh-CN"; "fr-FR" → "fr"), else English ("auto", None, "de")."""
    wanted = (tag or "").strip().replace("_", "-").split(",")[0].split(";")[0].lower()
    if not wanted:
        return DEFAULT_LANGUAGE
    langs = catalog()
    by_lower = {lang.lower(): lang for lang in langs}
    if wanted in by_lower:
        return by_lower[wanted]
    primary = wanted.split("-")[0]
    same = sorted(lang for lang in langs if lang.lower().split("-")[0] == primary)
    return same[0] if same else DEFAULT_LANGUAGE


def t(key: str, lang: str | None = DEFAULT_LANGUAGE, /, **params: Any) -> str:  # positional: ConfigError has `key`
    """The text of ``key`` in the best language for ``lang`` (English where that file lacks it), formatted with
    ``params``; a ``Text`` parameter is made in the same language. KeyError for a key no file has."""
    books = catalog()
    chosen = pick_language(lang)
    text = books[chosen].get(key) if chosen in books else None
    if text is None:
        text = books[DEFAULT_LANGUAGE][key]
    if not params:
        return text
    return text.format(**{name: _masked(_render(value, chosen)) for name, value in params.items()})


def _masked(value: Any) -> Any:
    """A parameter with the password of any URL in it masked (an OPENAI_BASE_URL with user:password@)."""
    from .logsafe import mask_credentials

    return mask_credentials(value) if isinstance(value, str) else value


def quoted(text: str) -> str:
    """``text`` as a fenced block that shows it verbatim (a fence longer than any run of backticks inside): a
    refused message quoted back, so nothing typed is lost."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _render(value: Any, lang: str) -> Any:
    return value.in_(lang) if isinstance(value, Text) else value


@dataclass(frozen=True)
class Text:
    """A text to make later, in the reader's language: a catalog key and its parameters (which may be Texts).

    ``Text.verbatim(s)`` is words that are not translated (a server's own message); ``Text.join(sep, parts)``
    joins texts with a separator (a Text or plain string); ``Text.trimmed(text, chars)`` drops trailing chars."""

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def verbatim(cls, text: str) -> Text:
        return cls("", {"text": text})

    @classmethod
    def join(cls, sep: Text | str, parts: Iterable[Text | str]) -> Text:
        return cls("", {"sep": sep, "parts": list(parts)})

    @classmethod
    def trimmed(cls, text: Text, chars: str) -> Text:
        """``text`` without the trailing ``chars`` (a sentence's full stop, when it goes inside another)."""
        return cls("", {"trim": text, "chars": chars})

    def in_(self, lang: str | None) -> str:
        """The words in the best language for ``lang``."""
        if self.key:
            return t(self.key, lang, **self.params)
        if "trim" in self.params:
            return str(_render(self.params["trim"], pick_language(lang))).rstrip(str(self.params.get("chars", "")))
        if "parts" in self.params:
            chosen = pick_language(lang)
            sep = _render(self.params.get("sep", ""), chosen)
            return str(sep).join(str(_render(p, chosen)) for p in self.params["parts"])
        return str(self.params.get("text", ""))

    def __str__(self) -> str:  # English: logs, exception messages
        return self.in_(DEFAULT_LANGUAGE)

    def __bool__(self) -> bool:
        return bool(self.key) or any(bool(self.params.get(k)) for k in ("text", "parts", "trim"))

    def map_strings(self, change: Any) -> Text:
        """The same Text with ``change(s)`` applied to every plain-string parameter (e.g. taking paths out)."""
        return Text(self.key, {k: _map_strings(v, change) for k, v in self.params.items()})

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "params": {k: _to_json(v) for k, v in self.params.items()}}

    @classmethod
    def from_json(cls, data: Any) -> Text | None:
        """A Text from ``to_json``'s object; None when ``data`` is not one (a file written by someone else)."""
        if not (isinstance(data, dict) and isinstance(data.get("key"), str) and isinstance(data.get("params"), dict)):
            return None
        return cls(data["key"], {str(k): _from_json(v) for k, v in data["params"].items()})


def _map_strings(value: Any, change: Any) -> Any:
    if isinstance(value, Text):
        return value.map_strings(change)
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    return change(value) if isinstance(value, str) else value


def _to_json(value: Any) -> Any:
    if isinstance(value, Text):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        found = Text.from_json(value)
        return value if found is None else found
    return value

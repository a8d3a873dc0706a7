"""backend.text: the catalog (one JSON file per language in backend/catalog/) is complete, consistent and the
only place user-facing strings live; a new language is one new file."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import string
from pathlib import Path

import pytest

import backend.tools.merge  # noqa: F401  (MergeError subclasses QwenChatError outside errors.py)
from backend import text
from backend.errors import QwenChatError
from backend.settings import Settings
from backend.text import CATALOG_DIR, Text, catalog, load_catalog, pick_language, t, use_catalog

ROOT = Path(__file__).resolve().parents[2]
CATALOG_FILES = sorted(CATALOG_DIR.glob("*.json"))
ENGLISH = catalog()["en"]
LANGUAGES = sorted(catalog())
# Where code may name catalog keys: the backend and the Chainlit app.
CODE = sorted((ROOT / "backend").rglob("*.py")) + [ROOT / "app.py"]
# Besides the catalog, Chinese is allowed only in counters.py (token-counting probe content, not UI text) and in
# text.py's docstring (an example of a lookup).
CHINESE_ALLOWED = {ROOT / "backend" / "chat" / "counters.py", ROOT / "backend" / "text.py"}
# A third language, only a few keys of it: the rest falls back to English.
FRENCH = Path(__file__).parent / "data" / "catalog" / "fr.json"

_CALL_KEY = re.compile(r"""\b(?:t|Text)\(\s*["']([^"'\n]+)["']""")
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
    fields = getattr(Settings, "model_fields", None)  # pydantic, or a dataclass
    sections = set(fields) if fields is not None else {f.name for f in dataclasses.fields(Settings)}
    dotted = _dotted_key({key.split(".")[0] for key in ENGLISH if "." in key} - sections)
    used: dict[str, set[str]] = {}
    for path in CODE:
        source = path.read_text(encoding="utf-8")
        keys = set(_CALL_KEY.findall(source)) | set(_TEXT_KEY.findall(source))
        keys |= {k for k in dotted.findall(source) if k.rsplit(".", 1)[-1] not in _FILE_SUFFIXES}
        for key in keys:
            used.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return used


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.name)
def test_no_key_is_written_twice_in_a_catalog_file(path):
    """json.loads keeps the last of two equal keys silently: the first text would vanish."""
    pairs = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=lambda kv: kv)
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    assert not twice, f"written twice in {path.name}: {twice}"


def test_the_loader_refuses_a_key_written_twice(tmp_path):
    (tmp_path / "en.json").write_text('{"retry": "Retry", "retry": "Again"}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"en\.json.*key written twice: retry"):
        load_catalog(tmp_path)


def test_the_product_has_english_and_chinese():
    assert {"en", "zh-CN"} <= set(LANGUAGES) and len(ENGLISH) > 250


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_language_has_every_key_and_no_other(lang):
    book = catalog()[lang]
    missing, extra = sorted(ENGLISH.keys() - book.keys()), sorted(book.keys() - ENGLISH.keys())
    assert not missing and not extra, f"{lang}.json: missing {missing}, not in en.json {extra}"
    empty = sorted(k for k, v in book.items() if not v.strip())
    assert not empty, f"{lang}.json: empty texts {empty}"


@pytest.mark.parametrize("lang", [lang for lang in LANGUAGES if lang != "en"])
def test_every_language_has_the_placeholders_of_english(lang):
    book = catalog()[lang]
    differ = {k: (sorted(_fields(ENGLISH[k])), sorted(_fields(v))) for k, v in book.items() if k in ENGLISH}
    differ = {k: pair for k, pair in differ.items() if pair[0] != pair[1]}
    assert not differ, f"{lang}.json placeholders differ from en.json (English, {lang}): {differ}"


def test_every_exception_class_names_a_text_that_is_in_the_catalog():
    classes = [QwenChatError, *_all_subclasses(QwenChatError)]
    assert any(c.__name__ == "MergeError" for c in classes)  # the walk reaches classes outside errors.py
    missing = {f"{c.__module__}.{c.__qualname__}": c.text_key for c in classes if c.text_key not in ENGLISH}
    assert not missing, f"text_key not in backend/catalog/en.json: {missing}"


def test_every_key_named_in_the_code_is_in_the_catalog():
    used = _keys_used_in_code()
    assert len(used) > 20, f"the scan found almost no keys ({sorted(used)}): has the call style changed?"
    missing = {key: sorted(files) for key, files in used.items() if key not in ENGLISH}
    assert not missing, f"keys used in code but missing from backend/catalog/en.json: {missing}"


def test_the_key_scan_catches_a_typo():
    source = 't("retyr", lang)\nText("cause.lora_bais")\n    text_key = "error.conifg"\n_lora("cause.lora_nto_found")\n'
    dotted = _dotted_key({"cause", "error"})
    found = set(_CALL_KEY.findall(source)) | set(_TEXT_KEY.findall(source)) | set(dotted.findall(source))
    assert found == {"retyr", "cause.lora_bais", "error.conifg", "cause.lora_nto_found"}
    assert not found & set(ENGLISH)


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
    return f"Chinese text outside the catalog (move it into backend/catalog/*.json): {where}"


def test_no_chinese_text_lives_outside_the_catalog():
    offenders = _chinese_outside_the_catalog()
    assert not offenders, _listing(offenders)


# ---------------------------------------------------------------- the Chinese file reads as Chinese

# Two or more English words in a row, outside {placeholders}, `code`, [section] key names and /commands: prose that
# was left untranslated ("finish reason", "bearer token"). Single words (LoRA, GiB, config.json) are names.
_ENGLISH_PHRASE = re.compile(r"(?<![\w/.\-\[`'])[a-z]{2,}(?: [a-z]{2,})+(?![\w/.\-\]`'])")
_NOT_PROSE = [r"\{[^}]*\}", r"`[^`]*`", r"\[[a-z_]+\][ .]?[a-z_]+", r"/\w+(?: [\w\[\]|]+)*", r"python -m \S+"]
_CJK_GAP = re.compile(
    "[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef] +[\u4e00-\u9fff]|[\u4e00-\u9fff] +[\u3000-\u303f\uff00-\uffef]"
)


def _prose(text: str) -> str:
    for pattern in _NOT_PROSE:
        text = re.sub(pattern, "", text)
    return text


def test_no_english_phrase_is_left_inside_a_chinese_text():
    left = {k: _ENGLISH_PHRASE.findall(_prose(v)) for k, v in catalog()["zh-CN"].items()}
    left = {k: found for k, found in left.items() if found}
    assert not left, f"English left in zh-CN.json: {left}"


def test_the_english_phrase_check_can_fail():
    assert _ENGLISH_PHRASE.findall(_prose("服务器没有说明（无 finish reason）；请检查 `a b` 和 [login] enable")) == [
        "finish reason"
    ]


def test_no_space_between_two_chinese_words():
    gaps = {k: v for k, v in catalog()["zh-CN"].items() if _CJK_GAP.search(v)}
    assert not gaps, f"a space between Chinese characters in zh-CN.json: {gaps}"
    assert _CJK_GAP.search("引擎端口 已被占用")


@pytest.mark.parametrize(
    "what", [None, Text("error.timeout.tokenize"), Text("error.timeout.loading", {"name": "pirate"})], ids=str
)
def test_a_timeout_names_what_it_waited_for_in_the_readers_language(what):
    from backend.errors import RequestTimeout

    zh = RequestTimeout(5.0, "[client].first_token_timeout", what).user_text("zh-CN")
    assert not re.search(r"[A-Za-z]{3,} [a-z]{3,}", _prose(zh)), zh  # "the model server", "loading adapter"


# ---------------------------------------------------------------- languages


@pytest.mark.parametrize(
    "tag,lang",
    [
        ("zh-CN", "zh-CN"),
        ("zh-cn", "zh-CN"),
        ("zh-TW", "zh-CN"),
        ("zh", "zh-CN"),
        ("zh_CN", "zh-CN"),
        ("en-US", "en"),
        ("en", "en"),
        ("fr-FR", "en"),  # no French file in the product
        ("auto", "en"),
        ("", "en"),
        (None, "en"),
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh-CN"),  # an Accept-Language header: its first tag
    ],
)
def test_a_browser_tag_picks_the_best_catalog_file(tag, lang):
    assert pick_language(tag) == lang


def test_a_text_is_made_in_the_readers_language_with_its_nested_texts():
    reason = Text("health.down_after", {"reason": Text("supervisor.exited", {"rc": 3}), "attempt": 2})
    assert reason.in_("zh-CN") == t(
        "health.down_after", "zh-CN", reason=t("supervisor.exited", "zh-CN", rc=3), attempt=2
    )
    assert str(reason) == "the engine exited with code 3; it is down after 2 attempts"
    assert Text.from_json(json.loads(json.dumps(reason.to_json()))) == reason  # the status file's round trip
    assert Text.from_json({"reason": "old text"}) is None


@pytest.fixture
def with_french(tmp_path):
    """The product's catalog folder plus tests/unit/data/catalog/fr.json, in use for the test."""
    for path in CATALOG_FILES:
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(FRENCH, tmp_path / "fr.json")
    before = use_catalog(tmp_path)
    yield tmp_path
    use_catalog(before)


def test_a_third_language_is_one_new_file(with_french):
    assert text.languages() == ["en", "fr", "zh-CN"]
    assert pick_language("fr-FR") == "fr" and pick_language("fr") == "fr" and pick_language("zh-CN") == "zh-CN"
    assert t("retry", "fr-FR") == "Réessayer"
    assert t("model", "fr-FR") == t("model", "en")  # a key the file lacks: English
    reason = Text("health.down_after", {"reason": Text("supervisor.exited", {"rc": 3}), "attempt": 2})
    assert reason.in_("fr-FR") == "le moteur s'est arrêté avec le code 3 ; arrêté après 2 tentatives"


def test_a_third_language_can_be_forced_by_ui_language(with_french, tmp_path):
    """[ui] language takes every language the catalog has, the new file's too (and still refuses others)."""
    from backend.errors import ConfigError
    from backend.settings import load_settings

    config = tmp_path / "config.toml"
    config.write_text('[ui]\nlanguage = "fr"\n')
    assert load_settings(config, env={}).ui.language == "fr"
    config.write_text('[ui]\nlanguage = "de"\n')
    with pytest.raises(ConfigError, match="en, fr, zh-CN"):
        load_settings(config, env={})


def test_a_third_language_reaches_the_status_line_and_the_model_picker(with_french):
    """A browser in French (fr-FR) gets the status line's words and the picker's labels from fr.json."""
    from backend.chat.health import HealthStatus, ModelEntry
    from backend.chat.service import Service, model_options
    from backend.settings import Settings

    class Poller:
        status = HealthStatus(reason=Text("health.ready"), models=(ModelEntry("base"),), base_model="base")

    service = Service(Settings())  # [ui].language "auto": the browser decides
    service._poller = Poller()  # type: ignore[assignment]
    line = service.status_json("fr-FR")
    assert (line["lang"], line["label"], line["offline_label"]) == ("fr", "démarrage", "interface hors ligne")
    assert line["reason"] == "le modèle est prêt"
    assert service.status_json("de-DE")["label"] == t("status.starting", "en")  # no German file: English
    [label] = model_options(Poller.status, [], "fr-FR")
    assert "modèle de base" in label


def test_the_catalog_in_use_comes_back_after_the_fixture():
    assert pick_language("fr-FR") == "en" and "fr" not in text.languages()

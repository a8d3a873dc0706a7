"""backend/storage/preferences.py: settings remembered per signed-in user or per browser cookie."""

from __future__ import annotations

import json
import sqlite3

import pytest

from backend.settings import HistorySettings, LoggingSettings, LoginSettings, Settings
from backend.storage import preferences

# ---------------------------------------------------------------- remembered settings


@pytest.mark.parametrize(
    "user,cookie,key",
    [
        ("admin", "qwenchat_browser=abcdef0123456789", "user:admin"),
        (None, "other=1; qwenchat_browser=abcdef0123456789", "browser:abcdef0123456789"),
        (None, "qwenchat_browser=../../etc", None),
        (None, "qwenchat_browser=", None),
        (None, None, None),
        (None, 'broken="', None),
    ],
)
def test_settings_are_remembered_per_user_when_signed_in_else_per_browser_cookie(user, cookie, key):
    assert preferences.preference_key(user, cookie) == key


def test_preferences_survive_a_new_instance_and_forget_the_oldest(tmp_path, monkeypatch):
    path = tmp_path / "prefs.sqlite3"
    prefs = preferences.Preferences(path)
    prefs.set("browser:a", {"model": "pirate"})
    prefs.set(None, {"model": "ignored"})
    assert preferences.Preferences(path).get("browser:a") == {"model": "pirate"}
    assert preferences.Preferences(path).get("browser:b") == {} and prefs.get(None) == {}
    monkeypatch.setattr(preferences, "MAX_PREFS", 3)
    for name in "bcd":
        prefs.set(f"browser:{name}", {"model": name})
    assert prefs.get("browser:a") == {} and prefs.get("browser:d") == {"model": "d"}
    assert prefs.keys() == ["browser:b", "browser:c", "browser:d"]
    prefs.set("browser:b", {"model": "b2"})  # changed: the newest now
    prefs.set("browser:e", {"model": "e"})
    assert prefs.keys() == ["browser:d", "browser:b", "browser:e"]


def test_each_key_is_one_row_in_sqlite_and_a_write_touches_only_its_row(tmp_path):
    path = tmp_path / "prefs.sqlite3"
    prefs = preferences.Preferences(path)
    prefs.set("user:admin", {"model": "pirate", "system_prompt": "be brief"})
    prefs.set("browser:abcdef0123456789", {"model": "base"})
    prefs.set("user:admin", {"model": "base", "system_prompt": "be brief"})
    with sqlite3.connect(path) as db:
        rows = dict(db.execute("SELECT key, state FROM preferences").fetchall())
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert set(rows) == {"user:admin", "browser:abcdef0123456789"}
    assert json.loads(rows["user:admin"]) == {"model": "base", "system_prompt": "be brief"}
    with sqlite3.connect(path) as db:
        db.execute("UPDATE preferences SET state = '{not json' WHERE key = 'user:admin'")
    assert prefs.get("user:admin") == {}  # a broken row means nothing remembered, not a crash
    assert prefs.get("browser:abcdef0123456789") == {"model": "base"}  # the others are untouched


def test_a_lone_surrogate_in_a_setting_does_not_make_the_write_fail(tmp_path):
    prefs = preferences.Preferences(tmp_path / "prefs.sqlite3")
    prefs.set("browser:a", {"system_prompt": "be \ud800 brief"})
    assert prefs.get("browser:a") == {"system_prompt": "be \ufffd brief"}


def test_a_system_prompt_past_the_limit_is_refused_with_the_limit_and_the_stored_one_kept(tmp_path):
    prefs = preferences.Preferences(tmp_path / "prefs.sqlite3")
    prefs.set("user:admin", {"system_prompt": "be brief"})
    limit = preferences.MAX_SYSTEM_PROMPT_BYTES
    preferences.check_system_prompt("x" * limit)  # at the limit: fine
    huge = "x" * (5 * 1024 * 1024)
    with pytest.raises(preferences.SystemPromptRefused) as refused:
        prefs.set("user:admin", {"system_prompt": huge})
    assert refused.value.size == len(huge) and refused.value.limit == limit
    text = refused.value.user_text("en")
    assert (
        f"{len(huge):,} bytes" in text
        and f"limit is {limit:,} bytes" in text
        and "previous system prompt is kept" in text
    )
    assert f"{limit:,}" in refused.value.user_text("zh")
    assert prefs.get("user:admin") == {"system_prompt": "be brief"}
    with pytest.raises(preferences.SystemPromptRefused):  # counted in UTF-8 bytes, not characters
        preferences.check_system_prompt("中" * (limit // 3 + 1))


def test_an_old_json_file_is_imported_once_then_renamed(tmp_path):
    settings = Settings(logging=LoggingSettings(dir=str(tmp_path / "logs")))
    legacy = tmp_path / "logs" / preferences.LEGACY_PREFS_FILE
    legacy.parent.mkdir()
    too_big = "x" * (preferences.MAX_SYSTEM_PROMPT_BYTES + 1)
    legacy.write_text(
        json.dumps(
            {
                "browser:old": {"model": "base"},
                "user:admin": {"model": "pirate", "system_prompt": too_big, "sampling": {"temperature": 0.7}},
                "browser:broken": "not a dict",
            }
        )
    )
    prefs = preferences.open_preferences(settings)
    assert prefs.path == tmp_path / "logs" / preferences.PREFS_DB
    assert prefs.get("browser:old") == {"model": "base"}
    assert prefs.get("user:admin") == {
        "model": "pirate",
        "sampling": {"temperature": 0.7},
    }  # the prompt past the cap dropped
    assert prefs.keys() == ["browser:old", "user:admin"]  # the file's order (its recency) kept
    assert not legacy.exists() and legacy.with_name(legacy.name + ".migrated").exists()
    prefs.set("browser:old", {"model": "pirate"})
    legacy.write_text(json.dumps({"browser:old": {"model": "stale"}}))  # a second file: a key in the DB wins
    assert preferences.open_preferences(settings).get("browser:old") == {"model": "pirate"}


def test_the_preferences_live_next_to_the_history_with_login_else_in_the_log_folder(tmp_path):
    logs = LoggingSettings(dir=str(tmp_path / "logs"))
    assert preferences.db_path(Settings(logging=logs)) == tmp_path / "logs" / preferences.PREFS_DB
    with_login = Settings(
        logging=logs,
        login=LoginSettings(enable=True, password="pw"),
        history=HistorySettings(db=str(tmp_path / "db" / "h.sqlite3")),
    )
    assert preferences.db_path(with_login) == tmp_path / "db" / preferences.PREFS_DB


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "path_type,cookie,sets",
    [
        ("text/html; charset=utf-8", None, True),
        ("text/html; charset=utf-8", "qwenchat_browser=abcdef0123456789", False),  # kept: the same browser
        ("application/javascript", None, False),  # assets load in parallel: they would race with new ids
    ],
)
async def test_the_page_sets_a_browser_cookie_only_when_missing(path_type, cookie, sets):
    async def page(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", path_type.encode())]})
        await send({"type": "http.response.body", "body": b"<html>"})

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    headers = [(b"cookie", cookie.encode())] if cookie else []
    await preferences.BrowserCookieMiddleware(page)({"type": "http", "headers": headers}, None, send)
    set_cookies = [v.decode() for k, v in sent[0]["headers"] if k == b"set-cookie"]
    assert len(set_cookies) == (1 if sets else 0) and sent[1]["body"] == b"<html>"
    if sets:
        assert preferences.preference_key(None, set_cookies[0].split(";")[0]).startswith("browser:")
        assert "HttpOnly" in set_cookies[0] and "Path=/" in set_cookies[0]

"""backend/chat/preferences.py: settings remembered per signed-in user or per browser cookie."""

from __future__ import annotations

import pytest

from backend.chat import preferences

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
    path = tmp_path / "prefs.json"
    prefs = preferences.Preferences(path)
    prefs.set("browser:a", {"model": "pirate"})
    prefs.set(None, {"model": "ignored"})
    assert preferences.Preferences(path).get("browser:a") == {"model": "pirate"}
    assert preferences.Preferences(path).get("browser:b") == {} and prefs.get(None) == {}
    monkeypatch.setattr(preferences, "MAX_PREFS", 3)
    for name in "bcd":
        prefs.set(f"browser:{name}", {"model": name})
    assert prefs.get("browser:a") == {} and prefs.get("browser:d") == {"model": "d"}
    path.write_text("{not json")
    assert prefs.get("browser:d") == {}  # a broken file means nothing remembered, not a crash


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

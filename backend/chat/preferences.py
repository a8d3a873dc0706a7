"""Remembered settings per signed-in user, or per browser (a cookie) when there is no login.

key = preference_key(user.identifier or None, cookie_header)
Preferences(path).get(key) / .set(key, state)
BrowserCookieMiddleware(asgi_app)    # the page sets the browser cookie the websocket then carries
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BROWSER_COOKIE = "qwenchat_browser"
PREFS_FILE = "ui-preferences.json"
MAX_PREFS = 500  # remembered browsers/users; the least recently changed are forgotten
# ---------------------------------------------------------------- remembered settings per user or browser


def browser_id(cookie_header: str | None) -> str | None:
    """Our browser cookie from a raw Cookie header (the websocket handshake's)."""
    if not cookie_header:
        return None
    jar = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(BROWSER_COOKIE)
    value = morsel.value if morsel else ""
    return value if value.isalnum() and 8 <= len(value) <= 64 else None


def new_browser_id() -> str:
    return secrets.token_hex(16)


def preference_key(user_identifier: str | None, cookie_header: str | None) -> str | None:
    """Signed-in users keep their choice on any browser; otherwise the browser cookie identifies."""
    if user_identifier:
        return f"user:{user_identifier}"
    bid = browser_id(cookie_header)
    return f"browser:{bid}" if bid else None


class BrowserCookieMiddleware:
    """ASGI: the HTML page sets our browser cookie when it is missing; the websocket opened by that
    page then carries it, so the session knows the browser (settings remembered without login).

    Only the page, not its assets: those load in parallel and would race to set different ids.
    A plain ASGI class, not Starlette's BaseHTTPMiddleware, which logs a traceback whenever the
    browser goes away mid-request.
    """

    def __init__(self, app: Any, max_age_days: int = 400) -> None:
        self.app = app
        self.max_age = max_age_days * 86400

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        cookie = b"; ".join(v for k, v in scope.get("headers") or [] if k == b"cookie").decode("latin-1")
        if browser_id(cookie):
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                headers = list(message.get("headers") or [])
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    value = (
                        f"{BROWSER_COOKIE}={new_browser_id()}; Max-Age={self.max_age}; Path=/; HttpOnly; SameSite=Lax"
                    )
                    message = {**message, "headers": headers + [(b"set-cookie", value.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


class Preferences:
    """Settings remembered per key in a small JSON file; a missing or broken file means none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str | None) -> dict[str, Any]:
        if not key:
            return {}
        with self._lock:
            value = self._read().get(key)
        return value if isinstance(value, dict) else {}

    def set(self, key: str | None, state: Mapping[str, Any]) -> None:
        if not key:
            return
        with self._lock:
            data = self._read()
            data.pop(key, None)
            data[key] = dict(state)  # insertion order = recency; the oldest go first
            while len(data) > MAX_PREFS:
                data.pop(next(iter(data)))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, ensure_ascii=False))
            tmp.replace(self.path)

"""Remembered settings per signed-in user, or per browser (a cookie) when there is no login.

key = preference_key(user.identifier or None, cookie_header)
prefs = open_preferences(settings)   # SQLite, one row per key; migrates an old ui-preferences.json once
prefs.get(key) / prefs.set(key, state)
check_system_prompt(text)            # raises SystemPromptRefused past MAX_SYSTEM_PROMPT_BYTES
BrowserCookieMiddleware(asgi_app)    # the page sets the browser cookie the websocket then carries
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any, ClassVar

from ..errors import QwenChatError
from ..settings import Settings
from . import history
from .client import sanitize_text

logger = logging.getLogger(__name__)

BROWSER_COOKIE = "qwenchat_browser"
PREFS_DB = "preferences.sqlite3"
LEGACY_PREFS_FILE = "ui-preferences.json"  # the whole-file JSON of earlier versions, imported once
MAX_PREFS = 500  # remembered browsers/users; the least recently changed are forgotten
MAX_SYSTEM_PROMPT_BYTES = 32 * 1024  # a system prompt (UTF-8) past this is refused, the previous one kept
BUSY_TIMEOUT_MS = 5000  # another connection writing: wait this long before "database is locked"


@contextlib.contextmanager
def sqlite_transaction(path: Path) -> Iterator[sqlite3.Connection]:
    """One transaction on the app's own SQLite file (preferences, votes): WAL, so readers never wait for a
    writer, and a busy timeout, so two writers wait instead of failing; committed, or rolled back on an error."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA journal_mode = WAL")
        with db:
            yield db
    finally:
        db.close()


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


class SystemPromptRefused(QwenChatError):
    """A system prompt past the limit (raised here, the only place that checks it; see errors.py)."""

    code: ClassVar[str] = "system_prompt_refused"
    text_key: ClassVar[str] = "error.system_prompt_refused"

    def __init__(self, size: int, limit: int = MAX_SYSTEM_PROMPT_BYTES) -> None:
        self.size, self.limit = size, limit
        super().__init__()


def check_system_prompt(text: str) -> None:
    """Refuse a system prompt past ``MAX_SYSTEM_PROMPT_BYTES`` (UTF-8): it is stored and sent with every message."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SYSTEM_PROMPT_BYTES:
        raise SystemPromptRefused(size)


def _bounded(state: Mapping[str, Any]) -> dict[str, Any]:
    """A stored state without a system prompt past the limit (written before there was one)."""
    out = dict(state)
    prompt = out.get("system_prompt")
    if isinstance(prompt, str):
        try:
            check_system_prompt(prompt)
        except SystemPromptRefused:
            del out["system_prompt"]
    return out


def db_path(settings: Settings) -> Path:
    """Next to the history database when login is on, else in ``[logging].dir``."""
    folder = history.db_path(settings).parent if settings.ui.auth else settings.logging.resolved_dir
    return folder / PREFS_DB


def open_preferences(settings: Settings) -> Preferences:
    """The preferences store for these settings, with an old ``ui-preferences.json`` imported (once)."""
    prefs = Preferences(db_path(settings))
    prefs.migrate(settings.logging.resolved_dir / LEGACY_PREFS_FILE)
    return prefs


class Preferences:
    """Settings remembered per key: one SQLite row each (WAL, busy timeout), at most ``MAX_PREFS`` rows.

    Each call opens its own connection (callers run it in a thread: ``asyncio.to_thread``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS preferences (key TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS preferences_updated ON preferences (updated)")

    def _db(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return sqlite_transaction(self.path)

    def get(self, key: str | None) -> dict[str, Any]:
        if not key:
            return {}
        with self._db() as db:
            row = db.execute("SELECT state FROM preferences WHERE key = ?", (key,)).fetchone()
        try:
            value = json.loads(row[0]) if row else None
        except ValueError:
            return {}
        return _bounded(value) if isinstance(value, dict) else {}

    def set(self, key: str | None, state: Mapping[str, Any]) -> None:
        """Remember ``state`` for ``key``; a system prompt past the limit raises ``SystemPromptRefused``."""
        if not key:
            return
        if isinstance(state.get("system_prompt"), str):
            check_system_prompt(state["system_prompt"])
        self._write({key: dict(state)})

    def _write(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        now = time.time()
        with self._db() as db:
            for i, (key, state) in enumerate(states.items()):
                # A lone surrogate typed into a field must not make the write fail: stored as U+FFFD.
                text = sanitize_text(json.dumps(state, ensure_ascii=False))
                db.execute(
                    "INSERT INTO preferences (key, state, updated) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET state = excluded.state, updated = excluded.updated",
                    (key, text, now + i * 1e-6),  # several at once (migration) keep their order
                )
            db.execute(
                "DELETE FROM preferences WHERE key NOT IN (SELECT key FROM preferences ORDER BY updated DESC LIMIT ?)",
                (MAX_PREFS,),
            )

    def keys(self) -> list[str]:
        """The remembered keys, oldest first."""
        with self._db() as db:
            return [row[0] for row in db.execute("SELECT key FROM preferences ORDER BY updated")]

    def migrate(self, legacy: Path) -> int:
        """Import ``ui-preferences.json`` (earlier versions' whole-file store) once, then rename it ``.migrated``.

        Keys already in the database win; a system prompt past the limit is left out. Returns the rows imported.
        """
        if not legacy.is_file():
            return 0
        try:
            data = json.loads(legacy.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            logger.warning("preferences: %s could not be read (%s); left as it is", legacy.name, exc)
            return 0
        have = set(self.keys())
        states = {
            k: _bounded(v)
            for k, v in (data.items() if isinstance(data, dict) else [])
            if isinstance(k, str) and isinstance(v, dict) and k not in have
        }
        self._write(states)  # the file's order is its recency: the oldest first
        legacy.replace(legacy.with_name(legacy.name + ".migrated"))
        logger.info("preferences: imported %d from %s into %s", len(states), legacy.name, self.path.name)
        return len(states)

"""Remembered settings per signed-in user, or per browser (a cookie) when there is no login.

key = preference_key(user.identifier or None, cookie_header)
prefs = open_preferences(settings)   # one row per key (SQLite, or the PostgreSQL history database: app_store);
                                     # migrates an old ui-preferences.json once
prefs.get(key) / prefs.set(key, state)
prefs.through(outbox)                # with the history on: writes journalled and retried (backend/storage/outbox.py)
await prefs.recall(key) / await prefs.remember(key, state)   # the chat's calls: never wait for a slow database
check_system_prompt(text)            # raises SystemPromptRefused past MAX_SYSTEM_PROMPT_BYTES
BrowserCookieMiddleware(asgi_app)    # the page sets the browser cookie the websocket then carries
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Column, Float, Index, MetaData, Table, Text, text
from sqlalchemy.engine import Connection

from backend.chat.sanitize import sanitize_text
from backend.errors import QwenChatError
from backend.settings import Settings
from backend.storage import database, history
from backend.storage.database import Store
from backend.storage.outbox import Outbox

logger = logging.getLogger(__name__)

BROWSER_COOKIE = "qwenchat_browser"
PREFS_DB = "preferences.sqlite3"
LEGACY_PREFS_FILE = "ui-preferences.json"  # the whole-file JSON of earlier versions, imported once
MAX_PREFS = 500  # remembered browsers/users; the least recently changed are forgotten
MAX_SYSTEM_PROMPT_BYTES = 32 * 1024  # a system prompt (UTF-8) past this is refused, the previous one kept
OUTBOX_OP = "preferences"  # the outbox's name for a remembered-settings write


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


def _lane(key: str) -> str:
    """The outbox lane of one key's writes (a chat's lane is its thread id; this cannot be one)."""
    return f"preferences:{key}"


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
    """Next to the history database when login is on, else in ``[logging].dir`` (the SQLite file; with a
    PostgreSQL history the preferences and votes are tables in that database: ``app_store``)."""
    folder = history.db_path(settings).parent if settings.login.enable else settings.logging.resolved_dir
    return folder / PREFS_DB


PREFS_TABLES = MetaData()
Table(
    "preferences",
    PREFS_TABLES,
    Column("key", Text(), primary_key=True),
    Column("state", Text(), nullable=False),
    Column("updated", Float(), nullable=False),
    Index("preferences_updated", "updated"),
)
_CHOSEN: dict[str, Store] = {}


def app_store(settings: Settings) -> Store:
    """Where preferences and votes live: the PostgreSQL history database when ``[history].db`` is one
    (and login is on), else ``db_path``'s SQLite file. A PostgreSQL database that cannot be reached at the
    first call falls back to the SQLite file, with one log line (the chat goes on)."""
    local = database.store(database.sqlite_file(db_path(settings)))
    db = history.database(settings) if settings.login.enable else None
    if db is None or not db.is_postgres:
        return local
    if db.async_url not in _CHOSEN:
        pg = database.store(db)
        try:
            database.ensure_tables(pg, PREFS_TABLES, "preferences", 1)
            _CHOSEN[db.async_url] = pg
        except Exception as exc:  # noqa: BLE001 - unreachable, wrong password …: remembered locally instead
            logger.error(
                "preferences: history.db = %s: %s; settings and votes are kept in %s instead",
                db.safe,
                database.failure(exc),
                PREFS_DB,
            )
            _CHOSEN[db.async_url] = local
    return _CHOSEN[db.async_url]


def open_preferences(settings: Settings) -> Preferences:
    """The preferences store for these settings, with an old ``ui-preferences.json`` imported (once)."""
    prefs = Preferences(app_store(settings))
    prefs.migrate(settings.logging.resolved_dir / LEGACY_PREFS_FILE)
    return prefs


class Preferences:
    """Settings remembered per key: one row each, at most ``MAX_PREFS`` rows; SQLite (WAL, busy timeout) or
    PostgreSQL (``database.Store``). Each call is one transaction (callers run it in ``asyncio.to_thread``).
    Reads that fail (the database went away) are logged and give no preferences; the chat goes on.
    """

    def __init__(self, where: Path | Store) -> None:
        self.store = database.store_at(where)
        self.path = self.store.db.path  # None on PostgreSQL
        self.outbox: Outbox | None = None
        database.ensure_tables(self.store, PREFS_TABLES, "preferences", 1)

    def through(self, outbox: Outbox) -> None:
        """From now on ``remember`` writes through the history's outbox: journalled, retried, in order per key."""
        self.outbox = outbox

        async def write(args: dict[str, Any]) -> None:
            await asyncio.to_thread(self.set, args["key"], args["state"])

        outbox.register(OUTBOX_OP, write)

    async def remember(self, key: str | None, state: Mapping[str, Any]) -> None:
        """``set`` without waiting for the database when there is an outbox (a slow or locked one must not hold up
        the turn that changed a setting); a system prompt past the limit still raises here, before anything is
        queued."""
        if not key:
            return
        if self.outbox is None:
            await asyncio.to_thread(self.set, key, state)
            return
        if isinstance(state.get("system_prompt"), str):
            check_system_prompt(state["system_prompt"])
        self.outbox.submit(_lane(key), OUTBOX_OP, {"key": key, "state": dict(state)})

    async def recall(self, key: str | None) -> dict[str, Any]:
        """``get``, where a write still waiting in the outbox wins over what the database holds."""
        waiting = self.outbox.pending(_lane(key)) if self.outbox is not None and key else []
        if waiting:
            return _bounded(dict(waiting[-1].args["state"]))
        return await asyncio.to_thread(self.get, key)

    def get(self, key: str | None) -> dict[str, Any]:
        if not key:
            return {}
        try:
            row = self.store.run(
                lambda c: c.execute(text("SELECT state FROM preferences WHERE key = :k"), {"k": key}).first()
            )
        except Exception as exc:  # noqa: BLE001 - a database gone away: no remembered settings this time
            logger.warning("preferences: could not be read (%s)", database.failure(exc))
            return {}
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

        def write(db: Connection) -> None:
            for i, (key, state) in enumerate(states.items()):
                # A lone surrogate typed into a field must not make the write fail: stored as U+FFFD.
                state_text = sanitize_text(json.dumps(state, ensure_ascii=False))
                db.execute(
                    text(
                        "INSERT INTO preferences (key, state, updated) VALUES (:k, :s, :u) "
                        "ON CONFLICT (key) DO UPDATE SET state = excluded.state, updated = excluded.updated"
                    ),
                    {"k": key, "s": state_text, "u": now + i * 1e-6},  # several at once (migration) keep their order
                )
            db.execute(
                text(
                    "DELETE FROM preferences WHERE key NOT IN "
                    "(SELECT key FROM preferences ORDER BY updated DESC LIMIT :n)"
                ),
                {"n": MAX_PREFS},
            )

        self.store.run(write)

    def keys(self) -> list[str]:
        """The remembered keys, oldest first."""
        rows = self.store.run(lambda c: c.execute(text("SELECT key FROM preferences ORDER BY updated")).all())
        return [row[0] for row in rows]

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
        logger.info("preferences: imported %d from %s into %s", len(states), legacy.name, self.store.db.safe)
        return len(states)

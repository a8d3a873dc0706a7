"""Chat history and remembered settings, without Chainlit.

- ``[ui].auth = true``: password login (``check_password``) and chat history in a SQLite file
  (``db_path``) read and written by Chainlit's own ``SQLAlchemyDataLayer``. Chainlit creates no
  tables and its documented DDL lacks ``steps."autoCollapse"`` (Chainlit 2.12 writes it), so
  ``ensure_schema`` creates them, and adds missing columns to an older file.
- Every answer step carries ``metadata["qwenchat"]`` = the raw answer text and the model that
  produced it; the shown text has a footer appended (``service.footer``) that must never go
  back to the model. ``conversation_from_thread`` rebuilds the ``Conversation`` from those steps.
- The chosen model and sampling are remembered per signed-in user, or per browser (a cookie)
  when there is no login (``Preferences``), so they survive a page reload either way.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import sqlite3
import threading
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any, Mapping

from .chat import Conversation
from .settings import Settings

logger = logging.getLogger(__name__)

META_KEY = "qwenchat"  # our key inside Chainlit's step and thread metadata
BROWSER_COOKIE = "qwenchat_browser"
COMMANDS = ("adapters", "unload")  # composer commands (app.py): talk to the app, never to the model
SECRET_FILE = "chainlit-auth-secret"
PREFS_FILE = "ui-preferences.json"
MAX_PREFS = 500  # remembered browsers/users; the least recently changed are forgotten

# Columns Chainlit 2.12's SQLAlchemyDataLayer reads and writes (chainlit/data/sql_alchemy.py: the keys
# of Step.to_dict / Message.to_dict / Element.to_dict / Feedback, and the SELECTs). All nullable but
# the keys: a NOT NULL Chainlit does not always fill would make its INSERT fail, and it only logs that.
SCHEMA: dict[str, list[tuple[str, str]]] = {
    "users": [("id", "TEXT PRIMARY KEY"), ("identifier", "TEXT NOT NULL UNIQUE"), ("metadata", "TEXT"),
              ("createdAt", "TEXT")],
    "threads": [("id", "TEXT PRIMARY KEY"), ("createdAt", "TEXT"), ("name", "TEXT"),
                ("userId", "TEXT REFERENCES users(id) ON DELETE CASCADE"), ("userIdentifier", "TEXT"),
                ("tags", "TEXT"), ("metadata", "TEXT")],
    "steps": [("id", "TEXT PRIMARY KEY"), ("name", "TEXT"), ("type", "TEXT"),
              ("threadId", "TEXT REFERENCES threads(id) ON DELETE CASCADE"), ("parentId", "TEXT"),
              ("streaming", "BOOLEAN"), ("waitForAnswer", "BOOLEAN"), ("isError", "BOOLEAN"), ("metadata", "TEXT"),
              ("tags", "TEXT"), ("input", "TEXT"), ("output", "TEXT"), ("createdAt", "TEXT"), ("command", "TEXT"),
              ("modes", "TEXT"), ("start", "TEXT"), ("end", "TEXT"), ("generation", "TEXT"), ("showInput", "TEXT"),
              ("language", "TEXT"), ("indent", "INTEGER"), ("defaultOpen", "BOOLEAN"), ("autoCollapse", "BOOLEAN")],
    "elements": [("id", "TEXT PRIMARY KEY"), ("threadId", "TEXT REFERENCES threads(id) ON DELETE CASCADE"),
                 ("type", "TEXT"), ("url", "TEXT"), ("chainlitKey", "TEXT"), ("name", "TEXT"), ("display", "TEXT"),
                 ("objectKey", "TEXT"), ("size", "TEXT"), ("page", "INTEGER"), ("language", "TEXT"),
                 ("forId", "TEXT"), ("mime", "TEXT"), ("props", "TEXT"), ("autoPlay", "BOOLEAN"),
                 ("playerConfig", "TEXT")],
    "feedbacks": [("id", "TEXT PRIMARY KEY"), ("forId", "TEXT NOT NULL"), ("threadId", "TEXT"),
                  ("value", "INTEGER NOT NULL"), ("comment", "TEXT")],
}


def _adapt_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# Chainlit binds step "tags" (a list) and message "modes" (a dict) as they are; SQLite cannot store
# either and SQLAlchemyDataLayer only logs the failed INSERT, losing the message. Store them as JSON.
sqlite3.register_adapter(dict, _adapt_json)
sqlite3.register_adapter(list, _adapt_json)


# ---------------------------------------------------------------- database and login


def db_path(settings: Settings) -> Path:
    """``[ui].history_db``, or ``history.sqlite3`` in ``[logging].dir``."""
    if settings.ui.history_db:
        return Path(settings.ui.history_db).expanduser().resolve()
    return settings.logging.resolved_dir / "history.sqlite3"


def database_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def ensure_schema(path: Path) -> None:
    """Create the tables Chainlit's SQLAlchemyDataLayer uses; add columns an older file lacks. Idempotent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        for table, columns in SCHEMA.items():
            cols = ", ".join(f'"{name}" {decl}' for name, decl in columns)
            db.execute(f'CREATE TABLE IF NOT EXISTS "{table}" ({cols})')
            have = {row[1] for row in db.execute(f'PRAGMA table_info("{table}")')}
            for name, decl in columns:
                if name not in have:  # e.g. a file made from Chainlit's docs: no "autoCollapse"
                    plain = decl.replace("PRIMARY KEY", "").replace("NOT NULL", "").replace("UNIQUE", "")
                    plain = plain.split(" REFERENCES")[0].strip()
                    db.execute(f'ALTER TABLE "{table}" ADD COLUMN "{name}" {plain}')
                    logger.info("history: added column %s.%s to %s", table, name, path)
        db.execute('CREATE INDEX IF NOT EXISTS steps_thread ON steps ("threadId")')
        db.execute('CREATE INDEX IF NOT EXISTS threads_user ON threads ("userId")')


def auth_secret(folder: Path, env: Mapping[str, str] = os.environ) -> str:
    """CHAINLIT_AUTH_SECRET, or one generated once and kept in ``folder`` so logins survive restarts."""
    if env.get("CHAINLIT_AUTH_SECRET"):
        return env["CHAINLIT_AUTH_SECRET"]
    path = folder / SECRET_FILE
    try:
        secret = path.read_text().strip()
        if secret:
            return secret
    except FileNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def prepare(settings: Settings, env: dict[str, str] | os._Environ = os.environ) -> str | None:
    """At app start: with ``[ui].auth``, the tables and the login secret; returns the database URL.

    Chainlit reads CHAINLIT_AUTH_SECRET from the environment lazily (after importing app.py), so
    setting it here, in the UI process, is enough.
    """
    if not settings.ui.auth:
        return None
    path = db_path(settings)
    ensure_schema(path)
    env["CHAINLIT_AUTH_SECRET"] = auth_secret(path.parent, env)
    logger.info("history: login on for %r, chats kept in %s", settings.ui.username, path)
    return database_url(path)


def check_password(settings: Settings, username: str, password: str) -> bool:
    """Constant-time check against ``[ui].username`` / ``[ui].password`` (or QWENCHAT_UI_PASSWORD)."""
    ui = settings.ui
    if not ui.auth or not ui.password:
        return False
    user_ok = hmac.compare_digest(username.encode("utf-8", "surrogatepass"), ui.username.encode())
    pass_ok = hmac.compare_digest(password.encode("utf-8", "surrogatepass"), ui.password.encode())
    return user_ok and pass_ok


# ---------------------------------------------------------------- rebuilding a chat from its thread


def answer_metadata(raw: str, model: str, *, interrupted: bool = False) -> dict[str, Any]:
    """Step metadata of an answer: what the model said (no footer) and which model said it."""
    return {META_KEY: {"raw": raw, "model": model, "interrupted": interrupted}}


def command_metadata(command: str) -> dict[str, Any]:
    """Metadata marking a user message as a composer command (Chainlit's data layer drops the
    step's own "command" column when it reads a thread back)."""
    return {META_KEY: {"command": command}}


def _json_dict(value: Any) -> dict[str, Any]:
    """Chainlit hands metadata back as a JSON string on SQLite, a dict elsewhere."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def conversation_from_thread(thread: Mapping[str, Any]) -> Conversation:
    """The model-facing history of a stored thread: user messages and our answers' raw text.

    Composer commands and their replies, error bubbles, Chainlit's own notes ("Task manually
    stopped.") and tool steps are left out. Two answers in a row (a cut answer, then its Retry)
    keep the last, as the live chat does.
    """
    conv = Conversation()
    for step in thread.get("steps") or []:  # answers have a parent (Chainlit's on_message run step)
        ours = _json_dict(step.get("metadata")).get(META_KEY)
        command = step.get("command") or (ours.get("command") if isinstance(ours, dict) else None)
        if command in COMMANDS:  # "/unload pirate" is stored as the user message "pirate"
            continue
        if step.get("type") == "user_message":
            conv.add_user(str(step["id"]), step.get("output") or "")
            continue
        if step.get("type") != "assistant_message" or not isinstance(ours, dict) or "raw" not in ours:
            continue
        if conv.turns and conv.turns[-1].role == "assistant":
            conv.turns.pop()
        conv.add_assistant(str(step["id"]), str(ours["raw"]), str(ours.get("model") or ""),
                           interrupted=bool(ours.get("interrupted")))
    return conv


def chat_state(model: str, sampling: Mapping[str, float], system_prompt: str) -> dict[str, Any]:
    """What the settings panel holds, as stored in thread metadata and preferences."""
    return {"model": model, "sampling": dict(sampling), "system_prompt": system_prompt}


def state_from_thread(thread: Mapping[str, Any], conv: Conversation | None = None) -> dict[str, Any]:
    """The settings a stored thread was last used with; the last answer's model when none were saved."""
    meta = _json_dict(thread.get("metadata"))
    state = meta.get(META_KEY) if isinstance(meta.get(META_KEY), dict) else {}
    out: dict[str, Any] = {}
    model = state.get("model") or meta.get("model")
    if not model and conv is not None:
        model = next((t.model for t in reversed(conv.turns) if t.role == "assistant" and t.model), "")
    if model:
        out["model"] = str(model)
    sampling = state.get("sampling") or meta.get("sampling")
    if isinstance(sampling, dict):
        out["sampling"] = sampling
    system_prompt = state.get("system_prompt", meta.get("system_prompt"))
    if isinstance(system_prompt, str):
        out["system_prompt"] = system_prompt
    return out


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

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        cookie = b"; ".join(v for k, v in scope.get("headers") or [] if k == b"cookie").decode("latin-1")
        if browser_id(cookie):
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict) -> None:
            if message.get("type") == "http.response.start":
                headers = list(message.get("headers") or [])
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    value = f"{BROWSER_COOKIE}={new_browser_id()}; Max-Age={self.max_age}; Path=/; HttpOnly; SameSite=Lax"
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

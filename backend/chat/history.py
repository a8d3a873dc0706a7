"""Chat history in Chainlit's data layer: the schema, and turning a stored thread back into a chat.

- ``[ui].auth = true``: password login (``login.py``) and chat history in a SQLite file
  (``db_path``) read and written by Chainlit's own ``SQLAlchemyDataLayer``. Chainlit creates no
  tables and its documented DDL lacks ``steps."autoCollapse"`` (Chainlit 2.12 writes it), so
  ``ensure_schema`` creates them, and adds missing columns to an older file.
- Every answer step carries ``metadata["qwenchat"]`` = the raw answer text and the model that
  produced it; the shown text has a footer appended (``service.footer``) that must never go
  back to the model. ``conversation_from_thread`` rebuilds the ``Conversation`` from those steps.
- The chat's settings (model, sampling, system prompt) are stored with its thread, so a resumed chat
  reopens with them (``chat_state``, ``state_from_thread``); ``preferences.py`` remembers them per
  user or browser across chats.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ..settings import Settings
from .conversation import Conversation
from .login import accounts_fingerprint, auth_secret, session_secret

logger = logging.getLogger(__name__)

META_KEY = "qwenchat"  # our key inside Chainlit's step and thread metadata
# Composer commands (app.py): talk to the app, never to the model.
COMMANDS = ("adapters", "unload", "export", "compare", "leaderboard", "vote")

# Columns Chainlit 2.12's SQLAlchemyDataLayer reads and writes (chainlit/data/sql_alchemy.py: the keys
# of Step.to_dict / Message.to_dict / Element.to_dict / Feedback, and the SELECTs). All nullable but
# the keys: a NOT NULL Chainlit does not always fill would make its INSERT fail, and it only logs that.
SCHEMA: dict[str, list[tuple[str, str]]] = {
    "users": [
        ("id", "TEXT PRIMARY KEY"),
        ("identifier", "TEXT NOT NULL UNIQUE"),
        ("metadata", "TEXT"),
        ("createdAt", "TEXT"),
    ],
    "threads": [
        ("id", "TEXT PRIMARY KEY"),
        ("createdAt", "TEXT"),
        ("name", "TEXT"),
        ("userId", "TEXT REFERENCES users(id) ON DELETE CASCADE"),
        ("userIdentifier", "TEXT"),
        ("tags", "TEXT"),
        ("metadata", "TEXT"),
    ],
    "steps": [
        ("id", "TEXT PRIMARY KEY"),
        ("name", "TEXT"),
        ("type", "TEXT"),
        ("threadId", "TEXT REFERENCES threads(id) ON DELETE CASCADE"),
        ("parentId", "TEXT"),
        ("streaming", "BOOLEAN"),
        ("waitForAnswer", "BOOLEAN"),
        ("isError", "BOOLEAN"),
        ("metadata", "TEXT"),
        ("tags", "TEXT"),
        ("input", "TEXT"),
        ("output", "TEXT"),
        ("createdAt", "TEXT"),
        ("command", "TEXT"),
        ("modes", "TEXT"),
        ("start", "TEXT"),
        ("end", "TEXT"),
        ("generation", "TEXT"),
        ("showInput", "TEXT"),
        ("language", "TEXT"),
        ("indent", "INTEGER"),
        ("defaultOpen", "BOOLEAN"),
        ("autoCollapse", "BOOLEAN"),
    ],
    "elements": [
        ("id", "TEXT PRIMARY KEY"),
        ("threadId", "TEXT REFERENCES threads(id) ON DELETE CASCADE"),
        ("type", "TEXT"),
        ("url", "TEXT"),
        ("chainlitKey", "TEXT"),
        ("name", "TEXT"),
        ("display", "TEXT"),
        ("objectKey", "TEXT"),
        ("size", "TEXT"),
        ("page", "INTEGER"),
        ("language", "TEXT"),
        ("forId", "TEXT"),
        ("mime", "TEXT"),
        ("props", "TEXT"),
        ("autoPlay", "BOOLEAN"),
        ("playerConfig", "TEXT"),
    ],
    "feedbacks": [
        ("id", "TEXT PRIMARY KEY"),
        ("forId", "TEXT NOT NULL"),
        ("threadId", "TEXT"),
        ("value", "INTEGER NOT NULL"),
        ("comment", "TEXT"),
    ],
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


def private_files(path: Path, *, own_folder: bool) -> None:
    """The history holds every chat: the database (and SQLite's journal files) owner-only (0600); its folder
    too (0700) when it is ours (the log folder), not one the user chose for it."""
    if own_folder:
        os.chmod(path.parent, 0o700)
    for p in (path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm"))):
        if p.is_file():
            os.chmod(p, 0o600)


def prepare(settings: Settings, env: MutableMapping[str, str] = os.environ) -> str | None:
    """At app start: with ``[ui].auth``, the tables and the login secret; returns the database URL.

    Chainlit reads CHAINLIT_AUTH_SECRET from the environment lazily (after importing app.py), so
    setting it here, in the UI process, is enough.
    """
    if not settings.ui.auth:
        return None
    path = db_path(settings)
    ensure_schema(path)
    private_files(path, own_folder=path.parent == settings.logging.resolved_dir)
    # Bound to the password: changing it signs everyone out (old tokens no longer verify).
    env["CHAINLIT_AUTH_SECRET"] = session_secret(
        auth_secret(path.parent, env), settings.ui.username, settings.ui.password + accounts_fingerprint(settings)
    )
    logger.info("history: login on for %r, chats kept in %s", settings.ui.username, path)
    return database_url(path)


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
        compared = ours.get("compare")
        if isinstance(compared, dict) and not compared.get("picked"):
            continue  # a compared answer the chat did not continue from: shown, not sent to the model
        if conv.turns and conv.turns[-1].role == "assistant":
            conv.turns.pop()
        conv.add_assistant(
            str(step["id"]), str(ours["raw"]), str(ours.get("model") or ""), interrupted=bool(ours.get("interrupted"))
        )
    return conv


def chat_state(model: str, sampling: Mapping[str, float], system_prompt: str) -> dict[str, Any]:
    """What the settings panel holds, as stored in thread metadata and preferences."""
    return {"model": model, "sampling": dict(sampling), "system_prompt": system_prompt}


def state_from_thread(thread: Mapping[str, Any], conv: Conversation | None = None) -> dict[str, Any]:
    """The settings a stored thread was last used with; the last answer's model when none were saved."""
    meta = _json_dict(thread.get("metadata"))
    stored = meta.get(META_KEY)
    state: dict[str, Any] = stored if isinstance(stored, dict) else {}
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

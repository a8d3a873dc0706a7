"""Chat history in Chainlit's data layer: the schema, and turning a stored thread back into a chat.

- ``[login].enable = true``: password login (``login.py``) and chat history in a SQLite file or a PostgreSQL
  database (``[history].db``, ``database.py``) read and written by Chainlit's own ``SQLAlchemyDataLayer``.
  Chainlit creates no tables and its documented DDL lacks ``steps."autoCollapse"`` (Chainlit 2.12 writes
  it), so ``ensure_schema`` creates them (SQLAlchemy, both databases), and adds what an older one lacks.
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
import secrets
import sqlite3
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Column, ForeignKey, Index, Integer, MetaData, Table, Text, inspect, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from backend.chat.conversation import Conversation
from backend.chat.documents import Document
from backend.settings import Settings
from backend.storage.database import Database, ensure_tables, failure, from_setting, sqlite_file, store, transient
from backend.web.login import SECRETS, accounts_fingerprint, auth_secret, session_secret, shared_auth_secret

logger = logging.getLogger(__name__)

WAIT_STEP = 1.0  # s between attempts while waiting for a PostgreSQL that is not there yet ([history].wait)
META_KEY = "qwenchat"  # our key inside Chainlit's step and thread metadata

# Columns Chainlit 2.12's SQLAlchemyDataLayer reads and writes (chainlit/data/sql_alchemy.py: the keys
# of Step.to_dict / Message.to_dict / Element.to_dict / Feedback, and the SELECTs). All nullable but
# the keys: a NOT NULL Chainlit does not always fill would make its INSERT fail, and it only logs that.
# Types that round-trip on SQLite and PostgreSQL alike: Chainlit binds metadata, generation and props as
# JSON strings (TEXT), timestamps as ISO strings (TEXT), booleans as bool, and thread/step "tags" as a
# Python list: TEXT[] on PostgreSQL (asyncpg binds a list as an array), JSON text on SQLite (the adapter
# below). "modes" (a dict) is turned into JSON text by datalayer.GuardedDataLayer before it is bound.
METADATA = MetaData()
_TAGS = Text().with_variant(ARRAY(Text()), "postgresql")


def _cols(*spec: tuple[str, Any]) -> list[Column[Any]]:
    return [Column(name, kind) for name, kind in spec]


Table(
    "users",
    METADATA,
    Column("id", Text(), primary_key=True),
    Column("identifier", Text(), nullable=False, unique=True),
    *_cols(("metadata", Text()), ("createdAt", Text())),
)
Table(
    "threads",
    METADATA,
    Column("id", Text(), primary_key=True),
    Column("createdAt", Text()),
    Column("name", Text()),
    Column("userId", Text(), ForeignKey("users.id", ondelete="CASCADE")),
    *_cols(("userIdentifier", Text()), ("tags", _TAGS), ("metadata", Text())),
    Index("threads_user", "userId"),
)
Table(
    "steps",
    METADATA,
    Column("id", Text(), primary_key=True),
    Column("name", Text()),
    Column("type", Text()),
    Column("threadId", Text(), ForeignKey("threads.id", ondelete="CASCADE")),
    *_cols(
        ("parentId", Text()),
        ("streaming", Boolean()),
        ("waitForAnswer", Boolean()),
        ("isError", Boolean()),
        ("metadata", Text()),
        ("tags", _TAGS),
        ("input", Text()),
        ("output", Text()),
        ("createdAt", Text()),
        ("command", Text()),
        ("modes", Text()),
        ("start", Text()),
        ("end", Text()),
        ("generation", Text()),
        ("showInput", Text()),
        ("language", Text()),
        ("indent", Integer()),
        ("defaultOpen", Boolean()),
        ("autoCollapse", Boolean()),
    ),
    Index("steps_thread", "threadId"),
)
Table(
    "elements",
    METADATA,
    Column("id", Text(), primary_key=True),
    Column("threadId", Text(), ForeignKey("threads.id", ondelete="CASCADE")),
    *_cols(
        ("type", Text()),
        ("url", Text()),
        ("chainlitKey", Text()),
        ("name", Text()),
        ("display", Text()),
        ("objectKey", Text()),
        ("size", Text()),
        ("page", Integer()),
        ("language", Text()),
        ("forId", Text()),
        ("mime", Text()),
        ("props", Text()),
        ("autoPlay", Boolean()),
        ("playerConfig", Text()),
    ),
)
Table(
    "feedbacks",
    METADATA,
    Column("id", Text(), primary_key=True),
    Column("forId", Text(), nullable=False),
    Column("threadId", Text()),
    Column("value", Integer(), nullable=False),
    Column("comment", Text()),
    Index("feedbacks_for", "forId"),  # version 2: Chainlit joins feedbacks on "forId" for every thread it reads
)
# Version 1: the tables above without the feedbacks_for index, and no qwenchat_schema row (SQLite only).
# Version 2: the index, the version row, PostgreSQL.
SCHEMA_VERSION = 2
SCHEMA: dict[str, list[str]] = {t.name: [c.name for c in t.columns] for t in METADATA.sorted_tables}


def _adapt_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# Chainlit binds step "tags" (a list) and message "modes" (a dict) as they are; SQLite cannot store
# either and SQLAlchemyDataLayer only logs the failed INSERT, losing the message. Store them as JSON.
sqlite3.register_adapter(dict, _adapt_json)
sqlite3.register_adapter(list, _adapt_json)


# ---------------------------------------------------------------- database and login


def database(settings: Settings) -> Database:
    """``[history].db`` parsed: a SQLite file (default ``history.sqlite3`` in ``[logging].dir``) or PostgreSQL."""
    return from_setting(settings.history.db, settings.logging.resolved_dir / "history.sqlite3")


def db_path(settings: Settings) -> Path:
    """The history's SQLite file; with PostgreSQL, where it would be (``[logging].dir``): local files go there."""
    db = database(settings)
    return db.path if db.path is not None else settings.logging.resolved_dir / "history.sqlite3"


def database_url(path: Path) -> str:
    return sqlite_file(path).async_url


def ensure_schema(where: Path | Database) -> list[str]:
    """Create the tables Chainlit's SQLAlchemyDataLayer uses; add what an older database lacks (columns,
    indexes, the version row). Idempotent, on SQLite and PostgreSQL; returns what it changed."""
    db = sqlite_file(where) if isinstance(where, Path) else where
    return ensure_tables(store(db), METADATA, "history", SCHEMA_VERSION)


def private_files(path: Path, *, own_folder: bool) -> None:
    """The history holds every chat: the database (and SQLite's journal files) owner-only (0600); its folder
    too (0700) when it is ours (the log folder), not one the user chose for it."""
    if own_folder:
        os.chmod(path.parent, 0o700)
    for p in (path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm"))):
        if p.is_file():
            os.chmod(p, 0o600)


ANSWER_KEY = "answer_signing"  # its row in qwenchat_secrets (login.SECRETS), in the history database


def answer_key(db: Database, *, create: bool = True) -> bytes | None:
    """The key answer steps are signed with (``datalayer.sign_answer``), kept in the history database itself: the
    UI processes and ``export-feedback`` read the same one, no browser ever sees it. ``create=False`` (an export):
    None when there is none yet, and nothing is written."""
    if not create and db.path is not None and not db.path.is_file():
        return None  # no SQLite file: not even an empty one is made
    st = store(db)
    if create:
        ensure_tables(st, SECRETS, "secrets", 1)

    def read_or_create(conn: Connection) -> bytes | None:
        if not create and "qwenchat_secrets" not in inspect(conn).get_table_names():
            return None
        if create:
            conn.execute(
                text("INSERT INTO qwenchat_secrets (name, value) VALUES (:n, :v) ON CONFLICT (name) DO NOTHING"),
                {"n": ANSWER_KEY, "v": secrets.token_urlsafe(32)},
            )
        value = conn.execute(text("SELECT value FROM qwenchat_secrets WHERE name = :n"), {"n": ANSWER_KEY}).scalar()
        return str(value).encode() if value else None

    return st.run(read_or_create)


@dataclass(frozen=True)
class HistoryStart:
    """What ``open_history`` found: the data layer's URL, or why there is no history."""

    url: str | None = None  # for Chainlit's SQLAlchemyDataLayer; None = no data layer
    db: Database | None = None
    off_reason: str = ""  # set when login is on but the database could not be used (the chat works without)
    answer_key: bytes | None = None  # signs the answers the UI stores (datalayer.sign_answer)


def open_history(settings: Settings, env: MutableMapping[str, str] = os.environ) -> HistoryStart:
    """At app start: with ``[login].enable``, the tables and the login secret.

    Chainlit reads CHAINLIT_AUTH_SECRET from the environment lazily (after importing app.py), so
    setting it here, in the UI process, is enough. With PostgreSQL the secret is kept in the database
    (written once by whichever UI process comes first), so UI processes on other machines share logins.
    A PostgreSQL that refuses connections, does not answer or is starting up is waited for up to
    ``[history].wait`` s (one log line when the wait starts, one when it answers). One that cannot be used
    (still not there after the wait, a wrong password, an unknown database) is one log line naming
    ``history.db`` (the URL without its password) and the cause: login still works, the chat works, nothing
    is kept.
    """
    if not settings.login.enable:
        return HistoryStart()
    db = database(settings)
    base: str | None = None
    off_reason = ""
    if db.is_postgres:
        started = time.monotonic()
        deadline, said = started + settings.history.wait, False
        while True:
            try:
                ensure_schema(db)
                base = shared_auth_secret(store(db), env)
                off_reason = ""
                if said:
                    logger.info("history: %s answered after %.0f s", db.safe, time.monotonic() - started)
                break
            except Exception as exc:  # noqa: BLE001 - any failure to reach it: the chat goes on without history
                off_reason = failure(exc)
                if transient(exc) and time.monotonic() < deadline:  # starting alongside the UI: give it time
                    if not said:
                        logger.warning(
                            "history: history.db = %s: %s; waiting up to %g s for it (history.wait)",
                            db.safe,
                            off_reason,
                            settings.history.wait,
                        )
                        said = True
                    time.sleep(max(0.0, min(WAIT_STEP, deadline - time.monotonic())))
                    continue
                waited = f" (waited {time.monotonic() - started:.0f} s)" if said else ""
                logger.error(
                    "history: history.db = %s: %s%s; history is off (chats are not kept), the chat works without it",
                    db.safe,
                    off_reason,
                    waited,
                )
                break
    else:
        path = db.path or db_path(settings)
        ensure_schema(path)
        private_files(path, own_folder=path.parent == settings.logging.resolved_dir)
    if base is None:
        base = auth_secret(db.path.parent if db.path is not None else settings.logging.resolved_dir, env)
    # Bound to the password: changing it signs everyone out (old tokens no longer verify).
    env["CHAINLIT_AUTH_SECRET"] = session_secret(
        base, settings.login.username, settings.login.password + accounts_fingerprint(settings)
    )
    if off_reason:
        return HistoryStart(None, db, off_reason)
    logger.info("history: login on for %r, chats kept in %s", settings.login.username, db.safe)
    return HistoryStart(db.async_url, db, answer_key=answer_key(db))


def prepare(settings: Settings, env: MutableMapping[str, str] = os.environ) -> str | None:
    """``open_history``'s data-layer URL (None: no login, or no history)."""
    return open_history(settings, env).url


# ---------------------------------------------------------------- rebuilding a chat from its thread


def answer_metadata(raw: str, model: str, *, interrupted: bool = False) -> dict[str, Any]:
    """Step metadata of an answer: what the model said (no footer) and which model said it."""
    return {META_KEY: {"raw": raw, "model": model, "interrupted": interrupted}}


def documents_metadata(docs: Iterable[Document]) -> dict[str, Any]:
    """Metadata of a user message with files attached: each as the converted text the model was given."""
    return {META_KEY: {"documents": [d.to_dict() for d in docs]}}


def documents_of(step: Mapping[str, Any]) -> tuple[Document, ...]:
    """The documents stored with a user message (``documents_metadata``); none when it has none or they are bad."""
    ours = json_dict(step.get("metadata")).get(META_KEY)
    stored = ours.get("documents") if isinstance(ours, dict) else None
    try:
        return tuple(Document.from_dict(d) for d in stored or ())
    except (TypeError, ValueError):
        logger.warning("history: step %s has documents that cannot be read; resumed without them", step.get("id"))
        return ()


def command_metadata(command: str) -> dict[str, Any]:
    """Metadata marking a user message as a composer command (Chainlit's data layer drops the
    step's own "command" column when it reads a thread back)."""
    return {META_KEY: {"command": command}}


def json_dict(value: Any) -> dict[str, Any]:
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
        ours = json_dict(step.get("metadata")).get(META_KEY)
        if isinstance(ours, dict) and ours.get("command"):  # "/unload pirate" is stored as the user message "pirate"
            continue
        if step.get("type") == "user_message":
            conv.add_user(str(step["id"]), step.get("output") or "", documents_of(step))
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
    meta = json_dict(thread.get("metadata"))
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

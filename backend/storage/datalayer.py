"""Chainlit's history data layer, hardened: thread ids checked, text made storable, SQLite tuned.

    layer = GuardedDataLayer(SQLAlchemyDataLayer(url))    # backend/ui/login.py's data layer (no Chainlit import here)

- **Thread ids are UUIDs** (Chainlit makes them with ``uuid4``). One that is not never reaches SQL:
  reads answer "no such thread" (Chainlit's routes then say 404), writes raise ``InvalidThreadId``.
  The browser sends thread ids to resume, rename, delete and share a chat and with every step it
  writes; Chainlit 2.12 pastes stored thread ids into the SQL text of its thread listing.
- **Stored text is sanitised like what is sent to the model** (``sanitize.sanitize_text``): a lone
  surrogate typed in a message cannot be encoded for SQLite and would make the write fail.
- **A step stays in its thread, and keeps its type** (issue #18). Chainlit's ``create_step`` upserts on the
  step id (``ON CONFLICT (id) DO UPDATE SET "threadId" = …``), and the browser chooses the ids of the messages
  it sends: a message sent with the id of a message in another chat moved it, text replaced, into the sender's
  chat. A write whose id is stored in another thread, or as another type, is refused: logged, nothing written.
- **Answers are signed**: an ``assistant_message`` step carrying our answer metadata gets an HMAC of its id,
  thread, raw text and model under the history's answer key (``history.answer_key``), which no browser has.
  ``export-feedback`` takes model answers only from steps whose signature verifies (``signed_answer``).
- **SQLite**: WAL and a busy timeout on every connection (the UI writes while a resume reads), and
  SQLAlchemy never puts statement parameters (prompt text) into its errors or logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from backend.chat.sanitize import sanitize_text
from backend.storage.database import failure, sqlite_pragmas
from backend.storage.history import META_KEY, json_dict

logger = logging.getLogger(__name__)

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class InvalidThreadId(ValueError):
    """A thread id from the browser that is not a UUID; refused before any SQL."""

    def __init__(self, value: object) -> None:
        super().__init__(f"refused a thread id that is not a UUID: {str(value)[:80]!r}")


def valid_thread_id(value: object) -> bool:
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def _refused(value: object, what: str) -> None:
    logger.warning("history: %s refused: thread id %r is not a UUID", what, str(value)[:80])


def sanitized(value: Any) -> Any:
    """``value`` with every string (also inside dicts and lists) storable: lone surrogates become U+FFFD."""
    if isinstance(value, str):
        return sanitize_text(value)
    if isinstance(value, list):
        return [sanitized(v) for v in value]
    if isinstance(value, dict):
        return {k: sanitized(v) for k, v in value.items()}
    return value


def storable_step(step_dict: Any) -> Any:
    """A step dict Chainlit can bind on SQLite and PostgreSQL alike: strings sanitised, and a dict other than
    the metadata and generation Chainlit encodes itself (the message's "modes") as JSON text. asyncpg binds no
    dict to a TEXT column; on SQLite the registered adapter (history.py) gave the same text."""
    out = sanitized(step_dict)
    for key, value in list(out.items()):
        if isinstance(value, dict) and value and key not in ("metadata", "generation"):
            out[key] = json.dumps(value, ensure_ascii=False)
    return out


def answer_signature(key: bytes, step_id: str, thread_id: str, raw: str, model: str) -> str:
    """The HMAC-SHA256 (hex) that marks an answer step as written by this server."""
    signed = json.dumps([step_id, thread_id, raw, model], ensure_ascii=False).encode("utf-8", "surrogatepass")
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def _answer_meta(step: Mapping[str, Any]) -> dict[str, Any] | None:
    ours = json_dict(step.get("metadata")).get(META_KEY)
    return ours if step.get("type") == "assistant_message" and isinstance(ours, dict) and "raw" in ours else None


def sign_answer(key: bytes, step: dict[str, Any]) -> dict[str, Any]:
    """``step`` with its answer metadata signed (a step that is no answer of ours: unchanged)."""
    ours = _answer_meta(step)
    if ours is None or not isinstance(step.get("metadata"), dict):
        return step
    sig = answer_signature(
        key, str(step.get("id")), str(step.get("threadId")), str(ours["raw"]), str(ours.get("model") or "")
    )
    return {**step, "metadata": {**step["metadata"], META_KEY: {**ours, "sig": sig}}}


def signed_answer(key: bytes | None, step: Mapping[str, Any]) -> bool:
    """Whether ``step`` (as read back from the steps table) is an answer this server wrote and signed."""
    ours = _answer_meta(step)
    if key is None or ours is None or not isinstance(ours.get("sig"), str):
        return False
    want = answer_signature(
        key, str(step.get("id")), str(step.get("threadId")), str(ours["raw"]), str(ours.get("model") or "")
    )
    return hmac.compare_digest(want, ours["sig"])


@dataclass(frozen=True)
class StepOwner:
    """Where a stored step lives: its thread, its type, and the thread's user ("" when it has none)."""

    thread_id: str
    type: str
    user: str


_OWNER = text(
    'SELECT s."threadId", s."type", t."userIdentifier" FROM steps s LEFT JOIN threads t ON t."id" = s."threadId" '
    'WHERE s."id" = :id'
)


def tune_engine(engine: AsyncEngine) -> None:
    """Never statement parameters in errors or logs. PostgreSQL: a pooled connection is checked before use (a
    server restarted since, or a proxy that dropped it, costs a reconnect, not a lost write). SQLite: WAL + busy
    timeout on each new connection."""
    sync = engine.sync_engine
    # Read by SQLAlchemy whenever it logs a statement or wraps a DBAPI error (Engine.hide_parameters);
    # Chainlit builds the engine itself and takes no engine options.
    sync.hide_parameters = True
    if sync.dialect.name != "sqlite":
        # create_engine(pool_pre_ping=True) sets this attribute of the pool; Chainlit's create_async_engine call
        # takes no pool options. Pool.recreate() (after a disconnect) copies it.
        sync.pool._pre_ping = True
        return

    event.listen(sync, "connect", sqlite_pragmas)


class GuardedDataLayer:
    """Chainlit's data layer behind the checks above; every other method goes straight through."""

    def __init__(self, inner: Any, *, answer_key: bytes | None = None) -> None:
        self.inner = inner
        self.answer_key = answer_key  # None: answers are stored unsigned (export-feedback then leaves them out)
        engine = getattr(inner, "engine", None)
        self._engine = engine if isinstance(engine, AsyncEngine) else None
        if self._engine is not None:
            tune_engine(self._engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # ------------------------------------------------------------ reads: an invalid id is no thread

    async def get_thread(self, thread_id: str) -> Any:
        if not valid_thread_id(thread_id):
            _refused(thread_id, "get_thread")
            return None
        return await self.inner.get_thread(thread_id)

    async def get_thread_author(self, thread_id: str) -> str:
        if not valid_thread_id(thread_id):  # Chainlit's ACL check answers 404 "Thread not found"
            _refused(thread_id, "get_thread_author")
            return ""
        return str(await self.inner.get_thread_author(thread_id))

    async def get_element(self, thread_id: str, element_id: str) -> Any:
        if not valid_thread_id(thread_id):
            _refused(thread_id, "get_element")
            return None
        return await self.inner.get_element(thread_id, element_id)

    # ------------------------------------------------------------ writes: an invalid id is an error

    def _check(self, thread_id: object, what: str) -> None:
        if not valid_thread_id(thread_id):
            _refused(thread_id, what)
            raise InvalidThreadId(thread_id)

    async def update_thread(self, thread_id: str, *args: Any, **kwargs: Any) -> Any:
        self._check(thread_id, "update_thread")
        return await self.inner.update_thread(thread_id, *sanitized(list(args)), **sanitized(kwargs))

    async def delete_thread(self, thread_id: str) -> Any:
        self._check(thread_id, "delete_thread")
        return await self.inner.delete_thread(thread_id)

    async def create_step(self, step_dict: Any) -> Any:
        self._check(step_dict.get("threadId"), "create_step")
        if not await self._stays(step_dict, "create_step"):
            return None
        return await self.inner.create_step(self._signed(storable_step(step_dict)))

    async def update_step(self, step_dict: Any) -> Any:
        self._check(step_dict.get("threadId"), "update_step")
        if not await self._stays(step_dict, "update_step"):
            return None
        return await self.inner.update_step(self._signed(storable_step(step_dict)))

    def _signed(self, step: dict[str, Any]) -> dict[str, Any]:
        return sign_answer(self.answer_key, step) if self.answer_key else step

    async def step_owner(self, step_id: str) -> StepOwner | None:
        """The stored step with this id (any thread, any user), or None."""
        if self._engine is None:
            return None
        async with self._engine.connect() as conn:
            row = (await conn.execute(_OWNER, {"id": step_id})).first()
        return None if row is None else StepOwner(str(row[0] or ""), str(row[1] or ""), str(row[2] or ""))

    async def _stays(self, step: Any, what: str) -> bool:
        """False (and logged) when writing ``step`` would move a stored step to another thread or change its type:
        Chainlit's upsert would do either without a word."""
        step_id = step.get("id")
        if not isinstance(step_id, str):
            return True  # Chainlit's own INSERT refuses it
        try:
            owner = await self.step_owner(step_id)
        except Exception as exc:  # noqa: BLE001 - Chainlit writes steps from tasks nobody awaits: log, never raise
            logger.warning(
                "history: %s of step %s not written: its owner could not be checked (%s)", what, step_id, failure(exc)
            )
            return False
        if owner is None:
            return True
        thread, kind = step.get("threadId"), step.get("type")
        if owner.thread_id != thread:
            logger.warning(
                "history: %s refused: step %s belongs to thread %s (user %r), not %s; nothing moved",
                what,
                step_id,
                owner.thread_id,
                owner.user,
                thread,
            )
            return False
        if kind and owner.type and kind != owner.type:
            logger.warning(
                "history: %s refused: step %s is stored as a %s, not a %s; nothing overwritten",
                what,
                step_id,
                owner.type,
                kind,
            )
            return False
        return True

    async def create_element(self, element: Any) -> Any:
        self._check(getattr(element, "thread_id", None), "create_element")
        return await self.inner.create_element(element)

    async def delete_element(self, element_id: str, thread_id: str | None = None) -> Any:
        if thread_id is not None:
            self._check(thread_id, "delete_element")
        return await self.inner.delete_element(element_id, thread_id)

    async def upsert_feedback(self, feedback: Any) -> Any:
        thread_id = getattr(feedback, "threadId", None)
        if thread_id is not None:
            self._check(thread_id, "upsert_feedback")
        if isinstance(getattr(feedback, "comment", None), str):  # the thumbs' comment box: typed text
            feedback.comment = sanitize_text(feedback.comment)
        return await self.inner.upsert_feedback(feedback)

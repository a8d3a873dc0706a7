"""Chainlit's history data layer, hardened: thread ids checked, text made storable, SQLite tuned.

    layer = GuardedDataLayer(SQLAlchemyDataLayer(url))    # app.py's @cl.data_layer (no Chainlit import here)

- **Thread ids are UUIDs** (Chainlit makes them with ``uuid4``). One that is not never reaches SQL:
  reads answer "no such thread" (Chainlit's routes then say 404), writes raise ``InvalidThreadId``.
  The browser sends thread ids to resume, rename, delete and share a chat and with every step it
  writes; Chainlit 2.12 pastes stored thread ids into the SQL text of its thread listing.
- **Stored text is sanitised like what is sent to the model** (``client.sanitize_text``): a lone
  surrogate typed in a message cannot be encoded for SQLite and would make the write fail.
- **SQLite**: WAL and a busy timeout on every connection (the UI writes while a resume reads), and
  SQLAlchemy never puts statement parameters (prompt text) into its errors or logs.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from .client import sanitize_text
from .database import sqlite_pragmas

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

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        engine = getattr(inner, "engine", None)
        if isinstance(engine, AsyncEngine):
            tune_engine(engine)

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
        return await self.inner.create_step(storable_step(step_dict))

    async def update_step(self, step_dict: Any) -> Any:
        self._check(step_dict.get("threadId"), "update_step")
        return await self.inner.update_step(storable_step(step_dict))

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

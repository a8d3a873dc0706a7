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
- **Every write goes through the outbox** (``outbox.py``, issue 32): checked and made storable here, then journalled
  and written in the background, in order per chat, retried until stored. Chainlit's ``execute_sql`` logs a failed
  statement and returns None; inside our writes it is replaced by one that raises, so a failure is seen and retried.
  Reads keep Chainlit's behaviour (a failed read is "no such thread"). ``get_thread`` merges the writes still
  pending for that thread into what the database returned: a resume, a share link and ``/export`` see them.
- **Metadata carried with a step's own write** (``carry_metadata``: the documents read for a user message). Chainlit
  writes the user's message from a task of its own; metadata for it given before that write goes in it (one write),
  given after goes as an update behind it in the chat's lane (the outbox keeps the order). Never an update first
  that Chainlit's own upsert of the message would then overwrite.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from backend.chat.sanitize import sanitize_text
from backend.storage.database import failure, sqlite_pragmas
from backend.storage.files import FileStore
from backend.storage.history import META_KEY, json_dict
from backend.storage.outbox import Outbox, Write

logger = logging.getLogger(__name__)

_WRITING: ContextVar[bool] = ContextVar("qwenchat_history_writing", default=False)  # inside one of our writes
CARRIED_MAX = 1_000  # steps whose own write is awaited with metadata to carry, and steps remembered as written

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

_CHATS_OF = text('SELECT "id" FROM threads WHERE "userIdentifier" = :user')


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


STEP_WRITES = ("create_step", "update_step")  # the outbox's writes that carry a step


@dataclass
class StoredFeedback:
    """A thumbs rating as Chainlit's ``Feedback`` (same fields, same order): what its ``upsert_feedback`` binds."""

    forId: str
    value: int
    threadId: str | None = None
    id: str | None = None
    comment: str | None = None


class GuardedDataLayer:
    """Chainlit's data layer behind the checks above, its writes through the outbox; other methods go straight
    through."""

    def __init__(
        self,
        inner: Any,
        *,
        answer_key: bytes | None = None,
        outbox: Outbox | None = None,
        files: FileStore | None = None,
    ) -> None:
        self.inner = inner
        self.files = files  # the chats' original files (storage/files.py), deleted with their chat
        self.answer_key = answer_key  # None: answers are stored unsigned (export-feedback then leaves them out)
        self.outbox = outbox  # None: each write is made at once and a failure only logged (tests, tools)
        self._users: dict[str, str] = {}  # user id -> identifier: the author of a thread not stored yet
        self._carried: dict[str, dict[str, Any]] = {}  # step id -> metadata for its own write, still to come
        self._written: dict[str, None] = {}  # ids of the steps written lately, oldest first
        engine = getattr(inner, "engine", None)
        self._engine = engine if isinstance(engine, AsyncEngine) else None
        if self._engine is not None:
            tune_engine(self._engine)
        if hasattr(inner, "execute_sql") and hasattr(inner, "async_session"):
            self._chainlit_execute = inner.execute_sql
            inner.execute_sql = self._execute_sql  # Chainlit's methods call self.execute_sql: ours, when we write
        self._ops = {
            "create_step": self._write_step,
            "update_step": self._write_step,
            "delete_step": lambda a: self._unqueued("delete_step")(a["id"]),
            "update_thread": self._write_thread,
            "delete_thread": lambda a: self.inner.delete_thread(a["thread_id"]),
            "upsert_feedback": lambda a: self.inner.upsert_feedback(StoredFeedback(**a["feedback"])),
            "delete_feedback": lambda a: self.inner.delete_feedback(a["id"]),
        }
        for op, fn in self._ops.items():
            if outbox is not None:
                outbox.register(op, functools.partial(self._run, fn))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # ------------------------------------------------------------ the write path

    async def _execute_sql(self, query: str, parameters: dict[str, Any]) -> Any:
        """Chainlit's ``execute_sql``, raising instead of logging and returning None while we write."""
        if not _WRITING.get():
            return await self._chainlit_execute(query, parameters)
        async with self.inner.async_session() as session, session.begin():
            result = await session.execute(text(query), parameters)
            if not result.returns_rows:
                return result.rowcount
            return self.inner.clean_result([dict(row._mapping) for row in result.fetchall()])

    @staticmethod
    async def _run(fn: Any, args: dict[str, Any]) -> None:
        token = _WRITING.set(True)
        try:
            await fn(args)
        finally:
            _WRITING.reset(token)

    async def _write(self, thread_id: str, op: str, args: dict[str, Any]) -> None:
        """Through the outbox (journalled, retried, never waited for); without one, at once."""
        if self.outbox is not None:
            self.outbox.submit(thread_id, op, args)
            return
        try:
            await self._run(self._ops[op], args)
        except Exception as exc:  # noqa: BLE001 - Chainlit writes from tasks nobody awaits: log, never raise
            logger.warning("history: %s of chat %s not stored: %s", op, thread_id, failure(exc))

    def _unqueued(self, name: str) -> Any:
        """The inner layer's method without Chainlit's queue_until_user_message (our own layer queues, login.py)."""
        method = getattr(type(self.inner), name)
        return functools.partial(getattr(method, "__wrapped__", method), self.inner)

    async def _write_step(self, args: dict[str, Any]) -> None:
        step = args["step"]
        if await self._stays(step, "create_step"):
            await self._unqueued("create_step")(step)

    async def _write_thread(self, args: dict[str, Any]) -> None:
        await self.inner.update_thread(
            args["thread_id"], name=args["name"], user_id=args["user_id"], metadata=args["metadata"], tags=args["tags"]
        )

    # ------------------------------------------------------------ reads: an invalid id is no thread

    async def get_thread(self, thread_id: str) -> Any:
        if not valid_thread_id(thread_id):
            _refused(thread_id, "get_thread")
            return None
        # The pending writes are taken before the read: one stored while the read runs is then in the read or in
        # the list (applying a stored write again changes nothing), never in neither (a share link still open
        # right after its owner's "unshare" returned).
        pending = self.pending(thread_id)
        thread = await self.inner.get_thread(thread_id)
        return with_pending(thread, thread_id, pending, self._users) if pending else thread

    async def get_thread_author(self, thread_id: str) -> str:
        if not valid_thread_id(thread_id):  # Chainlit's ACL check answers 404 "Thread not found"
            _refused(thread_id, "get_thread_author")
            return ""
        pending = self.pending(thread_id)  # before the read, as get_thread
        try:
            return str(await self.inner.get_thread_author(thread_id))
        except ValueError:  # not stored (yet): a thread whose first writes wait in the outbox has its author
            author = (with_pending(None, thread_id, pending, self._users) or {}).get("userIdentifier")
            if author:
                return str(author)
            raise

    async def get_user(self, identifier: str) -> Any:
        return self._known(await self.inner.get_user(identifier))

    async def create_user(self, user: Any) -> Any:
        return self._known(await self.inner.create_user(user))

    def _known(self, user: Any) -> Any:
        if getattr(user, "id", None) and getattr(user, "identifier", None):
            self._users[str(user.id)] = str(user.identifier)
        return user

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

    async def update_thread(
        self,
        thread_id: str,
        name: str | None = None,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self._check(thread_id, "update_thread")
        args = {"thread_id": thread_id, "name": name, "user_id": user_id, "metadata": metadata, "tags": tags}
        await self._write(thread_id, "update_thread", sanitized(args))

    async def delete_thread(self, thread_id: str) -> None:
        self._check(thread_id, "delete_thread")
        await self._write(thread_id, "delete_thread", {"thread_id": thread_id})
        if self.files is not None:  # the chat is gone for its owner now: its files too
            try:
                await self.files.delete_chat(thread_id)
            except OSError as exc:
                logger.warning("history: the kept files of chat %s could not be deleted: %s", thread_id, exc)

    async def create_step(self, step_dict: Any) -> None:
        self._check(step_dict.get("threadId"), "create_step")
        step = self._signed(storable_step(self._carrying(dict(step_dict))))
        await self._write(step["threadId"], "create_step", {"step": step})

    async def update_step(self, step_dict: Any) -> None:
        self._check(step_dict.get("threadId"), "update_step")
        step = self._signed(storable_step(self._carrying(dict(step_dict))))
        await self._write(step["threadId"], "update_step", {"step": step})

    def carry_metadata(self, step_id: str, metadata: dict[str, Any]) -> bool:
        """``metadata`` goes with step ``step_id``'s own write when that is still to come: False, nothing else to
        do. True when the step was written already: the caller writes an update, which comes after it."""
        if step_id in self._written:
            return True
        self._carried[step_id] = metadata
        while len(self._carried) > CARRIED_MAX:
            self._carried.pop(next(iter(self._carried)))
        return False

    def _carrying(self, step: dict[str, Any]) -> dict[str, Any]:
        """``step`` with the metadata carried for it, if any; remembered as written."""
        step_id = str(step.get("id"))
        self._written.pop(step_id, None)
        self._written[step_id] = None
        while len(self._written) > CARRIED_MAX:
            self._written.pop(next(iter(self._written)))
        carried = self._carried.pop(step_id, None)
        if carried is not None:
            step["metadata"] = {**json_dict(step.get("metadata")), **carried}
        return step

    def pending(self, thread_id: str | None = None) -> list[Write]:
        """The writes still waiting in the outbox, oldest first: of one chat, or of all."""
        return self.outbox.pending(thread_id) if self.outbox is not None else []

    def pending_thread_of_step(self, step_id: str) -> str | None:
        """The chat of a step whose write is still pending (not readable from the database yet), or None."""
        return next(
            (w.thread for w in self.pending() if w.op in STEP_WRITES and w.args["step"].get("id") == step_id), None
        )

    async def delete_step(self, step_id: str) -> None:
        thread = self.pending_thread_of_step(step_id)
        if thread is None and self._engine is not None:
            try:
                owner = await self.step_owner(step_id)
            except Exception as exc:  # noqa: BLE001 - down: the delete waits in a lane of its own, still kept
                logger.warning("history: the chat of step %s could not be looked up (%s)", step_id, failure(exc))
                owner = None
            thread = owner.thread_id if owner is not None else None
        await self._write(thread or f"step:{step_id}", "delete_step", {"id": step_id})

    def _signed(self, step: dict[str, Any]) -> dict[str, Any]:
        return sign_answer(self.answer_key, step) if self.answer_key else step

    async def step_owner(self, step_id: str) -> StepOwner | None:
        """The stored step with this id (any thread, any user), or None."""
        if self._engine is None:
            return None
        async with self._engine.connect() as conn:
            row = (await conn.execute(_OWNER, {"id": step_id})).first()
        return None if row is None else StepOwner(str(row[0] or ""), str(row[1] or ""), str(row[2] or ""))

    async def chats_of(self, identifier: str) -> int:
        """How many chats the account ``identifier`` keeps: the stored ones, plus those whose first write still waits
        in the outbox, less those whose delete waits there ([login] max_chats_per_account). A failed read raises."""
        stored: set[str] = set()
        if self._engine is not None:
            async with self._engine.connect() as conn:
                rows = await conn.execute(_CHATS_OF, {"user": identifier})
                stored = {str(row[0]) for row in rows}
        for w in self.pending():  # in order within each chat's lane
            if w.op == "update_thread" and self._users.get(str(w.args.get("user_id"))) == identifier:
                stored.add(w.thread)
            elif w.op == "delete_thread":
                stored.discard(w.thread)
        return len(stored)

    async def _stays(self, step: Any, what: str) -> bool:
        """False (and logged) when writing ``step`` would move a stored step to another thread or change its type:
        Chainlit's upsert would do either without a word. A failed check raises (the outbox retries it)."""
        step_id = step.get("id")
        if not isinstance(step_id, str):
            return True  # Chainlit's own INSERT refuses it
        owner = await self.step_owner(step_id)
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
        """Straight through: Chainlit's SQLAlchemyDataLayer stores no element without a storage provider (we set
        none), so there is nothing to keep."""
        self._check(getattr(element, "thread_id", None), "create_element")
        return await self.inner.create_element(element)

    async def delete_element(self, element_id: str, thread_id: str | None = None) -> Any:
        if thread_id is not None:
            self._check(thread_id, "delete_element")
        return await self.inner.delete_element(element_id, thread_id)

    async def upsert_feedback(self, feedback: Any) -> str:
        """The rating's id (a new one is made here, so that a replay updates the same row)."""
        thread_id = getattr(feedback, "threadId", None)
        if thread_id is not None:
            self._check(thread_id, "upsert_feedback")
        feedback.id = feedback.id or str(uuid.uuid4())
        if isinstance(getattr(feedback, "comment", None), str):  # the thumbs' comment box: typed text
            feedback.comment = sanitize_text(feedback.comment)
        row = asdict(StoredFeedback(feedback.forId, feedback.value, thread_id, feedback.id, feedback.comment))
        await self._write(thread_id or f"step:{feedback.forId}", "upsert_feedback", {"feedback": row})
        return str(feedback.id)

    async def delete_feedback(self, feedback_id: str) -> bool:
        """Behind its rating's own write when that is still pending (in that chat's lane), else in a lane of its own."""
        rating = rating_write(self.pending(), feedback_id)
        await self._write(
            rating.thread if rating is not None else f"feedback:{feedback_id}", "delete_feedback", {"id": feedback_id}
        )
        return True


def rating_write(writes: list[Write], feedback_id: str) -> Write | None:
    """The first of ``writes`` (the outbox's pending ones) that stores rating ``feedback_id``, or None."""
    return next((w for w in writes if w.op == "upsert_feedback" and w.args["feedback"].get("id") == feedback_id), None)


def pending_answer_of_feedback(layer: GuardedDataLayer, feedback_id: str) -> str | None:
    """The answer (step id) a rating whose write still waits in ``layer``'s outbox rates, or None."""
    write = rating_write(layer.pending(), feedback_id)
    answer = write.args["feedback"].get("forId") if write is not None else None
    return str(answer) if answer else None


def with_pending(thread: Any, thread_id: str, writes: list[Write], users: Mapping[str, str]) -> Any:
    """``thread`` as read from the database (None: not stored) with the writes still pending for it applied in
    order, as the database will have it once they are stored."""
    out: dict[str, Any] = dict(thread) if thread else {"id": thread_id, "createdAt": None, "name": None}
    out.setdefault("steps", [])
    steps = {str(s.get("id")): dict(s) for s in out.get("steps") or []}  # the stored order, then the new ones
    for w in writes:
        a = w.args
        if w.op in ("create_step", "update_step"):
            step_id = str(a["step"].get("id"))
            steps[step_id] = {**steps.get(step_id, {}), **a["step"]}
        elif w.op == "delete_step":
            steps.pop(str(a["id"]), None)
        elif w.op == "delete_thread":
            return None
        elif w.op == "update_thread":
            _apply_thread_update(out, a, users)
        elif w.op == "upsert_feedback" and a["feedback"]["forId"] in steps:
            steps[a["feedback"]["forId"]]["feedback"] = a["feedback"]
    out["steps"] = list(steps.values())
    if not out.get("createdAt") and out["steps"]:
        out["createdAt"] = out["steps"][0].get("createdAt")
    return out


def _apply_thread_update(out: dict[str, Any], args: Mapping[str, Any], users: Mapping[str, str]) -> None:
    """Chainlit's update_thread on a thread dict: metadata merged (a None value deletes its key), then name, user
    and tags where given."""
    meta = json_dict(out.get("metadata"))
    incoming = args.get("metadata") or {}
    meta = {k: v for k, v in {**meta, **incoming}.items() if incoming.get(k, v) is not None}
    out["metadata"] = meta
    name = args.get("name") or meta.get("name")
    if name:
        out["name"] = name
    if args.get("user_id"):
        out["userId"] = args["user_id"]
        out["userIdentifier"] = out.get("userIdentifier") or users.get(args["user_id"])
    if args.get("tags") is not None:
        out["tags"] = args["tags"]

"""The socket events through which a browser writes messages, guarded (issue #18).

Chainlit 2.12 takes a ``client_message`` as the browser wrote it: its ``id``, its ``type``, its metadata and parent.
Its data layer then upserts on that id, so a message sent with the id of another chat's message moved that message
(text replaced) into the sender's chat, and a browser could store ``assistant_message`` steps that looked like model
answers. Chainlit also starts a new answer for every message, whatever is still streaming. Here, before Chainlit
sees the event:

- ``client_message``: only a ``user_message`` with an id no stored step and no message of this chat has; our own
  metadata and any parent id are dropped from it; not while this chat is still answering, nor when it would start
  more answers than the user's fair share over all their chats (issue #20; the refusal quotes the text back, so
  it is not lost).
- a new chat's first message: not while more history writes wait than ``[history] pending_max`` (issue 32), nor
  when the account already keeps ``[login] max_chats_per_account`` chats (issue #29; the text is quoted back).
- ``edit_message``: only one of this chat's own user messages, not while this chat is answering, and within the
  user's fair share.

Each refusal is logged and said in the chat, in the user's language; nothing is stored, moved or overwritten. The
data layer refuses the same moves on its own (``backend/storage/datalayer.py``), whichever path a write takes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from chainlit.chat_context import chat_context
from chainlit.context import init_ws_context
from chainlit.data import get_data_layer
from chainlit.server import sio
from chainlit.session import WebsocketSession

from backend.chat.fairshare import Claim, TooMany
from backend.chat.session import ChatSession
from backend.storage.database import failure
from backend.storage.history import META_KEY, command_metadata
from backend.storage.outbox import Backlog, cause_text
from backend.text import quoted, t
from backend.ui.commands import BY_ID, typed_command
from backend.ui.views import show_error

logger = logging.getLogger(__name__)
T = TypeVar("T")

USER_MESSAGE = "user_message"
RESUME_WAIT_S = 15.0  # how long a message waits for its chat to be resumed from the history (Guard.resumed)
# How long a message waits for the history to answer (``asked``: is its id taken, how many chats the account keeps):
# a slow database must not hold up the answer; the data layer checks ids again before it writes (GuardedDataLayer._stays).
ID_LOOKUP_S = 1.0
_LATE: set[asyncio.Future[Any]] = set()  # lookups left to finish after their message went on


def _settled(lookup: asyncio.Future[Any]) -> None:
    _LATE.discard(lookup)
    if not lookup.cancelled() and (exc := lookup.exception()) is not None:
        logger.info("socket: a late message id lookup failed (%s)", failure(exc))


async def asked(query: Callable[[], Awaitable[T]], what: str, *, while_behind: bool = False) -> T | None:
    """The history's answer to ``query()``, for a socket message that must not wait on a slow database: None when
    it does not answer within ``ID_LOOKUP_S``, fails, or is not asked.

    A query that has not answered in time is left to finish on its own (not cancelled: a cancelled database call
    waits for its connection's clean-up), and the database is not asked again while it is out, nor while the
    outbox has writes it is failing or slow to take (unless ``while_behind``: a query whose answer counts those
    writes). Each of those is logged with ``what`` was not looked up."""
    box = getattr(get_data_layer(), "outbox", None)
    if _LATE or (not while_behind and box is not None and box.state().cause):
        return None
    lookup = asyncio.ensure_future(query())
    try:
        done, _ = await asyncio.wait({lookup}, timeout=ID_LOOKUP_S)
        if not done:
            _LATE.add(lookup)
            lookup.add_done_callback(_settled)
            logger.warning("socket: %s not looked up (the history took over %.0f s)", what, ID_LOOKUP_S)
            return None
        return lookup.result()
    except Exception as exc:  # noqa: BLE001 - logged; the caller goes on without the answer
        logger.warning("socket: could not look %s up in the history (%s)", what, failure(exc))
        return None


NAMESPACE = "/"
Handler = Callable[[str, Any], Awaitable[Any]]
Claimer = Callable[[], Claim | TooMany]  # answering.claim_answers: the user's fair share of what a message starts


def cleaned(message: dict[str, Any]) -> None:
    """What only the server writes, removed from a browser's message: our metadata (answer, command marks) and a
    parent (a browser's message hangs under no step)."""
    metadata = message.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop(META_KEY, None)
    message.pop("parentId", None)


def as_picked(message: dict[str, Any]) -> None:
    """A command typed out in full (``/compare off``) in the form Chainlit's menu sends a picked one: ``command`` set,
    the text after it as the message. Chainlit then stores and shows it as a command, and it starts no answer."""
    output = message.get("output")
    if message.get("command") or not isinstance(output, str):
        return
    typed = typed_command(output)
    if typed is not None:
        message["command"], message["output"] = typed


def _who(session: WebsocketSession) -> str:
    return session.user.identifier if session.user else "anonymous"


class Guard:
    """The wrappers around Chainlit's handlers; ``chat_session`` and ``lang`` are the installation's (context.Ui)."""

    def __init__(
        self,
        chat_session: Callable[[], ChatSession],
        lang: Callable[[], str],
        claim: Claimer,
        backlog: Callable[[], Backlog | None] = lambda: None,
        chat_cap: int = 0,
    ) -> None:
        self.chat_session, self.lang, self.claim = chat_session, lang, claim
        self.backlog = backlog  # the history writes waiting, when past [history] pending_max; else None
        self.chat_cap = chat_cap  # [login] max_chats_per_account (0: no cap)

    async def claimed(self, text: str, command: bool = False) -> Claim | None:
        """The user's fair share of the answers this message starts (a command starts none: a claim of nothing),
        or None after saying why not, with ``text`` quoted back."""
        claim = Claim(None, "", 0) if command else self.claim()
        if isinstance(claim, TooMany):
            await show_error(t("fair.busy", self.lang(), running=claim.held, limit=claim.limit, text=quoted(text)))
            return None
        return claim

    async def refusal(self, session: WebsocketSession, message: dict[str, Any]) -> str | None:
        """Why the browser may not send ``message`` as a new message (the text to show), or None."""
        kind, mid = message.get("type"), message.get("id")
        if kind != USER_MESSAGE:
            logger.warning(
                "socket: client_message refused: type %r is not a user message (user %r, thread %s)",
                str(kind)[:40],
                _who(session),
                session.thread_id,
            )
            return t("message.type_refused", self.lang(), kind=str(kind)[:40])
        if not session.has_first_interaction and not session.restored:
            refused = await self.new_chat_refusal(session, quoted(str(message.get("output") or "")))
            if refused is not None:
                return refused
        if not isinstance(mid, str):
            return None  # Chainlit refuses an id that is no UUID before anything is stored
        owner = None
        if any(m.id == mid for m in chat_context.get()):
            owner = f"this chat ({session.thread_id})"
        else:
            found = await self.stored_owner(mid)
            if found is not None:
                owner = f"thread {found.thread_id} (user {found.user!r}, a {found.type})"
        if owner is None:
            return None
        logger.warning(
            "socket: client_message refused: id %s is already a message of %s; sent by user %r in thread %s; "
            "nothing stored or moved",
            mid[:40],
            owner,
            _who(session),
            session.thread_id,
        )
        return t("message.id_taken", self.lang(), id=mid[:40])

    async def new_chat_refusal(self, session: WebsocketSession, text: str) -> str | None:
        """Why a new chat may not start (its first message ``text``, quoted): the history's backlog past its bound
        (open chats go on), or the account at [login] max_chats_per_account. None: it may."""
        full = self.backlog()
        if full is not None:
            logger.warning(
                "socket: a new chat refused: %d history writes waiting (user %r)", full.writes, _who(session)
            )
            cause = cause_text(full, self.lang())
            return t("history.new_chat_refused", self.lang(), count=full.writes, cause=cause, text=text)
        count = await self.chats_kept(session)
        if count is None or count < self.chat_cap:
            return None
        logger.warning(
            "socket: a new chat refused: user %r keeps %d chats, the cap is %d ([login] max_chats_per_account)",
            _who(session),
            count,
            self.chat_cap,
        )
        return t("chatcap.refused", self.lang(), count=count, limit=self.chat_cap, text=text)

    async def chats_kept(self, session: WebsocketSession) -> int | None:
        """The chats the signed-in account keeps (stored or pending, ``datalayer.chats_of``); None when there is no
        cap, no account or no history, or when the history does not answer in time (``asked``): the chat then
        starts (logged), its writes wait in the outbox, whose own bound holds, and the cap is checked again at the
        next new chat."""
        chats_of = getattr(get_data_layer(), "chats_of", None)
        if self.chat_cap <= 0 or session.user is None or chats_of is None:
            return None
        who = session.user.identifier
        count = await asked(lambda: chats_of(who), f"the chats of user {who!r}", while_behind=True)
        return None if count is None else int(count)

    async def stored_owner(self, mid: str) -> Any:
        """The stored step with id ``mid`` (``datalayer.StepOwner``), None when there is none, no history, or the
        history does not answer in time (``asked``): the message goes on, and the data layer makes the same check
        before it writes and refuses to move another chat's step."""
        step_owner = getattr(get_data_layer(), "step_owner", None)
        return None if step_owner is None else await asked(lambda: step_owner(mid), f"message id {mid[:40]}")

    async def resumed(self, session: WebsocketSession, timeout: float = RESUME_WAIT_S) -> None:
        """Wait (at most ``timeout``) until a chat this process is resuming from the history is resumed.

        A UI process that restarted (issue #20) gets the page's socket back with its thread id: Chainlit resumes the
        chat in ``connection_successful``, after it has told the page that nothing runs (the page's Stop button goes,
        so the user may type), and a message the page kept while it was away comes even before. Answered at once,
        it would go without the chat's earlier turns, and the resume would then replace the session's state under
        it. A thread that cannot be resumed (deleted meanwhile) costs its first message ``timeout``."""
        if not session.thread_id_to_resume or self.chat_session().resumed:
            return
        deadline = time.monotonic() + timeout
        while not self.chat_session().resumed:
            if time.monotonic() > deadline:
                logger.warning(
                    "socket: thread %s not resumed after %.0f s: the message goes on", session.thread_id, timeout
                )
                return
            await asyncio.sleep(0.05)

    async def client_message(self, original: Handler, sid: str, payload: Any) -> None:
        session = WebsocketSession.require(sid)
        init_ws_context(session)
        await self.resumed(session)
        message = payload.get("message") if isinstance(payload, dict) else None
        if not isinstance(message, dict):
            logger.warning("socket: client_message without a message refused (user %r)", _who(session))
            return
        refused = await self.refusal(session, message)
        if refused is not None:
            await show_error(refused)
            return
        state = self.chat_session()
        if state.answering:
            logger.info("socket: a message while this chat is answering refused (user %r)", _who(session))
            await show_error(t("busy", self.lang(), text=quoted(str(message.get("output") or ""))))
            return
        as_picked(message)
        command = message.get("command") in BY_ID
        claim = await self.claimed(str(message.get("output") or ""), command)
        if claim is None:
            return
        cleaned(message)
        if command:  # marked as a command in its first write: the history never sends it to the model
            metadata = message.get("metadata")
            message["metadata"] = {
                **(metadata if isinstance(metadata, dict) else {}),
                **command_metadata(message["command"]),
            }
        state.answering = True  # until the task Chainlit starts for it ends (no await in between: no race)
        state.ahead = claim.ahead  # the engine priority of its requests

        def ended(_task: object = None) -> None:
            state.answering = False
            claim.release()

        try:
            await original(sid, payload)
        finally:
            task = session.current_task
            if task is None or task.done():
                ended()
            else:  # the task's end, whichever: done, error, Stop (cancelled), the browser gone
                task.add_done_callback(ended)

    async def edit_message(self, original: Handler, sid: str, payload: Any) -> None:
        session = WebsocketSession.require(sid)
        init_ws_context(session)
        message = payload.get("message") if isinstance(payload, dict) else None
        mid, text = (message.get("id"), message.get("output")) if isinstance(message, dict) else (None, None)
        own = [m for m in chat_context.get() if m.id == mid and m.type == USER_MESSAGE]
        if not own or not isinstance(text, str):
            logger.warning(
                "socket: edit_message refused: %r is none of this chat's user messages (user %r, thread %s)",
                str(mid)[:40],
                _who(session),
                session.thread_id,
            )
            await show_error(t("message.edit_refused", self.lang(), id=str(mid)[:40]))
            return
        state = self.chat_session()
        if state.answering:
            logger.info("socket: an edit while this chat is answering refused (user %r)", _who(session))
            await show_error(t("busy", self.lang(), text=quoted(text)))
            return
        claim = await self.claimed(text)
        if claim is None:
            return
        state.answering = True  # Chainlit answers an edit inline, in this handler
        state.ahead = claim.ahead
        try:
            with claim:
                await original(sid, payload)
        finally:
            state.answering = False


def install(
    chat_session: Callable[[], ChatSession],
    lang: Callable[[], str],
    claim: Claimer,
    backlog: Callable[[], Backlog | None] = lambda: None,
    chat_cap: int = 0,
) -> None:
    """Put the guards in front of Chainlit's own handlers (again by a later installation: around Chainlit's, not
    around an earlier guard)."""
    guard = Guard(chat_session, lang, claim, backlog, chat_cap)
    handlers = sio.handlers.setdefault(NAMESPACE, {})
    for event, method in (("client_message", guard.client_message), ("edit_message", guard.edit_message)):
        current = handlers[event]
        handlers[event] = _wrapped(method, getattr(current, "chainlit_handler", current))


def _wrapped(method: Callable[[Handler, str, Any], Awaitable[None]], original: Handler) -> Handler:
    async def handler(sid: str, payload: Any) -> None:  # a coroutine function: python-socketio awaits it
        await method(original, sid, payload)

    handler.chainlit_handler = original  # type: ignore[attr-defined]
    return handler

"""A browser back after a network cut gets what it missed (issue #20, "Wi-Fi blips lose nothing").

Chainlit 2.12's socket.io client reconnects to the same session (same session id; ``restore_existing_session`` gives
the session the new socket), but what the server emitted while the socket was down went nowhere: an answer that
ended meanwhile stayed cut on screen, with no footer, and the tokens of the gap were missing from one still
streaming. Here, once per process:

- every event Chainlit emits to a session also goes into that session's ``Journal`` (backend/chat/replay.py);
- the ``disconnect`` handler notes when the server saw the socket close;
- once the session is on its new socket (``WebsocketSession.restore``), what the journal keeps is held back until
  the replay (replay.py says why);
- on the reconnected browser's ``connection_successful``, the journal's replay is sent (each message, step, button
  and element changed since shortly before the cut, whole), and the browser's "answering" state (the Stop button)
  is set from whether the session's task still runs. Chainlit's own handler is not run for a session that had its
  first message: it would end the task on screen and, for a chat resumed from the history, open that thread again
  from the database (replacing the session's state, the answer under way included).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from chainlit.context import init_ws_context
from chainlit.emitter import ChainlitEmitter
from chainlit.server import sio
from chainlit.session import WebsocketSession

from backend.chat.replay import Journal

logger = logging.getLogger(__name__)

NAMESPACE = "/"
SLACK = 5.0  # seconds added to the ping's window
JOURNALS: weakref.WeakKeyDictionary[Any, Journal] = weakref.WeakKeyDictionary()
Emit = Callable[[str, Any], Any]


def window() -> float:
    """How long before a cut emitted events may be lost: until engine.io's ping finds a socket that went silent."""
    return float(sio.eio.ping_interval) + float(sio.eio.ping_timeout) + SLACK


def journal_of(session: Any) -> Journal:
    journal = JOURNALS.get(session)
    if journal is None:
        journal = JOURNALS[session] = Journal(window())
    return journal


def _journaled_emit(emitter: ChainlitEmitter) -> Emit:
    """ChainlitEmitter.emit, patched: the session's emit, each event also kept in the session's journal."""
    send: Emit = emitter._get_session_property("emit")
    journal = journal_of(emitter.session)

    def emit(event: str, data: Any) -> Any:
        if journal.holds(journal.record(event, data)):
            return _held()
        return send(event, data)

    return emit


async def _held() -> None:
    """What an emit held back for the replay returns (Chainlit awaits what an emit returns)."""


def _restoring(original: Callable[..., Any]) -> Callable[..., Any]:
    """WebsocketSession.restore, patched: the session's journal holds back what the replay will carry."""

    @functools.wraps(original)
    def restore(session: WebsocketSession, *args: Any, **kwargs: Any) -> Any:
        journal_of(session).hold()
        return original(session, *args, **kwargs)

    restore.chainlit_restore = original  # type: ignore[attr-defined]
    return restore


async def disconnect(original: Callable[[str], Awaitable[Any]], sid: str) -> None:
    session = WebsocketSession.get(sid)
    if session is not None:
        journal_of(session).disconnected()
    await original(sid)


async def connection_successful(
    original: Callable[[str], Awaitable[Any]], sid: str, *, on_back: Callable[[], Awaitable[None]]
) -> None:
    session = WebsocketSession.get(sid)
    if session is None or not session.restored:  # a new session: Chainlit opens the chat
        await original(sid)
        return
    if session.has_first_interaction:
        context = init_ws_context(session)
        await context.emitter.clear("clear_ask")
        await context.emitter.clear("clear_call_fn")
    else:  # back before the first message: Chainlit starts the chat if it had not started yet
        await original(sid)
    sent = 0
    for event, data in journal_of(session).replay():  # each taken just before it is sent (replay.py)
        await session.emit(event, data)  # not through the emitter: already in the journal
        sent += 1
    task = session.current_task
    running = task is not None and not task.done()
    await (session.emit("task_start", {}) if running else session.emit("task_end", {}))
    await on_back()
    logger.info(
        "socket: session %s back on a new socket: %d event(s) sent again, %s",
        session.id[:8],
        sent,
        "an answer still running" if running else "nothing running",
    )


def install(on_back: Callable[[], Awaitable[None]]) -> None:
    """The journal on every session's emits and restores, and the two handlers (again by a later installation: around
    Chainlit's own handlers, not around an earlier wrapper). ``on_back``: the app's own work when a session is
    back (chat.on_reconnect), run in the session's context after the replay."""
    ChainlitEmitter.emit = property(_journaled_emit)  # type: ignore[assignment,method-assign]
    restore = WebsocketSession.restore
    WebsocketSession.restore = _restoring(getattr(restore, "chainlit_restore", restore))  # type: ignore[method-assign]
    handlers = sio.handlers.setdefault(NAMESPACE, {})
    back = functools.partial(connection_successful, on_back=on_back)
    for event, method in (("disconnect", disconnect), ("connection_successful", back)):
        current = handlers[event]
        handlers[event] = _wrapped(method, getattr(current, "chainlit_handler", current))


def _wrapped(method: Callable[..., Awaitable[None]], original: Any) -> Any:
    # One argument, like Chainlit's: python-socketio calls a disconnect handler that refuses (sid, reason) again
    # with the socket id alone.
    async def handler(sid: str) -> None:
        await method(original, sid)

    handler.chainlit_handler = original  # type: ignore[attr-defined]
    return handler

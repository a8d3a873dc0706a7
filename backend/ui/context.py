"""One installation of the UI (``Ui``): the Service it runs against and what it opened at start, passed to every
handler (the handlers live in chat.py, panel.py, answering.py, commands.py, compare_chat.py and login.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

import chainlit as cl

from backend.chat.client import new_request_id
from backend.chat.fairshare import FairShare
from backend.chat.reading import Reader
from backend.chat.service import Service
from backend.chat.session import ChatSession
from backend.settings import Settings
from backend.storage import preferences
from backend.storage.files import FileStore
from backend.storage.history import HistoryStart
from backend.storage.outbox import Backlog, Outbox
from backend.storage.preferences import Preferences
from backend.text import t
from backend.ui.views import show_error

if TYPE_CHECKING:
    from backend.ui.routes import Routes

logger = logging.getLogger(__name__)

SESSION_KEY = "chat_session"  # the ChatSession; history.META_KEY stays a plain dict beside it (see panel.remember)

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Ui:
    """The UI as installed against one Service (``installation.install``): every handler gets it first."""

    service: Service
    history: HistoryStart  # [login].enable: the history database, or why it is off
    prefs: Preferences  # remembered settings per user or browser
    files_directory: Path  # this process's own folder for uploads and /export files
    routes: Routes  # our HTTP routes, bound to ``service``
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # started at app startup, kept referenced
    outbox: Outbox | None = None  # with the history on: every history write's one path (backend/storage/outbox.py)
    files: FileStore | None = None  # [uploads] keep_originals with the history on: the originals (storage/files.py)
    fair: FairShare = field(init=False)  # answers streaming per user, over all chats ([ui] max_answers_per_user)
    reader: Reader = field(init=False)  # converts attached files, [uploads] workers at once (backend/chat/reading.py)

    def __post_init__(self) -> None:
        self.fair = FairShare(self.settings.ui.max_answers_per_user)
        self.reader = Reader(self.settings.uploads)

    @property
    def settings(self) -> Settings:
        return self.service.settings

    def backlog_past_max(self) -> Backlog | None:
        """The history writes waiting, when more than [history] pending_max (new chats are refused); else None."""
        return self.outbox.state() if self.outbox is not None and self.outbox.full else None

    def lang(self) -> str:
        """The language of this chat's text: [ui].language, else the browser's."""
        if self.settings.ui.language != "auto":
            return self.settings.ui.language
        return getattr(cl.context.session, "language", None) or "en"

    def chat(self) -> ChatSession:
        """This chat's state, one object under one key of Chainlit's user_session."""
        state = cl.user_session.get(SESSION_KEY)
        if not isinstance(state, ChatSession):  # a resumed thread's copy of user_session holds None here
            state = ChatSession(
                system_prompt=self.settings.model.system_prompt, sampling=self.service.default_sampling()
            )
            cl.user_session.set(SESSION_KEY, state)
        return state


def preference_key() -> str | None:
    """Whose remembered settings: the signed-in user's, else this browser's cookie."""
    session = cl.context.session
    return preferences.preference_key(
        session.user.identifier if session.user else None, (session.environ or {}).get("HTTP_COOKIE")
    )


def account() -> str | None:
    """The signed-in account's name (None with login off): whom the roles check (Service.require_operator)."""
    session = cl.context.session
    return str(session.user.identifier) if session.user else None


def answerer() -> str:
    """Whose answers count together for the fair share: the signed-in user, else this browser (its cookie), else
    the address the socket came from (a script without the cookie)."""
    session = cl.context.session
    environ = session.environ or {}
    return preference_key() or f"address:{environ.get('REMOTE_ADDR') or session.id}"


def guarded(handler: Callable[Concatenate[Ui, P], Awaitable[None]]) -> Callable[Concatenate[Ui, P], Awaitable[None]]:
    """An exception escaping a Chainlit handler is invisible in the UI: log it, say so, with an id."""

    @functools.wraps(handler)
    async def run(ui: Ui, /, *args: P.args, **kwargs: P.kwargs) -> None:
        try:
            await handler(ui, *args, **kwargs)
        except Exception:  # the last line of defence; CancelledError (Stop) passes
            rid = new_request_id()
            logger.exception("[%s] unexpected failure in %s", rid, handler.__name__)
            with contextlib.suppress(Exception):
                await show_error(t("app_error", ui.lang(), rid=rid))

    return run


def bound(ui: Ui, handler: Callable[Concatenate[Ui, P], Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``handler`` with ``ui`` given, for Chainlit's registration (it passes arguments by the remaining names)."""
    return functools.partial(handler, ui)

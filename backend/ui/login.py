"""[login].enable in Chainlit: the password callback, the history as Chainlit's data layer (SQLite or PostgreSQL,
behind backend/storage/datalayer.py's guard), and who may view a shared chat. With login off, none is set (an
earlier installation's are taken out)."""

from __future__ import annotations

import logging
from typing import cast

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.data.base import BaseDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.types import ThreadDict

from backend.storage import share
from backend.storage.datalayer import GuardedDataLayer
from backend.ui.context import Ui
from backend.web import security
from backend.web.login import verify_login

logger = logging.getLogger(__name__)


async def login(ui: Ui, username: str, password: str) -> cl.User | None:
    # One PBKDF2 (~0.25 s) per attempt, on the login's own threads: not on the event loop, and not in the
    # default pool where token counting runs, so open chats do not stall.
    if await verify_login(ui.settings, username, password):
        return cl.User(identifier=username, metadata={"provider": "credentials"})
    logger.warning("login refused: %s", security.login_refused_note(ui.settings, username))
    return None


class ChainlitHistory(GuardedDataLayer):
    """Chainlit's deferral kept: the step writes of a chat wait for its first user message (an opened, unused chat
    leaves no thread), as Chainlit's own layer does; flushed, they take our write path (``GuardedDataLayer``), where
    the inner layer's own deferral is skipped."""

    create_step = queue_until_user_message()(GuardedDataLayer.create_step)
    update_step = queue_until_user_message()(GuardedDataLayer.update_step)
    delete_step = queue_until_user_message()(GuardedDataLayer.delete_step)


def data_layer(ui: Ui) -> GuardedDataLayer:
    """Thread ids checked (UUIDs only), stored text sanitised, SQLite in WAL, no prompt text in SQL errors; a step
    never moves to another thread; the answers it stores are signed (export-feedback checks); every write through
    ``ui.outbox`` (journalled, retried, in order per chat); a chat deleted takes its kept files (``ui.files``)."""
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    assert ui.history.db is not None and ui.history.url is not None
    inner = SQLAlchemyDataLayer(ui.history.url, connect_args=ui.history.db.connect_args)
    return ChainlitHistory(inner, answer_key=ui.history.answer_key, outbox=ui.outbox, files=ui.files)


async def on_shared_thread_view(thread: ThreadDict, viewer: cl.User | None) -> bool:
    """Chainlit asks this for a non-owner; our route has already checked the same."""
    return viewer is not None and share.is_shared(thread)


def install(ui: Ui) -> None:
    """The login and history callbacks for ``ui``'s settings (HistoryStart.url: the history is on)."""
    code = chainlit_config.code
    code.data_layer = code.password_auth_callback = code.on_shared_thread_view = None
    if ui.history.url:
        layer = data_layer(ui)  # now, not at Chainlit's first use: the outbox replays through it at start
        cl.data_layer(lambda: cast(BaseDataLayer, layer))  # a wrapper, not a subclass
        cl.on_shared_thread_view(on_shared_thread_view)
    if ui.settings.login.enable:

        async def password_login(username: str, password: str) -> cl.User | None:
            return await login(ui, username, password)

        cl.password_auth_callback(password_login)

"""``install(service)``: the UI against one Service, in Chainlit's process-wide registries (its callbacks on
``config.code``, our routes on its server, the socket guards). A later installation (tests build one per
module) replaces every registration of an earlier one."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import chainlit as cl
from chainlit.server import app as http_app

from backend.chat.service import Service
from backend.storage import history, preferences
from backend.storage.files import file_store
from backend.storage.outbox import Outbox
from backend.storage.votes import Vote
from backend.ui import (
    answering,
    attachments,
    chainlit_patches,
    chainlit_settings,
    chat,
    compare_chat,
    login,
    server,
)
from backend.ui.context import Ui, bound
from backend.ui.routes import Routes, install_routes


def install(service: Service) -> Ui:
    """Open what the UI keeps (history, preferences, files folder) and register its handlers with Chainlit."""
    settings = service.settings
    # Sets CHAINLIT_AUTH_SECRET: Chainlit reads it only after importing app.py (which calls this). With [login].enable
    # the history is in SQLite or PostgreSQL ([history].db); one that cannot be reached leaves login on, history
    # off.
    started = history.open_history(settings)
    prefs = preferences.open_preferences(settings)  # SQLite or PG; an old ui-preferences.json is imported once
    routes = Routes(service, sharing=bool(started.url))
    ui = Ui(service, started, prefs, server.own_files_directory(), routes)
    if started.url:  # every history write through one path: journalled, retried, in order per chat
        ui.outbox = routes.outbox = history_outbox(ui)
        ui.files = routes.files = file_store(settings)  # deleted with their chat: the data layer (login.py) has it
    login.install(ui)
    install_routes(http_app, routes)
    chainlit_settings.apply(settings, sharing=bool(started.url), http_app=http_app)
    # Every Chainlit patch, after checking it is the Chainlit they were written for (chainlit_patches.py).
    claim = functools.partial(answering.claim_answers, ui)
    chainlit_patches.apply_in_app(settings, ui.chat, ui.lang, claim, bound(ui, chat.on_reconnect), ui.backlog_past_max)

    cl.on_app_startup(bound(ui, server.on_app_startup))
    cl.set_starters(bound(ui, chat.set_starters))
    cl.on_chat_start(bound(ui, chat.on_chat_start))
    cl.on_chat_resume(bound(ui, chat.on_chat_resume))
    cl.on_chat_end(bound(ui, chat.on_chat_end))
    cl.on_settings_update(bound(ui, chat.on_settings_update))
    cl.on_message(bound(ui, chat.on_message))
    cl.action_callback("retry")(bound(ui, answering.on_retry))
    cl.action_callback("send_trimmed")(bound(ui, answering.on_send_trimmed))
    cl.action_callback("send_cut")(bound(ui, attachments.on_send_cut))
    cl.action_callback("compare_vote")(bound(ui, compare_chat.on_compare_vote))
    cl.action_callback("compare_pick")(bound(ui, compare_chat.on_compare_pick))
    return ui


def history_outbox(ui: Ui) -> Outbox:
    """The outbox of this process, its journal in [logging].dir beside the history's other local files; votes are
    one of its operations, remembered settings another (the data layer registers the rest)."""
    settings = ui.settings
    box = Outbox(settings.logging.resolved_dir, pending_max=settings.history.pending_max)

    async def record_vote(args: dict[str, Any]) -> None:
        await asyncio.to_thread(ui.service.votes.record, Vote(**args))

    box.register("vote", record_vote)
    ui.prefs.through(box)
    return box

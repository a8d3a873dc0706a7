"""A chat's life in Chainlit's callbacks: start, resume, end, a settings change, a message, and the welcome
screen's starters (backend/chat/welcome.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import chainlit as cl
from chainlit.types import ThreadDict

from backend.chat import service as chat_service
from backend.chat import welcome
from backend.storage import history, preferences
from backend.text import pick_language, t
from backend.ui import attachments
from backend.ui.answering import answer
from backend.ui.commands import BY_ID, mark_command, name_bare_command, run_command, send_commands, typed_command
from backend.ui.compare_chat import choose_compare
from backend.ui.context import Ui, guarded, preference_key
from backend.ui.panel import (
    choose_model,
    ensure_watcher,
    remember,
    restore,
    send_settings,
    settings_state,
)
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


async def open_chat(ui: Ui) -> str:
    # Each session's files (an /export, uploads) go under this process's own folder (server.own_files_directory);
    # made again should something have removed it since (a temp-folder cleaner), or a file could not be attached.
    ui.files_directory.mkdir(parents=True, exist_ok=True)
    await ui.service.start()
    told = await send_settings(ui)
    await send_commands(ui)
    ensure_watcher(ui)
    return told


async def on_chat_start(ui: Ui) -> None:
    ui.chat()
    restore(ui, await ui.prefs.recall(preference_key()))
    told = await open_chat(ui)
    lang = ui.lang()
    for name, reason in ui.service.excluded_adapters().items():
        await show_error(t("excluded_adapter", lang, name=name, reason=reason))
    for note in ui.service.partial_adapters(lang, skip=told):  # a fleet: adapters some ready replicas lack
        await show_error(note)
    if ui.history.off_reason:  # login on, but the history database was not there at start (ui.log says why)
        await cl.Message(content=t("history_off", lang), author="history").send()


async def on_chat_resume(ui: Ui, thread: ThreadDict) -> None:
    """A chat reopened from the history: its turns (raw text, no footers) and its settings."""
    conv = history.conversation_from_thread(thread)
    ui.chat().conversation = conv
    restore(ui, history.state_from_thread(thread, conv))
    ui.chat().resumed = True  # a message that came meanwhile may go now (socket_guard.Guard.resumed)
    await open_chat(ui)


async def on_chat_end(ui: Ui) -> None:
    chat = ui.chat()
    chat.connected = False  # a chat start still running must not start the watcher now
    if chat.watcher is not None:
        chat.watcher.cancel()  # a reconnect restarts it (ensure_watcher)
    # Chainlit now writes user_session into the thread, where the ChatSession becomes None: this way a
    # chat whose settings were never remembered (no answer, no change yet) still resumes with them.
    if not isinstance(cl.user_session.get(history.META_KEY), dict):
        cl.user_session.set(history.META_KEY, settings_state(ui))


@guarded
async def on_reconnect(ui: Ui) -> None:
    """The same session back on a new socket after a network cut (reconnect.py): the model-list watcher that the
    disconnect's on_chat_end stopped runs again, and a model list that changed meanwhile reaches the panel."""
    ensure_watcher(ui, from_browser=True)
    if ui.service.poller.status.version != ui.chat().models_version:
        await send_settings(ui)


@guarded
async def on_settings_update(ui: Ui, values: dict[str, Any]) -> None:
    # Chainlit runs this in its socket handler: make it the task Stop cancels (an adapter load can take a while).
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher(ui, from_browser=True)
    chat = ui.chat()
    chat.sampling = chat_service.sampling_from(values, ui.service.default_sampling())
    try:
        preferences.check_system_prompt(values.get("system_prompt") or "")
        chat.system_prompt = values.get("system_prompt") or ""
    except preferences.SystemPromptRefused as exc:  # the previous prompt stays; the panel shows it again
        await show_error(exc.user_text(ui.lang()))
        await send_settings(ui)
    model = values.get("model")
    if model and model != chat.model:
        await choose_model(ui, model)
    await choose_compare(ui, values.get("compare"))
    await remember(ui)


@guarded
async def on_message(ui: Ui, message: cl.Message) -> None:
    # Chainlit runs an edited message inline in its socket handler, not as the task Stop cancels.
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher(ui, from_browser=True)
    if ui.service.poller.status.version != ui.chat().models_version:  # missed while disconnected
        await send_settings(ui)
    text = message.content or ""
    command = getattr(message, "command", None)
    if not isinstance(command, str) or command not in BY_ID:
        # Typed out in full ("/unload pirate"): the socket guard already turned a new message into the picked form;
        # an edited message comes here as typed.
        typed = typed_command(text) if command is None else None
        command, text = typed if typed else (None, text)
    if command is not None:
        await mark_command(message, command)
        await name_bare_command(ui, message)
        await run_command(ui, command, text)
        return
    uploads = attachments.uploads_of(message)  # files attached in the composer
    if not text.strip() and not uploads:
        await show_error(t("empty_message", ui.lang()))
        return
    picked = (getattr(message, "modes", None) or {}).get("model")
    if picked and picked != ui.chat().mode_shown:  # changed in the composer picker
        await choose_model(ui, picked)
    if not await starter_chosen(ui, text, getattr(message, "command", None)):  # a starter picks its model first
        return
    docs = await attachments.read_documents(ui, message, uploads) if uploads else ()
    if docs is None:  # refused, said with the text kept
        return
    ui.chat().conversation.add_user(message.id, text, docs or None)
    await answer(ui)


async def set_starters(ui: Ui, user: cl.User | None = None, language: str | None = None) -> list[cl.Starter]:
    """The welcome screen: each adapter's starters (backend/chat/welcome.py), in the browser's language."""
    app = ui.service
    shown = app.settings.ui.language if app.settings.ui.language != "auto" else pick_language(language)
    status = app.poller.status
    served = [m.id for m in status.models] + [a.name for a in await app.local_adapters(status)]
    # command = the model: the message then says it came from a starter (welcome.starter_model)
    return [
        cl.Starter(label=s.label, message=s.message, command=s.model)
        for s in welcome.starters(app.settings, served, shown)
    ]


async def log_unserved_starters(ui: Ui) -> None:
    """Once the engine lists its models: a warning per starter whose model is not served."""
    app = ui.service
    async with app.poller.subscribe() as changes:
        async for status in changes:
            if status.models:
                loadable = [a.name for a in await app.local_adapters(status)]
                for name in welcome.unserved(app.settings, [m.id for m in status.models], loadable):
                    logger.warning(
                        "[lora.starters] names %r, which the engine does not serve (served: %s): its starters "
                        "say so when clicked; serve it under [lora] modules or remove its starters",
                        name,
                        ", ".join(m.id for m in status.models),
                    )
                return


async def starter_chosen(ui: Ui, text: str, command: str | None) -> bool:
    """The first message of a chat, sent by a starter: choose its model. False: not sent (not served)."""
    app, chat = ui.service, ui.chat()
    if chat.conversation.turns:
        return True
    model = welcome.starter_model(app.settings, text, command)
    if model is None or model == chat.model:
        return True
    status = app.poller.status
    served = [m.id for m in status.models]
    if model not in served and model not in [a.name for a in await app.local_adapters(status)]:
        await show_error(t("welcome.starter_unserved", ui.lang(), name=model, served=", ".join(served) or "-"))
        return False
    await choose_model(ui, model)
    return True

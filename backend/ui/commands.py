"""The composer's commands (panel.send_commands lists them): /adapters (with owner/name[@revision]: add one from the
hub), /unload NAME, /export, and compare's (compare_chat.py); a command message is marked as one in the history."""

from __future__ import annotations

import logging
from datetime import datetime

import chainlit as cl

from backend import hub
from backend.chat import export as chat_export
from backend.chat import history
from backend.errors import QwenChatError
from backend.text import t
from backend.ui.compare_chat import run_compare_command
from backend.ui.compare_view import COMPARE_COMMANDS
from backend.ui.context import Ui
from backend.ui.panel import chat_view, send_settings
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


async def run_command(ui: Ui, command: str, text: str) -> None:
    if command in COMPARE_COMMANDS:
        await run_compare_command(ui, command, text)
        return
    app, lang = ui.service, ui.lang()
    status = app.poller.status
    if command == "export":
        await run_export(ui)
        return
    if command == "adapters":
        if text.strip():
            await add_hub_adapter(ui, text)
            return
        await cl.Message(content=app.adapters_overview(status, await app.local_adapters(status), lang)).send()
        return
    name = text.strip().strip("`")
    try:
        await app.unload(name, status)
    except QwenChatError as exc:
        await show_error(exc.user_text(lang))
        return
    chat = ui.chat()
    if chat.model == name:
        chat.model = app.default_model(app.poller.status)
    await cl.Message(content=t("unloaded", lang, name=name, model=chat.model)).send()
    await send_settings(ui)


async def add_hub_adapter(ui: Ui, text: str) -> None:
    """/adapters owner/name[@revision]: the adapter downloaded (a step shows the progress), checked by the doctor and
    loaded; this chat answers from it from now on. Anything that goes wrong is one message (Service.add_hub_adapter)."""
    app, lang, chat = ui.service, ui.lang(), ui.chat()
    shown = text.strip().strip("`")
    said = [-1]
    try:
        async with chat_view(ui).step(t("adapter_hub.downloading", lang, id=shown)) as step:

            async def progress(done: int, total: int, rate: int) -> None:
                percent = done * 100 // total if total else 0
                if percent == said[0]:
                    return
                said[0] = percent
                size_done, size_total = hub.bytes_of(done, total)
                step.output = t(
                    "adapter_hub.progress",
                    lang,
                    percent=percent,
                    done=size_done,
                    total=size_total,
                    rate=hub.human_bytes(rate),
                )
                await step.update()

            name, loaded = await app.add_hub_adapter(text, progress)
            if loaded is not None and loaded.evicted:
                step.output = t("adapter_evicted", lang, name=name, evicted=loaded.evicted)
    except QwenChatError as exc:
        await show_error(exc.user_text(lang))
        return
    chat.model = name
    await cl.Message(content=t("adapter_hub.added", lang, name=name, id=shown)).send()
    await send_settings(ui)


async def run_export(ui: Ui) -> None:
    """/export: this chat as a Markdown file with the model of each answer (compared pairs with both sides)."""
    chat, lang = ui.chat(), ui.lang()
    if not chat.conversation.turns:
        await cl.Message(content=t("export.empty", lang)).send()
        return
    pairs = getattr(cl.user_session.get("compare"), "pairs", None) or {}  # compare mode's, when it is on
    now = datetime.now()
    text = chat_export.conversation_markdown(
        chat.conversation, lang, system_prompt=chat.system_prompt, pairs=pairs, now=now
    )
    file = cl.File(name=chat_export.export_filename(now), content=text.encode("utf-8"), mime="text/markdown")
    done = t("export.done", lang, turns=len(chat.conversation.turns))
    await cl.Message(content=done, elements=[file]).send()


async def name_bare_command(ui: Ui, message: cl.Message) -> None:
    """A chat opened with a bare command ("/compare") would keep the browser's Stop button hidden for good:
    Chainlit announces the first interaction with the message text, here empty, and the page shows Stop only
    once that is non-empty. Announce it with the command's name instead."""
    if (message.content or "").strip() or ui.chat().conversation.turns or cl.user_session.get("named"):
        return
    cl.user_session.set("named", True)
    session = cl.context.session
    await cl.context.emitter.emit(
        "first_interaction", {"interaction": f"/{message.command}", "thread_id": session.thread_id}
    )


async def mark_command(message: cl.Message, command: str) -> None:
    """Tag the stored message as a command, so a resumed chat does not send "/unload x" as "x"."""
    message.metadata = {**(message.metadata or {}), **history.command_metadata(command)}
    try:
        await message.update()
    except Exception:  # the command still runs; only a resume would show it
        logger.exception("could not mark the /%s message as a command", command)

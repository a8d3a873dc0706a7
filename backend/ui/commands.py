"""The composer's commands, one table (``REGISTRY``): Chainlit's command menu, the dispatch and the socket guard's
"starts no answer" all derive from it. A new command is one entry plus its ``cmd_<id>`` key in each catalog.

A command runs the same whether it was picked from Chainlit's menu (``message.command``) or typed out in full
(``/unload pirate``, ``/compare off``): Chainlit's menu closes at the first space and then sends the whole text as
an ordinary message, so ``typed_command`` recognises a first word that names a registered command. An unknown
``/word`` still goes to the model: paths and code start with ``/`` too. A command message is marked as one in the
history, so a resumed chat never sends it to the model."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import chainlit as cl

from backend import hub
from backend.chat import export as chat_export
from backend.errors import QwenChatError
from backend.storage import history
from backend.text import t
from backend.ui import compare_chat
from backend.ui.context import Ui, account
from backend.ui.panel import chat_view, send_settings
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


Runner = Callable[[Ui, str], Awaitable[None]]


@dataclass(frozen=True)
class Command:
    """One composer command: its id (what follows the ``/``), Chainlit's icon name, what runs it with the text
    after the command, and who may run it: ``operator``, an ``operator.action.*`` key, makes it operators' only
    (checked again in the service layer). Its menu description is the catalog's ``cmd_<id>``."""

    id: str
    icon: str
    run: Runner
    operator: str = ""

    def menu_entry(self, lang: str) -> dict[str, Any]:
        return {"id": self.id, "description": t(f"cmd_{self.id}", lang), "icon": self.icon, "button": False}


async def run_adapters(ui: Ui, text: str) -> None:
    """/adapters lists the base model and the adapters; /adapters owner/name[@revision] adds one from the hub."""
    if text.strip():
        await add_hub_adapter(ui, text)
        return
    app = ui.service
    status = app.poller.status
    await cl.Message(content=app.adapters_overview(status, await app.local_adapters(status), ui.lang())).send()


async def run_unload(ui: Ui, text: str) -> None:
    """/unload NAME frees a runtime adapter's slot; a chat that used it goes back to the default model."""
    app, lang = ui.service, ui.lang()
    name = text.strip().strip("`")
    try:
        await app.unload(name, app.poller.status, who=account())
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

            async def queued(position: int) -> None:
                step.output = t("download.queued", lang, position=position)
                await step.update()

            name, loaded = await app.add_hub_adapter(text, progress, queued, who=account())
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


async def run_status(ui: Ui, _text: str) -> None:
    """/status (operators): the engine and replicas, adapters and slots, the queue, answers per account, downloads,
    disk free."""
    report = await ui.service.operator_report(who=account(), answering=ui.fair.by_user(), lang=ui.lang())
    await cl.Message(content=report).send()


REGISTRY: tuple[Command, ...] = (
    Command("adapters", "layers", run_adapters),
    Command("unload", "circle-minus", run_unload, operator="unload"),
    Command("status", "activity", run_status, operator="engine"),
    Command("export", "download", lambda ui, _text: run_export(ui)),
    Command("compare", "columns-2", compare_chat.set_compare),
    Command("leaderboard", "trophy", lambda ui, _text: compare_chat.show_leaderboard(ui)),
    Command("vote", "vote", compare_chat.run_vote),
)
BY_ID = {c.id: c for c in REGISTRY}
_TYPED = re.compile(r"\s*/([A-Za-z][\w-]*)(?:\s+(.*))?\Z", re.DOTALL)


def typed_command(text: str) -> tuple[str, str] | None:
    """``(command id, the rest)`` when ``text``'s first word is ``/`` and a registered command (any case), else None:
    ``"/unload  pirate"`` -> ``("unload", "pirate")``, ``"/usr/bin/env"`` and ``"/nope x"`` -> None."""
    m = _TYPED.match(text)
    if m is None or m.group(1).lower() not in BY_ID:
        return None
    return m.group(1).lower(), (m.group(2) or "").strip()


async def run_command(ui: Ui, command: str, text: str) -> None:
    """Run a command; an operators' one run by anyone else is one line saying who may (OperatorOnly)."""
    entry = BY_ID[command]
    if entry.operator:
        try:
            ui.service.require_operator(account(), entry.operator)
        except QwenChatError as exc:
            await show_error(exc.user_text(ui.lang()))
            return
    await entry.run(ui, text)


async def send_commands(ui: Ui) -> None:
    """Chainlit's command menu in the composer (type ``/``), from the registry."""
    lang = ui.lang()
    mine = [c for c in REGISTRY if not c.operator or ui.service.is_operator(account())]  # users: not the operators'
    await cl.context.emitter.set_commands(cast(Any, [c.menu_entry(lang) for c in mine]))


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

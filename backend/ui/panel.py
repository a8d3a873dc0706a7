"""The settings panel and the composer: the model dropdown (live from the poller) and sampling, the composer's
model picker, the watcher that re-sends them, and the settings a chat remembers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import chainlit as cl
from chainlit.data import get_data_layer
from chainlit.input_widget import Select, Slider, TextInput

from backend.chat import service as chat_service
from backend.chat import turn
from backend.storage import history
from backend.text import t
from backend.ui.compare_view import compare_widget
from backend.ui.context import Ui, preference_key
from backend.ui.views import ChatView, show_error

logger = logging.getLogger(__name__)


class Host:
    """The views' way back into the handlers (views.ViewHost), for one installation."""

    def __init__(self, ui: Ui) -> None:
        self.ui = ui

    def flush_seconds(self) -> float:
        return self.ui.settings.ui.stream_flush_ms / 1000

    def latest_turn_id(self) -> str | None:
        """Buttons name the user turn they belong to, so an older bubble's button is refused (answering.turn_of)."""
        last = self.ui.chat().conversation.last_user()
        return last.id if last else None

    async def send_settings(self) -> None:
        await send_settings(self.ui)


def chat_view(ui: Ui) -> ChatView:
    return ChatView(ui.lang(), Host(ui))


async def send_settings(ui: Ui) -> str:
    """The settings panel: model/adapter dropdown (live from the poller) and sampling.

    One at a time per chat: between setting "model" and sending the composer's modes, a second
    call (the watcher, a choice) would otherwise send the other model as the picker's default.
    """
    async with ui.chat().settings_lock:
        return await _send_settings(ui)


async def _send_settings(ui: Ui) -> str:
    """Returns the chosen model it had to drop because some fleet replicas lack it ("" if none)."""
    app, lang = ui.service, ui.lang()
    state, status = ui.chat(), app.poller.status
    told = ""
    options = chat_service.model_options(status, await app.local_adapters(status), lang, app.adapter_rank)
    if not options:  # no model listed yet (engine loading): Select refuses an empty list
        options = {app.default_model(status): app.default_model(status)}
    chosen = state.model or app.default_model(status)
    if chosen not in options.values():
        if status.models:  # gone from the engine
            told = chosen if status.lacking(chosen) else ""  # a fleet: only some ready replicas serve it
            chosen = app.default_model(status)
        else:  # nothing listed yet (loading): keep a remembered choice
            options[chosen] = chosen
    state.model, state.models_version = chosen, status.version
    sampling = state.sampling
    await cl.ChatSettings(
        [
            Select(
                id="model",
                label=t("model", lang),
                items=options,
                initial_value=chosen,
                description=t("stale", lang) if status.models_stale else t("model_desc", lang),
            ),
            TextInput(id="system_prompt", label=t("system_prompt", lang), initial=state.system_prompt),
            Slider(
                id="temperature",
                label=t("temperature", lang),
                initial=sampling["temperature"],
                min=0,
                max=2,
                step=0.05,
            ),
            Slider(id="top_p", label=t("top_p", lang), initial=sampling["top_p"], min=0.05, max=1, step=0.05),
            Slider(id="top_k", label=t("top_k", lang), initial=sampling["top_k"], min=-1, max=100, step=1),
            Slider(id="min_p", label=t("min_p", lang), initial=sampling["min_p"], min=0, max=1, step=0.01),
            compare_widget(lang),
        ]
    ).send()
    # The same choice as a picker in the composer (Chainlit Modes): visible without opening the panel.
    state.mode_shown = chosen
    await cl.context.emitter.set_modes(
        [
            cl.Mode(
                id="model",
                name=t("model", lang),
                options=[
                    cl.ModeOption(id=model_id, name=label, default=model_id == chosen)
                    for label, model_id in options.items()
                ],
            )
        ]
    )
    if told:  # the chat's model is no longer offered: say why, not just switch
        await show_error(app.partial_reset_text(told, chosen, lang))
    return told


async def watch_models(ui: Ui) -> None:
    """Re-send the dropdown when adapters appear or disappear (the poller's version changes)."""
    async with ui.service.poller.subscribe() as changes:  # leaving it unsubscribes, also when cancelled
        async for status in changes:
            if status.version != ui.chat().models_version:
                try:
                    await send_settings(ui)
                except Exception:  # one failed update must not end the watching
                    logger.exception("could not re-send the model list")


def ensure_watcher(ui: Ui, *, from_browser: bool = False) -> None:
    """Start the model-list watcher, or restart it: Chainlit runs on_chat_end on every disconnect,
    but not on_chat_start when the same session reconnects.

    Not after on_chat_end until the browser acts again (``from_browser``): a browser that left while
    on_chat_start was still running would otherwise leave a watcher no on_chat_end will ever cancel.
    """
    state = ui.chat()
    if from_browser:
        state.connected = True
    if not state.connected:
        return
    if state.watcher is None or state.watcher.done():
        state.watcher = asyncio.create_task(watch_models(ui))


def restore(ui: Ui, state: dict[str, Any]) -> None:
    """Settings from a stored thread or preference; whatever is missing or malformed stays default."""
    chat = ui.chat()
    if isinstance(state.get("model"), str) and state["model"]:
        chat.model = state["model"]
    if isinstance(state.get("sampling"), dict):
        chat.sampling = chat_service.sampling_from(state["sampling"], ui.service.default_sampling())
    if isinstance(state.get("system_prompt"), str):
        chat.system_prompt = state["system_prompt"]


def settings_state(ui: Ui) -> dict[str, Any]:
    chat = ui.chat()
    return history.chat_state(chat.model or "", chat.sampling, chat.system_prompt)


async def remember(ui: Ui) -> None:
    """Keep the settings for this user/browser and in this chat's stored thread (reload, resume)."""
    state = settings_state(ui)
    # Chainlit copies the thread metadata into user_session on resume and writes it back (a shallow
    # merge) on disconnect: keep that copy current, or it overwrites what update_thread stored.
    cl.user_session.set(history.META_KEY, state)
    try:
        await ui.prefs.remember(preference_key(), state)  # through the outbox with the history on: never waits
        layer = get_data_layer()
        if layer and cl.context.session.has_first_interaction:  # the thread exists
            await layer.update_thread(cl.context.session.thread_id, metadata={history.META_KEY: state})
    except Exception:  # a lost preference is not worth a broken chat
        logger.exception("could not remember the chat settings")


async def choose_model(ui: Ui, model: str) -> None:
    """The user picked a model (settings panel or composer); one from [lora].dir loads now."""
    chat = ui.chat()
    chat.model = model
    if model not in {m.id for m in ui.service.poller.status.models}:
        await turn.load_adapter(chat, ui.service, chat_view(ui), model)  # re-sends the settings
    else:  # no "Loading adapter" step for a served one; keep panel and composer in step
        await send_settings(ui)

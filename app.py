"""Chainlit handlers: chat start/resume, settings, message, stop, actions. Logic lives in backend/."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid

import chainlit as cl
from backend.chat.client import Finish, ReasoningDelta, TextDelta, Usage, new_request_id
from backend.chat.health import EngineState
from chainlit.auth import get_current_user
from chainlit.data import get_data_layer
from chainlit.input_widget import Select, Slider, TextInput
from chainlit.server import app as http_app
from fastapi import Depends

from backend.chat import history, login, preferences
from backend.chat import service as ui
from backend.chat.conversation import Conversation
from backend.errors import (
    ConnectionLost,
    ModelNotFound,
    PromptTooLong,
    QwenChatError,
    ServerStarting,
    ServerUnreachable,
)
from backend.i18n import t

logger = logging.getLogger(__name__)
app = ui.Service.from_environment()
# Sets CHAINLIT_AUTH_SECRET: Chainlit checks it only after importing this file.
DB_URL = history.prepare(app.settings)
prefs = preferences.Preferences(app.settings.logging.resolved_dir / preferences.PREFS_FILE)

if DB_URL:  # [ui].auth: login, and history through Chainlit's own data layer
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    @cl.data_layer
    def data_layer() -> SQLAlchemyDataLayer:
        return SQLAlchemyDataLayer(DB_URL)

    @cl.password_auth_callback
    async def login(username: str, password: str) -> cl.User | None:
        if login.check_password(app.settings, username, password):
            return cl.User(identifier=username, metadata={"provider": "credentials"})
        logger.warning("login refused for %r", username)
        return None


@cl.on_app_startup
async def on_app_startup() -> None:
    """Poll the engine from the first second, so the status line is right before anyone chats."""
    await app.start()


async def status_route(user: cl.User | None = Depends(get_current_user)) -> dict:
    """Polled by public/status.js: the engine state line shown at all times.

    With [ui].auth it names models, adapters and failure paths: Chainlit's own dependency answers
    401 without a login (and returns None when login is off).
    """
    await app.start()
    return app.status_json()


http_app.add_api_route("/qwenchat/status", status_route, methods=["GET"])
# Chainlit serves its SPA from a catch-all route; ours must come first.
http_app.router.routes.insert(0, http_app.router.routes.pop())


# Without login, the page sets a browser cookie that the websocket carries: settings survive a reload.
if not any(m.cls is preferences.BrowserCookieMiddleware for m in http_app.user_middleware):
    http_app.add_middleware(preferences.BrowserCookieMiddleware)


def lang() -> str:
    if app.settings.ui.language != "auto":
        return app.settings.ui.language
    return getattr(cl.context.session, "language", None) or "en"


def conversation() -> Conversation:
    conv = cl.user_session.get("conversation")
    if conv is None:
        conv = Conversation()
        cl.user_session.set("conversation", conv)
    return conv


def guarded(handler):
    """An exception escaping a Chainlit handler is invisible in the UI: log it, say so, with an id."""

    @functools.wraps(handler)
    async def run(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the last line of defence; CancelledError (Stop) passes
            rid = new_request_id()
            logger.exception("[%s] unexpected failure in %s", rid, handler.__name__)
            with contextlib.suppress(Exception):
                await show_error(t("app_error", lang(), rid=rid))

    return run


def settings_lock() -> asyncio.Lock:
    lock = cl.user_session.get("settings_lock")
    if not isinstance(lock, asyncio.Lock):  # a resumed thread's copy of user_session holds None here
        lock = asyncio.Lock()
        cl.user_session.set("settings_lock", lock)
    return lock


async def send_settings() -> None:
    """The settings panel: model/adapter dropdown (live from the poller) and sampling.

    One at a time per chat: between setting "model" and sending the composer's modes, a second
    call (the watcher, a choice) would otherwise send the other model as the picker's default.
    """
    async with settings_lock():
        await _send_settings()


async def _send_settings() -> None:
    status = app.poller.status
    options = ui.model_options(status, await app.local_adapters(status), lang(), app.adapter_rank)
    if not options:  # no model listed yet (engine loading): Select refuses an empty list
        options = {app.default_model(status): app.default_model(status)}
    chosen = cl.user_session.get("model") or app.default_model(status)
    if chosen not in options.values():
        if status.models:  # gone from the engine
            chosen = app.default_model(status)
        else:  # nothing listed yet (loading): keep a remembered choice
            options[chosen] = chosen
    cl.user_session.set("model", chosen)
    cl.user_session.set("models_version", status.version)
    sampling = cl.user_session.get("sampling") or app.default_sampling()
    await cl.ChatSettings([
        Select(id="model", label=t("model", lang()), items=options, initial_value=chosen,
               description=t("stale", lang()) if status.models_stale else t("model_desc", lang())),
        TextInput(id="system_prompt", label=t("system_prompt", lang()),
                  initial=cl.user_session.get("system_prompt", app.settings.model.system_prompt)),
        Slider(id="temperature", label=t("temperature", lang()), initial=sampling["temperature"], min=0, max=2, step=0.05),
        Slider(id="top_p", label=t("top_p", lang()), initial=sampling["top_p"], min=0.05, max=1, step=0.05),
        Slider(id="top_k", label=t("top_k", lang()), initial=sampling["top_k"], min=-1, max=100, step=1),
        Slider(id="min_p", label=t("min_p", lang()), initial=sampling["min_p"], min=0, max=1, step=0.01),
    ]).send()
    # The same choice as a picker in the composer (Chainlit Modes): visible without opening the panel.
    cl.user_session.set("mode_shown", chosen)
    await cl.context.emitter.set_modes([cl.Mode(id="model", name=t("model", lang()), options=[
        cl.ModeOption(id=model_id, name=label, default=model_id == chosen) for label, model_id in options.items()])])


async def watch_models() -> None:
    """Re-send the dropdown when adapters appear or disappear (the poller's version changes)."""
    async with app.poller.subscribe() as changes:  # leaving it unsubscribes, also when cancelled
        async for status in changes:
            if status.version != cl.user_session.get("models_version"):
                try:
                    await send_settings()
                except Exception:  # noqa: BLE001 - one failed update must not end the watching
                    logger.exception("could not re-send the model list")


def ensure_watcher() -> None:
    """Start the model-list watcher, or restart it: Chainlit runs on_chat_end on every disconnect,
    but not on_chat_start when the same session reconnects."""
    task = cl.user_session.get("watcher")
    if not isinstance(task, asyncio.Task) or task.done():  # None, or a resumed thread's copy
        cl.user_session.set("watcher", asyncio.create_task(watch_models()))


def preference_key() -> str | None:
    session = cl.context.session
    return preferences.preference_key(session.user.identifier if session.user else None,
                                  (session.environ or {}).get("HTTP_COOKIE"))


def restore(state: dict) -> None:
    """Settings from a stored thread or preference; whatever is missing or malformed stays default."""
    if isinstance(state.get("model"), str) and state["model"]:
        cl.user_session.set("model", state["model"])
    if isinstance(state.get("sampling"), dict):
        cl.user_session.set("sampling", ui.sampling_from(state["sampling"], app.default_sampling()))
    if isinstance(state.get("system_prompt"), str):
        cl.user_session.set("system_prompt", state["system_prompt"])


async def remember() -> None:
    """Keep the settings for this user/browser and in this chat's stored thread (reload, resume)."""
    state = history.chat_state(cl.user_session.get("model") or "", cl.user_session.get("sampling") or app.default_sampling(),
                               cl.user_session.get("system_prompt", app.settings.model.system_prompt))
    # Chainlit copies the thread metadata into user_session on resume and writes it back (a shallow
    # merge) on disconnect: keep that copy current, or it overwrites what update_thread stored.
    cl.user_session.set(history.META_KEY, state)
    try:
        await asyncio.to_thread(prefs.set, preference_key(), state)
        layer = get_data_layer()
        if layer and cl.context.session.has_first_interaction:  # the thread exists
            await layer.update_thread(cl.context.session.thread_id, metadata={history.META_KEY: state})
    except Exception:  # noqa: BLE001 - a lost preference is not worth a broken chat
        logger.exception("could not remember the chat settings")


async def open_chat() -> None:
    await app.start()
    await send_settings()
    await send_commands()
    ensure_watcher()


@cl.on_chat_start
async def on_chat_start() -> None:
    conversation()
    restore(await asyncio.to_thread(prefs.get, preference_key()))
    await open_chat()
    for name, reason in app.excluded_adapters().items():
        await show_error(t("excluded_adapter", lang(), name=name, reason=reason))


@cl.on_chat_resume
async def on_chat_resume(thread: dict) -> None:
    """A chat reopened from the history: its turns (raw text, no footers) and its settings."""
    conv = history.conversation_from_thread(thread)
    cl.user_session.set("conversation", conv)
    restore(history.state_from_thread(thread, conv))
    await open_chat()


@cl.on_chat_end
async def on_chat_end() -> None:
    task = cl.user_session.get("watcher")
    if isinstance(task, asyncio.Task):
        task.cancel()  # a reconnect restarts it (ensure_watcher)


@cl.on_settings_update
@guarded
async def on_settings_update(values: dict) -> None:
    # Chainlit runs this in its socket handler: make it the task Stop cancels (an adapter load can take a while).
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher()
    cl.user_session.set("sampling", ui.sampling_from(values, app.default_sampling()))
    cl.user_session.set("system_prompt", values.get("system_prompt") or "")
    model = values.get("model")
    if model and model != cl.user_session.get("model"):
        await choose_model(model)
    await remember()


async def choose_model(model: str) -> None:
    """The user picked a model (settings panel or composer); one from [lora].dir loads now."""
    cl.user_session.set("model", model)
    if model not in {m.id for m in app.poller.status.models}:
        await load_adapter(model)  # re-sends the settings
    else:  # no "Loading adapter" step for a served one; keep panel and composer in step
        await send_settings()


async def load_adapter(model: str) -> None:
    try:
        async with cl.Step(name=t("loading_adapter", lang(), name=model), type="tool") as step:
            if await app.ensure_loaded(model):
                step.output = t("adapter_loaded", lang(), name=model)
    except QwenChatError as exc:
        cl.user_session.set("model", app.default_model(app.poller.status))
        await show_error(exc.user_text(lang()))
    except asyncio.CancelledError:  # Stop during the load: the adapter is not there, do not keep it chosen
        cl.user_session.set("model", app.default_model(app.poller.status))
        with contextlib.suppress(Exception):
            await send_settings()
        raise
    await send_settings()


async def send_commands() -> None:
    """Composer commands: /adapters lists them, /unload NAME frees an adapter slot."""
    await cl.context.emitter.set_commands([
        {"id": "adapters", "description": t("cmd_adapters", lang()), "icon": "layers", "button": False},
        {"id": "unload", "description": t("cmd_unload", lang()), "icon": "circle-minus", "button": False},
    ])


async def run_command(command: str, text: str) -> None:
    status = app.poller.status
    if command == "adapters":
        await cl.Message(content=app.adapters_overview(status, await app.local_adapters(status), lang())).send()
        return
    name = text.strip().strip("`")
    try:
        await app.unload(name, status)
    except QwenChatError as exc:
        await show_error(exc.user_text(lang()))
        return
    if cl.user_session.get("model") == name:
        cl.user_session.set("model", app.default_model(app.poller.status))
    await cl.Message(content=t("unloaded", lang(), name=name, model=cl.user_session.get("model"))).send()
    await send_settings()


@cl.on_message
@guarded
async def on_message(message: cl.Message) -> None:
    # Chainlit runs an edited message inline in its socket handler, not as the task Stop cancels.
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher()
    if app.poller.status.version != cl.user_session.get("models_version"):  # missed while disconnected
        await send_settings()
    text = message.content or ""
    if getattr(message, "command", None) in history.COMMANDS:
        await mark_command(message)
        await run_command(message.command, text)
        return
    if not text.strip():
        await show_error(t("empty_message", lang()))
        return
    picked = (getattr(message, "modes", None) or {}).get("model")
    if picked and picked != cl.user_session.get("mode_shown"):  # changed in the composer picker
        await choose_model(picked)
    conversation().add_user(message.id, text)
    await answer()


async def mark_command(message: cl.Message) -> None:
    """Tag the stored message as a command, so a resumed chat does not send "/unload x" as "x"."""
    message.metadata = {**(message.metadata or {}), **history.command_metadata(message.command)}
    try:
        await message.update()
    except Exception:  # noqa: BLE001 - the command still runs; only a resume would show it
        logger.exception("could not mark the /%s message as a command", message.command)


async def turn_of(action: cl.Action):
    """The user turn an action button belongs to, if it is still the latest; else say why not."""
    await action.remove()  # one press per button
    last = conversation().last_user()
    if last is None:
        await show_error(t("nothing_to_retry", lang()))
    elif (action.payload or {}).get("turn") != last.id:
        await show_error(t("old_button", lang()))
    else:
        return last
    return None


@cl.action_callback("retry")
@guarded
async def on_retry(action: cl.Action) -> None:
    if await turn_of(action) is None:
        return
    conversation().drop_answers_after_last_user()
    await answer_as_task()


@cl.action_callback("send_trimmed")
@guarded
async def on_send_trimmed(action: cl.Action) -> None:
    last = await turn_of(action)
    if last is None:
        return
    conversation().add_user(last.id, action.payload["text"])
    await answer_as_task()


async def answer_as_task() -> None:
    """Answer as the session's current task, like a typed message, so the Stop button shows and works.

    Action callbacks run inside Chainlit's HTTP request, not the message task Stop cancels.
    """
    task = asyncio.create_task(answer())
    cl.context.session.current_task = task
    await cl.context.emitter.task_start()
    try:
        await asyncio.wait({task})
    finally:
        await cl.context.emitter.task_end()


async def show_error(text: str, actions: list[cl.Action] | None = None) -> None:
    """An error bubble, with buttons if any (Chainlit 2.12's cl.ErrorMessage takes no actions)."""
    msg = cl.Message(content=text, actions=actions or [])
    msg.is_error = True
    await msg.send()


def retry_action() -> cl.Action:
    """Retry for the latest user turn; the payload names it, so an older bubble's button is refused."""
    turn = conversation().last_user()
    return cl.Action(name="retry", payload={"turn": turn.id if turn else None}, label=t("retry", lang()),
                     icon="rotate-ccw")


async def wait_for_engine() -> bool:
    """Wait (with a live step) while the model loads; False when the user must retry later."""
    status = app.poller.status
    if status.answering:
        return True
    if status.state is EngineState.DOWN:
        await show_error(t("engine_down", lang(), reason=status.text(lang()) or "?"), [retry_action()])
        return False
    t0 = time.monotonic()
    async with cl.Step(name=t("loading", lang(), elapsed=0), type="tool") as step:
        async def progress(elapsed: float, st) -> None:
            step.name = t("loading", lang(), elapsed=time.monotonic() - t0)
            step.output = st.text(lang()) or ""
            await step.update()

        status = await app.poller.wait_until_ready(app.settings.ui.wait_for_ready, on_progress=progress)
        step.name = t("loading_done", lang(), elapsed=time.monotonic() - t0)
    if status.answering:
        return True
    if status.state is EngineState.DOWN:
        await show_error(t("engine_down", lang(), reason=status.text(lang()) or "?"), [retry_action()])
    else:
        await show_error(ServerStarting(time.monotonic() - t0).user_text(lang()), [retry_action()])
    return False


async def answer() -> None:
    """Answer the last user turn; if the engine vanished before any text, wait for it and try once more."""
    if await answer_once(may_wait_again=True) == "engine_gone":
        await answer_once(may_wait_again=False)


async def answer_once(may_wait_again: bool) -> str:
    """One attempt; returns "engine_gone" when the engine died before any text and it is worth waiting."""
    conv = conversation()
    model = cl.user_session.get("model") or app.default_model(app.poller.status)
    rid = new_request_id()
    msg = cl.Message(content="", author=model)
    text, reasoning_step = "", None
    usage, finish, t0 = None, None, time.monotonic()
    fitted = None
    try:
        if not await wait_for_engine():
            return "failed"
        if await app.needs_runtime_load(model):  # e.g. chosen before a restart, restored on reload
            await load_adapter(model)
            model = msg.author = cl.user_session.get("model")
        system = cl.user_session.get("system_prompt", app.settings.model.system_prompt)
        fitted = await app.fit(conv.messages(system))
        sampling = cl.user_session.get("sampling") or app.default_sampling()
        async with contextlib.aclosing(app.client.stream(fitted.messages, model, max_tokens=app.reply_tokens(),
                                                         sampling=ui.sampling_body(sampling), request_id=rid)) as events:
            async for ev in events:
                if isinstance(ev, TextDelta):
                    text += ev.text
                    await msg.stream_token(ev.text)
                elif isinstance(ev, ReasoningDelta) and app.settings.ui.show_reasoning:
                    if reasoning_step is None:
                        reasoning_step = cl.Step(name=t("reasoning", lang()), type="llm", default_open=False)
                        await reasoning_step.send()
                    await reasoning_step.stream_token(ev.text)
                elif isinstance(ev, Usage):
                    usage = ev
                elif isinstance(ev, Finish):
                    finish = ev
        served = finish.model if finish and finish.model else model
        msg.author = served
        msg.content = ui.close_fence(text) + ui.footer(served, usage, fitted, time.monotonic() - t0, lang(), finish)
        msg.metadata = history.answer_metadata(text, served)  # the history keeps no footer
        await msg.send()
        conv.add_assistant(msg.id, text, served)
    except PromptTooLong as exc:
        try:
            trimmed = await app.trimmed(conv.last_user().content, exc)
        except Exception:  # noqa: BLE001 - without a trimmed version the numbers still help
            logger.exception("[%s] could not build a trimmed version", rid)
            await show_error(exc.user_text(lang()))
        else:
            await show_error(exc.user_text(lang()), [cl.Action(
                name="send_trimmed", payload={"turn": conv.last_user().id, "text": trimmed},
                label=t("send_trimmed", lang()), icon="scissors")])
    except asyncio.CancelledError:
        # Stop button: Chainlit cancels this task; the client closes the upstream request.
        await keep_partial(conv, msg, text, model, t("stopped", lang()))
        raise
    except (ServerUnreachable, ConnectionLost) as exc:
        # The engine went away (crash, kill, restart): say why, and if nothing was shown yet,
        # wait for the supervisor to bring it back like during start-up, then try once more.
        logger.info("[%s] engine connection failed: %s", rid, exc.code)
        status = await app.status_after_failure()
        if not text and may_wait_again and not status.answering and status.state is not EngineState.DOWN:
            return "engine_gone"
        await keep_partial(conv, msg, text, model, t("interrupted", lang()))
        why = status.text(lang()) if not status.answering else ""
        await show_error(exc.user_text(lang()) + (f"\n\n{t('engine_state', lang(), reason=why)}" if why else ""),
                         [retry_action()])
    except ModelNotFound as exc:
        # The adapter is gone (unloaded elsewhere, engine restarted): left selected, every later message fails.
        logger.info("[%s] model %r is not served", rid, model)
        await keep_partial(conv, msg, text, model, t("interrupted", lang()))
        default = app.default_model(app.poller.status)
        if model == default:
            await show_error(exc.user_text(lang()))
        else:
            cl.user_session.set("model", default)
            await send_settings()
            await show_error(f"{exc.user_text(lang())}\n\n{t('model_reset', lang(), model=default)}", [retry_action()])
    except QwenChatError as exc:
        logger.info("[%s] answer failed: %s", rid, exc.code)
        await keep_partial(conv, msg, text, model, t("interrupted", lang()))
        await show_error(exc.user_text(lang()), [retry_action()] if getattr(exc, "retryable", True) else [])
    except Exception:  # noqa: BLE001 - a bug in the app, not the engine's fault: say so; the log has the id
        logger.exception("[%s] unexpected failure", rid)
        await keep_partial(conv, msg, text, model, t("interrupted", lang()))
        await show_error(t("app_error", lang(), rid=rid), [retry_action()])
    else:
        # The answer is recorded: a failure or Stop from here on must not record it again as interrupted.
        try:
            await show_left_out(fitted)
        except Exception:  # noqa: BLE001 - the answer stands; the left-out note is extra
            logger.exception("[%s] could not show the left-out turns", rid)
        await remember()
        return "answered"
    finally:
        if reasoning_step is not None:  # never left streaming after an error or Stop
            with contextlib.suppress(Exception):
                await reasoning_step.update()
    return "failed"


async def keep_partial(conv: Conversation, msg: cl.Message, text: str, model: str, why: str) -> None:
    """What was shown stays, visibly marked; the history holds it as interrupted."""
    if not text:
        with contextlib.suppress(Exception):
            await msg.remove()
        return
    msg.content = ui.close_fence(text) + ui.interrupted_marker(why, model)
    msg.metadata = history.answer_metadata(text, model, interrupted=True)
    with contextlib.suppress(Exception):
        await msg.send()
    conv.add_assistant(msg.id or str(uuid.uuid4()), text, model, interrupted=True)


async def show_left_out(fitted) -> None:
    """Which earlier turns were not sent (the context meter says how many)."""
    if fitted is None or not fitted.dropped:
        return
    lines = [f"- #{d.index + 1}: {d.preview}" for d in fitted.dropped]
    async with cl.Step(name=t("left_out_title", lang()), type="tool", default_open=False) as step:
        step.output = "\n".join(lines)

"""Chainlit handlers: chat start/resume, settings, message, stop, actions. Logic lives in backend/; our routes
and the renderers (ChatView, the compare views) in webui/."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import chainlit as cl
import chainlit.config as chainlit_config_module
import chainlit.server as chainlit_server
from chainlit.data import get_data_layer
from chainlit.input_widget import Select, Slider, TextInput
from chainlit.server import app as http_app
from chainlit.server import sio

from backend.chat import compare, files, history, loopstats, metrics, preferences, security, share, turn, welcome
from backend.chat import export as chat_export
from backend.chat import service as ui
from backend.chat.client import new_request_id
from backend.chat.datalayer import GuardedDataLayer
from backend.chat.login import verify_login
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome
from backend.chat.votes import WINNERS
from backend.errors import QwenChatError
from backend.text import pick_language, t
from webui import socket_guard
from webui.compare_view import (
    COMPARE_COMMANDS,
    CompareView,
    compare_commands,
    compare_state,
    compare_widget,
    pair_of,
    panel_choice,
    update_pair,
)
from webui.routes import Routes, install_routes
from webui.views import ChatView, show_error

logger = logging.getLogger(__name__)
app = ui.Service.from_environment()
# Sets CHAINLIT_AUTH_SECRET: Chainlit checks it only after importing this file. With [ui].auth the history is
# in SQLite or PostgreSQL ([ui].history_db); a PostgreSQL that cannot be reached leaves login on, history off.
HISTORY = history.open_history(app.settings)
DB_URL = HISTORY.url
prefs = preferences.open_preferences(app.settings)  # SQLite or PG; an old ui-preferences.json is imported once
# Chainlit deletes <app root>/.files when its process stops: a folder of this process's own, so another UI
# process on the same checkout (a second port) stopping cannot take this one's uploads and files with it.
FILES_DIRECTORY = files.own_directory()  # owner-only (0700); also removes those of killed UI processes
chainlit_config_module.FILES_DIRECTORY = chainlit_server.FILES_DIRECTORY = FILES_DIRECTORY  # read at use

if DB_URL:  # [ui].auth: history through Chainlit's own data layer
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    @cl.data_layer
    def data_layer() -> GuardedDataLayer:
        # Thread ids checked (UUIDs only), stored text sanitised, SQLite in WAL, no prompt text in SQL errors.
        assert HISTORY.db is not None and DB_URL is not None
        # A step never moves to another thread; the answers it stores are signed (export-feedback checks).
        inner = SQLAlchemyDataLayer(DB_URL, connect_args=HISTORY.db.connect_args)
        return GuardedDataLayer(inner, answer_key=HISTORY.answer_key)


if app.settings.ui.auth:  # login, with or without history

    @cl.password_auth_callback
    async def login(username: str, password: str) -> cl.User | None:
        # One PBKDF2 (~0.25 s) per attempt, on the login's own threads: not on the event loop, and not in the
        # default pool where token counting runs, so open chats do not stall.
        if await verify_login(app.settings, username, password):
            return cl.User(identifier=username, metadata={"provider": "credentials"})
        logger.warning("login refused: %s", security.login_refused_note(app.settings, username))
        return None


STARTUP_TASKS: set[asyncio.Task] = set()  # kept referenced until the process ends


@cl.on_app_startup
async def on_app_startup() -> None:
    """Poll the engine from the first second, so the status line is right before anyone chats."""
    loopstats.start_from_environment()  # benchmarks only: nothing unless QWENCHAT_LOOPSTATS is set
    await app.start()
    STARTUP_TASKS.add(asyncio.create_task(log_unserved_starters()))
    STARTUP_TASKS.add(asyncio.create_task(count_restarts()))


async def count_restarts() -> None:
    """Every poller snapshot to /metrics, so a restart between two scrapes is still counted."""
    async with app.poller.subscribe() as statuses:
        async for status in statuses:
            metrics.METRICS.observe_engine(status)


# Our routes (status, /metrics, sharing, feedback owner checks, branding) in front of Chainlit's, bound to this
# import's Service; a later import (tests) replaces them (webui/routes.py).
ROUTES = Routes(app, sharing=bool(DB_URL))
status_route, metrics_route = ROUTES.status, ROUTES.metrics
install_routes(http_app, ROUTES)

if DB_URL:

    @cl.on_shared_thread_view
    async def on_shared_thread_view(thread: dict, viewer: cl.User | None) -> bool:
        """Chainlit asks this for a non-owner; our route has already checked the same."""
        return viewer is not None and share.is_shared(thread)


@cl.set_starters
async def set_starters(user: cl.User | None = None, language: str | None = None) -> list[cl.Starter]:
    """The welcome screen: each adapter's starters (backend/chat/welcome.py), in the browser's language."""
    shown = app.settings.ui.language if app.settings.ui.language != "auto" else pick_language(language)
    status = app.poller.status
    served = [m.id for m in status.models] + [a.name for a in await app.local_adapters(status)]
    # command = the model: the message then says it came from a starter (welcome.starter_model)
    return [
        cl.Starter(label=s.label, message=s.message, command=s.model)
        for s in welcome.starters(app.settings, served, shown)
    ]


async def log_unserved_starters() -> None:
    """Once the engine lists its models: a warning per starter whose model is not served."""
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


async def starter_chosen(text: str, command: str | None) -> bool:
    """The first message of a chat, sent by a starter: choose its model. False: not sent (not served)."""
    if chat_session().conversation.turns:
        return True
    model = welcome.starter_model(app.settings, text, command)
    if model is None or model == chat_session().model:
        return True
    status = app.poller.status
    served = [m.id for m in status.models]
    if model not in served and model not in [a.name for a in await app.local_adapters(status)]:
        await show_error(t("welcome.starter_unserved", lang(), name=model, served=", ".join(served) or "-"))
        return False
    await choose_model(model)
    return True


# One socket message may carry a pasted document: python-engineio's default cap (1 MB) closes the
# connection on a larger one and the message is lost. 256K tokens of CJK text are ~3 MB of UTF-8;
# 16 MB leaves room for a paste the budget then trims, with a clear message, on the same connection.
MAX_SOCKET_MESSAGE = 16 * 1024 * 1024
sio.eio.max_http_buffer_size = MAX_SOCKET_MESSAGE


class _NonBlockingTime:
    """Chainlit 2.12's Message and Step constructors call time.sleep(0.001), so that consecutive objects get
    distinct timestamps. On the event loop that blocks every session: ~1 ms per message or step, ~3.5 ms on a
    loaded machine (the largest stall found by bench/concurrency.py's profile). This keeps the guarantee,
    a later timestamp, by waiting for the microsecond clock to move (about 1 µs), without the sleep."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds: float) -> None:
        now = time.time_ns() // 1000
        while time.time_ns() // 1000 == now:
            pass


# By the classes' own globals: the package's name "chainlit.step" is the @step decorator, not the module.
for _cls in (cl.Message, cl.Step):
    _cls.__init__.__globals__["time"] = _NonBlockingTime()

# The browser's client_message and edit_message, checked before Chainlit takes them (webui/socket_guard.py).
socket_guard.install(lambda: chat_session(), lambda: lang())

# Without login, the page sets a browser cookie that the websocket carries: settings survive a reload.
if not any(m.cls is preferences.BrowserCookieMiddleware for m in http_app.user_middleware):
    http_app.add_middleware(preferences.BrowserCookieMiddleware)
# Outermost: origin check (HTTP and the socket.io websocket/polling), security headers, login throttle.
security.install(http_app, app.settings)


def lang() -> str:
    if app.settings.ui.language != "auto":
        return app.settings.ui.language
    return getattr(cl.context.session, "language", None) or "en"


SESSION_KEY = "chat_session"  # the ChatSession; history.META_KEY stays a plain dict beside it (see remember)


def chat_session() -> ChatSession:
    """This chat's state, one object under one key of Chainlit's user_session."""
    state = cl.user_session.get(SESSION_KEY)
    if not isinstance(state, ChatSession):  # a resumed thread's copy of user_session holds None here
        state = ChatSession(system_prompt=app.settings.model.system_prompt, sampling=app.default_sampling())
        cl.user_session.set(SESSION_KEY, state)
    return state


def guarded(handler):
    """An exception escaping a Chainlit handler is invisible in the UI: log it, say so, with an id."""

    @functools.wraps(handler)
    async def run(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except Exception:  # the last line of defence; CancelledError (Stop) passes
            rid = new_request_id()
            logger.exception("[%s] unexpected failure in %s", rid, handler.__name__)
            with contextlib.suppress(Exception):
                await show_error(t("app_error", lang(), rid=rid))

    return run


async def send_settings() -> str:
    """The settings panel: model/adapter dropdown (live from the poller) and sampling.

    One at a time per chat: between setting "model" and sending the composer's modes, a second
    call (the watcher, a choice) would otherwise send the other model as the picker's default.
    """
    async with chat_session().settings_lock:
        return await _send_settings()


async def _send_settings() -> str:
    """Returns the chosen model it had to drop because some fleet replicas lack it ("" if none)."""
    state, status = chat_session(), app.poller.status
    told = ""
    options = ui.model_options(status, await app.local_adapters(status), lang(), app.adapter_rank)
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
                label=t("model", lang()),
                items=options,
                initial_value=chosen,
                description=t("stale", lang()) if status.models_stale else t("model_desc", lang()),
            ),
            TextInput(id="system_prompt", label=t("system_prompt", lang()), initial=state.system_prompt),
            Slider(
                id="temperature",
                label=t("temperature", lang()),
                initial=sampling["temperature"],
                min=0,
                max=2,
                step=0.05,
            ),
            Slider(id="top_p", label=t("top_p", lang()), initial=sampling["top_p"], min=0.05, max=1, step=0.05),
            Slider(id="top_k", label=t("top_k", lang()), initial=sampling["top_k"], min=-1, max=100, step=1),
            Slider(id="min_p", label=t("min_p", lang()), initial=sampling["min_p"], min=0, max=1, step=0.01),
            compare_widget(lang()),
        ]
    ).send()
    # The same choice as a picker in the composer (Chainlit Modes): visible without opening the panel.
    state.mode_shown = chosen
    await cl.context.emitter.set_modes(
        [
            cl.Mode(
                id="model",
                name=t("model", lang()),
                options=[
                    cl.ModeOption(id=model_id, name=label, default=model_id == chosen)
                    for label, model_id in options.items()
                ],
            )
        ]
    )
    if told:  # the chat's model is no longer offered: say why, not just switch
        await show_error(app.partial_reset_text(told, chosen, lang()))
    return told


async def watch_models() -> None:
    """Re-send the dropdown when adapters appear or disappear (the poller's version changes)."""
    async with app.poller.subscribe() as changes:  # leaving it unsubscribes, also when cancelled
        async for status in changes:
            if status.version != chat_session().models_version:
                try:
                    await send_settings()
                except Exception:  # one failed update must not end the watching
                    logger.exception("could not re-send the model list")


def ensure_watcher(*, from_browser: bool = False) -> None:
    """Start the model-list watcher, or restart it: Chainlit runs on_chat_end on every disconnect,
    but not on_chat_start when the same session reconnects.

    Not after on_chat_end until the browser acts again (``from_browser``): a browser that left while
    on_chat_start was still running would otherwise leave a watcher no on_chat_end will ever cancel.
    """
    state = chat_session()
    if from_browser:
        state.connected = True
    if not state.connected:
        return
    if state.watcher is None or state.watcher.done():
        state.watcher = asyncio.create_task(watch_models())


def preference_key() -> str | None:
    session = cl.context.session
    return preferences.preference_key(
        session.user.identifier if session.user else None, (session.environ or {}).get("HTTP_COOKIE")
    )


def restore(state: dict) -> None:
    """Settings from a stored thread or preference; whatever is missing or malformed stays default."""
    chat = chat_session()
    if isinstance(state.get("model"), str) and state["model"]:
        chat.model = state["model"]
    if isinstance(state.get("sampling"), dict):
        chat.sampling = ui.sampling_from(state["sampling"], app.default_sampling())
    if isinstance(state.get("system_prompt"), str):
        chat.system_prompt = state["system_prompt"]


def settings_state() -> dict:
    chat = chat_session()
    return history.chat_state(chat.model or "", chat.sampling, chat.system_prompt)


async def remember() -> None:
    """Keep the settings for this user/browser and in this chat's stored thread (reload, resume)."""
    state = settings_state()
    # Chainlit copies the thread metadata into user_session on resume and writes it back (a shallow
    # merge) on disconnect: keep that copy current, or it overwrites what update_thread stored.
    cl.user_session.set(history.META_KEY, state)
    try:
        await asyncio.to_thread(prefs.set, preference_key(), state)
        layer = get_data_layer()
        if layer and cl.context.session.has_first_interaction:  # the thread exists
            await layer.update_thread(cl.context.session.thread_id, metadata={history.META_KEY: state})
    except Exception:  # a lost preference is not worth a broken chat
        logger.exception("could not remember the chat settings")


async def open_chat() -> str:
    # Each session's files (an /export, uploads) go under this process's own FILES_DIRECTORY (see the top);
    # made again should something have removed it since (a temp-folder cleaner), or a file could not be attached.
    FILES_DIRECTORY.mkdir(parents=True, exist_ok=True)
    await app.start()
    told = await send_settings()
    await send_commands()
    ensure_watcher()
    return told


@cl.on_chat_start
async def on_chat_start() -> None:
    chat_session()
    restore(await asyncio.to_thread(prefs.get, preference_key()))
    told = await open_chat()
    for name, reason in app.excluded_adapters().items():
        await show_error(t("excluded_adapter", lang(), name=name, reason=reason))
    for note in app.partial_adapters(lang(), skip=told):  # a fleet: adapters some ready replicas lack, not offered
        await show_error(note)
    if HISTORY.off_reason:  # login on, but the history database was not there at start (ui.log says why)
        await cl.Message(content=t("history_off", lang()), author="history").send()


@cl.on_chat_resume
async def on_chat_resume(thread: dict) -> None:
    """A chat reopened from the history: its turns (raw text, no footers) and its settings."""
    conv = history.conversation_from_thread(thread)
    chat_session().conversation = conv
    restore(history.state_from_thread(thread, conv))
    await open_chat()


@cl.on_chat_end
async def on_chat_end() -> None:
    chat_session().connected = False  # a chat start still running must not start the watcher now
    watcher = chat_session().watcher
    if watcher is not None:
        watcher.cancel()  # a reconnect restarts it (ensure_watcher)
    # Chainlit now writes user_session into the thread, where the ChatSession becomes None: this way a
    # chat whose settings were never remembered (no answer, no change yet) still resumes with them.
    if not isinstance(cl.user_session.get(history.META_KEY), dict):
        cl.user_session.set(history.META_KEY, settings_state())


@cl.on_settings_update
@guarded
async def on_settings_update(values: dict) -> None:
    # Chainlit runs this in its socket handler: make it the task Stop cancels (an adapter load can take a while).
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher(from_browser=True)
    chat = chat_session()
    chat.sampling = ui.sampling_from(values, app.default_sampling())
    try:
        preferences.check_system_prompt(values.get("system_prompt") or "")
        chat.system_prompt = values.get("system_prompt") or ""
    except preferences.SystemPromptRefused as exc:  # the previous prompt stays; the panel shows it again
        await show_error(exc.user_text(lang()))
        await send_settings()
    model = values.get("model")
    if model and model != chat.model:
        await choose_model(model)
    await choose_compare(values.get("compare"))
    await remember()


async def choose_model(model: str) -> None:
    """The user picked a model (settings panel or composer); one from [lora].dir loads now."""
    chat = chat_session()
    chat.model = model
    if model not in {m.id for m in app.poller.status.models}:
        await turn.load_adapter(chat, app, ChatView(lang(), HOST), model)  # re-sends the settings
    else:  # no "Loading adapter" step for a served one; keep panel and composer in step
        await send_settings()


async def send_commands() -> None:
    """Composer commands: /adapters lists them, /unload NAME frees an adapter slot."""
    await cl.context.emitter.set_commands(
        [
            {"id": "adapters", "description": t("cmd_adapters", lang()), "icon": "layers", "button": False},
            {"id": "unload", "description": t("cmd_unload", lang()), "icon": "circle-minus", "button": False},
            {"id": "export", "description": t("cmd_export", lang()), "icon": "download", "button": False},
            *compare_commands(lang()),
        ]
    )


async def run_command(command: str, text: str) -> None:
    if command in COMPARE_COMMANDS:
        await run_compare_command(command, text)
        return
    status = app.poller.status
    if command == "export":
        await run_export()
        return
    if command == "adapters":
        await cl.Message(content=app.adapters_overview(status, await app.local_adapters(status), lang())).send()
        return
    name = text.strip().strip("`")
    try:
        await app.unload(name, status)
    except QwenChatError as exc:
        await show_error(exc.user_text(lang()))
        return
    chat = chat_session()
    if chat.model == name:
        chat.model = app.default_model(app.poller.status)
    await cl.Message(content=t("unloaded", lang(), name=name, model=chat.model)).send()
    await send_settings()


async def run_export() -> None:
    """/export: this chat as a Markdown file with the model of each answer (compared pairs with both sides)."""
    from datetime import datetime

    chat = chat_session()
    if not chat.conversation.turns:
        await cl.Message(content=t("export.empty", lang())).send()
        return
    pairs = getattr(cl.user_session.get("compare"), "pairs", None) or {}  # compare mode's, when it is on
    now = datetime.now()
    text = chat_export.conversation_markdown(
        chat.conversation, lang(), system_prompt=chat.system_prompt, pairs=pairs, now=now
    )
    file = cl.File(name=chat_export.export_filename(now), content=text.encode("utf-8"), mime="text/markdown")
    done = t("export.done", lang(), turns=len(chat.conversation.turns))
    await cl.Message(content=done, elements=[file]).send()


@cl.on_message
@guarded
async def on_message(message: cl.Message) -> None:
    # Chainlit runs an edited message inline in its socket handler, not as the task Stop cancels.
    cl.context.session.current_task = asyncio.current_task()
    ensure_watcher(from_browser=True)
    if app.poller.status.version != chat_session().models_version:  # missed while disconnected
        await send_settings()
    text = message.content or ""
    if getattr(message, "command", None) in history.COMMANDS:
        await mark_command(message)
        await name_bare_command(message)
        await run_command(message.command, text)
        return
    if not text.strip():
        await show_error(t("empty_message", lang()))
        return
    picked = (getattr(message, "modes", None) or {}).get("model")
    if picked and picked != chat_session().mode_shown:  # changed in the composer picker
        await choose_model(picked)
    if not await starter_chosen(text, getattr(message, "command", None)):  # a starter picks its model first
        return
    chat_session().conversation.add_user(message.id, text)
    await answer()


async def name_bare_command(message: cl.Message) -> None:
    """A chat opened with a bare command ("/compare") would keep the browser's Stop button hidden for good:
    Chainlit announces the first interaction with the message text, here empty, and the page shows Stop only
    once that is non-empty. Announce it with the command's name instead."""
    if (message.content or "").strip() or chat_session().conversation.turns or cl.user_session.get("named"):
        return
    cl.user_session.set("named", True)
    session = cl.context.session
    await cl.context.emitter.emit(
        "first_interaction", {"interaction": f"/{message.command}", "thread_id": session.thread_id}
    )


async def mark_command(message: cl.Message) -> None:
    """Tag the stored message as a command, so a resumed chat does not send "/unload x" as "x"."""
    message.metadata = {**(message.metadata or {}), **history.command_metadata(message.command)}
    try:
        await message.update()
    except Exception:  # the command still runs; only a resume would show it
        logger.exception("could not mark the /%s message as a command", message.command)


async def turn_of(action: cl.Action):
    """The user turn an action button belongs to, if it is still the latest; else say why not."""
    await action.remove()  # one press per button
    last = chat_session().conversation.last_user()
    if last is None:
        await show_error(t("nothing_to_retry", lang()))
    elif (action.payload or {}).get("turn") != last.id:
        await show_error(t("old_button", lang()))
    else:
        return last
    return None


@contextlib.asynccontextmanager
async def one_answer() -> AsyncIterator[bool]:
    """Around a button's work: False (and said, the button stays for later) while this chat is answering; else
    True, and the chat counts as answering until the block ends (one answer streams per chat; a typed message or
    an edit claims the same flag in webui/socket_guard.py). Claimed before any await, so two presses never both
    pass."""
    state = chat_session()
    if state.answering:
        await show_error(t("busy_action", lang()))
        yield False
        return
    state.answering = True
    try:
        yield True
    finally:
        state.answering = False


@cl.action_callback("retry")
@guarded
async def on_retry(action: cl.Action) -> None:
    async with one_answer() as free:
        if not free or await turn_of(action) is None:
            return
        side = (action.payload or {}).get("side")  # a compare side's error: retry that side only, keep the other's
        pair = compare_state().pairs.get((action.payload or {}).get("turn", "")) if side else None
        if pair is not None and side in compare.LABELS:
            if pair.vote is not None:
                await show_error(t("compare.voted_no_retry", lang()))
                return
            await answer_as_task(functools.partial(retry_compared_side, pair, side))
            return
        chat_session().conversation.drop_answers_after_last_user()
        await answer_as_task()


@cl.action_callback("send_trimmed")
@guarded
async def on_send_trimmed(action: cl.Action) -> None:
    async with one_answer() as free:
        last = await turn_of(action) if free else None
        if last is None:
            return
        chat_session().conversation.add_user(last.id, action.payload["text"])
        await answer_as_task()


async def answer_as_task(work: Callable[[], Awaitable[None]] | None = None) -> None:
    """Answer (or do ``work``) as the session's current task, like a typed message, so the Stop button shows and
    works. Action callbacks run inside Chainlit's HTTP request, not the message task Stop cancels. Called inside
    ``one_answer``.
    """
    task = asyncio.create_task((work or answer)())
    cl.context.session.current_task = task
    await cl.context.emitter.task_start()
    try:
        await asyncio.wait({task})
    finally:
        await cl.context.emitter.task_end()


async def answer() -> None:
    """Answer the last user turn (backend/chat/turn.py holds the policy); keep the settings it used."""
    if compare_state().mode is not None:  # compare mode: two models answer side by side
        await answer_compared()
        return
    if await turn.answer(chat_session(), app, ChatView(lang(), HOST)) is Outcome.ANSWERED:
        await remember()


def latest_turn_id() -> str | None:
    """Buttons name the user turn they belong to, so an older bubble's button is refused (turn_of)."""
    last = chat_session().conversation.last_user()
    return last.id if last else None


class Host:
    """The renderers' way back into this file (webui/views.py ViewHost): names looked up when they are needed."""

    def flush_seconds(self) -> float:
        return app.settings.ui.stream_flush_ms / 1000

    def latest_turn_id(self) -> str | None:
        return latest_turn_id()

    async def send_settings(self) -> None:
        await send_settings()


HOST = Host()


# ---------------------------------------------------------------- compare mode (backend/chat/compare.py)


async def run_compare_command(command: str, text: str) -> None:
    if command == "leaderboard":
        standings = await asyncio.to_thread(app.votes.leaderboard)
        await cl.Message(content=compare.leaderboard_markdown(standings, lang())).send()
    elif command == "vote":
        pair = compare_state().latest(blind=True)
        if pair is None:
            await show_error(t("compare.vote_none", lang()))
            return
        try:
            winner, comment = compare.parse_vote(text)
        except compare.CompareRefused as exc:
            await show_error(exc.user_text(lang()))
            return
        await cast_vote(pair, winner, comment)
    else:
        await set_compare(text)


async def choose_compare(choice: object) -> None:
    """The panel's compare choice, when it changed: the same as typing /compare, /compare blind, /compare off."""
    if choice not in ("off", "on", "blind") or choice == panel_choice():
        return
    await set_compare({"off": "off", "on": "", "blind": "blind"}[str(choice)])
    await send_settings()  # the panel shows what is on (a refusal leaves it as it was)


async def set_compare(text: str) -> None:
    """/compare [blind] [A] [B] turns compare mode on (or changes it), /compare off ends it."""
    state, status = compare_state(), app.poller.status
    served = [m.id for m in status.models if not m.is_adapter] + [m.id for m in status.adapters]
    loadable = [a.name for a in await app.local_adapters(status)]
    try:
        used = [turn.model for turn in chat_session().conversation.turns if turn.role == "assistant"]
        mode = compare.parse_command(text, served, loadable, chat_session().model, app.default_model(status), used)
    except compare.CompareRefused as exc:
        await show_error(exc.user_text(lang()))
        return
    state.mode = mode
    if mode is None:
        model = chat_session().model or app.default_model(status)
        await cl.Message(content=t("compare.off", lang(), model=model)).send()
    else:
        await cl.Message(content=mode.announcement(lang())).send()


async def answer_compared() -> None:
    """Both models answer the last user turn at once, each in its own bubble with its own footer and error."""
    state, chat = compare_state(), chat_session()
    mode, last = state.mode, chat.conversation.last_user()
    if mode is None or last is None:
        return
    pair = compare.new_pair(mode, last.id, chat.conversation.messages(chat.system_prompt))
    views = {side.label: CompareView(lang(), HOST, pair, side) for side in pair.sides}
    compare.remember(state.pairs, pair)
    state.views[pair.turn_id] = views
    for old in list(state.views):
        if old not in state.pairs:
            del state.views[old]
    for view in views.values():  # both bubbles at once, A above B, before either model sends a token
        await view.open()
    try:
        await compare.run(pair, chat, app, views)
    finally:
        with contextlib.suppress(Exception):  # after Stop too: the picked side is marked in the stored messages
            await update_pair(pair, lang(), new_note=True)
    if any(s.outcome is Outcome.ANSWERED for s in pair.sides):
        await remember()


async def retry_compared_side(pair: compare.Pair, label: str) -> None:
    """A compare side's Retry: that side answers the pair's turn again in a new bubble; the other side's answer,
    and which answer the chat continues from (if it is on screen), are kept."""
    state = compare_state()
    side = pair.side(label)
    side.text, side.message_id, side.interrupted, side.shown, side.outcome = "", None, False, False, None
    for old in state.buttons.pop(pair.turn_id, []):  # the pair's note is sent again below, with current buttons
        with contextlib.suppress(Exception):
            await old.remove()
    view = CompareView(lang(), HOST, pair, side)
    state.views.setdefault(pair.turn_id, {})[label] = view
    await view.open()
    try:
        await compare.run(pair, chat_session(), app, {label: view}, only=label)
    finally:
        with contextlib.suppress(Exception):
            await update_pair(pair, lang(), new_note=True)
    if side.outcome is Outcome.ANSWERED:
        await remember()


@cl.action_callback("compare_vote")
@guarded
async def on_compare_vote(action: cl.Action) -> None:
    pair = await pair_of(action, lang())
    if pair is None:
        return
    winner = (action.payload or {}).get("winner")
    if not pair.blind:  # the buttons are only under blind pairs; a forged press on another is no blind vote
        logger.warning("compare_vote refused: the pair of turn %s is not blind", pair.turn_id)
        await show_error(t("compare.vote_not_blind", lang()))
    elif winner not in WINNERS:
        await show_error(t("compare.vote_usage", lang(), text=str(winner)[:80]))
    else:
        await cast_vote(pair, winner, "")


@cl.action_callback("compare_pick")
@guarded
async def on_compare_pick(action: cl.Action) -> None:
    pair = await pair_of(action, lang())
    if pair is None:
        return
    if not compare.pick(pair, action.payload["side"], chat_session().conversation):
        await show_error(t("compare.moved_on", lang()))
        return
    await update_pair(pair, lang())


def voter() -> str:
    session = cl.context.session
    if session.user:
        return session.user.identifier
    return preference_key() or "anonymous"


async def cast_vote(pair: compare.Pair, winner: compare.Winner, comment: str) -> None:
    """Store the vote (the last vote on a turn wins, and the chat says so), then reveal the names."""
    vote = compare.to_vote(pair, winner, voter(), cl.context.session.thread_id, comment)
    try:
        replaced = await asyncio.to_thread(app.votes.record, vote)
    except Exception as exc:  # a locked or broken file: say so, keep the names hidden
        logger.exception("could not store a vote")
        await show_error(t("compare.vote_failed", lang(), detail=type(exc).__name__))
        return
    compare.apply_vote(pair, winner, chat_session().conversation)
    await update_pair(pair, lang())
    if replaced:
        await cl.Message(content=t("compare.vote_replaced", lang()), author="compare").send()

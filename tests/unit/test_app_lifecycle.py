"""The UI's handlers on paths the main handler tests do not take: a browser leaving during chat start,
a system prompt past the limit, and the engine not answering when a message is sent (still loading past
``[ui] wait_for_ready``, already down, dying before the first token).

Same harness as tests/unit/test_app_handlers.py (a real Chainlit WebsocketSession, the fault server).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from backend.chat.health import EngineState, HealthPoller
from backend.contract import EngineStatus, SupervisorState
from backend.settings import HealthSettings, replace
from backend.storage import preferences
from backend.text import Text, t
from tests.conftest import free_port
from tests.unit import test_app_handlers as handlers
from tests.unit.chat.test_turn import RestartingPoller
from tests.unit.test_app_handlers import FULL, Chat, marker, settings_sent, user_session

# The handler tests' fixtures: the UI installed against the fault server, and one open chat.
fake, ui, chat = handlers.fake, handlers.ui, handlers.chat

pytestmark = pytest.mark.asyncio(loop_scope="module")

BROWSER_COOKIE = f"{preferences.BROWSER_COOKIE}=abcdef0123456789"


async def settings_update(chat: Chat, values: dict) -> list:
    """Confirm the settings panel with ``values``; returns the events it caused."""
    from chainlit.config import config
    from chainlit.context import init_ws_context

    n = len(chat.events)
    init_ws_context(chat.session)
    await config.code.on_settings_update(values)
    return chat.screen(n).errors


# ---------------------------------------------------------------- the model watcher is bounded by its session


async def test_a_browser_that_leaves_during_chat_start_leaves_no_model_watcher_behind(ui, fake, monkeypatch):
    from chainlit import socket
    from chainlit.config import config
    from chainlit.context import init_ws_context

    entered, release = asyncio.Event(), asyncio.Event()
    from backend.ui import chat as chat_handlers

    real_send_commands = chat_handlers.send_commands

    async def slow_send_commands(_ui) -> None:  # chat start is still running when the browser goes away
        entered.set()
        await release.wait()
        await real_send_commands(ui)

    monkeypatch.setattr(chat_handlers, "send_commands", slow_send_commands)
    await ui.service.start()
    await asyncio.wait_for(ui.service._warm, 30)  # the start's warm-up waits on the poller too: let it finish first
    subscribers = len(ui.service.poller.subscribers)
    tab = Chat(ui, fake)
    await socket.connection_successful(tab.sid)
    start = tab.session.current_task
    try:
        await asyncio.wait_for(entered.wait(), 10)
        init_ws_context(tab.session)
        await config.code.on_chat_end()  # what Chainlit's disconnect handler runs
        release.set()
        await asyncio.wait_for(start, 10)
        assert user_session(tab).watcher is None  # nothing left that no on_chat_end would cancel
        assert len(ui.service.poller.subscribers) == subscribers

        monkeypatch.setattr(chat_handlers, "send_commands", real_send_commands)
        assert (await ui.service.poller.wait_until_ready(20)).answering
        screen = await tab.send(f"back again {marker()}")  # the same session reconnects and sends a message
        assert screen.errors == [] and screen.answers[0].startswith(FULL), screen.errors
        watcher = user_session(tab).watcher
        assert watcher is not None and not watcher.done()
        assert len(ui.service.poller.subscribers) == subscribers + 1
    finally:
        release.set()
        await tab.end()
    await asyncio.wait({watcher}, timeout=5)
    assert watcher.cancelled() and len(ui.service.poller.subscribers) == subscribers


# ---------------------------------------------------------------- the system prompt is capped


async def test_a_5_mb_system_prompt_from_the_settings_panel_is_refused_with_the_limit_and_the_previous_kept(ui, fake):
    tab = Chat(ui, fake)
    tab.session.environ = {**tab.session.environ, "HTTP_COOKIE": BROWSER_COOKIE}  # settings remembered per browser
    await tab.start()
    try:
        assert await settings_update(tab, {"system_prompt": "answer like a pirate", "temperature": 0.3}) == []
        n = len(tab.events)
        huge = "x" * (5 * 1024 * 1024)
        [error] = await settings_update(tab, {"system_prompt": huge, "temperature": 0.6})
        limit = preferences.MAX_SYSTEM_PROMPT_BYTES
        assert f"{len(huge):,} bytes" in error and f"the limit is {limit:,} bytes" in error
        assert "previous system prompt is kept" in error
        state = user_session(tab)
        assert state.system_prompt == "answer like a pirate" and state.sampling["temperature"] == 0.6
        [*_, panel] = settings_sent(tab, n)  # the panel shows the prompt that is kept, not the refused one
        assert next(w for w in panel if w["id"] == "system_prompt")["initial"] == "answer like a pirate"
        remembered = ui.prefs.get(preferences.preference_key(None, BROWSER_COOKIE))
        assert remembered["system_prompt"] == "answer like a pirate" and remembered["sampling"]["temperature"] == 0.6

        m = marker()
        await tab.send(f"ahoy {m}")
        [rec] = tab.received(m)
        assert rec.messages[0] == {"role": "system", "content": "answer like a pirate"}
    finally:
        await tab.end()


# ---------------------------------------------------------------- the engine is not answering


def poller_for(url: str, status_file=None) -> HealthPoller:
    return HealthPoller(
        url, "test", HealthSettings(poll_starting=0.05, poll_ready=0.5, probe_timeout=2, probe_slow=1), status_file
    )


async def test_a_message_sent_while_the_model_loads_past_wait_for_ready_is_kept_with_retry(chat, ui, fake, monkeypatch):
    loading = poller_for(f"http://127.0.0.1:{free_port()}/v1")  # nothing answers yet: a model still loading
    await loading.start()
    real = ui.service._poller
    monkeypatch.setattr(ui.service, "_poller", loading)
    monkeypatch.setattr(
        ui.service,
        "settings",
        replace(ui.service.settings, ui=replace(ui.service.settings.ui, wait_for_ready=1.0)),
    )
    m = marker()
    try:
        screen = await chat.send(f"while loading {m}")
    finally:
        await loading.stop()
    [error] = screen.errors
    assert "the model is still loading after 1 s ([ui].wait_for_ready)" in error and "press Retry" in error
    assert "retry" in screen.error_actions() and screen.answers == []
    [step] = [s for s in screen.steps.values() if s.get("type") == "tool"]
    assert step["name"] == "Stopped waiting for the model after 1 s."  # shown live, and never "ready"
    assert chat.received(m) == [] and [t.role for t in chat.conversation.turns][-1] == "user"

    monkeypatch.setattr(ui.service, "_poller", real)  # the model is ready now: Retry sends the kept message
    [retry] = [a for actions in screen.actions.values() for a in actions if a["name"] == "retry"]
    again = await chat.click(retry)
    assert again.errors == [] and again.answers[-1].startswith(FULL) and len(chat.received(m)) == 1


async def test_a_message_sent_while_the_engine_is_down_says_why_sends_nothing_and_offers_retry(
    chat, ui, monkeypatch, tmp_path
):
    status_file = tmp_path / "engine-status.json"
    EngineStatus(
        state=SupervisorState.DOWN,
        pid=None,
        attempt=5,
        max_attempts=5,
        reason=Text("cause.cpu_out_of_memory", {"size": "2 GiB"}),
        cause="oom",
        message="the engine ran out of memory; gave up after 5 restarts in 10 min",
        log_path="engine.log",
        since=time.time(),
    ).write(status_file)
    down = poller_for(f"http://127.0.0.1:{free_port()}/v1", status_file)  # the supervisor gave up
    await down.start()
    monkeypatch.setattr(ui.service, "_poller", down)
    try:
        status = await down.wait_until_ready(5)
        assert status.state is EngineState.DOWN, status
        m = marker()
        screen = await chat.send(f"anyone there? {m}")
    finally:
        await down.stop()
    [error] = screen.errors
    assert error.startswith("The engine is not answering:") and t("cause.cpu_out_of_memory", size="2 GiB") in error
    assert "retry" in screen.error_actions() and screen.answers == []
    assert chat.received(m) == [] and chat.conversation.turns[-1].content == f"anyone there? {m}"


@pytest.mark.parametrize("drops, answered", [(1, True), (2, False)])
async def test_an_engine_dying_before_the_first_token_is_waited_for_and_the_message_sent_once_more(
    chat, ui, monkeypatch, drops, answered
):
    poller = RestartingPoller(ui.service._poller)  # after the failure: "restarting" until waited for
    monkeypatch.setattr(ui.service, "_poller", poller)
    m = marker()
    screen = await chat.send(f"[[fault:drop-mid:at=0:fail={drops}]] {m}")
    assert len(chat.received(m)) == 2 and poller.waits == 1  # waited once, sent again once, never twice
    assert [s["name"] for s in screen.steps.values() if s.get("type") == "tool"][0].startswith(
        "The model is ready (waited"
    )
    if answered:
        assert screen.errors == [] and len(screen.answers) == 1 and screen.answers[0].startswith(FULL)
        assert [t.role for t in chat.conversation.turns] == ["user", "assistant"]
    else:
        [error] = screen.errors
        assert "broke off" in error and "retry" in screen.error_actions() and screen.answers == []
        assert [t.role for t in chat.conversation.turns] == ["user"]

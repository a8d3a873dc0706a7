"""The Chainlit handlers (backend/ui/), driven through Chainlit's own socket handlers without a browser.

A real ``WebsocketSession`` whose ``emit`` records every event stands in for the browser; messages
go through ``chainlit.socket.message`` (the ``client_message`` event, so Stop cancels the same task
as in production), Stop through ``chainlit.socket.stop``, edits through ``chainlit.socket.edit_message``,
action buttons through the registered callbacks (what ``POST /project/action`` calls). The app runs in
external mode against ``tests.fakes.openai_server`` (in-process, so the test sees exactly what it received).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from backend.chat.conversation import Conversation
from backend.settings import ROOT
from tests.fakes.openai_server import FAULTS, FakeServer, expected_text

pytestmark = pytest.mark.asyncio(loop_scope="module")

# [client] limits for this module, small so stalls are seen quickly, but not so small that a loaded machine's pause
# (seconds, seen while vLLM ran beside the tests) cuts a normal answer of the in-process fake server
FIRST_TOKEN_TIMEOUT = 4
IDLE_TIMEOUT = 3
STALL = 12  # seconds a fault stalls: well above both limits


# ---------------------------------------------------------------- what the browser would show


@dataclass
class Screen:
    """The chat as the browser would render it from a list of socket events."""

    events: list[tuple[str, Any]]
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, data in self.events:
            if name in ("new_message", "stream_start"):
                self.steps[data["id"]] = {**self.steps.get(data["id"], {}), **data}
            elif name == "update_message":
                self.steps.setdefault(data["id"], {}).update(data)
            elif name == "stream_token" and data["id"] in self.steps:
                step = self.steps[data["id"]]
                step["output"] = data["token"] if data["isSequence"] else (step.get("output") or "") + data["token"]
            elif name == "delete_message":
                self.steps.pop(data["id"], None)
            elif name == "action":
                self.actions.setdefault(data["forId"], []).append(data)
            elif name == "remove_action":
                self.actions[data["forId"]] = [a for a in self.actions.get(data["forId"], []) if a["id"] != data["id"]]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [s for s in self.steps.values() if s.get("type") == "assistant_message"]

    @property
    def answers(self) -> list[str]:
        return [m["output"] for m in self.messages if not m.get("isError")]

    @property
    def errors(self) -> list[str]:
        return [m["output"] for m in self.messages if m.get("isError")]

    def action_names(self, message: dict[str, Any]) -> list[str]:
        return [a["name"] for a in self.actions.get(message["id"], [])]

    def error_actions(self) -> list[str]:
        return [n for m in self.messages if m.get("isError") for n in self.action_names(m)]

    def steps_named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.steps.values() if s.get("name") == name]


# ---------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fake():
    async with FakeServer() as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ui(fake, tmp_path_factory):
    """The UI installed as app.py installs it, with its settings from the environment, pointed at the fake server."""
    import backend.ui
    from backend.chat import health
    from backend.chat.service import Service

    env = {
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "test",
        "QWENCHAT_CLIENT_FIRST_TOKEN_TIMEOUT": str(FIRST_TOKEN_TIMEOUT),
        "QWENCHAT_CLIENT_IDLE_TIMEOUT": str(IDLE_TIMEOUT),
        "QWENCHAT_CLIENT_MAX_RETRIES": "1",
        "QWENCHAT_CLIENT_RETRY_BACKOFF": "0.05",
        "QWENCHAT_UI_LANGUAGE": "en",
        "QWENCHAT_UI_WAIT_FOR_READY": "20",
        "QWENCHAT_LOGGING_DIR": str(tmp_path_factory.mktemp("logs")),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.setenv("QWENCHAT_CONFIG", str(ROOT / "tests" / "config.toml"))  # never the shipped config.toml
        for key in ("QWENCHAT_STATUS_FILE", "QWENCHAT_LOG_DIR", "QWENCHAT_PROFILE"):
            mp.delenv(key, raising=False)
        await health.reset_shared()
        module = backend.ui.install(Service.from_environment())
        assert module.service.settings.external and module.service.base_url == fake.base_url
        yield module
        await module.service.poller.stop()
        await module.service.client.aclose()
        await health.reset_shared()


class Chat:
    """One browser tab: a Chainlit websocket session whose emitted events are recorded."""

    def __init__(self, ui, fake: FakeServer) -> None:
        from chainlit.session import WebsocketSession

        self.ui, self.fake = ui, fake
        self.events: list[tuple[str, Any]] = []
        self.sid = f"sid-{uuid.uuid4()}"

        async def emit(event: str, data: Any) -> None:
            self.events.append((event, data))

        async def emit_call(event: str, data: Any, timeout: Any) -> None:
            raise AssertionError(f"the app asked the browser a question ({event}); no test expects that")

        self.session = WebsocketSession(
            id=str(uuid.uuid4()),
            socket_id=self.sid,
            emit=emit,
            emit_call=emit_call,
            user_env={},
            client_type="webapp",
            environ={"HTTP_ACCEPT_LANGUAGE": "en-US"},
        )

    # -------------------------------------------------------- lifecycle

    async def start(self) -> None:
        from chainlit import socket

        await socket.connection_successful(self.sid)
        await asyncio.wait_for(self.session.current_task, 30)  # on_chat_start
        status = await self.ui.service.poller.wait_until_ready(20)
        assert status.answering, f"the fake server never became ready: {status}"

    async def end(self) -> None:
        from chainlit.config import config
        from chainlit.context import init_ws_context
        from chainlit.user_session import user_sessions

        init_ws_context(self.session)
        await config.code.on_chat_end()
        user_sessions.pop(self.session.id, None)
        await self.session.delete()

    # -------------------------------------------------------- what a user does

    async def send(self, text: str, message_id: str | None = None, timeout: float = 60) -> Screen:
        """Type and send a message; return what appeared on the screen for it."""
        from chainlit import socket

        n = len(self.events)
        await socket.message(self.sid, {"message": self.payload(text, message_id), "fileReferences": None})
        await asyncio.wait_for(self.session.current_task, timeout)
        return self.screen(n)

    def start_sending(self, text: str) -> asyncio.Task:
        """Send without waiting for the answer (for Stop); returns the message task."""
        from chainlit import socket

        async def go() -> None:
            await socket.message(self.sid, {"message": self.payload(text), "fileReferences": None})
            await self.session.current_task

        return asyncio.create_task(go())

    async def edit(self, message_id: str, text: str, timeout: float = 60) -> Screen:
        from chainlit import socket

        n = len(self.events)
        await asyncio.wait_for(socket.edit_message(self.sid, {"message": {"id": message_id, "output": text}}), timeout)
        return self.screen(n)

    async def stop(self) -> None:
        from chainlit import socket

        await socket.stop(self.sid)

    async def click(self, action: dict[str, Any], timeout: float = 60) -> Screen:
        """Press an action button (what Chainlit's POST /project/action does)."""
        import chainlit as cl
        from chainlit.config import config
        from chainlit.context import init_ws_context

        n = len(self.events)
        init_ws_context(self.session)
        await asyncio.wait_for(config.code.action_callbacks[action["name"]](cl.Action(**action)), timeout)
        return self.screen(n)

    # -------------------------------------------------------- what the test looks at

    def payload(self, text: str, message_id: str | None = None) -> dict[str, Any]:
        return {
            "id": message_id or str(uuid.uuid4()),
            "threadId": self.session.thread_id,
            "type": "user_message",
            "name": "User",
            "output": text,
            "createdAt": datetime.now(UTC).isoformat(),
        }

    def screen(self, since: int = 0) -> Screen:
        return Screen(self.events[since:])

    @property
    def conversation(self) -> Conversation:
        from chainlit.user_session import user_sessions

        from backend.ui.context import SESSION_KEY

        return user_sessions[self.session.id][SESSION_KEY].conversation

    def received(self, marker: str) -> list:
        """The chat requests the fake server got whose last user message contains ``marker``."""
        out = []
        for rec in self.fake.records:
            users = [m for m in rec.messages if isinstance(m, dict) and m.get("role") == "user"]
            if users and marker in str(users[-1].get("content")):
                out.append(rec)
        return out


@pytest_asyncio.fixture(loop_scope="module")
async def chat(ui, fake):
    c = Chat(ui, fake)
    await c.start()
    yield c
    await c.end()


def marker() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------- opening a chat


async def test_a_chat_opened_while_the_engine_lists_no_model_yet_still_gets_its_settings_panel(ui, fake, monkeypatch):
    from backend.chat.health import HealthStatus

    class LoadingPoller:
        """The shared poller before the engine lists any model (it is still loading)."""

        status = HealthStatus()

        async def start(self) -> None:
            pass

        def subscribe(self):
            return NoChanges()

    class NoChanges:
        """A subscription on which nothing ever changes."""

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc) -> None:
            pass

        def __aiter__(self):
            return self

        async def __anext__(self):
            await asyncio.Event().wait()

    monkeypatch.setattr(ui.service, "_poller", LoadingPoller())
    tab = Chat(ui, fake)
    from chainlit import socket

    await socket.connection_successful(tab.sid)
    await asyncio.wait_for(tab.session.current_task, 30)
    try:
        assert tab.screen().errors == []  # Select refuses an empty list; that error must not reach the user
        [widgets] = [data for event, data in tab.events if event == "chat_settings"]
        [model] = [w for w in widgets if w["id"] == "model"]
        assert ui.service.settings.model.name in str(model["items"])
    finally:
        await tab.end()


# ---------------------------------------------------------------- every fault mode, as the user sees it

FULL = expected_text(8)  # a normal answer from the fake server
PARTIAL = expected_text(3)  # what a mid-stream fault lets through (at=3)

# mode spec -> (text shown in the answer, error text fragment or None, Retry offered)
# text: FULL = the whole answer, PARTIAL = cut and marked, "" = no answer bubble at all.
CASES: dict[str, tuple[str, str | None, bool]] = {
    "fault:empty-choices-first": (FULL, None, False),
    "fault:usage-only-final": (FULL, None, False),
    "fault:no-delta": (FULL, None, False),
    "fault:null-content": (FULL, None, False),
    "fault:no-finish": (FULL, None, False),
    "fault:role-only-first": (FULL, None, False),
    "fault:extra-fields": (FULL, None, False),
    "fault:several-choices": (FULL, None, False),
    "fault:other-choice-chunks": (FULL, None, False),
    "fault:think-inline": (FULL, None, False),
    "fault:reasoning-field": (FULL, None, False),
    "fault:invalid-utf8": ("ok 中 bad", None, False),
    f"fault:stall-first:stall={STALL}": (
        "",
        f"did not start answering within {FIRST_TOKEN_TIMEOUT} s ([client].first_token_timeout)",
        True,
    ),
    f"fault:slow-headers:stall={STALL}": (
        "",
        f"did not start answering within {FIRST_TOKEN_TIMEOUT} s ([client].first_token_timeout)",
        True,
    ),
    f"fault:stall-mid:stall={STALL}": (PARTIAL, f"nothing arrived for {IDLE_TIMEOUT} s ([client].idle_timeout)", True),
    "fault:drop-mid": (PARTIAL, "the connection to the model server broke off", True),
    "fault:error-mid": (PARTIAL, "failed while answering: HTTP 500: fake engine failure mid-stream.", True),
    "fault:error-mid-flat": (PARTIAL, "failed while answering: HTTP 500: fake engine failure mid-stream (flat).", True),
    "fault:non-json": (PARTIAL, "sent a response that could not be read", True),
    "fault:http-500": ("", "failed while answering: HTTP 500", True),
    "fault:http-503": ("", "the model server is busy", True),
    "fault:overflow-400": (
        "",
        "the conversation is too long for the model (This model's maximum context length is 8192 tokens",
        False,
    ),
    "fault:unknown-model-404": ("", "the model server does not serve 'fake-qwen'", False),
    "fault:empty-choices": ("", "ended the answer without sending any text", True),
    "fault:empty-stream": ("", "ended the answer without sending any text", True),
    # Odd backend answers, by kind (issue #10): the answer a server did send is shown, a cut one is marked.
    "fault:json-body": (FULL, None, False),
    "fault:sse-wrong-type": (FULL, None, False),
    "fault:finish-no-done": (FULL, None, False),
    "fault:eof-no-finish": (PARTIAL, "ended the answer before it finished (neither a finish reason nor [DONE]", True),
    "fault:html-200": (
        "",
        '/v1/chat/completions answered with a web page "Sign in - Corporate Proxy" (HTTP 200), not the OpenAI API',
        True,
    ),
    "fault:html-502": ("", '/v1/chat/completions answered with a web page "502 Bad Gateway" (HTTP 502)', True),
    "fault:text-200": ("", "answered with plain text (text/plain; charset=utf-8), not an event stream", True),
    "fault:json-error-200": ("", "failed while answering: HTTP 500: fake engine failure in a 200 body.", True),
    "fault:tool-calls": ("", "the model asked to call a tool (get_weather); this chat does not run tools", True),
}


async def test_the_table_covers_every_fault_of_the_fake_server():
    assert {spec.split(":")[1] for spec in CASES} == set(FAULTS) | {"http-500", "http-503"}


@pytest.mark.parametrize("spec", list(CASES))
async def test_each_fault_shows_text_or_a_clear_error_keeps_history_and_the_next_message_works(chat, spec):
    shown, error, retry = CASES[spec]
    m = marker()
    text = f"[[{spec}]] question {m}"
    screen = await chat.send(text)

    # What the user sees.
    assert [e for e in screen.errors if "Traceback" in e] == []
    if error is None:
        assert screen.errors == [], screen.errors
        assert len(screen.answers) == 1 and screen.answers[0].startswith(shown), screen.answers
        assert "interrupted" not in screen.answers[0]
    else:
        assert len(screen.errors) == 1 and error in screen.errors[0], screen.errors
        assert ("retry" in screen.error_actions()) is retry
        if shown:
            assert len(screen.answers) == 1, screen.answers
            assert screen.answers[0].startswith(shown) and "⚠ answer interrupted · `fake-qwen`" in screen.answers[0]
            assert expected_text(4) not in screen.answers[0]  # nothing after the fault point was invented
        else:
            assert screen.answers == []  # no empty bubble left behind

    # What the history holds: the user's message, and what was shown, marked when cut.
    turns = chat.conversation.turns
    assert turns[0].role == "user" and turns[0].content == text
    if shown:
        assert len(turns) == 2 and turns[1].role == "assistant" and turns[1].content.startswith(shown)
        assert turns[1].interrupted is (error is not None)
    else:
        assert len(turns) == 1

    # The chat keeps working.
    after = await chat.send(f"next {m}")
    assert after.errors == [] and len(after.answers) == 1 and after.answers[0].startswith(FULL)
    assert chat.conversation.turns[-1].content == FULL and not chat.conversation.turns[-1].interrupted


# mode spec -> the one line the footer adds to a complete answer that did not end with a plain stop
ENDINGS = {
    "normal:finish=content_filter": "stopped by the server's content filter",
    "normal:finish=abort_by_policy": "ended for a reason this chat does not know (abort_by_policy); it may be incomplete",
    "normal:tokens=20:finish=length": "cut at the reply limit ([budget].reply_reserve)",
    "fault:no-finish": "the server did not say why the answer ended (no finish reason)",  # [DONE], no reason
}


@pytest.mark.parametrize("spec", list(ENDINGS))
async def test_every_ending_other_than_a_plain_stop_is_explained_in_one_line_under_the_answer(chat, spec):
    screen = await chat.send(f"[[{spec}]] {marker()}")
    assert screen.errors == [] and len(screen.answers) == 1, screen
    answer = screen.answers[0]
    body, footer_line = answer.rsplit("\n\n", 1)
    assert body.startswith("w0 w1") and "interrupted" not in answer
    assert footer_line.startswith("*`fake-qwen` ·") and ENDINGS[spec] in footer_line, footer_line


async def test_a_plain_stop_adds_no_ending_line(chat):
    answer = (await chat.send(f"plain {marker()}")).answers[0]
    assert not any(note in answer for note in ("did not say", "content filter", "does not know", "reply limit", "tool"))


@pytest.mark.parametrize(
    "spec, why",
    [
        ("normal:tokens=0", "the model ended it at once (finish reason stop)"),
        ("normal:tokens=0:finish=content_filter", "stopped by the server's content filter"),
        ("fault:tool-calls", "the model asked to call a tool (get_weather); this chat does not run tools"),
    ],
)
async def test_an_answer_with_no_text_says_why_with_retry_and_no_footer_stands_alone(chat, spec, why):
    screen = await chat.send(f"[[{spec}]] {marker()}")
    assert screen.answers == [], screen.answers  # no bubble holding only "*`fake-qwen` · 0.1 s · context …*"
    assert screen.errors == [f"The model's answer carried no text: {why}. Press Retry, or rephrase your message."]
    assert screen.error_actions() == ["retry"]
    assert [t.role for t in chat.conversation.turns] == ["user"]  # nothing recorded as an answer


async def test_a_web_page_names_the_exact_url_the_chat_asked(chat, fake):
    screen = await chat.send(f"[[fault:html-200]] {marker()}")
    assert screen.errors[0].startswith(f"{fake.base_url}/chat/completions answered with a web page")
    assert "a proxy or a login page in the way?" in screen.errors[0]


async def test_a_json_body_to_a_streaming_request_is_shown_whole_and_counted(chat, ui):
    before = ui.service.status_json()["anomalies"].get("json_body", 0)
    screen = await chat.send(f"[[fault:json-body]] {marker()}")
    assert screen.errors == [] and screen.answers[0].startswith(FULL + "\n\n*`fake-qwen` ·")
    assert "without sending any text" not in screen.answers[0]
    assert ui.service.status_json()["anomalies"]["json_body"] == before + 1


def browser_language(service, monkeypatch) -> None:
    """The fixture's app forces English ([ui].language = "en"); here the viewer's browser decides ("auto")."""
    settings = service.settings
    if hasattr(settings, "model_copy"):  # pydantic settings
        auto = settings.model_copy(update={"ui": settings.ui.model_copy(update={"language": "auto"})})
    else:
        import dataclasses

        auto = dataclasses.replace(settings, ui=dataclasses.replace(settings.ui, language="auto"))
    monkeypatch.setattr(service, "settings", auto)


async def test_the_status_line_gets_its_words_in_both_languages_from_the_catalog(chat, ui, monkeypatch):
    import dataclasses

    from backend.chat.health import EngineState

    assert ui.service.status_json("zh-CN")["label"] == "ready"  # [ui].language = "en" forces the badge's language
    browser_language(ui.service, monkeypatch)
    st, zh = ui.service.status_json("en-US"), ui.service.status_json("zh-CN")
    assert (st["state"], st["label"], zh["label"]) == ("ready", "ready", "就绪")
    assert (st["offline_label"], zh["offline_label"]) == ("UI offline", "界面未连接")
    assert (st["lang"], zh["lang"]) == ("en", "zh-CN")
    poller = ui.service.poller
    real = poller.status
    try:  # while the launcher installs the engine the word is "preparing", whatever the state
        poller._status = dataclasses.replace(real, state=EngineState.STARTING, phase="install_engine")
        assert (ui.service.status_json()["label"], ui.service.status_json("zh-CN")["label"]) == ("preparing", "准备中")
        poller._status = dataclasses.replace(real, state=EngineState.DOWN)
        assert ui.service.status_json("zh-TW")["label"] == "引擎不可用"
    finally:
        poller._status = real


async def test_reasoning_is_shown_in_its_own_step_not_in_the_answer(chat):
    screen = await chat.send(f"[[fault:think-inline]] {marker()}")
    assert [s["output"] for s in screen.steps_named("Reasoning")] == ["reasoning"]
    assert "<think>" not in screen.answers[0] and "reasoning" not in screen.answers[0]


async def test_several_choices_show_only_the_first(chat):
    screen = await chat.send(f"[[fault:several-choices]] {marker()}")
    assert screen.answers[0].startswith(FULL) and "X" not in screen.answers[0].split("\n")[0]


# ---------------------------------------------------------------- Stop, edit, Retry


async def test_stop_closes_the_upstream_request_and_keeps_the_partial_marked_stopped(chat, fake):
    m = marker()
    task = chat.start_sending(f"[[normal:tokens=400:rate=20]] long answer {m}")
    await wait_for(lambda: chat.screen().answers and "w3" in chat.screen().answers[-1], 20, "four streamed tokens")
    await chat.stop()
    await asyncio.wait_for(task, 20)

    [rec] = chat.received(m)
    await fake.wait_finished(rec, 5)
    assert rec.disconnected and not rec.completed  # the engine saw the connection close
    [shown] = [a for a in chat.screen().answers if "⚠" in a]
    assert shown.endswith("*⚠ stopped · `fake-qwen`*")
    partial = shown.split("\n\n*⚠")[0]
    assert partial.startswith(expected_text(4)) and expected_text(400) not in partial
    last = chat.conversation.turns[-1]
    assert last.interrupted and last.content == partial
    after = await chat.send(f"next {m}")
    assert after.answers[0].startswith(FULL)


async def test_an_edited_message_replaces_its_turn_and_drops_the_turns_after_it(chat, fake):
    m = marker()
    first_id = str(uuid.uuid4())
    await chat.send(f"alpha {m}", message_id=first_id)
    await chat.send(f"beta {m}")
    screen = await chat.edit(first_id, f"gamma {m}")

    assert screen.answers and screen.answers[-1].startswith(FULL)
    sent = chat.received(m)[-1].messages
    assert sent == [{"role": "user", "content": f"gamma {m}"}]  # no stale alpha, beta or their answers
    assert [(t.role, t.content) for t in chat.conversation.turns] == [("user", f"gamma {m}"), ("assistant", FULL)]


async def test_stop_also_cancels_the_answer_to_an_edited_message(chat, fake):
    m = marker()
    first_id = str(uuid.uuid4())
    await chat.send(f"short {m}", message_id=first_id)
    n = len(chat.events)
    edited = asyncio.create_task(chat.edit(first_id, f"[[normal:tokens=400:rate=20]] long {m}"))
    await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, "four streamed tokens after the edit")
    await chat.stop()
    await asyncio.wait_for(edited, 20)

    rec = chat.received(m)[-1]
    await fake.wait_finished(rec, 5)
    assert rec.disconnected
    assert [a for a in chat.screen(n).answers if "⚠" in a][0].endswith("*⚠ stopped · `fake-qwen`*")
    assert chat.conversation.turns[-1].interrupted


async def test_retry_resends_the_last_user_turn_without_the_cut_answer(chat, fake):
    m = marker()
    screen = await chat.send(f"[[fault:drop-mid:fail=1]] retry me {m}")
    [retry] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "retry"]
    again = await chat.click(retry)

    first, second = chat.received(m)
    assert second.messages == first.messages  # the same turn, without the partial answer
    assert again.errors == [] and again.answers[-1].startswith(FULL)
    turns = chat.conversation.turns
    assert [(t.role, t.interrupted) for t in turns] == [("user", False), ("assistant", False)]
    assert turns[1].content == FULL


async def test_stop_also_cancels_an_answer_started_by_retry(chat, fake):
    m = marker()
    screen = await chat.send(f"[[fault:http-500:fail=1:tokens=400:rate=20]] {m}")
    [retry] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "retry"]
    n = len(chat.events)
    clicked = asyncio.create_task(chat.click(retry))
    await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, "four streamed tokens after Retry")
    assert ("task_start", {}) in chat.events[n:]  # the UI shows the Stop button
    await chat.stop()
    await asyncio.wait_for(clicked, 20)

    rec = chat.received(m)[-1]
    await fake.wait_finished(rec, 5)
    assert rec.disconnected
    assert [a for a in chat.screen(n).answers if "⚠" in a][0].endswith("*⚠ stopped · `fake-qwen`*")
    assert chat.events[-1] == ("task_end", {})


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("text", ["", "   ", " \n\t "])
async def test_an_empty_message_is_refused_with_a_clear_message_and_nothing_is_sent(chat, fake, text):
    before = len(fake.records)
    screen = await chat.send(text)
    assert screen.errors == ["Your message is empty; nothing was sent."]
    assert [r for r in fake.records[before:] if r.messages != [{"role": "user", "content": "ping"}]] == []
    assert chat.conversation.turns == []


async def test_a_10_mb_message_gets_a_clear_message_is_kept_and_its_trimmed_version_can_be_sent(chat, fake):
    m = marker()
    big = (f"{m} " + "lorem ipsum dolor sit amet " * 400_000)[: 10 * 1024 * 1024]
    t0 = time.monotonic()
    screen = await chat.send(big, timeout=120)
    seconds = time.monotonic() - t0
    assert chat.received(m) == []  # nothing was sent to the engine
    [error] = screen.errors
    assert "Nothing was sent" in error and "tokens" in error, error
    assert chat.conversation.turns[-1].content == big  # nothing typed is lost
    [trim] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "send_trimmed"]

    trimmed = await chat.click(trim, timeout=120)
    [rec] = chat.received(m)
    assert trimmed.errors == [] and trimmed.answers[-1].startswith(FULL)
    assert rec.body_bytes < 200_000, rec.body_bytes  # fits an 8192-token model
    after = await chat.send(f"next {m}x")
    assert after.errors == [] and after.answers[-1].startswith(FULL)
    print(f"10 MB message: refused with a message in {seconds:.1f} s; trimmed request {rec.body_bytes} bytes")


async def test_nul_bytes_and_lone_surrogates_go_through(chat, fake):
    m = marker()
    text = f"nul\x00here and a lone \ud800 surrogate {m}"
    screen = await chat.send(text)
    assert screen.errors == [] and screen.answers[0].startswith(FULL)
    [rec] = chat.received(m)
    assert rec.messages[-1]["content"] == f"nul\x00here and a lone \ufffd surrogate {m}"
    assert chat.conversation.turns[0].content == text  # kept as typed


async def test_a_settings_change_to_a_served_adapter_shows_no_loading_step_and_the_next_answer_uses_it(chat, fake):
    from chainlit.config import config
    from chainlit.context import init_ws_context

    m = marker()
    await chat.send(f"before {m}")
    n = len(chat.events)
    init_ws_context(chat.session)
    await config.code.on_settings_update({"model": "fake-adapter", "temperature": 0.5})
    assert [e for e, d in chat.events[n:] if e in ("new_message", "delete_message", "stream_start")] == []
    screen = await chat.send(f"after {m}")
    assert "`fake-adapter` ·" in screen.answers[-1]
    rec = chat.received(m)[-1]
    assert rec.model == "fake-adapter" and len(rec.messages) == 3  # the earlier exchange is still sent


# ---------------------------------------------------------------- composer commands


async def send_command(chat, command: str, text: str):
    from chainlit import socket

    n = len(chat.events)
    payload = {**chat.payload(text), "command": command}
    await socket.message(chat.sid, {"message": payload, "fileReferences": None})
    await asyncio.wait_for(chat.session.current_task, 30)
    return chat.screen(n)


async def test_the_chat_offers_the_adapters_and_unload_commands(chat):
    sent = [d for e, d in chat.events if e == "set_commands"]
    assert sent and {"adapters", "unload"} <= {c["id"] for c in sent[-1]}  # and the compare commands


async def test_adapters_command_lists_the_base_and_the_served_adapter_and_sends_nothing_to_the_model(chat, fake):
    before = len(fake.records)
    screen = await send_command(chat, "adapters", "")
    assert "fake-qwen" in screen.answers[-1] and "fake-adapter" in screen.answers[-1]
    assert len(fake.records) == before


@pytest.mark.parametrize(
    "typed, words",
    [
        ("two words", ["'two words' is not a hub id", "/adapters owner/name"]),
        # this chat's app talks to an external server (the fake): it could not read an adapter downloaded here
        ("acme/some-lora", ["acme/some-lora was not added", "external server"]),
    ],
    ids=["not-an-id", "external-mode"],
)
async def test_adapters_with_a_hub_id_it_cannot_add_is_one_error_and_nothing_reaches_the_model(
    chat, fake, typed, words
):
    before = len(fake.records)
    screen = await send_command(chat, "adapters", typed)
    assert len(screen.errors) == 1 and all(w in screen.errors[0] for w in words), screen.errors
    assert len(fake.records) == before
    assert (await chat.send("still there?")).answers


async def test_unloading_something_that_is_not_a_served_adapter_is_a_clear_error(chat):
    screen = await send_command(chat, "unload", "fake-qwen")
    assert screen.errors and "fake-qwen" in screen.errors[-1]


async def test_unload_refused_by_the_engine_is_shown_and_the_chat_goes_on(chat):
    # The fake server has no /v1/unload_lora_adapter route: the engine's refusal must reach the user.
    screen = await send_command(chat, "unload", "fake-adapter")
    assert screen.errors and "fake-adapter" in screen.errors[-1]
    assert (await chat.send("still there?")).answers


async def send_typed(chat, text: str):
    """A message as Chainlit sends text typed in the composer (no command picked from the menu), dispatched as the
    socket server does: through the guard registered for the event."""
    from chainlit.server import sio

    n = len(chat.events)
    await sio.handlers["/"]["client_message"](chat.sid, {"message": chat.payload(text), "fileReferences": None})
    await asyncio.wait_for(chat.session.current_task, 30)
    return chat.screen(n)


@pytest.mark.parametrize("typed", ["/unload fake-adapter", "/Unload   fake-adapter", "/unload\nfake-adapter"])
async def test_a_command_typed_out_in_full_runs_as_the_picked_one_and_nothing_reaches_the_model(chat, fake, typed):
    before = len(fake.records)
    picked = await send_command(chat, "unload", "fake-adapter")
    screen = await send_typed(chat, typed)
    assert screen.errors == picked.errors and "fake-adapter" in screen.errors[-1]
    assert len(fake.records) == before
    assert [t for t in chat.conversation.turns if "unload" in t.content or t.content == "fake-adapter"] == []


async def test_typed_adapters_lists_them_and_a_typed_compare_off_says_compare_is_off(chat, fake):
    before = len(fake.records)
    listed = await send_typed(chat, "/adapters")
    assert "fake-qwen" in listed.answers[-1] and "fake-adapter" in listed.answers[-1]
    on = await send_typed(chat, "/compare")
    off = await send_typed(chat, "/compare off")
    assert on.answers and off.answers and on.answers[-1] != off.answers[-1]
    assert len(fake.records) == before and chat.conversation.turns == []


async def test_an_unknown_slash_word_is_a_message_for_the_model(chat, fake):
    m = marker()
    screen = await send_typed(chat, f"/usr/bin/env python {m}")
    assert screen.answers and chat.received(m)[-1].messages[-1]["content"] == f"/usr/bin/env python {m}"


async def test_a_typed_command_is_kept_as_the_picked_form_marked_so_a_resumed_chat_does_not_send_it(chat):
    from chainlit.chat_context import chat_context
    from chainlit.context import init_ws_context

    from backend.storage import history

    await send_typed(chat, "/unload fake-adapter")
    init_ws_context(chat.session)
    [msg] = [m for m in chat_context.get() if m.type == "user_message" and m.content == "fake-adapter"]
    assert msg.command == "unload" and msg.metadata[history.META_KEY] == {"command": "unload"}


async def test_status_route_exposes_the_anomaly_counters_by_kind(chat, ui):
    before = (await ui.routes.status())["anomalies"].get("empty_choices", 0)
    screen = await chat.send(f"[[fault:empty-choices-first]] {marker()}")
    assert screen.answers  # tolerated: the answer still appears
    assert (await ui.routes.status())["anomalies"]["empty_choices"] == before + 1


async def test_a_model_picked_in_the_composer_answers_the_message_it_came_with(chat, fake):
    from chainlit import socket

    sent = [d for e, d in chat.events if e == "set_modes"]
    assert sent and [o["id"] for o in sent[-1][0]["options"]] == ["fake-qwen", "fake-adapter"]
    m = marker()
    n = len(chat.events)
    payload = {**chat.payload(f"composer {m}"), "modes": {"model": "fake-adapter"}}
    await socket.message(chat.sid, {"message": payload, "fileReferences": None})
    await asyncio.wait_for(chat.session.current_task, 30)
    assert "`fake-adapter` ·" in chat.screen(n).answers[-1]
    assert chat.received(m)[-1].model == "fake-adapter"


# ---------------------------------------------------------------- review fixes: watcher, failures, buttons, races


def user_session(chat):
    """The chat's ChatSession (backend/ui/context.py keeps it under one key of Chainlit's user_session)."""
    from chainlit.user_session import user_sessions

    from backend.ui.context import SESSION_KEY

    return user_sessions[chat.session.id][SESSION_KEY]


def settings_sent(chat, since: int = 0) -> list:
    return [d for e, d in chat.events[since:] if e == "chat_settings"]


async def push_model_change(ui) -> None:
    """What the poller does when the engine's model list changes: a status with a new version."""
    import dataclasses

    st = ui.service.poller.status
    for q in list(ui.service.poller.subscribers):
        q.put_nowait(dataclasses.replace(st, version=st.version + 1000))


async def test_a_reconnect_restarts_the_model_watcher_and_a_cancelled_one_unsubscribes(chat, ui):
    from chainlit.config import config
    from chainlit.context import init_ws_context

    subscribers = len(ui.service.poller.subscribers)
    first = user_session(chat).watcher
    init_ws_context(chat.session)
    await config.code.on_chat_end()  # Chainlit calls it on every disconnect, also a brief network drop
    await asyncio.wait({first}, timeout=5)
    assert first.cancelled()
    assert len(ui.service.poller.subscribers) == subscribers - 1  # its queue left the poller

    await chat.send(f"after the reconnect {marker()}")  # same session: no on_chat_start
    again = user_session(chat).watcher
    assert again is not first and not again.done()
    assert len(ui.service.poller.subscribers) == subscribers
    n = len(chat.events)
    await push_model_change(ui)
    await wait_for(lambda: settings_sent(chat, n), 5, "the settings panel re-sent by the restarted watcher")


async def test_a_failed_settings_update_does_not_end_the_model_watcher(chat, ui, monkeypatch):
    real = ui.service.local_adapters
    calls = []

    async def broken_once(status):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("adapter folder unreadable")
        return await real(status)

    monkeypatch.setattr(ui.service, "local_adapters", broken_once)
    watcher = user_session(chat).watcher
    await push_model_change(ui)
    await wait_for(lambda: calls, 5, "the watcher to try re-sending the settings")
    n = len(chat.events)
    await push_model_change(ui)
    await wait_for(lambda: settings_sent(chat, n), 5, "the settings re-sent after the failure")
    assert not watcher.done()


async def test_an_app_bug_while_answering_is_reported_as_the_apps_with_a_request_id_not_the_engines(
    chat, ui, monkeypatch
):
    async def broken_fit(messages):
        raise KeyError("boom")

    monkeypatch.setattr(ui.service, "fit", broken_fit)
    screen = await chat.send(f"question {marker()}")
    [error] = screen.errors
    assert error.startswith("Something went wrong in the chat app (request ") and "it is logged" in error, error
    assert "model server" not in error and "KeyError" not in error
    assert chat.conversation.turns[-1].role == "user"  # the message is kept for Retry


async def test_an_app_bug_in_a_command_is_shown_not_swallowed(chat, ui, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("broken overview")

    monkeypatch.setattr(ui.service, "adapters_overview", broken)
    screen = await send_command(chat, "adapters", "")
    assert len(screen.errors) == 1 and "Something went wrong in the chat app" in screen.errors[0]


async def test_retry_on_an_older_bubble_is_refused_and_does_not_resend_the_latest_message(chat, fake):
    m = marker()
    screen = await chat.send(f"[[fault:http-500:fail=1]] old {m}")
    [retry] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "retry"]
    assert retry["payload"]["turn"] == chat.conversation.last_user().id
    await chat.send(f"newer {m}")
    turns_before = [(t.role, t.content) for t in chat.conversation.turns]
    requests_before = len(fake.records)

    clicked = await chat.click(retry)
    assert clicked.errors == [
        "This button belongs to an earlier message; only the latest message can be retried or trimmed."
    ]
    assert len(fake.records) == requests_before  # nothing was sent again
    assert [(t.role, t.content) for t in chat.conversation.turns] == turns_before
    assert [d["id"] for e, d in clicked.events if e == "remove_action"] == [retry["id"]]  # one press per button


async def test_the_settings_panel_and_the_composer_picker_agree_when_a_choice_lands_mid_update(chat, ui, monkeypatch):
    import chainlit as cl

    real_send = cl.ChatSettings.send
    calls = []
    in_flight = asyncio.Event()

    async def slow_first_send(self):
        calls.append(1)
        if len(calls) == 1:  # the first update (the watcher's) is slow to reach the browser
            in_flight.set()
            await asyncio.sleep(0.3)
        return await real_send(self)

    monkeypatch.setattr(cl.ChatSettings, "send", slow_first_send)
    from chainlit.context import init_ws_context

    from backend.ui import panel

    init_ws_context(chat.session)
    user_session(chat).model = "fake-qwen"
    n = len(chat.events)
    watcher_update = asyncio.create_task(panel.send_settings(ui))
    await asyncio.wait_for(in_flight.wait(), 10)  # not a fixed 0.05 s: the update may take longer to get there
    await panel.choose_model(ui, "fake-adapter")  # the user picks while that update is in flight
    await watcher_update

    modes = [d for e, d in chat.events[n:] if e == "set_modes"]
    picked = [o["id"] for o in modes[-1][0]["options"] if o.get("default")]
    assert user_session(chat).model == "fake-adapter" and picked == ["fake-adapter"], picked


async def test_settings_changes_are_kept_in_the_user_session_copy_chainlit_writes_back(chat, ui):
    from chainlit.config import config
    from chainlit.context import init_ws_context

    from backend.storage import history

    init_ws_context(chat.session)
    await config.code.on_settings_update({"model": "fake-adapter", "temperature": 0.25})
    stored = chat.session.to_persistable()[history.META_KEY]  # what Chainlit writes on disconnect
    assert stored["model"] == "fake-adapter" and stored["sampling"]["temperature"] == 0.25


async def test_a_command_message_is_marked_so_a_resumed_chat_leaves_it_out(chat):
    from backend.storage import history

    n = len(chat.events)
    await send_command(chat, "unload", "fake-qwen")
    marked = [d for e, d in chat.events[n:] if e == "update_message" and d.get("type") == "user_message"]
    assert marked and marked[-1]["metadata"] == history.command_metadata("unload")
    thread = {"steps": [marked[-1]]}
    assert history.conversation_from_thread(thread).turns == []


async def test_a_failure_after_the_answer_was_shown_records_it_once_and_unmarked(chat, ui, monkeypatch):
    async def broken_left_out(fitted, lang):
        raise RuntimeError("left-out note failed")

    monkeypatch.setattr("backend.ui.views.show_left_out", broken_left_out)
    m = marker()
    screen = await chat.send(f"question {m}")
    assert screen.errors == [] and len(screen.answers) == 1 and "⚠" not in screen.answers[0]
    turns = chat.conversation.turns
    assert [(t.role, t.interrupted) for t in turns[-2:]] == [("user", False), ("assistant", False)]
    assert turns[-1].content == FULL and len(turns) == 2


async def test_stop_after_the_answer_was_shown_does_not_record_it_twice(chat, ui, monkeypatch):
    reached = asyncio.Event()

    async def slow_left_out(fitted, lang):
        reached.set()
        await asyncio.sleep(30)

    monkeypatch.setattr("backend.ui.views.show_left_out", slow_left_out)
    task = chat.start_sending(f"question {marker()}")
    await asyncio.wait_for(reached.wait(), 20)
    await chat.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 20)
    turns = chat.conversation.turns
    assert [(t.role, t.interrupted) for t in turns] == [("user", False), ("assistant", False)]
    assert [a for a in chat.screen().answers if "⚠" in a] == []


async def test_stop_during_an_adapter_load_from_the_settings_panel_cancels_it(chat, ui, monkeypatch):
    from chainlit import socket

    started = asyncio.Event()

    async def slow_load(name, status=None):
        started.set()
        await asyncio.sleep(30)

    monkeypatch.setattr(ui.service, "ensure_loaded", slow_load)
    change = asyncio.create_task(socket.change_settings(chat.sid, {"model": "slow-adapter"}))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()
    await chat.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(change, 10)
    assert change.done() and time.monotonic() - t0 < 5
    assert user_session(chat).model == "fake-qwen"  # the load never happened: not left chosen


async def test_an_adapter_gone_from_the_engine_switches_the_chat_back_to_the_base_model(chat, fake):
    user_session(chat).model = "gone-adapter"  # chosen, then unloaded elsewhere
    m = marker()
    screen = await chat.send(f"question {m}")
    [error] = screen.errors
    assert "does not serve 'gone-adapter'" in error and "Switched back to fake-qwen" in error, error
    assert user_session(chat).model == "fake-qwen"
    after = await chat.send(f"next {m}")
    assert after.errors == [] and after.answers[-1].startswith(FULL)
    assert chat.received(m)[-1].model == "fake-qwen"


async def test_the_status_route_needs_a_login_when_login_is_on(ui, monkeypatch):
    import chainlit as cl
    import httpx
    from chainlit.auth import create_jwt
    from chainlit.config import config
    from chainlit.server import app as http_app

    transport = httpx.ASGITransport(app=http_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        open_status = await client.get("/qwenchat/status")
        assert open_status.status_code == 200 and open_status.json()["lang"] == "en"

        monkeypatch.setattr(config.code, "password_auth_callback", lambda u, p: None)
        monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "x" * 64)
        refused = await client.get("/qwenchat/status")
        assert refused.status_code == 401 and "adapters" not in refused.text

        token = create_jwt(cl.User(identifier="admin"))
        allowed = await client.get("/qwenchat/status", headers={"Authorization": f"Bearer {token}"})
        assert allowed.status_code == 200 and allowed.json()["model"] == "fake-qwen"


async def test_stop_mid_answer_also_ends_the_reasoning_steps_streaming(chat):
    task = chat.start_sending(f"[[fault:think-inline:tokens=400:rate=20]] {marker()}")
    await wait_for(lambda: chat.screen().answers and "w3" in chat.screen().answers[-1], 20, "four streamed tokens")
    await chat.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 20)
    [reasoning] = chat.screen().steps_named("Reasoning")
    assert reasoning["output"] == "reasoning" and reasoning["streaming"] is False, reasoning


async def test_a_user_running_every_operator_command_gets_one_line_saying_who_may(ui, chat, monkeypatch, caplog):
    import chainlit as cl

    from backend.settings import LoginSettings
    from backend.ui import commands

    login = LoginSettings(enable=True, password="long enough", operators=("admin", "carol"))
    monkeypatch.setattr(ui.service, "settings", ui.service.settings.model_copy(update={"login": login}))
    monkeypatch.setattr(chat.session, "user", cl.User(identifier="bob"))
    operator_commands = [c.id for c in commands.REGISTRY if c.operator] + ["adapters"]  # /adapters ID: a download
    typed = {"unload": "/unload pirate", "status": "/status", "adapters": "/adapters acme/pirate-lora"}
    for command in operator_commands:
        screen = await chat.send(typed[command])
        assert len(screen.errors) == 1 and "\n" not in screen.errors[0], (command, screen.errors)
        assert screen.errors[0].startswith("Only an operator may") and "(operators: admin, carol)" in screen.errors[0]
        assert screen.answers == [] and "Server status" not in str(screen.messages)
    assert "refused to" in caplog.text and "'bob'" in caplog.text

    monkeypatch.setattr(chat.session, "user", cl.User(identifier="carol"))
    screen = await chat.send("/status")
    assert screen.errors == [] and "Server status (operators only)" in str(screen.messages)

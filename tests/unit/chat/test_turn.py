"""The policy of one chat turn (backend/chat/turn.py): one test per way a turn can end.

A real ``Service`` (client, budget, health poller) talks to the fault-injecting fake OpenAI server
(``tests.fakes.openai_server``); a recording renderer stands in for Chainlit and keeps, in order,
everything the turn asked it to show. Only the engine's restart is staged, by a poller that says
"restarting" once: the fake server cannot restart itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
import uuid
from typing import Any

import pytest
import pytest_asyncio

from backend.chat import turn
from backend.chat.health import EngineLoad, EngineState, HealthPoller, HealthStatus, ReplicaHealth
from backend.chat.service import Service
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome, Reply
from backend.settings import ClientSettings, HealthSettings, LoggingSettings, Settings, UISettings
from backend.text import Text
from tests.fakes.openai_server import FakeServer, expected_text

pytestmark = pytest.mark.asyncio(loop_scope="module")

FULL = expected_text(8)  # a normal answer from the fake server


# ---------------------------------------------------------------- a renderer that records


class RecordedStep:
    """A progress step: its title and detail as last set, and how often it was updated."""

    def __init__(self, title: str) -> None:
        self.name, self.output, self.updates, self.open = title, "", 0, False

    async def update(self) -> None:
        self.updates += 1

    async def __aenter__(self) -> RecordedStep:
        self.open = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.open = False


class Recorder:
    """What the turn showed, in order: ``events`` holds (callback, arguments…) tuples."""

    def __init__(self, lang: str = "en") -> None:
        self.lang = lang
        self.events: list[tuple[Any, ...]] = []
        self.steps: list[RecordedStep] = []
        self.token_seen = asyncio.Event()  # set on every streamed token (Stop tests wait on it)

    def step(self, title: str) -> RecordedStep:
        self.steps.append(RecordedStep(title))
        return self.steps[-1]

    async def new_answer(self, model: str) -> None:
        self.events.append(("new_answer", model))

    async def stream_token(self, token: str) -> None:
        self.events.append(("token", token))
        self.token_seen.set()

    async def stream_reasoning(self, token: str) -> None:
        self.events.append(("reasoning", token))

    async def reasoning_done(self) -> None:
        self.events.append(("reasoning_done",))

    async def show_answer(self, reply: Reply) -> str:
        self.events.append(("answer", reply))
        return "answer-bubble"

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        self.events.append(("partial", text, model, why))
        return "partial-bubble"

    async def drop_answer(self) -> None:
        self.events.append(("drop_answer",))

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        self.events.append(("error", text, retry, trimmed))

    async def offer_cut(self, text: str, *, document: int, part: int, label: str) -> None:
        self.events.append(("offer_cut", text, document, part, label))

    async def model_changed(self) -> None:
        self.events.append(("model_changed",))

    async def left_out(self, fitted: Any) -> None:
        self.events.append(("left_out", fitted))

    # -------------------------------------------------------- what the test looks at

    def kinds(self) -> list[str]:
        return [e[0] for e in self.events]

    def tokens(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "token"]

    def reply(self) -> Reply:
        [reply] = [e[1] for e in self.events if e[0] == "answer"]
        return reply

    def errors(self) -> list[tuple[str, bool, str | None]]:
        return [e[1:] for e in self.events if e[0] == "error"]


async def test_the_recorder_has_every_callback_of_the_renderer_protocol():
    """Else a callback the turn starts to use would fail here as an app bug, not as a missing method."""
    wanted = {name for name in vars(turn.Renderer) if not name.startswith("_")} - {"lang"}
    assert wanted <= set(dir(Recorder)), wanted - set(dir(Recorder))


# ---------------------------------------------------------------- the service, against the fake server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fake():
    async with FakeServer() as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def service(fake, tmp_path_factory):
    settings = Settings(
        base_url=fake.base_url,
        api_key="test",
        client=ClientSettings(first_token_timeout=2, idle_timeout=1, max_retries=0, retry_backoff=0.05),
        ui=UISettings(language="en", wait_for_ready=10),
        logging=LoggingSettings(dir=str(tmp_path_factory.mktemp("logs"))),
    )
    svc = Service(settings)
    svc._poller = HealthPoller(
        fake.base_url, "test", HealthSettings(poll_starting=0.05, poll_ready=0.5, probe_timeout=2, probe_slow=1)
    )
    await svc.poller.start()
    status = await svc.poller.wait_until_ready(10)
    assert status.ready, f"the fake server never became ready: {status}"
    yield svc
    await svc.poller.stop()
    await svc.client.aclose()


def chat(service: Service, text: str, model: str | None = None) -> ChatSession:
    """A chat whose last user turn is ``text``."""
    session = ChatSession(system_prompt="", sampling=service.default_sampling(), model=model)
    session.conversation.add_user(str(uuid.uuid4()), text)
    return session


def marker() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


def received(fake: FakeServer, marker: str) -> list:
    """The chat requests the fake server got whose last message contains ``marker``."""
    return [r for r in fake.records if r.messages and marker in str(r.messages[-1].get("content"))]


# ---------------------------------------------------------------- one test per way a turn ends


async def test_an_answer_streams_its_tokens_in_order_and_reports_who_answered_how_much_and_how_long(service, fake):
    m = marker()
    session = chat(service, f"hello {m}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    assert view.tokens() == [f"w{i} " for i in range(8)]
    assert view.kinds() == ["new_answer", *["token"] * 8, "answer", "left_out", "reasoning_done"]
    reply = view.reply()
    assert (reply.text, reply.model, reply.finish.reason) == (FULL, "fake-qwen", "stop")
    assert reply.usage.completion_tokens == 8 and reply.fitted.prompt_tokens > 0 and reply.seconds > 0
    assert [(t.id, t.role, t.content, t.interrupted) for t in session.conversation.turns[1:]] == [
        ("answer-bubble", "assistant", FULL, False)
    ]
    [rec] = received(fake, m)
    assert rec.model == "fake-qwen" and rec.max_tokens == service.reply_tokens()


async def test_a_message_too_long_for_the_model_sends_nothing_and_offers_a_trimmed_version(service, fake):
    m = marker()
    big = f"{m} " + "lorem ipsum dolor sit amet " * 5_000  # far above the fake's 8192 tokens, under 100,000
    session = chat(service, big)
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert received(fake, m) == []
    [(text, retry, trimmed)] = view.errors()
    assert "Nothing was sent" in text and not retry
    assert trimmed is not None and trimmed.startswith(m) and len(trimmed) < len(big)
    assert [t.content for t in session.conversation.turns] == [big]  # nothing typed is lost


async def test_a_1m_token_message_is_refused_with_its_count_and_its_text_quoted_back(service, fake):
    m = marker()
    big = f"{m} " + "word " * 1_000_000  # about 1M tokens, far above [ui] max_message_tokens (100,000)
    session = chat(service, big)
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert received(fake, m) == []
    [(text, retry, trimmed)] = view.errors()
    tokens = int(text.split(" tokens")[0].rsplit(" ", 1)[1])
    assert tokens >= 1_000_000 and "100000" in text and not retry
    assert trimmed is not None and trimmed.startswith(m) and len(trimmed) < len(big) // 10  # fits the model
    assert f"```text\n{big}\n```" in text  # the whole text, quoted back: nothing typed is lost
    assert [t.content for t in session.conversation.turns] == [big]


async def test_a_message_within_the_token_limit_is_not_counted_twice(service, fake, monkeypatch):
    counted: list[int] = []
    real = service.counter

    async def spy():
        counter = await real()
        original = counter.count_text

        async def count_text(text: str) -> int:
            counted.append(len(text))
            return await original(text)

        monkeypatch.setattr(counter, "count_text", count_text)
        return counter

    monkeypatch.setattr(service, "counter", spy)
    await service.check_message_length("short " * 1000)  # 6,000 bytes: at most 6,000 tokens, under 100,000
    assert counted == []


async def test_stop_keeps_the_partial_answer_marked_stopped_and_lets_the_cancellation_through(service, fake):
    m = marker()
    session = chat(service, f"[[normal:tokens=400:rate=50]] long {m}")
    view = Recorder()
    task = asyncio.create_task(turn.answer(session, service, view))
    while len(view.tokens()) < 4:
        await asyncio.wait_for(view.token_seen.wait(), 10)
        view.token_seen.clear()

    task.cancel()  # what Chainlit's Stop does to the message task
    with pytest.raises(asyncio.CancelledError):
        await task

    shown = "".join(view.tokens())
    assert shown.startswith(expected_text(4)) and shown != expected_text(400)
    assert ("partial", shown, "fake-qwen", "stopped") in view.events and view.errors() == []
    assert view.kinds()[-1] == "reasoning_done"
    last = session.conversation.turns[-1]
    assert (last.id, last.content, last.interrupted) == ("partial-bubble", shown, True)
    [rec] = received(fake, m)
    await fake.wait_finished(rec, 5)
    assert rec.disconnected  # the engine saw the connection close


class RestartingPoller:
    """The real poller, except that right after a failure the engine is "restarting" until waited for."""

    def __init__(self, real: HealthPoller) -> None:
        self.real, self.restarting, self.waits = real, False, 0

    @property
    def status(self) -> HealthStatus:
        st = self.real.status
        return (
            dataclasses.replace(st, state=EngineState.STARTING, reason=Text.verbatim("restarting"))
            if self.restarting
            else st
        )

    async def refresh(self, probe: bool = False) -> HealthStatus:
        self.restarting = True
        return self.status

    async def wait_until_ready(self, timeout: float, on_progress=None, **kwargs: Any) -> HealthStatus:
        self.waits += 1
        if on_progress is not None:
            await on_progress(0.0, self.status)
        self.restarting = False
        return self.real.status


@pytest.mark.parametrize("drops, outcome", [(1, Outcome.ANSWERED), (2, Outcome.FAILED)])
async def test_an_engine_gone_before_any_text_is_waited_for_and_asked_once_more(
    service, fake, monkeypatch, drops, outcome
):
    poller = RestartingPoller(service.poller)
    monkeypatch.setattr(service, "_poller", poller)
    m = marker()
    session = chat(service, f"[[fault:drop-mid:at=0:fail={drops}]] {m}")  # the connection closes before any text
    view = Recorder()

    assert await turn.answer(session, service, view) is outcome

    assert len(received(fake, m)) == 2  # sent again once, never twice
    [step] = view.steps  # the wait, shown live
    assert poller.waits == 1 and step.name.startswith("The model is ready (waited")
    assert step.output.split("\n\n")[0] == "restarting"  # then the waiting message's context meter
    assert view.kinds().count("new_answer") == 2  # a fresh bubble for the second try
    if outcome is Outcome.ANSWERED:
        assert view.errors() == [] and view.reply().text == FULL
        assert [t.role for t in session.conversation.turns] == ["user", "assistant"]
    else:
        [(text, retry, _)] = view.errors()
        assert "broke off" in text and retry
        assert "drop_answer" in view.kinds() and [t.role for t in session.conversation.turns] == ["user"]


class UnroutablePoller(RestartingPoller):
    """A fleet (one replica ready) whose router does not route until waited for: a probe through it after a failed
    message says STARTING ("not routable"), as the real poller does for a router that answers /health only."""

    @property
    def status(self) -> HealthStatus:
        return dataclasses.replace(super().status, replicas=(ReplicaHealth(1, "127.0.0.1:1", ready=True),))


async def test_a_router_that_does_not_route_is_waited_for_as_long_as_the_poller_says_it_comes_back(
    service, fake, monkeypatch
):
    """Issue #28: a router that answers a message with 503 while a probe through it fails too (back, but routing
    nothing yet) is waited for, and again after each wait while it still does not route: as long as the poller says it
    is coming back, not a fixed number of times (it used to be 3: a message that met a router flapping while its workers
    came in ended in a "busy" bubble; seen against the real router in tests/integration/test_fleet.py)."""
    poller = UnroutablePoller(service.poller)
    monkeypatch.setattr(service, "_poller", poller)
    m = marker()
    session = chat(service, f"[[fault:http-503:fail=9]] {m}")  # the router: "no available workers", 9 times
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    assert len(received(fake, m)) == 10 and poller.waits == 9
    assert view.errors() == [] and view.reply().text == FULL


class NeverRoutingPoller(UnroutablePoller):
    """A router that never comes back: each wait runs out (as the real poller's would after its timeout)."""

    def __init__(self, real: HealthPoller) -> None:
        super().__init__(real)
        self.timeouts: list[float] = []

    async def wait_until_ready(self, timeout: float, on_progress=None, **kwargs: Any) -> HealthStatus:
        self.waits += 1
        self.timeouts.append(timeout)
        if on_progress is not None:
            await on_progress(0.0, self.status)
        return self.status  # still STARTING: the wait ran out


async def test_a_router_that_never_routes_ends_in_the_waits_timeout_not_in_busy(service, fake, monkeypatch):
    poller = NeverRoutingPoller(service.poller)
    monkeypatch.setattr(service, "_poller", poller)
    m = marker()
    view = Recorder()

    assert await turn.answer(chat(service, f"[[fault:http-503:fail=99]] {m}"), service, view) is Outcome.FAILED

    assert len(received(fake, m)) == 1 and poller.waits == 1  # one wait, bounded by [ui] wait_for_ready
    assert 0 < poller.timeouts[0] <= service.settings.ui.wait_for_ready
    [step] = view.steps
    assert step.name.startswith("Stopped waiting for the model")
    [(text, retry, _)] = view.errors()
    assert "busy" not in text and retry, text


class DownPoller:
    """The engine is down and the supervisor gave up: nothing to wait for."""

    status = HealthStatus(state=EngineState.DOWN, reason=Text.verbatim("the model server crashed"))


async def test_a_down_engine_is_an_error_with_retry_and_nothing_is_sent(service, fake, monkeypatch):
    monkeypatch.setattr(service, "_poller", DownPoller())
    m = marker()
    view = Recorder()

    assert await turn.answer(chat(service, m), service, view) is Outcome.FAILED

    assert received(fake, m) == [] and view.steps == []
    [(text, retry, _)] = view.errors()
    assert "the model server crashed" in text and retry


async def test_an_adapter_the_engine_no_longer_serves_switches_the_chat_back_to_the_default_model(service, fake):
    m = marker()
    session = chat(service, f"question {m}", model="gone-adapter")  # chosen, then unloaded elsewhere
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert session.model == "fake-qwen"
    assert view.kinds()[-3:] == ["model_changed", "error", "reasoning_done"]  # the panel shows it before the error
    [(text, retry, _)] = view.errors()
    assert "does not serve 'gone-adapter'" in text and "Switched back to fake-qwen" in text and retry


async def test_the_default_model_not_served_is_an_error_without_a_switch_or_retry(service, fake):
    session = chat(service, f"[[fault:unknown-model-404]] {marker()}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert session.model is None and "model_changed" not in view.kinds()
    [(text, retry, _)] = view.errors()
    assert "does not serve 'fake-qwen'" in text and not retry


@pytest.mark.parametrize(
    "spec, shown, error, retry",
    [
        ("fault:http-500", "", "failed while answering: HTTP 500", True),
        ("fault:error-mid", expected_text(3), "fake engine failure mid-stream", True),
        ("fault:overflow-400", "", "too long for the model", False),
    ],
)
async def test_other_backend_errors_keep_what_was_shown_and_offer_retry_only_when_resending_may_help(
    service, fake, spec, shown, error, retry
):
    session = chat(service, f"[[{spec}]] {marker()}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    [(text, offered, trimmed)] = view.errors()
    assert error in text and offered is retry and trimmed is None
    if shown:
        assert ("partial", shown, "fake-qwen", "answer interrupted") in view.events
        assert [(t.content, t.interrupted) for t in session.conversation.turns[1:]] == [(shown, True)]
    else:
        assert "drop_answer" in view.kinds() and len(session.conversation.turns) == 1


async def test_a_bug_in_the_app_is_reported_as_the_apps_with_the_request_id_the_log_has(
    service, fake, monkeypatch, caplog
):
    async def broken_fit(messages):
        raise KeyError("boom")

    monkeypatch.setattr(service, "fit", broken_fit)
    session = chat(service, marker())
    view = Recorder()

    with caplog.at_level(logging.ERROR, logger="backend.chat.turn"):
        assert await turn.answer(session, service, view) is Outcome.FAILED

    [(text, retry, _)] = view.errors()
    rid = re.search(r"\(request (\w+)\)", text).group(1)
    assert text.startswith("Something went wrong in the chat app") and "KeyError" not in text and retry
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)
    assert [t.role for t in session.conversation.turns] == ["user"]  # the message is kept for Retry


# ---------------------------------------------------------------- the footer's time apart from the wait (#20)


class LoadingPoller:
    """The real poller, except that the model is still loading until waited for (``load`` seconds), or that the
    engine's queue holds requests (``queued``: what the shared poller read from vLLM's /metrics)."""

    def __init__(self, real: HealthPoller, load: float = 0.0, queued: int = 0) -> None:
        self.real, self.loading, self.load, self.queued = real, load > 0, load, queued

    @property
    def status(self) -> HealthStatus:
        st = self.real.status
        if self.loading:
            return dataclasses.replace(st, state=EngineState.STARTING, reason=Text.verbatim("loading"))
        return dataclasses.replace(st, load=EngineLoad(1, self.queued)) if self.queued else st

    async def wait_until_ready(self, timeout: float, on_progress=None, **kwargs: Any) -> HealthStatus:
        await asyncio.sleep(self.load)
        self.loading = False
        return self.status

    async def subscribe(self):
        yield self.status
        await asyncio.Event().wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_cold_starts_answer_reports_its_own_time_apart_from_the_wait_for_the_model(service, monkeypatch):
    """Issue #20: the footer read "8 tokens · 158.3 s" for an answer of under a second once the model was ready."""
    monkeypatch.setattr(service, "_poller", LoadingPoller(service.poller, load=1.5))
    view = Recorder()

    started = time.monotonic()
    assert await turn.answer(chat(service, marker()), service, view) is Outcome.ANSWERED
    wall = time.monotonic() - started

    reply = view.reply()
    assert [s.name.startswith("The model is ready (waited") for s in view.steps] == [True]
    assert reply.waited is not None and reply.waited >= 1.5, reply
    assert reply.seconds <= wall - 1.5 and reply.seconds + reply.waited <= wall, (reply, wall)  # the load: not in it


async def test_an_answer_queued_in_the_engine_counts_the_queue_as_waited_not_as_its_own_time(service, monkeypatch):
    monkeypatch.setattr(service, "_poller", LoadingPoller(service.poller, queued=3))
    view = Recorder()
    session = chat(service, f"[[fault:stall-first:stall=1.2]] {marker()}")  # no first token for 1.2 s: queued

    started = time.monotonic()
    assert await turn.answer(session, service, view) is Outcome.ANSWERED
    wall = time.monotonic() - started

    reply = view.reply()
    assert [s.name for s in view.steps] == ["queued: 3 answers ahead · engine busy"]
    assert reply.waited is not None and reply.waited >= 1.2 and reply.seconds <= wall - 1.2, (reply, wall)


async def test_an_answer_that_never_waited_shows_no_wait_and_its_time_from_the_request(service, fake):
    view = Recorder()
    session = chat(service, f"[[fault:stall-first:stall=0.5]] {marker()}")  # a slow prefill, nothing queued

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    reply = view.reply()
    assert view.steps == [] and reply.waited is None and reply.seconds >= 0.5, reply

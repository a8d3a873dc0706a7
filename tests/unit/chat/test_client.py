"""backend.chat.client against tests.fakes.openai_server: every fault mode, stream and non-stream, ends in one typed outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import pytest_asyncio

from backend import errors
from backend.chat.client import (
    Anomaly,
    Answer,
    ChatClient,
    ErrorEvent,
    Finish,
    ReasoningDelta,
    TextDelta,
    ThinkSplitter,
    Usage,
    anomaly_counts,
    log_anomaly_summary,
    map_error,
    new_request_id,
    reset_anomaly_counts,
)
from backend.chat.sanitize import sanitize_messages
from backend.errors import (
    AuthenticationFailed,
    BackendError,
    ConnectionLost,
    ConnectTimeout,
    ContextOverflow,
    EmptyAnswer,
    EngineError,
    FirstTokenTimeout,
    IdleTimeout,
    MalformedResponse,
    ModelNotFound,
    Overloaded,
    RequestRejected,
    ServerStarting,
    ServerUnreachable,
    TotalTimeout,
)
from backend.settings import ClientSettings
from backend.text import Text, catalog
from tests.fakes.openai_server import FAULTS, FakeServer, expected_text, not_found_body, overflow_body

ROOT = Path(__file__).resolve().parents[3]
N = 8  # tokens in a default fake answer
TEXT = expected_text(N)
AT = 3  # default index of a mid-stream fault
# Seconds a timeout may fire late on a busy CI box (a loaded 2-core machine can hold this process back for more than
# a second). Each upper bound below stays under what a wrong behaviour would take: the stall (10 s), the total
# timeout (5 s), or the type of the error tells those apart anyway.
SLACK = 1.5
HI = [{"role": "user", "content": "hi"}]

FAST = ClientSettings(
    connect_timeout=2.0, first_token_timeout=0.5, idle_timeout=0.3, total_timeout=5.0, max_retries=0, retry_backoff=0.01
)
#: For the cases that do not test a time limit: limits no busy machine reaches (FAST's 0.5 s once ended a plain
#: answer in FirstTokenTimeout while another process was busy).
UNHURRIED = ClientSettings(
    connect_timeout=30.0, first_token_timeout=120.0, idle_timeout=120.0, total_timeout=300.0, max_retries=0
)
TIME_LIMITS = (FirstTokenTimeout, IdleTimeout, TotalTimeout)


@pytest_asyncio.fixture
async def server():
    async with FakeServer() as srv:
        yield srv


@pytest_asyncio.fixture
async def client(server):
    c = ChatClient(server.base_url, "test-key", FAST)
    yield c
    await c.aclose()


def make_client(server: FakeServer, **kw: Any) -> ChatClient:
    values = {**FAST.__dict__, **kw}
    return ChatClient(server.base_url, "test-key", ClientSettings(**values))


async def collect(
    client: ChatClient, model: str, messages: list[dict[str, Any]] = HI, **kw: Any
) -> tuple[list[Any], BaseException | None]:
    """All events of one stream and the exception that ended it (None: it finished)."""
    events: list[Any] = []
    try:
        async with contextlib.aclosing(client.stream(messages, model, **kw)) as stream:
            async for ev in stream:
                events.append(ev)
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever escaped
        return events, exc
    return events, None


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def reasoning_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))


def kinds_of(events: list[Any]) -> set[str]:
    return {e.kind for e in events if isinstance(e, Anomaly)}


def assert_well_formed(events: list[Any], exc: BaseException | None) -> None:
    """A stream ends with exactly one Finish (last, after at most one Usage) or one BackendError."""
    finishes = [e for e in events if isinstance(e, Finish)]
    usages = [e for e in events if isinstance(e, Usage)]
    assert len(usages) <= 1
    if exc is None:
        assert len(finishes) == 1 and events[-1] is finishes[0]
        if usages:
            assert events.index(usages[0]) == len(events) - 2
    else:
        assert isinstance(exc, BackendError), f"{type(exc).__name__} escaped: {exc!r}"
        assert not finishes


# ---------------------------------------------------------------- the matrix

# fault -> expected stream outcome: an error class, or (text, reasoning, anomaly kinds, finish reason)
OK = (TEXT, "", set(), "stop")
STREAM: dict[str, Any] = {
    "empty-choices-first": (TEXT, "", {"empty_choices"}, "stop"),
    "usage-only-final": OK,
    "no-delta": (TEXT, "", {"missing_delta"}, "stop"),
    "null-content": (TEXT, "", {"null_content"}, "stop"),
    "no-finish": (TEXT, "", {"no_finish_reason"}, None),
    "role-only-first": OK,
    "stall-first": FirstTokenTimeout,
    "stall-mid": IdleTimeout,
    "drop-mid": ConnectionLost,
    "error-mid": EngineError,
    "error-mid-flat": EngineError,
    "http-500": EngineError,
    "http-503": Overloaded,
    "overflow-400": ContextOverflow,
    "unknown-model-404": ModelNotFound,
    "non-json": MalformedResponse,
    "empty-choices": EmptyAnswer,
    "empty-stream": EmptyAnswer,
    "invalid-utf8": ("ok 中 bad\ufffd\ufffd end " + TEXT, "", {"invalid_utf8"}, "stop"),
    "several-choices": (TEXT, "", {"several_choices"}, "stop"),
    "other-choice-chunks": (TEXT, "", {"other_choice"}, "stop"),
    "extra-fields": OK,
    "think-inline": (TEXT, "reasoning", set(), "stop"),
    "reasoning-field": (TEXT, "reasoning", set(), "stop"),
    "slow-headers": FirstTokenTimeout,
    "json-body": (TEXT, "", {"json_body"}, "stop"),  # stream: true ignored: the whole answer, delivered
    "json-error-200": EngineError,
    "html-200": errors.WebPageResponse,
    "html-502": errors.WebPageResponse,
    "text-200": MalformedResponse,
    "sse-wrong-type": (TEXT, "", {"sse_content_type"}, "stop"),
    "eof-no-finish": errors.StreamCut,  # never shown as complete
    "finish-no-done": (TEXT, "", {"no_done"}, "stop"),
    "tool-calls": ("", "", set(), "tool_calls"),
}

NONSTREAM: dict[str, Any] = {
    "empty-choices-first": EmptyAnswer,
    "usage-only-final": OK,
    "no-delta": ("", "", {"missing_message"}, "stop"),
    "null-content": ("", "", {"null_content"}, "stop"),
    "no-finish": (TEXT, "", {"no_finish_reason"}, None),
    "role-only-first": OK,
    "stall-first": TotalTimeout,
    "stall-mid": TotalTimeout,
    "drop-mid": ConnectionLost,
    "error-mid": EngineError,
    "error-mid-flat": EngineError,
    "http-500": EngineError,
    "http-503": Overloaded,
    "overflow-400": ContextOverflow,
    "unknown-model-404": ModelNotFound,
    "non-json": MalformedResponse,
    "empty-choices": EmptyAnswer,
    "empty-stream": EmptyAnswer,
    "invalid-utf8": ("ok 中 bad\ufffd\ufffd end", "", {"invalid_utf8"}, "stop"),
    "several-choices": (TEXT, "", {"several_choices"}, "stop"),
    "other-choice-chunks": (TEXT, "", {"several_choices"}, "stop"),
    "extra-fields": OK,
    "think-inline": (TEXT, "reasoning\n", set(), "stop"),  # "<think>\nreasoning\n</think>"
    "reasoning-field": (TEXT, "reasoning", set(), "stop"),
    "slow-headers": TotalTimeout,
    "json-body": OK,
    "json-error-200": EngineError,
    "html-200": errors.WebPageResponse,
    "html-502": errors.WebPageResponse,
    "text-200": MalformedResponse,
    "sse-wrong-type": OK,
    "eof-no-finish": MalformedResponse,
    "finish-no-done": OK,
    "tool-calls": ("", "", set(), "tool_calls"),
}

PARTIAL = {
    "stall-mid": expected_text(AT),
    "drop-mid": expected_text(AT),
    "error-mid": expected_text(AT),
    "error-mid-flat": expected_text(AT),
    "non-json": expected_text(AT),
    "eof-no-finish": expected_text(AT),
}


def test_matrix_covers_every_fault_mode_of_the_fake_server():
    assert set(STREAM) == set(FAULTS) == set(NONSTREAM)


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", sorted(STREAM))
async def test_stream_fault_ends_in_its_typed_outcome(server, fault):
    expected = STREAM[fault]
    spec = f"fault:{fault}:stall=30"  # a stall runs into FAST's limits; every other fault gets UNHURRIED ones
    client = ChatClient(server.base_url, "test-key", FAST if expected in TIME_LIMITS else UNHURRIED)
    try:
        events, exc = await collect(client, spec)
    finally:
        await client.aclose()
    assert_well_formed(events, exc)
    if isinstance(expected, type):
        assert type(exc) is expected, f"{fault}: got {exc!r}"
        assert text_of(events) == PARTIAL.get(fault, "")  # what arrived before the failure is delivered
    else:
        assert exc is None, f"{fault}: {exc!r}"
        text, reasoning, kinds, finish = expected
        assert text_of(events) == text
        assert reasoning_of(events) == reasoning
        assert kinds_of(events) == kinds
        assert (events[-1].reason, events[-1].model) == (finish, spec)
    assert server.attempts(spec) == 1  # max_retries=0: the first failure as it is


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", sorted(NONSTREAM))
async def test_complete_fault_ends_in_its_typed_outcome(server, fault):
    # [client] total_timeout is what a stall (30 s here) runs into; every other fault gets a limit no busy machine
    # reaches (a 0.5 s limit for all once ended a plain answer in TotalTimeout while another process was busy)
    expected = NONSTREAM[fault]
    client = make_client(server, total_timeout=0.5 if expected is TotalTimeout else 120)
    spec = f"fault:{fault}:stall=30"
    try:
        result: Answer | BaseException = await client.complete(HI, spec)
    except Exception as exc:  # noqa: BLE001
        result = exc
    finally:
        await client.aclose()
    if isinstance(expected, type):
        assert type(result) is expected, f"{fault}: got {result!r}"
    else:
        assert isinstance(result, Answer), f"{fault}: {result!r}"
        text, reasoning, kinds, finish = expected
        assert (result.text, result.reasoning, {a.kind for a in result.anomalies}, result.finish_reason) == (
            text,
            reasoning,
            kinds,
            finish,
        )
        assert result.model == spec and re.fullmatch(r"[0-9a-f]{8}", result.request_id)


@pytest.mark.asyncio
async def test_normal_stream_yields_text_usage_and_finish_in_order(server, client):
    events, exc = await collect(client, "normal:tokens=20")
    assert exc is None
    assert text_of(events) == expected_text(20)
    assert events[-2:] == [
        Usage(prompt_tokens=events[-2].prompt_tokens, completion_tokens=20),
        Finish("stop", "normal:tokens=20"),
    ]
    assert not kinds_of(events)


@pytest.mark.asyncio
async def test_max_tokens_and_sampling_reach_the_server_and_length_is_reported(server, client):
    events, exc = await collect(client, "normal:tokens=20", max_tokens=5, sampling={"temperature": 0.7, "top_k": 20})
    assert exc is None and text_of(events) == expected_text(5)
    assert events[-1].reason == "length"
    assert server.records[-1].max_tokens == 5


@pytest.mark.asyncio
async def test_a_priority_reaches_the_server_and_priority_0_is_not_sent(server, client):
    """vLLM's scheduling priority (issue #20); 0, its default, is left out: vLLM under fcfs refuses any priority."""
    events, exc = await collect(client, "normal:tokens=3", priority=2)
    assert exc is None and server.records[-1].priority == 2
    events, exc = await collect(client, "normal:tokens=3")
    assert exc is None and server.records[-1].priority is None


@pytest.mark.asyncio
async def test_the_fake_servers_stream_interval_groups_tokens_as_vllm_does_and_loses_none(server, client):
    """``interval`` (vLLM's --stream-interval, checked against the real engine in tests/integration/test_engine.py):
    the same text in fewer chunks, the first token at once; a fault mid-stream still follows every token before it."""
    sizes = {}
    for interval in (1, 4):
        events, exc = await collect(client, f"normal:tokens=13:interval={interval}")
        assert exc is None and text_of(events) == expected_text(13)
        assert [e.text for e in events if isinstance(e, TextDelta)][0] == expected_text(1)
        sizes[interval] = server.records[-1].chunks_sent
    assert sizes[1] - sizes[4] == 13 - 4  # 13 content chunks become 1 + 4 + 4 + 4 tokens
    events, exc = await collect(client, "fault:drop-mid:at=6:tokens=13:interval=4")
    assert exc is not None and text_of(events) == expected_text(6)


@pytest.mark.asyncio
async def test_after_a_burst_of_answers_at_most_eight_idle_connections_stay_open(server, client):
    """Issue #20: every idle keep-alive connection is polled at each request's start and end; the SDK's default
    keeps 100 of them. 20 answers at once, each whole, then the server sees at most 8 connections left open."""
    results = await asyncio.gather(*(collect(client, "normal:tokens=5:rate=50") for _ in range(20)))
    assert all(exc is None and text_of(events) == expected_text(5) for events, exc in results)
    assert len({r.peer for r in server.records[-20:]}) > 8  # the burst did use more than 8 connections
    deadline = time.monotonic() + 5  # the surplus closes as the answers end; the server sees each close
    while server.open_connections() > 8 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert 0 < server.open_connections() <= 8
    events, exc = await collect(client, "normal:tokens=3")  # and the next answer goes on a kept one
    assert exc is None and server.open_connections() <= 8


@pytest.mark.asyncio
async def test_directive_in_the_user_message_picks_the_mode_for_the_served_model(server, client):
    events, exc = await collect(client, server.model, [{"role": "user", "content": "[[fault:overflow-400]] hi"}])
    assert type(exc) is ContextOverflow
    events, exc = await collect(client, server.model)
    assert exc is None and text_of(events) == TEXT


@pytest.mark.asyncio
@pytest.mark.parametrize("param", ["input_tokens", "max_tokens"])
async def test_context_overflow_keys_on_param_for_both_vllm_bodies(server, client, param):
    events, exc = await collect(client, f"fault:overflow-400:param={param}")
    assert type(exc) is ContextOverflow
    assert exc.detail == overflow_body(param, 8192, 1024)["error"]["message"]


@pytest.mark.asyncio
async def test_unknown_model_is_model_not_found_naming_the_model(server, client):
    events, exc = await collect(client, "no-such-adapter")
    assert type(exc) is ModelNotFound and exc.model == "no-such-adapter"
    assert "no-such-adapter" in exc.user_text("en") and "no-such-adapter" in exc.user_text("zh")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "status,cls",
    [
        (401, AuthenticationFailed),
        (403, AuthenticationFailed),
        (422, RequestRejected),
        (429, Overloaded),
        (502, EngineError),
        (504, EngineError),
    ],
)
async def test_other_http_statuses_map_to_their_class(server, client, status, cls):
    events, exc = await collect(client, f"fault:http-{status}")
    assert type(exc) is cls


# ---------------------------------------------------------------- timeouts


@pytest.mark.asyncio
async def test_stall_mid_stream_is_detected_within_idle_timeout(server, client):
    t0 = time.monotonic()
    last_text = None
    events: list[Any] = []
    with pytest.raises(IdleTimeout) as info:
        async for ev in client.stream(HI, "fault:stall-mid:stall=10"):
            events.append(ev)
            last_text = time.monotonic()
    gap = time.monotonic() - last_text
    assert FAST.idle_timeout - 0.05 <= gap <= FAST.idle_timeout + SLACK
    assert info.value.seconds == FAST.idle_timeout and "[client].idle_timeout" in str(info.value)
    assert "0.3" in info.value.user_text("en") and "0.3" in info.value.user_text("zh")
    assert text_of(events) == expected_text(AT)
    assert time.monotonic() - t0 < 4  # not the 10 s stall, nor the 5 s total timeout


@pytest.mark.asyncio
async def test_stall_before_first_token_is_detected_within_first_token_timeout(server, client):
    t0 = time.monotonic()
    with pytest.raises(FirstTokenTimeout) as info:
        async for _ in client.stream(HI, "fault:stall-first:stall=10"):
            pass
    assert FAST.first_token_timeout - 0.05 <= time.monotonic() - t0 <= FAST.first_token_timeout + SLACK
    assert info.value.seconds == FAST.first_token_timeout


@pytest.mark.asyncio
async def test_slow_but_steady_answer_hits_total_timeout_with_partial_text(server):
    client = make_client(server, total_timeout=0.4, idle_timeout=0.3)
    t0 = time.monotonic()
    events, exc = await collect(client, "normal:tokens=200:rate=50")
    await client.aclose()
    assert type(exc) is TotalTimeout and exc.seconds == 0.4
    assert 0.35 <= time.monotonic() - t0 <= 0.4 + SLACK
    assert 5 <= len(text_of(events).split()) < 200


@pytest.mark.asyncio
async def test_a_slow_first_token_under_the_limit_is_not_an_error(server):
    client = make_client(server, first_token_timeout=1.0, idle_timeout=0.2)
    events, exc = await collect(client, "fault:stall-first:stall=0.5")
    await client.aclose()
    assert exc is None and text_of(events) == TEXT


@pytest.mark.asyncio
async def test_connect_timeout_names_its_setting_when_the_server_never_accepts():
    # A listener with backlog 0 whose queue is already full: SYNs go unanswered.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            f.connect(("127.0.0.1", port))
        fillers.append(f)
    client = ChatClient(
        f"http://127.0.0.1:{port}/v1", "", ClientSettings(connect_timeout=0.3, first_token_timeout=2.0, max_retries=0)
    )
    try:
        t0 = time.monotonic()
        events, exc = await collect(client, "m")
        assert type(exc) is ConnectTimeout and exc.seconds == 0.3
        assert "[client].connect_timeout" in exc.user_text("en")
        assert time.monotonic() - t0 <= 0.3 + SLACK
    finally:
        await client.aclose()
        for s in fillers + [listener]:
            s.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["stall-mid", "stall-first"])
async def test_a_timeout_closes_the_upstream_connection(server, client, fault):
    events, exc = await collect(client, f"fault:{fault}:stall=10")
    assert isinstance(exc, errors.RequestTimeout)
    rec = await server.wait_finished(server.records[-1], 3)
    assert rec.disconnected and not rec.completed


@pytest.mark.asyncio
async def test_a_non_streamed_timeout_closes_the_upstream_connection(server):
    client = make_client(server, total_timeout=0.3)
    with pytest.raises(TotalTimeout):
        await client.complete(HI, "fault:stall-first:stall=10")
    await client.aclose()
    rec = await server.wait_finished(server.records[-1], 3)
    assert rec.disconnected and not rec.completed


# ---------------------------------------------------------------- stop / cancel


async def _consume(client: ChatClient, model: str, stop_after: int, hang_in_body: bool, seen: list[Any]) -> None:
    async for ev in client.stream(HI, model):
        seen.append(ev)
        if isinstance(ev, TextDelta) and len(seen) >= stop_after and hang_in_body:
            await asyncio.sleep(30)


@pytest.mark.asyncio
@pytest.mark.parametrize("hang_in_body", [False, True], ids=["cancel-while-waiting", "cancel-in-consumer"])
async def test_stop_cancels_the_upstream_request_and_the_server_sees_the_close(server, client, hang_in_body):
    seen: list[Any] = []
    task = asyncio.create_task(_consume(client, "normal:tokens=1000:rate=50", 3, hang_in_body, seen))
    for _ in range(200):  # until some text arrived (bounded: 2 s)
        if len(text_of(seen)) > 6:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rec = await server.wait_finished(server.records[-1], 3)
    assert rec.disconnected and not rec.completed
    assert rec.chunks_sent < 1000


@pytest.mark.asyncio
async def test_leaving_the_loop_early_with_aclosing_closes_the_upstream(server, client):
    async with contextlib.aclosing(client.stream(HI, "normal:tokens=1000:rate=50")) as stream:
        async for ev in stream:
            if isinstance(ev, TextDelta):
                break
    rec = await server.wait_finished(server.records[-1], 3)
    assert rec.disconnected


# ---------------------------------------------------------------- retries


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_retryable_status_before_the_first_token_is_retried(server, status):
    client = make_client(server, max_retries=2)
    spec = f"fault:http-{status}:fail=1:retry_after=0.01"
    events, exc = await collect(client, spec)
    await client.aclose()
    assert exc is None and text_of(events) == TEXT
    assert server.attempts(spec) == 2


@pytest.mark.asyncio
async def test_retry_after_from_the_server_is_honoured_over_our_backoff(server):
    client = make_client(server, max_retries=1, retry_backoff=20.0)  # our backoff would take ~20 s
    spec = "fault:http-503:fail=1:retry_after=0.05"
    t0 = time.monotonic()
    events, exc = await collect(client, spec)
    await client.aclose()
    assert exc is None and server.attempts(spec) == 2
    assert 0.05 <= time.monotonic() - t0 < 5.0  # our backoff would have slept 15 s or more


@pytest.mark.asyncio
async def test_retries_give_up_after_max_retries_with_the_last_error(server):
    client = make_client(server, max_retries=2, first_token_timeout=5.0)
    spec = "fault:http-503:retry_after=0.01"
    events, exc = await collect(client, spec)
    await client.aclose()
    assert type(exc) is Overloaded and server.attempts(spec) == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["http-500", "overflow-400", "unknown-model-404", "http-422"])
async def test_non_retryable_statuses_are_sent_once(server, fault):
    client = make_client(server, max_retries=3)
    spec = f"fault:{fault}"
    events, exc = await collect(client, spec)
    await client.aclose()
    assert isinstance(exc, BackendError) and server.attempts(spec) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["drop-mid", "error-mid", "stall-mid", "non-json"])
async def test_no_retry_once_text_was_shown(server, fault):
    client = make_client(server, max_retries=3)
    spec = f"fault:{fault}:stall=5"
    events, exc = await collect(client, spec)
    await client.aclose()
    assert isinstance(exc, BackendError) and text_of(events) == expected_text(AT)
    assert server.attempts(spec) == 1


@pytest.mark.asyncio
async def test_max_retries_zero_shows_the_first_failure_as_it_is(server):
    client = make_client(server, max_retries=0)
    spec = "fault:http-503:fail=1:retry_after=0.01"  # a retry would have succeeded
    events, exc = await collect(client, spec)
    await client.aclose()
    assert type(exc) is Overloaded and server.attempts(spec) == 1


@pytest.mark.asyncio
async def test_connection_refused_is_server_unreachable_after_backed_off_retries():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}/v1"
    timings = {}
    for retries in (0, 2):
        client = ChatClient(url, "", ClientSettings(max_retries=retries, retry_backoff=1.0))
        t0 = time.monotonic()
        events, exc = await collect(client, "m")
        timings[retries] = time.monotonic() - t0
        await client.aclose()
        assert type(exc) is ServerUnreachable
        assert url in exc.user_text("en") and "connection refused" in exc.user_text("en")
    # retry_backoff 1.0: sleeps 1.0 then 2.0, each cut by up to 25 % jitter, so 2.25 s or more (the SDK default,
    # 0.5 + 1.0, would be 1.5 s at most); without retries no sleep at all, i.e. less than one retry's 0.75 s. Lower
    # bounds prove the backoff; the margins are wide so that a loaded machine cannot blur them.
    assert timings[0] < 0.75 and 1.0 * 0.75 * 3 <= timings[2] < 10, timings


# ---------------------------------------------------------------- request id and diagnostics


@pytest.mark.asyncio
async def test_request_id_is_sent_as_header_and_on_every_log_line(server, client, caplog):
    caplog.set_level(logging.DEBUG)
    prompt = [{"role": "user", "content": "SECRET-PROMPT-42"}]
    events, exc = await collect(client, "fault:empty-choices-first", prompt, request_id="abcd1234")
    assert exc is None
    assert server.records[-1].request_id == "abcd1234"
    # the client and the modules that read its streams (stream_read, stream_events)
    lines = [
        r.getMessage() for r in caplog.records if r.name.startswith(("backend.chat.client", "backend.chat.stream_"))
    ]
    assert lines and all("[abcd1234]" in line for line in lines)
    first = [m for m in lines if "first chunk" in m]
    assert first and '"choices": []' in first[0]  # the raw first chunk, as the engine sent it
    assert any("anomaly empty_choices" in m and '"choices": []' in m for m in lines)
    assert not any("SECRET-PROMPT" in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)


def test_generated_request_ids_are_8_hex_chars_and_differ():
    ids = {new_request_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"[0-9a-f]{8}", i) for i in ids)


@pytest.mark.asyncio
async def test_anomalies_are_counted_once_per_request_and_kind(server, client, caplog):
    reset_anomaly_counts()
    for _ in range(2):
        await collect(client, "fault:null-content:tokens=10")  # ten null chunks each
    await collect(client, "fault:several-choices")
    assert anomaly_counts() == {"null_content": 2, "several_choices": 1}
    caplog.set_level(logging.INFO, logger="backend.chat")
    log_anomaly_summary()
    assert any("null_content" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


# ---------------------------------------------------------------- bad input


@pytest.mark.asyncio
@pytest.mark.parametrize("content", ["", "   \n\t "], ids=["empty", "whitespace"])
async def test_empty_or_blank_message_is_sent_without_crashing(server, client, content):
    events, exc = await collect(client, "normal", [{"role": "user", "content": content}])
    assert exc is None and text_of(events) == TEXT
    assert server.records[-1].messages[-1]["content"] == content


@pytest.mark.asyncio
async def test_ten_megabytes_of_text_arrive_intact(server, client):
    big = ("0123456789abcdef" * 65536) * 10  # 10 MiB
    events, exc = await collect(client, "normal", [{"role": "user", "content": big}])
    assert exc is None and text_of(events) == TEXT
    assert server.records[-1].messages[-1]["content"] == big


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "typed,sent",
    [
        ("a\x00b", "a\x00b"),  # NUL goes through unchanged
        ("x\ud800y", "x\ufffdy"),  # lone high surrogate
        ("\udfffz", "\ufffdz"),  # lone low surrogate
        ("\ud83d\ude00", "\U0001f600"),  # a pair split into two code points is joined
    ],
)
async def test_nul_and_lone_surrogates_never_crash_the_request(server, client, typed, sent):
    messages = [{"role": "user", "content": typed}]
    events, exc = await collect(client, "normal", messages)
    assert exc is None and text_of(events) == TEXT
    assert server.records[-1].messages[-1]["content"] == sent
    assert messages[0]["content"] == typed  # the caller's history is not rewritten


def test_sanitize_messages_handles_content_parts_and_leaves_others_alone():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a\ud800"}], "n": 1}]
    assert sanitize_messages(msgs) == [{"role": "user", "content": [{"type": "text", "text": "a\ufffd"}], "n": 1}]


@pytest.mark.asyncio
async def test_complete_sends_sanitized_input_too(server, client):
    answer = await client.complete([{"role": "user", "content": "q\ud800"}], "normal")
    assert answer.text == TEXT and server.records[-1].messages[-1]["content"] == "q\ufffd"


# ---------------------------------------------------------------- <think> splitting

THINK = "<think>\nplan it\n</think>\n\nThe answer."


def _split_all(text: str) -> list[list[str]]:
    """Every way to cut text into two pieces, and into three pieces at tag-relevant spots."""
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    for i in range(0, 10):
        for j in range(i, len(text) + 1, 3):
            cuts.append([text[:i], text[i:j], text[j:]])
    return cuts


def _run_splitter(pieces: list[str]) -> tuple[str, str]:
    sp = ThinkSplitter()
    out: list[Any] = []
    for p in pieces:
        out += sp.feed(p)
    out += sp.flush()
    return text_of(out), reasoning_of(out)


@pytest.mark.parametrize("pieces", _split_all(THINK), ids=lambda p: "|".join(map(repr, p)))
def test_think_tags_split_anywhere_across_chunks_still_separate_reasoning(pieces):
    assert _run_splitter(pieces) == ("The answer.", "plan it\n")


@pytest.mark.parametrize(
    "pieces,expected",
    [
        (["no tags here"], ("no tags here", "")),
        (["a < b and <think> later"], ("a < b and <think> later", "")),  # only a leading tag opens reasoning
        (["<thx>not a tag"], ("<thx>not a tag", "")),
        (["<thi"], ("<thi", "")),  # a held prefix is released at the end
        (["<think>never closed"], ("", "never closed")),
        (["  ", "<think>", "r", "</think>", "", "t"], ("t", "r")),
        (["<think></think>answer"], ("answer", "")),
    ],
)
def test_think_splitter_edge_cases(pieces, expected):
    assert _run_splitter(pieces) == expected


# ---------------------------------------------------------------- error mapping

REQ = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def _status(cls: type, status: int, body: Any, headers: dict[str, str] | None = None) -> Exception:
    resp = httpx2.Response(status, request=REQ, headers=headers)
    return cls(f"Error code: {status}", response=resp, body=body)


def _caused(exc: Exception, cause: BaseException) -> Exception:
    exc.__cause__ = cause
    return exc


MAPPING: list[tuple[str, Exception, type]] = [
    ("400 input_tokens", _status(openai.BadRequestError, 400, overflow_body("input_tokens")["error"]), ContextOverflow),
    ("400 max_tokens", _status(openai.BadRequestError, 400, overflow_body("max_tokens")["error"]), ContextOverflow),
    (
        "400 wording alone is not overflow",
        _status(openai.BadRequestError, 400, {"message": "maximum context length exceeded", "param": None}),
        RequestRejected,
    ),
    (
        "400 openai code",
        _status(openai.BadRequestError, 400, {"message": "x", "code": "context_length_exceeded"}),
        ContextOverflow,
    ),
    ("413 proxy limit", _status(openai.APIStatusError, 413, "Request Entity Too Large"), ContextOverflow),
    ("404", _status(openai.NotFoundError, 404, not_found_body("m")["error"]), ModelNotFound),
    (
        "404 vLLM wording without param",
        _status(openai.NotFoundError, 404, {"message": "The model `m` does not exist.", "code": 404}),
        ModelNotFound,
    ),
    ("404 route, not the model", _status(openai.NotFoundError, 404, {"detail": "Not Found"}), RequestRejected),
    ("404 plain text", _status(openai.NotFoundError, 404, "404: Not Found"), RequestRejected),
    ("401", _status(openai.AuthenticationError, 401, {"message": "bad key"}), AuthenticationFailed),
    ("422", _status(openai.UnprocessableEntityError, 422, {"message": "bad field"}), RequestRejected),
    ("429", _status(openai.RateLimitError, 429, {"message": "slow down"}), Overloaded),
    ("503", _status(openai.InternalServerError, 503, {"message": "busy"}), Overloaded),
    (
        "503 vllm-router without a worker",
        _status(openai.InternalServerError, 503, "No available workers (all circuits open or unhealthy)"),
        errors.NoWorkerAvailable,
    ),
    ("500", _status(openai.InternalServerError, 500, {"message": "boom"}), EngineError),
    ("502 html", _status(openai.InternalServerError, 502, "<html>bad gateway</html>"), errors.WebPageResponse),
    (
        "connect refused",
        _caused(openai.APIConnectionError(request=REQ), httpx2.ConnectError("[Errno 111] Connection refused")),
        ServerUnreachable,
    ),
    ("connect timeout", _caused(openai.APITimeoutError(request=REQ), httpx2.ConnectTimeout("t")), ConnectTimeout),
    ("read timeout", _caused(openai.APITimeoutError(request=REQ), httpx2.ReadTimeout("t")), IdleTimeout),
    ("write timeout", _caused(openai.APITimeoutError(request=REQ), httpx2.WriteTimeout("t")), ConnectionLost),
    (
        "dropped",
        _caused(openai.APIConnectionError(request=REQ), httpx2.RemoteProtocolError("peer closed connection")),
        ConnectionLost,
    ),
    ("raw reset", ConnectionResetError(104, "Connection reset by peer"), ConnectionLost),
    ("nested error event", openai.APIError("boom", REQ, body={"message": "boom", "code": 500}), EngineError),
    (
        "nested overflow event",
        openai.APIError("x", REQ, body={"message": "x", "param": "input_tokens", "code": 400}),
        ContextOverflow,
    ),
    ("flat error event", ErrorEvent({"object": "error", "message": "m", "code": 503}), Overloaded),
    ("flat error without code", ErrorEvent({"object": "error", "message": "m"}), EngineError),
    ("error as a string", ErrorEvent({"error": "text only"}), EngineError),
    ("validation", openai.APIResponseValidationError(httpx2.Response(200, request=REQ), body=None), MalformedResponse),
    ("json", json.JSONDecodeError("Expecting value", "x", 0), MalformedResponse),
    ("utf8", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), MalformedResponse),
    ("unknown", RuntimeError("surprise"), EngineError),
    ("already ours", Overloaded("x"), Overloaded),
]


@pytest.mark.parametrize("exc,expected", [(e, c) for _, e, c in MAPPING], ids=[n for n, _, _ in MAPPING])
def test_map_error_translates_most_specific_first(exc, expected):
    mapped = map_error(exc, url="http://h/v1", model="m", settings=FAST)
    assert type(mapped) is expected
    for lang in ("en", "zh-CN"):  # every mapped error renders its own template, with no fallback
        params = {k: v.in_(lang) if isinstance(v, Text) else v for k, v in mapped.params.items()}  # a Text: in lang
        assert mapped.user_text(lang) == catalog()[lang][mapped.text_key].format(**params)


def test_a_404_that_is_not_about_the_model_points_at_the_base_url_not_the_model_list():
    exc = _status(openai.NotFoundError, 404, {"detail": "Not Found"})
    mapped = map_error(exc, url="http://h:8000", model="m", settings=FAST)
    text = mapped.user_text("en")
    assert type(mapped) is RequestRejected and mapped.status == 404
    assert "OPENAI_BASE_URL" in text and "/v1" in text and "http://h:8000/chat/completions" in text
    assert "pick another model" not in text


@pytest.mark.asyncio
async def test_a_base_url_without_v1_is_a_rejected_route_not_an_unknown_model(server):
    client = ChatClient(server.base_url[: -len("/v1")], "test-key", FAST)
    try:
        events, exc = await collect(client, "normal")
    finally:
        await client.aclose()
    assert type(exc) is RequestRejected and exc.status == 404, exc
    assert "ends in /v1" in exc.user_text("en")


@pytest.mark.asyncio
async def test_a_request_body_that_stops_going_out_is_connection_lost_not_an_idle_answer():
    """A server that accepts but never reads: the 40 MB prompt stalls in the socket (httpx WriteTimeout)."""
    release = asyncio.Event()

    async def never_read(reader, writer):
        await release.wait()
        writer.close()

    srv = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    settings = ClientSettings(
        connect_timeout=2.0, first_token_timeout=10.0, idle_timeout=0.3, total_timeout=10.0, max_retries=0
    )
    client = ChatClient(f"http://127.0.0.1:{port}/v1", "", settings)
    try:
        t0 = time.monotonic()
        events, exc = await collect(client, "m", [{"role": "user", "content": "x" * 40_000_000}])
        assert type(exc) is ConnectionLost, exc
        assert any(isinstance(c, httpx2.WriteTimeout) for c in _causes_of(exc))
        text = exc.user_text("en")
        assert "sending the request" in text and "[client].idle_timeout" in text and "0.3 s" in text
        assert time.monotonic() - t0 < 5
    finally:
        await client.aclose()
        release.set()
        srv.close()
        await srv.wait_closed()


def _causes_of(exc: BaseException) -> list[BaseException]:
    out, cur = [], exc
    while cur is not None and len(out) < 20:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


RAISED_ELSEWHERE = {
    ServerStarting: "shown by the app when the model is still loading after [ui].wait_for_ready",
    errors.RequestTimeout: "abstract parent of the four timeouts",
    errors.ModelPartial: "raised by turn.py before sending: a fleet model some ready replicas lack (not offered)",
}


def test_every_backend_error_subclass_is_reachable_from_the_client():
    reachable = {c for _, _, c in MAPPING}
    reachable |= {v for v in list(STREAM.values()) + list(NONSTREAM.values()) if isinstance(v, type)}
    missing = _all_subclasses(BackendError) - reachable - set(RAISED_ELSEWHERE)
    assert not missing, f"no mapping or fault mode produces {sorted(c.__name__ for c in missing)}"


def test_the_error_tree_in_the_errors_docstring_names_every_class():
    import backend.storage.preferences
    import backend.tools.merge  # noqa: F401 - registers MergeError, which lives next to its only user

    tree = errors.__doc__.split("QwenChatError", 1)[1]
    named = set(re.findall(r"[├└]── (?:\w+\.)?(\w+)", tree))
    classes = {c.__name__ for c in _all_subclasses(errors.QwenChatError)}
    assert classes - named == set(), f"missing from the tree: {sorted(classes - named)}"
    assert named - classes == set(), f"in the tree but not a class: {sorted(named - classes)}"
    assert "merge.MergeError (see backend/tools/merge.py)" in " ".join(errors.__doc__.split())


# ---------------------------------------------------------------- any malformed body: the principle


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _whole(content: str, finish: str | None) -> bytes:
    message = {"role": "assistant", "content": content}
    body = {
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    return json.dumps(body).encode()


SSE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
HELLO = _chunk("", None) + _chunk("Hel") + _chunk("lo")
# name -> (content type, body, expected): an error class, or (text, finish reason, anomaly kinds)
RAW: dict[str, tuple[str, bytes, Any]] = {
    "no finish, no [DONE]": (SSE, HELLO, errors.StreamCut),
    "cut mid-line": (SSE, HELLO + b'data: {"choices": [{"delta": {"con', errors.StreamCut),
    "cut mid-event, no blank line": (SSE, HELLO + _chunk("!").rstrip(b"\n"), errors.StreamCut),
    "empty 200 body": (SSE, b"", errors.StreamCut),
    "finish, no [DONE]": (SSE, HELLO + _chunk("", "stop"), ("Hello", "stop", {"no_done"})),
    "[DONE] without its blank line": (SSE, HELLO + b"data: [DONE]\n", ("Hello", None, {"no_finish_reason"})),
    "CRLF lines": (SSE, (HELLO + _chunk("", "stop") + DONE).replace(b"\n", b"\r\n"), ("Hello", "stop", set())),
    "keep-alive comments only": (SSE, b": ping\n\n: ping\n\n" + DONE, EmptyAnswer),
    "an empty data event": (SSE, b"data:\n\n" + HELLO + _chunk("", "stop") + DONE, ("Hello", "stop", {"empty_event"})),
    "event: error": (SSE, HELLO + b'event: error\ndata: {"message": "boom", "code": 500}\n\n', EngineError),
    "JSON error object in the stream": (SSE, HELLO + b'data: {"error": {"message": "x", "code": 503}}\n\n', Overloaded),
    "stream sent as application/json": (
        "application/json",
        HELLO + _chunk("", "stop") + DONE,
        ("Hello", "stop", {"sse_content_type"}),
    ),
    "stream with no content type": ("", HELLO + _chunk("", "stop") + DONE, ("Hello", "stop", {"sse_content_type"})),
    "whole JSON after a BOM": (
        "application/json",
        b"\xef\xbb\xbf \n" + _whole("Hi", "stop"),
        ("Hi", "stop", {"json_body"}),
    ),
    "whole JSON as text/event-stream": (SSE, _whole("Hi", "length"), ("Hi", "length", {"json_body"})),
    "whole JSON, no finish reason": (
        "application/json",
        _whole("Hi", None),
        ("Hi", None, {"json_body", "no_finish_reason"}),
    ),
    "whole JSON cut short": ("application/json", _whole("Hi", "stop")[:30], MalformedResponse),
    "whole JSON error object": ("application/json", b'{"object": "error", "message": "m", "code": 500}', EngineError),
    "a JSON list": ("application/json", b"[1, 2]", MalformedResponse),
    "plain text": ("text/plain", b"Bad Gateway", MalformedResponse),
    "JSON null": ("application/json", b"null", MalformedResponse),
    "text/html without tags": ("text/html; charset=utf-8", b"Service unavailable", errors.WebPageResponse),
    "HTML sent as an event stream": (
        SSE,
        b"\n<!-- proxy -->\n<html><title>Login</title></html>",
        errors.WebPageResponse,
    ),
    "unknown finish reason": (SSE, HELLO + _chunk("", "abort") + DONE, ("Hello", "abort", set())),
}


@pytest_asyncio.fixture
async def raw_server():
    """Answers each chat request with RAW[model], written a few bytes at a time."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        ctype, body, _ = RAW[(await request.json())["model"]]
        resp = web.StreamResponse(headers={"Content-Type": ctype} if ctype else {})
        if not ctype:
            resp.headers.popall("Content-Type", None)
        await resp.prepare(request)
        for i in range(0, len(body), 7):  # sniffing and events must work across any split
            await resp.write(body[i : i + 7])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = ChatClient(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "k", UNHURRIED)  # no case is a time limit
    yield client
    await client.aclose()
    await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(RAW))
async def test_any_malformed_body_ends_in_one_outcome_and_never_passes_a_cut_answer_as_complete(raw_server, name):
    _, body, expected = RAW[name]
    events, exc = await collect(raw_server, name)
    assert_well_formed(events, exc)
    if isinstance(expected, type):
        assert type(exc) is expected, f"{name}: {exc!r}"
        if isinstance(exc, EmptyAnswer):
            assert text_of(events) == ""  # a non-empty answer is never called empty
    else:
        assert exc is None, f"{name}: {exc!r}"
        text, finish, kinds = expected
        assert (text_of(events), events[-1].reason, kinds_of(events)) == (text, finish, kinds)
    # The principle: a Finish without a reason only when the end was marked ([DONE] or a whole body).
    if exc is None and events[-1].reason is None:
        assert b"[DONE]" in body or body.lstrip(b"\xef\xbb\xbf \n").startswith(b"{")


@pytest.mark.asyncio
async def test_a_json_body_is_counted_per_request_and_warned_once_per_process(server, client, caplog):
    reset_anomaly_counts()
    with caplog.at_level(logging.WARNING, logger="backend.chat"):
        for _ in range(2):
            events, exc = await collect(client, "fault:json-body")
            assert exc is None and text_of(events) == TEXT
    assert anomaly_counts()["json_body"] == 2
    warnings = [r.getMessage() for r in caplog.records if "json_body" in r.getMessage()]
    assert len(warnings) == 1 and "ignores stream: true" in warnings[0]


@pytest.mark.asyncio
async def test_a_stream_cut_is_a_connection_lost_that_delivers_what_arrived_first(server, client):
    events, exc = await collect(client, "fault:eof-no-finish:at=5")
    assert isinstance(exc, errors.StreamCut) and isinstance(exc, ConnectionLost)
    assert text_of(events) == expected_text(5) and not [e for e in events if isinstance(e, Finish)]
    assert "neither a finish reason nor [DONE]" in exc.user_text("en") and "[DONE]" in exc.user_text("zh")


@pytest.mark.asyncio
async def test_a_web_page_names_the_chat_url_after_the_retries_of_a_502(server):
    client = make_client(server, max_retries=1)
    try:
        events, exc = await collect(client, "fault:html-502")
    finally:
        await client.aclose()
    assert isinstance(exc, errors.WebPageResponse) and (exc.status, exc.title) == (502, "502 Bad Gateway")
    assert exc.user_text("en").startswith(f'{server.base_url}/chat/completions answered with a web page "502 Bad')
    assert server.attempts("fault:html-502") == 2  # a 502 is retried like any other; then the page is named


@pytest.mark.asyncio
async def test_a_tool_call_is_reported_with_the_tool_names_stream_and_not(server, client):
    events, exc = await collect(client, "fault:tool-calls")
    assert exc is None and events[-1] == Finish("tool_calls", "fault:tool-calls", ("get_weather",))
    assert text_of(events) == "" and not kinds_of(events)
    answer = await client.complete(HI, "fault:tool-calls")
    assert (answer.text, answer.finish_reason, answer.anomalies) == ("", "tool_calls", ())


# ---------------------------------------------------------------- the fake server itself


@pytest.mark.asyncio
async def test_fake_server_serves_health_and_models_with_an_adapter(server):
    async with httpx2.AsyncClient() as http:
        assert (await http.get(f"{server.url}/health")).status_code == 200
        data = (await http.get(f"{server.base_url}/models")).json()["data"]
        unknown = await http.post(f"{server.base_url}/chat/completions", json={"model": "x", "messages": []})
    assert [(m["id"], m["parent"]) for m in data] == [(server.model, None), (server.adapter, server.model)]
    assert data[0]["max_model_len"] == 8192
    assert unknown.status_code == 404 and unknown.json() == {
        "error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}
    }


@pytest.mark.asyncio
async def test_fake_server_rejects_a_bad_mode_spec_with_the_list_of_faults(server, client):
    events, exc = await collect(client, "fault:nonsense")
    assert type(exc) is RequestRejected and "stall-mid" in exc.detail


def test_fake_server_runs_standalone_and_reports_requests():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.openai_server", "--port", "0", "--mode", "fault:no-finish"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "the fake server printed nothing within 20 s"
        line = proc.stdout.readline()
        base = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        with httpx2.Client() as http:
            assert http.get(base.removesuffix("/v1") + "/health").status_code == 200
            body = http.post(f"{base}/chat/completions", json={"model": "fake-qwen", "messages": HI}).json()
            assert body["choices"][0]["finish_reason"] is None  # the default mode applied
            records = http.get(base.removesuffix("/v1") + "/fake/requests").json()
        assert records[0]["spec"] == "fault:no-finish" and records[0]["completed"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)

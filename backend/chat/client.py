"""Streaming chat against an OpenAI-compatible engine (vLLM), on the openai SDK's AsyncOpenAI.

    client = ChatClient(settings.engine_base_url, settings.api_key, settings.client)
    async with contextlib.aclosing(client.stream(messages, model)) as events:
        async for ev in events:          # TextDelta | ReasoningDelta | Anomaly | Usage | Finish
            ...                          # or a BackendError subclass is raised
    answer = await client.complete(messages, model)   # non-streaming: Answer
    await client.aclose()

Guarantees:

- Every field of every chunk is optional to us (empty ``choices``, no ``delta``,
  ``content: null``, usage-only chunks, several choices, unknown fields). Oddities become
  ``Anomaly`` events, are counted per process (``anomaly_counts()``) and the chunk is logged
  at debug with the request id; they are never raised.
- A stream yields at most one ``Usage`` and ends with exactly one ``Finish`` (always last),
  or raises exactly one ``BackendError`` subclass. Nothing else escapes (``CancelledError``
  propagates as it should). All lower-layer errors go through ``map_error``.
- The body is read for what it is, whatever its content type says: an event stream (a wrong
  content type is an anomaly), one whole JSON ``chat.completion`` (a server that ignored
  ``stream: true``: its answer is delivered, anomaly ``json_body``), a JSON error object
  (its error), a web page (``WebPageResponse``, naming the URL) or plain text (``MalformedResponse``).
- A possibly truncated answer is never reported as finished: a stream that ends with neither
  a ``finish_reason`` nor ``data: [DONE]`` raises ``StreamCut`` (after delivering what arrived).
  ``[DONE]`` without a finish reason ends with ``Finish(None)``; a finish reason without
  ``[DONE]`` is complete (anomaly ``no_done``).
- Timeouts (``ClientSettings``): connect (httpx), first token (request start until the first
  text or reasoning), idle (gap between two chunks once text flows), total. Each error names
  the setting and its value. The upstream response is closed on timeout, error, ``aclose()``
  and cancellation (Stop), so the engine sees the connection close and stops generating.
- Retries (the SDK's own, with its backoff and ``Retry-After``) happen only while opening
  the request, for connection failures and HTTP 429/502/503/504; never once a stream was
  returned, so a half-shown answer is never silently replayed. ``max_retries=0`` shows the
  first failure as it is.
- Input text is sanitized (sanitize.py): lone surrogates (which cannot be encoded as UTF-8 and would
  crash the request) become U+FFFD; NUL and everything else is sent unchanged. Response
  bytes that are not valid UTF-8 are decoded with U+FFFD and reported as an anomaly.
- Every request has an id (8 hex chars) on all our log lines and sent as ``X-Request-Id``.

Inline ``<think>…</think>`` at the start of the content (Qwen3) and ``reasoning_content`` /
``reasoning`` delta fields (vLLM's reasoning parser) become ``ReasoningDelta``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx2
import openai
from openai import AsyncOpenAI
from openai._constants import INITIAL_RETRY_DELAY, MAX_RETRY_AFTER_DELAY

from ..engine_http import (
    Limits,
    Route,
    looks_like_html,
    page_title,
    public_url,
    short,
    status_error,
    transport_error,
)
from ..errors import (
    BackendError,
    EmptyAnswer,
    EngineError,
    FirstTokenTimeout,
    IdleTimeout,
    MalformedResponse,
    RequestTimeout,
    TotalTimeout,
    WebPageResponse,
)
from ..settings import ClientSettings
from ..text import Text
from .sanitize import sanitize_messages
from .stream_events import (
    Anomaly,
    Answer,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ThinkSplitter,
    Usage,
    anomaly_counts,
    log_anomaly_summary,
    maybe_log_summary,
    new_request_id,
    raw_text,
    reset_anomaly_counts,
)
from .stream_read import (
    ErrorEvent,
    Malformed,
    RequestState,
    TolerantSSEDecoder,
    body_data,
    body_events,
    events_of,
    stream_ending,
)

# What a stream yields and the anomaly counters live in stream_events.py; callers import them from here too.
__all__ = [
    "Anomaly",
    "Answer",
    "ChatClient",
    "Event",
    "Finish",
    "ReasoningDelta",
    "TextDelta",
    "ThinkSplitter",
    "Usage",
    "anomaly_counts",
    "log_anomaly_summary",
    "map_error",
    "new_request_id",
    "reset_anomaly_counts",
]

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})


def map_error(
    exc: BaseException, *, url: str = "", model: str = "", settings: ClientSettings | None = None
) -> BackendError:
    """Translate any exception from a chat request into one BackendError (most specific first).

    HTTP answers and transport failures go through ``engine_http`` (the one table for every
    engine call); what is particular to the chat stream (error events, unreadable chunks) is
    handled here. The caller raises the result ``from exc``. Our own time limits are not mapped
    here: they are raised where they are measured (they are not lower-layer errors).
    """
    s = settings or ClientSettings()
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, ErrorEvent):
        return _chat_error(None, exc.body, str(exc), model=model, url=url)
    if isinstance(exc, openai.APIResponseValidationError):
        return MalformedResponse(short(exc.message))
    if isinstance(exc, openai.APIStatusError):
        return _chat_error(exc.status_code, exc.body, exc.message, model=model, url=url)
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, httpx2.TransportError, OSError)):
        limits = Limits(s.connect_timeout, s.idle_timeout, "[client].idle_timeout", Text("error.timeout.model_server"))
        return transport_error(exc, Route.CHAT, url=url, limits=limits)
    if isinstance(exc, openai.APIError):  # the SDK's own error event inside a stream
        return _chat_error(None, exc.body, exc.message, model=model, url=url)
    if isinstance(exc, (Malformed, ValueError)):  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        return MalformedResponse(short(f"{type(exc).__name__}: {exc}" if not isinstance(exc, Malformed) else exc))
    return EngineError(short(f"{type(exc).__name__}: {exc}"))


def _chat_error(status: int | None, body: Any, message: str, *, model: str, url: str) -> BackendError:
    err = status_error(status, body, Route.CHAT, url=url, model=model, message=message)
    assert isinstance(err, BackendError)  # the chat route maps to BackendErrors only
    return err


# ---------------------------------------------------------------- the SDK, narrowed


#: The SDK's connection limits but for the idle keep-alive connections kept: 8, not 100. httpcore checks every idle
#: connection (a poll() of its socket) at each request's start and end, so with 200 answers streaming at once the
#: 100 left idle by one round made the next round's 200 starts a quadratic walk on the event loop (issue #20, P4 in
#: docs/PERFORMANCE.md: up to a fifth of the UI's CPU per answer). 8 stay warm for the next turns; the rest reconnect.
CONNECTION_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=8, keepalive_expiry=5.0)


class _EngineAPI(AsyncOpenAI):
    """AsyncOpenAI with our retry policy and a UTF-8-tolerant SSE decoder.

    The SDK retries 408, 409, 429 and every 5xx; the issue allows 429/502/503/504 only (a 500
    from a bad adapter will not heal by resending). ``retry_backoff`` scales the SDK's own
    jittered exponential backoff; a server's ``Retry-After`` is honoured unchanged.
    """

    def __init__(self, *, retry_backoff: float = INITIAL_RETRY_DELAY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._retry_backoff = retry_backoff

    def _should_retry(self, response: httpx2.Response) -> bool:
        return response.status_code in RETRY_STATUSES and super()._should_retry(response)

    def _calculate_retry_timeout(
        self, remaining_retries: int, options: Any, response_headers: httpx2.Headers | None = None
    ) -> float:
        delay = super()._calculate_retry_timeout(remaining_retries, options, response_headers)
        after = self._parse_retry_after_header(response_headers)
        if after is not None and math.isfinite(after) and 0 < after <= MAX_RETRY_AFTER_DELAY:
            return delay  # server-directed
        return delay * self._retry_backoff / INITIAL_RETRY_DELAY

    def _make_sse_decoder(self) -> TolerantSSEDecoder:
        return TolerantSSEDecoder()


class _Deadlines:
    """A streamed request's deadlines: the first token, then the idle gap between chunks, and the total."""

    __slots__ = ("_settings", "_loop", "t0", "_total_at", "_first_at")

    def __init__(self, settings: ClientSettings, loop: asyncio.AbstractEventLoop) -> None:
        self._settings, self._loop = settings, loop
        self.t0 = loop.time()
        self._total_at, self._first_at = self.t0 + settings.total_timeout, self.t0 + settings.first_token_timeout

    def elapsed(self) -> float:
        return self._loop.time() - self.t0

    async def bounded(self, awaitable: Any, idle: bool) -> Any:
        """Await under the binding deadline (``idle``: something was shown); raise the matching RequestTimeout.

        Called for every chunk: the error is built only when a deadline passed (building one
        formats its message, which cost more than the rest of a chunk's handling)."""
        s, total_at = self._settings, self._total_at
        when = min(total_at, self._loop.time() + s.idle_timeout if idle else self._first_at)
        try:
            async with asyncio.timeout_at(when) as cm:
                return await awaitable
        except TimeoutError:
            if cm.expired():
                err: RequestTimeout
                if when == total_at:
                    err = TotalTimeout(s.total_timeout)
                elif idle:
                    err = IdleTimeout(s.idle_timeout)
                else:
                    err = FirstTokenTimeout(s.first_token_timeout)
                raise err from None
            raise


# ---------------------------------------------------------------- the client


class ChatClient:
    """Chat completions against one engine base URL (ending in /v1)."""

    def __init__(self, base_url: str, api_key: str = "", settings: ClientSettings | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = s = settings or ClientSettings()
        self._api = _EngineAPI(
            base_url=self.base_url,
            api_key=api_key or "EMPTY",  # vLLM without --api-key accepts anything; the SDK wants a value
            max_retries=s.max_retries,
            retry_backoff=s.retry_backoff,
            # read=None: first-token / idle / total are enforced by our own deadlines below.
            # write: a body that stops going out (map_error: ConnectionLost, not IdleTimeout).
            timeout=httpx2.Timeout(connect=s.connect_timeout, read=None, write=s.idle_timeout, pool=s.connect_timeout),
            http_client=openai.DefaultAsyncHttpxClient(limits=CONNECTION_LIMITS),
        )

    async def aclose(self) -> None:
        await self._api.close()

    async def warm_up(self) -> None:
        """Pay the SDK's first-request costs (lazy imports of the chat resources, the connection) before
        the first message: ``GET /v1/models`` through the same client. Raises what the SDK raises."""
        _ = self._api.chat.completions
        await self._api.models.list()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _body(
        self,
        messages: list[dict[str, Any]],
        model: str,
        max_tokens: int | None,
        sampling: dict[str, Any] | None,
        stream: bool,
        priority: int = 0,
    ) -> dict[str, Any]:
        body: dict[str, Any] = dict(sampling or {})
        body.update(model=model, messages=sanitize_messages(messages), stream=stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if priority:  # vLLM's scheduling priority, lower first; 0 (its default) is not sent: fcfs refuses any other
            body["priority"] = priority
        return body

    def _map(self, exc: BaseException, model: str) -> BackendError:
        return map_error(exc, url=self.base_url, model=model, settings=self.settings)

    def _outcome(self, exc: BaseException, model: str) -> tuple[str, BaseException]:
        """How a request ended (for its log line) and what to raise: ours as is, the rest mapped."""
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            return "cancelled", exc
        if isinstance(exc, BackendError):
            return f"failed: {exc.code}", exc
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours to translate
            return "failed", exc
        mapped = self._map(exc, model)
        return f"failed: {mapped.code} ({type(exc).__name__}: {short(exc)})", mapped

    @contextlib.contextmanager
    def _request(self, model: str, request_id: str | None) -> Iterator[RequestState]:
        """One request's bookkeeping: its state, how it ended (ours raised as is, the rest mapped to
        ours), and its one log line, whichever way it ended."""
        st = RequestState(request_id or new_request_id(), model)
        t0 = time.monotonic()
        outcome = "failed"
        try:
            yield st
            outcome = "done"
        except BaseException as exc:
            outcome, err = self._outcome(exc, model)
            if err is exc:
                raise
            raise err from exc
        finally:
            self._log_end(st, outcome, time.monotonic() - t0)

    async def stream(
        self,
        messages: list[dict[str, Any]],
        model: str,
        *,
        max_tokens: int | None = None,
        sampling: dict[str, Any] | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[Event, None]:
        """Stream one answer as events; see the module docstring for the guarantees.

        Close it when you stop early (``contextlib.aclosing``); cancelling the consuming task
        also closes the upstream connection. ``priority``: vLLM's scheduling priority (an engine started with
        ``--scheduling-policy priority``; lower goes first), not sent when 0.
        """
        body = self._body(messages, model, max_tokens, sampling, stream=True, priority=priority)
        clock = _Deadlines(self.settings, asyncio.get_running_loop())
        response: httpx2.Response | None = None
        with self._request(model, request_id) as st:
            try:
                response = await self._open_stream(st, body, len(messages), clock)
                decoder = TolerantSSEDecoder()
                source = body_data(st, response, decoder, f"{self.base_url}/chat/completions")
                try:
                    for _ in range(10**9):  # bounded by total_timeout in practice
                        try:
                            data = await clock.bounded(source.__anext__(), st.shown)
                        except StopAsyncIteration:
                            break
                        for ev in events_of(st, data, decoder):
                            yield ev
                finally:
                    await source.aclose()
                for ev in st.count(st.splitter.flush()):
                    yield ev
                for ev in stream_ending(st):
                    yield ev
            finally:
                if response is not None:
                    try:
                        await response.aclose()  # the engine sees the connection close
                    except Exception as exc:  # noqa: BLE001 - closing must never mask the real outcome
                        logger.debug("[%s] closing the response failed: %r", st.rid, exc)

    async def _open_stream(
        self, st: RequestState, body: dict[str, Any], n_messages: int, clock: _Deadlines
    ) -> httpx2.Response:
        """POST a streamed request, under the first-token deadline."""
        logger.debug(
            "[%s] POST %s/chat/completions model=%s messages=%d stream",
            st.rid,
            self.base_url,
            st.model,
            n_messages,
        )
        # The raw response (the SDK still does the request, its retries and status errors): its
        # body is read by body_data for what it is, not taken to be an event stream.
        response: httpx2.Response = await clock.bounded(
            self._api.post(
                "/chat/completions",
                body=body,
                cast_to=httpx2.Response,
                stream=True,
                stream_cls=openai.AsyncStream[object],
                options={"headers": {"X-Request-Id": st.rid}},
            ),
            st.shown,
        )
        logger.debug(
            "[%s] response %s (%s) after %.3fs",
            st.rid,
            response.status_code,
            response.headers.get("content-type", "no content type"),
            clock.elapsed(),
        )
        return response

    async def complete(
        self,
        messages: list[dict[str, Any]],
        model: str,
        *,
        max_tokens: int | None = None,
        sampling: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> Answer:
        """One non-streamed answer, bounded by connect_timeout and total_timeout."""
        s = self.settings
        body = self._body(messages, model, max_tokens, sampling, stream=False)
        notes: list[Anomaly] = []
        with self._request(model, request_id) as st:
            try:
                async with asyncio.timeout(s.total_timeout) as cm:
                    response = await self._api.post(
                        "/chat/completions",
                        body=body,
                        cast_to=httpx2.Response,
                        options={"headers": {"X-Request-Id": st.rid}},
                    )
                    raw = response.content
            except TimeoutError:
                if cm.expired():
                    raise TotalTimeout(s.total_timeout) from None
                raise
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", "replace")
                notes.append(
                    st.anomaly("invalid_utf8", "response bytes were not valid UTF-8; replaced")
                    or Anomaly("invalid_utf8")
                )
            logger.debug("[%s] body: %s", st.rid, raw_text(text))
            where = f"{self.base_url}/chat/completions"
            if looks_like_html(raw, response.headers.get("content-type", "")):
                raise WebPageResponse(public_url(where), response.status_code, page_title(raw))
            if text.lstrip("\ufeff \t\r\n")[:1] not in ("{", "["):
                raise Malformed(f"{public_url(where)} answered with something that is not JSON: {short(text, 200)!r}")
            return self._answer(st, json.loads(text), notes)

    def _answer(self, st: RequestState, data: Any, notes: list[Anomaly]) -> Answer:
        events = body_events(st, data)
        usage, finish = st.usage, st.finish
        if not st.shown and finish is None:
            raise EmptyAnswer()
        if finish is None:
            a = st.anomaly("no_finish_reason", "answer without finish_reason", data)
            events += [a] if a else []
        served = data.get("model")
        model = served if isinstance(served, str) and served else st.model
        return Answer(
            text="".join(e.text for e in events if isinstance(e, TextDelta)),
            reasoning="".join(e.text for e in events if isinstance(e, ReasoningDelta)),
            finish_reason=finish,
            model=model,
            usage=usage,
            anomalies=tuple(notes) + tuple(e for e in events if isinstance(e, Anomaly)),
            request_id=st.rid,
        )

    def _log_end(self, st: RequestState, outcome: str, seconds: float) -> None:
        first = f"{st.first_token_at - st.started:.2f}s" if st.first_token_at else "-"
        logger.info(
            "[%s] %s: model=%s finish=%s text=%d reasoning=%d chars, first token %s, %.2fs%s",
            st.rid,
            outcome,
            st.model,
            st.finish,
            st.text_chars,
            st.reasoning_chars,
            first,
            seconds,
            f", anomalies={sorted(st.kinds)}" if st.kinds else "",
        )
        maybe_log_summary()

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
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from openai import AsyncOpenAI
from openai._constants import INITIAL_RETRY_DELAY, MAX_RETRY_AFTER_DELAY
from openai._streaming import ServerSentEvent, SSEDecoder

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
    StreamCut,
    TotalTimeout,
    WebPageResponse,
)
from ..settings import ClientSettings
from ..text import Text
from .sanitize import sanitize_messages, sanitize_text

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
SUMMARY_INTERVAL = 300.0  # seconds between INFO summaries of the anomaly counters
RAW_LOG_LIMIT = 2000  # characters of a raw chunk in a debug line
SNIFF_LIMIT = 64 * 1024  # bytes read to tell an event stream from a JSON body, a web page or plain text
BODY_LIMIT = 16 * 1024 * 1024  # the largest whole (non-stream) JSON body read where a stream was asked for
_BLANK = b"\xef\xbb\xbf \t\r\n"  # a BOM and whitespace before the first real byte
_SSE_LINE = re.compile(rb"(?:data|event|id|retry)?:")  # how an event stream's first line starts
#: Anomaly kinds worth a WARNING the first time they happen in the process (they say what the backend is doing).
WARN_ONCE = {
    "json_body": "the model server answered a streaming request with one JSON body (it ignores stream: true); "
    "answers are shown, but only once complete",
    "sse_content_type": "the model server sends its event stream with a wrong content type",
    "no_done": "the model server ends its streams without data: [DONE]",
}


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer text."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's reasoning (``<think>`` content or a reasoning delta field)."""

    text: str


@dataclass(frozen=True)
class Usage:
    """Token counts reported by the engine (None when it did not say)."""

    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Anomaly:
    """The engine sent something off-spec that we tolerated; ``kind`` is a stable key."""

    kind: str
    detail: str = ""


@dataclass(frozen=True)
class Finish:
    """The answer ended; ``reason`` is the engine's finish_reason (None: it never sent one, but the end was
    clean: ``[DONE]`` or a whole body); ``tools`` the names of the tool calls the model asked for, if any."""

    reason: str | None
    model: str
    tools: tuple[str, ...] = ()


Event = TextDelta | ReasoningDelta | Usage | Anomaly | Finish


@dataclass(frozen=True)
class Answer:
    """A whole non-streamed answer."""

    text: str
    reasoning: str
    finish_reason: str | None
    model: str
    usage: Usage | None
    anomalies: tuple[Anomaly, ...]
    request_id: str


# ---------------------------------------------------------------- anomaly counters

_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()
_last_summary = {"at": time.monotonic(), "total": 0}


def anomaly_counts() -> dict[str, int]:
    """Requests with each anomaly kind since the process started (one count per request and kind)."""
    with _counts_lock:
        return dict(_counts)


def reset_anomaly_counts() -> None:
    """Forget the counters (tests)."""
    with _counts_lock:
        _counts.clear()
        _warned.clear()
        _last_summary["total"] = 0


def log_anomaly_summary() -> None:
    """Log the counters at INFO now (also done automatically every SUMMARY_INTERVAL when they change)."""
    counts = anomaly_counts()
    logger.info("anomalies since start (requests per kind): %s", counts or "none")
    _last_summary["at"] = time.monotonic()
    _last_summary["total"] = sum(counts.values())


_warned: set[str] = set()


def _count_anomaly(kind: str) -> None:
    with _counts_lock:
        _counts[kind] += 1
        first = kind in WARN_ONCE and kind not in _warned
        _warned.add(kind)
    if first:
        logger.warning("%s (anomaly %r, counted in anomaly_counts())", WARN_ONCE[kind], kind)


def _maybe_log_summary() -> None:
    with _counts_lock:
        total = sum(_counts.values())
    if total != _last_summary["total"] and time.monotonic() - _last_summary["at"] >= SUMMARY_INTERVAL:
        log_anomaly_summary()


# ---------------------------------------------------------------- small helpers


def new_request_id() -> str:
    """8 hex characters, unique enough to grep one request in the logs."""
    return secrets.token_hex(4)


def _raw(data: Any) -> str:
    try:
        text = json.dumps(data, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(data)
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + f"… ({len(text)} chars)"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ThinkSplitter:
    """Split streamed content into text and ``<think>…</think>`` reasoning, tags split anywhere.

    Only a ``<think>`` at the very start of the content (after whitespace) opens reasoning, as
    Qwen3 emits it; a literal "<think>" later in an answer stays text. Whitespace right after
    ``</think>`` is dropped.
    """

    OPEN = "<think>"
    CLOSE = "</think>"

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._started = False  # non-whitespace text outside a think block was emitted
        self._after_close = False
        self._after_open = False

    @staticmethod
    def _held(buf: str, tag: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of tag."""
        for n in range(min(len(buf), len(tag) - 1), 0, -1):
            if tag.startswith(buf[-n:]):
                return n
        return 0

    def feed(self, text: str) -> list[TextDelta | ReasoningDelta]:
        self._buf += text
        out: list[TextDelta | ReasoningDelta] = []
        for _ in range(len(self._buf) + 2):  # each pass consumes input or stops; bounded anyway
            if not self._buf:
                break
            if self._inside:
                if self._after_open:  # Qwen writes "<think>\n"; the newline is not reasoning
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        break
                    self._after_open = False
                i = self._buf.find(self.CLOSE)
                if i >= 0:
                    if i:
                        out.append(ReasoningDelta(self._buf[:i]))
                    self._buf = self._buf[i + len(self.CLOSE) :]
                    self._inside, self._after_close = False, True
                    continue
                keep = self._held(self._buf, self.CLOSE)
                if len(self._buf) > keep:
                    out.append(ReasoningDelta(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
                break
            if self._after_close:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._after_close = False
            if not self._started:
                stripped = self._buf.lstrip()
                if stripped.startswith(self.OPEN):
                    self._buf = stripped[len(self.OPEN) :]
                    self._inside = self._after_open = True
                    continue
                if self.OPEN.startswith(stripped):  # whitespace or "<thi": wait for more
                    break
                self._started = True
            out.append(TextDelta(self._buf))
            self._buf = ""
        return out

    def flush(self) -> list[TextDelta | ReasoningDelta]:
        """Whatever is held back at the end of the stream."""
        buf, self._buf = self._buf, ""
        if not buf or ((self._after_close or self._after_open) and not buf.strip()):
            return []
        return [ReasoningDelta(buf) if self._inside else TextDelta(buf)]


# ---------------------------------------------------------------- error mapping


class ErrorEvent(Exception):
    """An error object inside a 200 response: a stream event or a whole body.

    Both vLLM shapes: nested ``{"error": {"message", "type", "param", "code"}}`` and the
    older flat ``{"object": "error", "message", ...}`` (which the SDK does not recognise).
    """

    def __init__(self, body: dict[str, Any]) -> None:
        inner = body.get("error")
        self.body = inner if isinstance(inner, dict) else body
        if isinstance(inner, str):  # {"error": "text"}
            self.body = {"message": inner}
        super().__init__(str(self.body.get("message") or "error event"))


class _Malformed(Exception):
    """The response is not the OpenAI chat API."""


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
    if isinstance(exc, (_Malformed, ValueError)):  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        return MalformedResponse(short(f"{type(exc).__name__}: {exc}" if not isinstance(exc, _Malformed) else exc))
    return EngineError(short(f"{type(exc).__name__}: {exc}"))


def _chat_error(status: int | None, body: Any, message: str, *, model: str, url: str) -> BackendError:
    err = status_error(status, body, Route.CHAT, url=url, model=model, message=message)
    assert isinstance(err, BackendError)  # the chat route maps to BackendErrors only
    return err


# ---------------------------------------------------------------- the SDK, narrowed


class _TolerantSSEDecoder(SSEDecoder):
    """The SDK's SSE decoder, but invalid UTF-8 becomes U+FFFD instead of raising."""

    def __init__(self) -> None:
        super().__init__()
        self.replaced_lines = 0

    def _decode_lines(self, lines: Iterator[bytes]) -> Iterator[ServerSentEvent]:
        for raw_line in lines:
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError:
                self.replaced_lines += 1
                line = raw_line.decode("utf-8", "replace")
            sse = self.decode(line)
            if sse:
                yield sse


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

    def _make_sse_decoder(self) -> _TolerantSSEDecoder:
        return _TolerantSSEDecoder()


# ---------------------------------------------------------------- per-request state


@dataclass
class _Request:
    rid: str
    model: str
    started: float = field(default_factory=time.monotonic)
    chunks: int = 0
    text_chars: int = 0
    reasoning_chars: int = 0
    first_token_at: float | None = None
    finish: str | None = None
    done: bool = False  # the end was marked: data: [DONE], or a whole JSON body was read
    tools: list[str] = field(default_factory=list)
    usage: Usage | None = None
    kinds: set[str] = field(default_factory=set)
    utf8_seen: int = 0
    splitter: ThinkSplitter = field(default_factory=ThinkSplitter)

    @property
    def shown(self) -> bool:
        return self.text_chars > 0 or self.reasoning_chars > 0

    def anomaly(self, kind: str, detail: str, data: Any = None) -> Anomaly | None:
        """Log every occurrence at debug; count and report each kind once per request."""
        logger.debug("[%s] anomaly %s (%s): %s", self.rid, kind, detail, _raw(data) if data is not None else "-")
        if kind in self.kinds:
            return None
        self.kinds.add(kind)
        _count_anomaly(kind)
        return Anomaly(kind, detail)

    def content(self, text: Any, data: Any, *, reasoning: bool = False) -> list[Event]:
        """Events for one content (or reasoning) value of a chunk or body."""
        out: list[Event] = []
        if text is None or text == "":
            return out
        if not isinstance(text, str):
            a = self.anomaly("non_string_content", f"content is {type(text).__name__}", data)
            return [a] if a else []
        text = sanitize_text(text)
        pieces = [ReasoningDelta(text)] if reasoning else self.splitter.feed(text)
        return self.count(pieces)

    def tool_calls(self, calls: Any) -> None:
        """Remember the names of the tools the model asked for (a stream sends each name once)."""
        if not isinstance(calls, list):
            return
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(name, str) and name and name not in self.tools:
                self.tools.append(name)

    def count(self, pieces: list[Any]) -> list[Event]:
        for p in pieces:
            if isinstance(p, TextDelta):
                self.text_chars += len(p.text)
            elif isinstance(p, ReasoningDelta):
                self.reasoning_chars += len(p.text)
            if self.first_token_at is None and isinstance(p, (TextDelta, ReasoningDelta)) and p.text:
                self.first_token_at = time.monotonic()
        return pieces


def _pick_choice(st: _Request, choices: Any, data: Any, has_usage: bool) -> tuple[dict[str, Any] | None, list[Event]]:
    """The choice with index 0 (a choice without an index counts as 0), with anomalies for everything unusual.

    Only index 0 is ever the answer: a server that ignores ``n = 1`` (or a proxy fanning out) streams other choices
    as chunks of their own, and taking "the first choice of each chunk" would mix their text into ours."""
    notes: list[Event] = []

    def note(kind: str, detail: str) -> None:
        a = st.anomaly(kind, detail, data)
        if a:
            notes.append(a)

    if choices is None:
        if not has_usage:
            note("missing_choices", "no choices field")
        return None, notes
    if not isinstance(choices, list):
        note("bad_choices", f"choices is {type(choices).__name__}")
        return None, notes
    if not choices:
        if not has_usage:  # vLLM's usage chunk legitimately has choices: []
            note("empty_choices", "choices: [] without usage")
        return None, notes
    dicts = [c for c in choices if isinstance(c, dict)]
    if len(dicts) != len(choices):
        note("bad_choice", "a choice is not an object")
    if len(choices) > 1:
        note("several_choices", f"{len(choices)} choices; using index 0")
    for c in dicts:
        if c.get("index", 0) == 0:
            return c, notes
    if dicts:
        note("other_choice", f"a chunk for choice {dicts[0].get('index')!r} only; not part of the answer (index 0)")
    return None, notes


def _usage_of(data: dict[str, Any]) -> Usage | None:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(_int_or_none(usage.get("prompt_tokens")), _int_or_none(usage.get("completion_tokens")))


def _reasoning_of(part: dict[str, Any]) -> Any:
    value = part.get("reasoning_content")
    return value if value is not None else part.get("reasoning")


def _stream_chunk(st: _Request, data: Any) -> list[Event]:
    """Events for one decoded stream chunk; raises ErrorEvent / _Malformed."""
    st.chunks += 1
    if st.chunks == 1:
        logger.debug("[%s] first chunk: %s", st.rid, _raw(data))
    if not isinstance(data, dict):
        raise _Malformed(f"a stream event is {type(data).__name__}, not an object")
    if data.get("object") == "error" or data.get("error"):
        raise ErrorEvent(data)
    if isinstance(data.get("model"), str) and data["model"]:
        st.model = data["model"]
    usage = _usage_of(data)
    if usage is not None:
        st.usage = usage
    choice, out = _pick_choice(st, data.get("choices"), data, usage is not None)
    if choice is None:
        return out
    delta = choice.get("delta")
    finish = choice.get("finish_reason")
    if delta is None and isinstance(choice.get("message"), dict):
        delta = choice["message"]  # some proxies stream whole messages
        a = st.anomaly("message_in_stream", "choice has message instead of delta", data)
        out += [a] if a else []
    if delta is None:
        a = st.anomaly("missing_delta", "choice without delta", data)
        out += [a] if a else []
        delta = {}
    elif not isinstance(delta, dict):
        a = st.anomaly("bad_delta", f"delta is {type(delta).__name__}", data)
        out += [a] if a else []
        delta = {}
    content = delta.get("content")
    reasoning = _reasoning_of(delta)
    if (
        "content" in delta
        and content is None
        and reasoning is None
        and finish is None
        and not delta.get("role")
        and not delta.get("tool_calls")
    ):
        a = st.anomaly("null_content", "delta.content is null", data)
        out += [a] if a else []
    st.tool_calls(delta.get("tool_calls"))
    out += st.content(reasoning, data, reasoning=True)
    out += st.content(content, data)
    if isinstance(finish, str) and finish:
        st.finish = finish
    elif finish is not None:
        a = st.anomaly("bad_finish_reason", f"finish_reason is {finish!r}", data)
        out += [a] if a else []
    return out


def _body_events(st: _Request, data: Any) -> list[Event]:
    """Events for one whole ``chat.completion`` body (sets ``st.finish``, ``st.usage``, ``st.model``);
    raises ErrorEvent for an error object, _Malformed for anything that is not an object."""
    if not isinstance(data, dict):
        raise _Malformed(f"the body is {type(data).__name__}, not an object")
    if data.get("object") == "error" or data.get("error"):
        raise ErrorEvent(data)
    if isinstance(data.get("model"), str) and data["model"]:
        st.model = data["model"]
    st.usage = _usage_of(data)
    choice, picked = _pick_choice(st, data.get("choices"), data, has_usage=False)
    events: list[Any] = list(picked)
    st.finish = None
    if choice is not None:
        message = choice.get("message")
        if not isinstance(message, dict):
            a = st.anomaly("missing_message", "choice without message", data)
            events += [a] if a else []
            message = {}
        content = message.get("content")
        st.tool_calls(message.get("tool_calls"))
        if content is None and "content" in message and not message.get("tool_calls"):
            a = st.anomaly("null_content", "message.content is null", data)
            events += [a] if a else []
        events += st.content(_reasoning_of(message), data, reasoning=True)
        events += st.content(content, data)
        events += st.count(st.splitter.flush())
        fr = choice.get("finish_reason")
        st.finish = fr if isinstance(fr, str) and fr else None
    return events


@dataclass(frozen=True)
class _WholeBody:
    """A whole JSON body where an event stream was asked for (the server ignored ``stream: true``)."""

    data: Any


def _decode(raw: bytes) -> tuple[str, bool]:
    """Text of ``raw`` and whether invalid UTF-8 had to be replaced."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), True


async def _read_up_to(chunks: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool]:
    """The rest of a body, at most ``limit`` bytes; True when there was more."""
    out = b""
    async for chunk in chunks:
        out += chunk
        if len(out) > limit:
            return out[:limit], True
    return out, False


async def _body_data(
    st: _Request, response: httpx2.Response, decoder: _TolerantSSEDecoder, where: str
) -> AsyncGenerator[Any, None]:
    """What a response to a streaming request holds, as it arrives, whatever its content type says.

    Yields the JSON value of each event-stream ``data:`` event, ``Anomaly`` events, or one ``_WholeBody``.
    Sets ``st.done`` at ``data: [DONE]`` or after a whole JSON body. Raises ``WebPageResponse`` for a web
    page, ``_Malformed`` for plain text or a body too large, ``ErrorEvent`` for an ``event: error``.
    """
    ctype = response.headers.get("content-type", "")
    chunks = response.aiter_bytes().__aiter__()
    head, eof = b"", False
    while True:  # read until the first real byte (and, for a stream, its first line) tells what this is
        start = head.lstrip(_BLANK)
        if start[:1] in (b"{", b"[", b"<") or b"\n" in start or len(head) >= SNIFF_LIMIT:
            break
        try:
            head += await chunks.__anext__()
        except StopAsyncIteration:
            eof = True
            break
    start = head.lstrip(_BLANK)
    if not start and eof:
        return  # an empty body: not done, so the caller says the answer was cut
    if looks_like_html(start, ctype):
        more, _ = (b"", False) if eof else await _read_up_to(chunks, SNIFF_LIMIT)
        raise WebPageResponse(public_url(where), response.status_code, page_title(start + more))
    if start[:1] in (b"{", b"["):
        more, too_big = (b"", False) if eof else await _read_up_to(chunks, BODY_LIMIT)
        if too_big:
            raise _Malformed(f"{public_url(where)} answered with a JSON body over {BODY_LIMIT // 2**20} MiB")
        text, replaced = _decode(start + more)
        if replaced:
            a = st.anomaly("invalid_utf8", "response bytes were not valid UTF-8; replaced")
            if a:
                yield a
        logger.debug("[%s] whole body (%s): %s", st.rid, ctype or "no content type", _raw(text))
        data = json.loads(text)
        st.done = True
        yield _WholeBody(data)
        return
    if not _SSE_LINE.match(start):
        text, _ = _decode(start[:400])
        raise _Malformed(
            f"{public_url(where)} answered with plain text ({ctype or 'no content type'}), "
            f"not an event stream: {short(text.strip(), 200)!r}"
        )
    if "text/event-stream" not in ctype.lower():
        a = st.anomaly("sse_content_type", f"an event stream sent as {ctype or 'no content type'!r}")
        if a:
            yield a

    async def replay() -> AsyncGenerator[bytes, None]:
        tail = head[-2:]
        yield head
        async for chunk in chunks:
            tail = (tail + chunk)[-2:]
            yield chunk
        if tail.endswith(b"\n") and not tail.endswith(b"\n\n"):
            yield b"\n"  # the last event's closing blank line is missing: end it (a cut mid-line is not ended)

    async for sse in decoder.aiter_bytes(replay()):
        if sse.data.startswith("[DONE]"):
            st.done = True
            await _drain(chunks)
            return
        if sse.event == "error":
            try:
                body = json.loads(sse.data)
            except ValueError:
                body = sse.data
            raise ErrorEvent(body if isinstance(body, dict) else {"message": str(body)})
        if not sse.data.strip():
            a = st.anomaly("empty_event", "an event with no data")
            if a:
                yield a
            continue
        yield json.loads(sse.data)


async def _drain(chunks: AsyncIterator[bytes], limit: int = 64 * 1024, seconds: float = 0.5) -> None:
    """Read what follows ``[DONE]`` (normally just the end of the chunked body), so the connection goes
    back to the pool instead of being closed: otherwise every answer opens a new connection. A server
    that keeps sending (or stays silent) past ``limit`` bytes or ``seconds`` is left to ``aclose()``."""
    read = 0
    with contextlib.suppress(TimeoutError, httpx2.HTTPError, OSError):
        async with asyncio.timeout(seconds):
            async for chunk in chunks:
                read += len(chunk)
                if read > limit:
                    return


def _events_of(st: _Request, data: Any, decoder: _TolerantSSEDecoder) -> list[Event]:
    """The events one item of ``_body_data`` gives: an anomaly as is, a whole body's answer, or a chunk's."""
    if isinstance(data, Anomaly):
        events: list[Event] = [data]
    elif isinstance(data, _WholeBody):
        a = st.anomaly("json_body", "a whole chat.completion body, not an event stream")
        events = ([a] if a else []) + _body_events(st, data.data)
    else:
        events = _stream_chunk(st, data)
    if decoder.replaced_lines > st.utf8_seen:
        st.utf8_seen = decoder.replaced_lines
        a = st.anomaly("invalid_utf8", "response bytes were not valid UTF-8; replaced", data)
        events += [a] if a else []
    return events


def _stream_ending(st: _Request) -> list[Event]:
    """The events after a stream's last chunk: how it ended (anomalies), the usage, the finish. Raises
    ``StreamCut`` for a stream that ended early and ``EmptyAnswer`` for one with nothing in it."""
    if st.finish is None and not st.done:
        # Neither a finish reason nor [DONE]: the response ended early (a proxy, a crash).
        raise StreamCut(f"after {st.chunks} chunks, {st.text_chars} characters")
    if not st.shown and st.finish is None:
        raise EmptyAnswer()
    events: list[Event] = []
    if st.finish is None:
        a = st.anomaly("no_finish_reason", "stream ended without finish_reason")
        events += [a] if a else []
    elif not st.done:
        a = st.anomaly("no_done", "stream ended after its finish_reason without data: [DONE]")
        events += [a] if a else []
    if st.usage is not None:
        events.append(st.usage)
    events.append(Finish(st.finish, st.model, tuple(st.tools)))
    return events


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
    def _request(self, model: str, request_id: str | None) -> Iterator[_Request]:
        """One request's bookkeeping: its state, how it ended (ours raised as is, the rest mapped to
        ours), and its one log line, whichever way it ended."""
        st = _Request(request_id or new_request_id(), model)
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
                decoder = _TolerantSSEDecoder()
                source = _body_data(st, response, decoder, f"{self.base_url}/chat/completions")
                try:
                    for _ in range(10**9):  # bounded by total_timeout in practice
                        try:
                            data = await clock.bounded(source.__anext__(), st.shown)
                        except StopAsyncIteration:
                            break
                        for ev in _events_of(st, data, decoder):
                            yield ev
                finally:
                    await source.aclose()
                for ev in st.count(st.splitter.flush()):
                    yield ev
                for ev in _stream_ending(st):
                    yield ev
            finally:
                if response is not None:
                    try:
                        await response.aclose()  # the engine sees the connection close
                    except Exception as exc:  # noqa: BLE001 - closing must never mask the real outcome
                        logger.debug("[%s] closing the response failed: %r", st.rid, exc)

    async def _open_stream(
        self, st: _Request, body: dict[str, Any], n_messages: int, clock: _Deadlines
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
        # body is read by _body_data for what it is, not taken to be an event stream.
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
            logger.debug("[%s] body: %s", st.rid, _raw(text))
            where = f"{self.base_url}/chat/completions"
            if looks_like_html(raw, response.headers.get("content-type", "")):
                raise WebPageResponse(public_url(where), response.status_code, page_title(raw))
            if text.lstrip("\ufeff \t\r\n")[:1] not in ("{", "["):
                raise _Malformed(f"{public_url(where)} answered with something that is not JSON: {short(text, 200)!r}")
            return self._answer(st, json.loads(text), notes)

    def _answer(self, st: _Request, data: Any, notes: list[Anomaly]) -> Answer:
        events = _body_events(st, data)
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

    def _log_end(self, st: _Request, outcome: str, seconds: float) -> None:
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
        _maybe_log_summary()

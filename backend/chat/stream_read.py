"""A response to a streaming chat request, read for what it is (an event stream, one whole JSON body, a web page,
plain text) and turned into events, every field of every chunk optional: ``body_data`` yields what the body holds,
``events_of`` the events of each item, ``stream_ending`` how the stream ended. One ``RequestState`` per request
keeps what was seen (client.py's guarantees are in its docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
from openai._streaming import ServerSentEvent, SSEDecoder

from ..engine_http import looks_like_html, page_title, public_url, short
from ..errors import EmptyAnswer, StreamCut, WebPageResponse
from .sanitize import sanitize_text
from .stream_events import (
    Anomaly,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ThinkSplitter,
    Usage,
    count_anomaly,
    int_or_none,
    raw_text,
)

logger = logging.getLogger(__name__)

SNIFF_LIMIT = 64 * 1024  # bytes read to tell an event stream from a JSON body, a web page or plain text
BODY_LIMIT = 16 * 1024 * 1024  # the largest whole (non-stream) JSON body read where a stream was asked for
_BLANK = b"\xef\xbb\xbf \t\r\n"  # a BOM and whitespace before the first real byte
_SSE_LINE = re.compile(rb"(?:data|event|id|retry)?:")  # how an event stream's first line starts


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


class Malformed(Exception):
    """The response is not the OpenAI chat API."""


class TolerantSSEDecoder(SSEDecoder):
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


# ---------------------------------------------------------------- per-request state


@dataclass
class RequestState:
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
        logger.debug("[%s] anomaly %s (%s): %s", self.rid, kind, detail, raw_text(data) if data is not None else "-")
        if kind in self.kinds:
            return None
        self.kinds.add(kind)
        count_anomaly(kind)
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


def _pick_choice(
    st: RequestState, choices: Any, data: Any, has_usage: bool
) -> tuple[dict[str, Any] | None, list[Event]]:
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
    return Usage(int_or_none(usage.get("prompt_tokens")), int_or_none(usage.get("completion_tokens")))


def _reasoning_of(part: dict[str, Any]) -> Any:
    value = part.get("reasoning_content")
    return value if value is not None else part.get("reasoning")


def _stream_chunk(st: RequestState, data: Any) -> list[Event]:
    """Events for one decoded stream chunk; raises ErrorEvent / Malformed."""
    st.chunks += 1
    if st.chunks == 1:
        logger.debug("[%s] first chunk: %s", st.rid, raw_text(data))
    if not isinstance(data, dict):
        raise Malformed(f"a stream event is {type(data).__name__}, not an object")
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


def body_events(st: RequestState, data: Any) -> list[Event]:
    """Events for one whole ``chat.completion`` body (sets ``st.finish``, ``st.usage``, ``st.model``);
    raises ErrorEvent for an error object, Malformed for anything that is not an object."""
    if not isinstance(data, dict):
        raise Malformed(f"the body is {type(data).__name__}, not an object")
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


async def body_data(
    st: RequestState, response: httpx2.Response, decoder: TolerantSSEDecoder, where: str
) -> AsyncGenerator[Any, None]:
    """What a response to a streaming request holds, as it arrives, whatever its content type says.

    Yields the JSON value of each event-stream ``data:`` event, ``Anomaly`` events, or one ``_WholeBody``.
    Sets ``st.done`` at ``data: [DONE]`` or after a whole JSON body. Raises ``WebPageResponse`` for a web
    page, ``Malformed`` for plain text or a body too large, ``ErrorEvent`` for an ``event: error``.
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
            raise Malformed(f"{public_url(where)} answered with a JSON body over {BODY_LIMIT // 2**20} MiB")
        text, replaced = _decode(start + more)
        if replaced:
            a = st.anomaly("invalid_utf8", "response bytes were not valid UTF-8; replaced")
            if a:
                yield a
        logger.debug("[%s] whole body (%s): %s", st.rid, ctype or "no content type", raw_text(text))
        data = json.loads(text)
        st.done = True
        yield _WholeBody(data)
        return
    if not _SSE_LINE.match(start):
        text, _ = _decode(start[:400])
        raise Malformed(
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


def events_of(st: RequestState, data: Any, decoder: TolerantSSEDecoder) -> list[Event]:
    """The events one item of ``body_data`` gives: an anomaly as is, a whole body's answer, or a chunk's."""
    if isinstance(data, Anomaly):
        events: list[Event] = [data]
    elif isinstance(data, _WholeBody):
        a = st.anomaly("json_body", "a whole chat.completion body, not an event stream")
        events = ([a] if a else []) + body_events(st, data.data)
    else:
        events = _stream_chunk(st, data)
    if decoder.replaced_lines > st.utf8_seen:
        st.utf8_seen = decoder.replaced_lines
        a = st.anomaly("invalid_utf8", "response bytes were not valid UTF-8; replaced", data)
        events += [a] if a else []
    return events


def stream_ending(st: RequestState) -> list[Event]:
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

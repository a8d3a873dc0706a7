"""What a chat stream yields (``TextDelta`` … ``Finish``, a whole ``Answer``), the per-process counters of the
off-spec things tolerated in streams (``anomaly_counts``), and the split of Qwen3's inline ``<think>`` reasoning.
``client.py`` reads responses into these; the UI and the tests consume them."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SUMMARY_INTERVAL = 300.0  # seconds between INFO summaries of the anomaly counters
RAW_LOG_LIMIT = 2000  # characters of a raw chunk in a debug line
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


def count_anomaly(kind: str) -> None:
    with _counts_lock:
        _counts[kind] += 1
        first = kind in WARN_ONCE and kind not in _warned
        _warned.add(kind)
    if first:
        logger.warning("%s (anomaly %r, counted in anomaly_counts())", WARN_ONCE[kind], kind)


def maybe_log_summary() -> None:
    with _counts_lock:
        total = sum(_counts.values())
    if total != _last_summary["total"] and time.monotonic() - _last_summary["at"] >= SUMMARY_INTERVAL:
        log_anomaly_summary()


# ---------------------------------------------------------------- small helpers


def new_request_id() -> str:
    """8 hex characters, unique enough to grep one request in the logs."""
    return secrets.token_hex(4)


def raw_text(data: Any) -> str:
    try:
        text = json.dumps(data, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(data)
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + f"… ({len(text)} chars)"


def int_or_none(value: Any) -> int | None:
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

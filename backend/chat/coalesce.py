"""Coalesce streamed tokens into fewer, larger UI updates.

Each Chainlit ``stream_token`` call is one socket message and one re-render of the answer in the
browser; at hundreds of tokens per second the browser, not the engine, sets the pace (and after a
large pasted message each re-render is slower still). A :class:`Coalescer` sits between the turn
and the UI:

    co = Coalescer(sink, interval=0.040)     # sink(kind, text): e.g. msg.stream_token for "answer"
    await co.add("answer", token)            # the first token of each kind goes out at once
    ...                                      # later ones at most every ``interval`` seconds
    await co.flush()                         # before the answer is finalised, on Stop, on errors

Guarantees: text reaches the sink in the order it was added, nothing is dropped or repeated, a
buffered token waits at most ``interval`` (a timer flushes it when no further token comes), and a
switch of kind (reasoning ↔ answer) sends what was buffered of the other kind first.
``interval = 0`` sends every token at once, one sink call each (the behaviour without coalescing).

No Chainlit here: backend/ui/views.py passes the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

Sink = Callable[[str, str], Awaitable[None]]


class Coalescer:
    """Throttle with a leading and a trailing edge, per stream of (kind, text) pieces."""

    def __init__(
        self,
        sink: Sink,
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be 0 or more seconds, not {interval!r}")
        self._sink, self.interval, self._clock, self._sleep = sink, interval, clock, sleep
        self._pending: list[list[str]] = []  # [kind, text] runs, oldest first; one run per kind switch
        self._kinds_seen: set[str] = set()
        self._last_flush = -float("inf")
        self._lock = asyncio.Lock()  # one sink call at a time: the timer's and the caller's
        self._timer: asyncio.Task[None] | None = None
        self._timer_error: BaseException | None = None
        self.flushes = 0  # sink calls so far (for tests and benchmarks)

    @property
    def pending(self) -> str:
        """The buffered text not yet sent (all kinds, in order)."""
        return "".join(text for _, text in self._pending)

    async def add(self, kind: str, text: str) -> None:
        """Buffer ``text`` of ``kind`` and send it now or within ``interval``.

        A failed flush by the timer is raised here (``text`` is kept: the next flush sends it).
        """
        if not text:
            self._raise_timer_error()
            return
        if self.interval <= 0:
            await self._send_now(kind, text)
            return
        first_of_kind = kind not in self._kinds_seen
        self._kinds_seen.add(kind)
        switched = bool(self._pending) and self._pending[-1][0] != kind
        if self._pending and not switched:
            self._pending[-1][1] += text
        else:
            self._pending.append([kind, text])
        self._raise_timer_error()
        if first_of_kind or switched or self._clock() - self._last_flush >= self.interval:
            await self.flush()
        elif self._timer is None:
            delay = max(0.0, self._last_flush + self.interval - self._clock())
            self._timer = asyncio.create_task(self._flush_later(delay), name="coalescer-flush")

    async def flush(self) -> None:
        """Send everything buffered now, in order (also after the timer's own flush failed)."""
        self._cancel_sleeping_timer()
        async with self._lock:
            while self._pending:
                kind, text = self._pending[0]
                await self._sink(kind, text)
                self._pending.pop(0)  # only once sent: a failed sink call leaves it for the next flush
                self.flushes += 1
            self._last_flush = self._clock()
        self._raise_timer_error()

    async def _send_now(self, kind: str, text: str) -> None:
        async with self._lock:
            await self._sink(kind, text)
            self.flushes += 1
            self._last_flush = self._clock()

    async def _flush_later(self, delay: float) -> None:
        try:
            await self._sleep(delay)
        except asyncio.CancelledError:
            return
        self._timer = None  # from here on a flush by the caller waits for this one (the lock)
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - handed to the next add()/flush() of the streaming task
            logger.debug("coalesced flush failed: %r", exc)
            self._timer_error = exc

    def _cancel_sleeping_timer(self) -> None:
        if self._timer is not None:  # still sleeping: this flush takes its text
            self._timer.cancel()
            self._timer = None

    def _raise_timer_error(self) -> None:
        if self._timer_error is not None:
            exc, self._timer_error = self._timer_error, None
            raise exc

    async def aclose(self) -> None:
        """Flush what is left and stop the timer; safe to call twice and from a cancelled task."""
        with contextlib.suppress(Exception):
            self._raise_timer_error()  # already reported by the failed flush's log; retry the text below
        await self.flush()

"""One hub download at a time per server; the others wait in order, each told its place.

    queue = DownloadQueue()
    async with queue.turn("acme/lora", on_queued):   # on_queued(1): one download ahead of this one
        ...                                           # the download
    queue.running, queue.waiting                      # for the operator's /status

A download fills the disk and the link for everyone; with one at a time, a second account's download waits (its
chat shows its place) instead of halving the first one's speed. A waiter that is stopped (its chat closed, Stop)
leaves the queue; those behind move up and are told their new place.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

Queued = Callable[[int], Awaitable[None]]


class DownloadQueue:
    """First come, first served; ``turn`` holds the one slot while its block runs."""

    def __init__(self) -> None:
        self._queue: list[tuple[str, object]] = []
        self._changed = asyncio.Condition()

    @property
    def running(self) -> str | None:
        return self._queue[0][0] if self._queue else None

    @property
    def waiting(self) -> list[str]:
        return [what for what, _ in self._queue[1:]]

    @contextlib.asynccontextmanager
    async def turn(self, what: str, on_queued: Queued | None = None) -> AsyncIterator[None]:
        ticket = object()
        self._queue.append((what, ticket))
        try:
            told = 0
            while True:
                async with self._changed:  # the place read and the wait under one hold: no wake-up missed
                    ahead = self._index(ticket)
                    if ahead == 0:
                        break
                    if ahead == told:
                        await self._changed.wait()
                        continue
                told = ahead
                if on_queued is not None:  # said outside the hold: a slow chat does not stop the queue
                    await on_queued(ahead)
            yield
        finally:
            self._queue[:] = [entry for entry in self._queue if entry[1] is not ticket]
            async with self._changed:
                self._changed.notify_all()

    def _index(self, ticket: object) -> int:
        return next(i for i, (_, t) in enumerate(self._queue) if t is ticket)

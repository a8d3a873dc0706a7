"""Who hears of the poller's changes: subscriptions (async iterators of ``HealthStatus``) and waits for a state.

subs = Subscribers()
async for status in subs.subscribe(current): ...   # the current status first, then each change
subs.publish(status)                                # to every subscriber; a slow one misses only the middle ones
subs.close()                                        # ends every subscription
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator

from .health_status import EngineState, HealthStatus

Queue = asyncio.Queue[HealthStatus | None]


def put_latest(q: Queue, item: HealthStatus | None) -> None:
    """Queue ``item``; when full, drop the oldest so the latest always gets through."""
    while True:
        try:
            q.put_nowait(item)
            return
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()


class Subscribers:
    """The open subscriptions' queues."""

    def __init__(self) -> None:
        self._queues: set[Queue] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._queues)

    def __iter__(self) -> Iterator[Queue]:
        return iter(list(self._queues))

    def subscribe(self, current: HealthStatus) -> Subscription:
        """``current`` first, then each published status; ends at once when closed."""
        q: Queue = asyncio.Queue(maxsize=8)
        q.put_nowait(current)
        if self.closed:
            q.put_nowait(None)
        else:
            self._queues.add(q)
        return Subscription(self, q)

    def publish(self, status: HealthStatus) -> None:
        for q in list(self._queues):
            put_latest(q, status)

    def discard(self, q: Queue) -> None:
        self._queues.discard(q)

    def close(self) -> None:
        self.closed = True
        for q in list(self._queues):
            put_latest(q, None)
        self._queues.clear()


class Subscription:
    """Async iterator of HealthStatus changes; ``aclose()`` (or leaving ``async with``) unsubscribes."""

    def __init__(self, subscribers: Subscribers, queue: Queue) -> None:
        self._subscribers = subscribers
        self._queue = queue
        self._closed = False

    def __aiter__(self) -> AsyncIterator[HealthStatus]:
        return self

    async def __anext__(self) -> HealthStatus:
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._closed = True
        self._subscribers.discard(self._queue)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def wait_for_state(
    sub: Subscription,
    current: Callable[[], HealthStatus],
    stopped: Callable[[], bool],
    done: Collection[EngineState],
    timeout: float,
    on_progress: Callable[[float, HealthStatus], Awaitable[None] | None] | None,
    progress_every: float,
) -> HealthStatus:
    """HealthPoller.wait_until_ready's wait, on ``sub`` (whose first status is the current one): until a state in
    ``done``, ``timeout`` seconds not counting a preparation phase, or ``stopped()``."""
    started = time.monotonic()
    preparing = 0.0  # seconds spent in a preparation phase, not counted
    status = await sub.__anext__()  # the current status, queued by subscribe()
    mark = time.monotonic()
    while True:
        now = time.monotonic()
        if status.phase:
            preparing += now - mark
        mark = now
        elapsed = now - started
        if on_progress is not None:
            result = on_progress(elapsed, status)
            if inspect.isawaitable(result):
                await result
        counted = elapsed - preparing
        if status.state in done or counted >= timeout or stopped():
            return status
        wait = min(progress_every, max(0.0, timeout - counted))
        try:
            status = await asyncio.wait_for(sub.__anext__(), wait)
        except TimeoutError:
            status = current()
        except StopAsyncIteration:
            return current()

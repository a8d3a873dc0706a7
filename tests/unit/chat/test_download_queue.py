"""One hub download at a time per server: the second waits, told its place, and starts when the first ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from backend.chat.download_queue import DownloadQueue


async def until(what: str, condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition()`` holds; fails naming ``what`` after 10 s."""
    deadline = asyncio.get_running_loop().time() + 10
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.001)


@pytest.mark.asyncio
async def test_a_second_download_waits_told_its_place_and_starts_when_the_first_ends():
    queue = DownloadQueue()
    first_in, first_may_end, second_may_end = asyncio.Event(), asyncio.Event(), asyncio.Event()
    order: list[str] = []
    told: dict[str, list[int]] = {"b": [], "c": []}

    async def download(name: str) -> None:
        async def queued(position: int) -> None:
            told[name].append(position)

        async with queue.turn(name, queued):
            order.append(f"{name} starts")
            if name == "a":
                first_in.set()
                await first_may_end.wait()
            if name == "b":
                await second_may_end.wait()
            order.append(f"{name} ends")

    a = asyncio.create_task(download("a"))
    await asyncio.wait_for(first_in.wait(), 10)
    b = asyncio.create_task(download("b"))
    c = asyncio.create_task(download("c"))
    await until("c told it is second", lambda: told["c"] == [2])
    assert (queue.running, queue.waiting, told["b"]) == ("a", ["b", "c"], [1])
    first_may_end.set()
    await until("c told it moved up", lambda: told["c"] == [2, 1])  # b runs now
    second_may_end.set()
    await asyncio.wait_for(asyncio.gather(a, b, c), 10)
    assert order == ["a starts", "a ends", "b starts", "b ends", "c starts", "c ends"]
    assert told == {"b": [1], "c": [2, 1]} and queue.running is None


@pytest.mark.asyncio
async def test_a_waiter_that_is_stopped_leaves_the_queue_and_those_behind_move_up():
    queue = DownloadQueue()
    hold = asyncio.Event()
    told: list[int] = []

    async def running() -> None:
        async with queue.turn("a"):
            await hold.wait()

    async def waiting(on_queued=None) -> None:
        async with queue.turn("x", on_queued):
            pass

    async def note(position: int) -> None:
        told.append(position)

    a = asyncio.create_task(running())
    await until("a running", lambda: queue.running == "a")
    b = asyncio.create_task(waiting())
    c = asyncio.create_task(waiting(note))
    await until("c told it is second", lambda: told == [2])
    b.cancel()
    await until("c told it moved up", lambda: told == [2, 1])
    hold.set()
    await asyncio.wait_for(asyncio.gather(a, c), 10)
    assert queue.waiting == [] and queue.running is None

"""Issue #20, the queue visible, through Chainlit's own socket handlers against the fake server: while a turn waits
for its first token and the engine says requests wait (vLLM's /metrics, read by the shared poller), a wait step
says "queued: 3 answers ahead · engine busy", follows each poll, and ends at the first token."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from backend.chat.health import EngineLoad
from tests.unit import test_app_handlers as handlers
from tests.unit.test_app_handlers import marker, wait_for

fake, ui, chat = handlers.fake, handlers.ui, handlers.chat

pytestmark = pytest.mark.asyncio(loop_scope="module")


def publish(poller, load: EngineLoad | None) -> None:
    """What a poll that read vLLM's gauges does (_note_load): the status with its load, to every subscriber."""
    poller._status = dataclasses.replace(poller._status, load=load)
    poller.subscribers.publish(poller.status)


def queued_steps(chat, since: int) -> list[dict]:
    return [s for s in chat.screen(since).steps.values() if str(s.get("name", "")).startswith(("queued", "排队"))]


async def test_a_turn_waiting_for_its_first_token_says_how_many_are_queued_and_follows_the_polls(chat, ui, monkeypatch):
    poller = ui.service.poller

    async def no_read() -> None:  # the load is what the test publishes, not the fake server's (no /metrics)
        return None

    monkeypatch.setattr(poller, "_note_load", no_read)
    await poller.refresh()  # a poll under way may still read the fake server's (absent) /metrics: let it end
    publish(poller, EngineLoad(8, 3))
    try:
        n = len(chat.events)
        m = marker()
        sending = chat.start_sending(f"[[fault:stall-first:stall=3]] {m}")
        await wait_for(lambda: queued_steps(chat, n), 10, "the wait step")
        [step] = queued_steps(chat, n)
        assert step["name"] == "queued: 3 answers ahead · engine busy"
        assert not any(a.strip() for a in chat.screen(n).answers)  # no token yet
        publish(poller, EngineLoad(8, 1))  # the next poll: one ahead
        await wait_for(
            lambda: queued_steps(chat, n)[0]["name"] == "queued: 1 answer ahead · engine busy", 10, "the update"
        )
        await asyncio.wait_for(sending, 30)
        screen = chat.screen(n)
        assert screen.answers and not screen.errors, screen.errors
        assert queued_steps(chat, n)[0].get("end"), "the wait step ended with the answer"
        # a turn while nothing waits shows no wait step
        publish(poller, EngineLoad(2, 0))
        n2 = len(chat.events)
        await chat.send(f"[[fault:stall-first:stall=1]] {marker()}")
        assert queued_steps(chat, n2) == []
    finally:
        publish(poller, None)


async def test_the_wait_step_is_in_chinese_for_a_chinese_viewer(chat, ui, monkeypatch):
    poller = ui.service.poller

    async def no_read() -> None:
        return None

    monkeypatch.setattr(poller, "_note_load", no_read)
    await poller.refresh()
    handlers.browser_language(ui.service, monkeypatch)
    chat.session.language = "zh-CN"
    publish(poller, EngineLoad(8, 3))
    try:
        n = len(chat.events)
        await chat.send(f"[[fault:stall-first:stall=2]] {marker()}")
        [step] = queued_steps(chat, n)
        assert step["name"] == "排队中：前面还有 3 个回答 · 引擎繁忙"
    finally:
        publish(poller, None)


async def test_the_footer_of_a_queued_answer_keeps_its_own_time_apart_from_the_wait(chat, ui, monkeypatch):
    """The footer under an answer that queued: its own time from its first token, the queue as "waited" (#20)."""
    import re
    import time

    poller = ui.service.poller

    async def no_read() -> None:
        return None

    monkeypatch.setattr(poller, "_note_load", no_read)
    await poller.refresh()
    publish(poller, EngineLoad(8, 3))
    try:
        n = len(chat.events)
        started = time.monotonic()
        screen = await chat.send(f"[[fault:stall-first:stall=2]] {marker()}")  # no first token for 2 s: queued
        wall = time.monotonic() - started
        footer = screen.answers[-1].rsplit("\n\n", 1)[-1]
        found = re.search(r"· 8 tokens · (\d+\.\d) s · waited (\d+\.\d) s ·", footer)
        assert found, footer
        own, waited = map(float, found.groups())
        assert waited >= 2.0 and own <= wall - 2.0 + 0.05, (footer, wall)  # the queue is not the answer's own time
        assert queued_steps(chat, n)
        publish(poller, EngineLoad(2, 0))  # nothing waits: no wait in the footer
        screen = await chat.send(marker())
        assert "waited" not in screen.answers[-1], screen.answers[-1]
    finally:
        publish(poller, None)

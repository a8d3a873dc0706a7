"""ChatClient reuses its connection to the engine across answers, as the openai SDK does (issue #11, P1)."""

from __future__ import annotations

import contextlib

import pytest

from backend.chat.client import ChatClient, Finish, TextDelta
from backend.errors import BackendError
from backend.settings import ClientSettings
from tests.fakes.openai_server import FakeServer, expected_text

HI = [{"role": "user", "content": "hi"}]


async def answer(client: ChatClient, spec: str) -> tuple[str, Finish | None]:
    text, finish = "", None
    async with contextlib.aclosing(client.stream(HI, spec)) as events:
        async for ev in events:
            if isinstance(ev, TextDelta):
                text += ev.text
            elif isinstance(ev, Finish):
                finish = ev
    return text, finish


@pytest.mark.asyncio
async def test_consecutive_answers_use_one_connection():
    async with FakeServer() as fake:
        client = ChatClient(fake.base_url, "x", ClientSettings(max_retries=0))
        try:
            for _ in range(4):
                text, finish = await answer(client, "normal:tokens=50")
                assert text == expected_text(50) and finish is not None
        finally:
            await client.aclose()
        peers = [r.peer for r in fake.records if r.stream]
        assert len(peers) == 4 and all(peers)
        assert len(set(peers)) == 1, f"a new connection per answer: {peers}"


@pytest.mark.asyncio
async def test_a_stream_cut_mid_body_does_not_poison_the_next_answer():
    async with FakeServer() as fake:
        client = ChatClient(fake.base_url, "x", ClientSettings(max_retries=0))
        try:
            with pytest.raises(BackendError):  # which one is test_client.py's business
                await answer(client, "fault:drop-mid:at=3")
            text, finish = await answer(client, "normal:tokens=5")
            assert text == expected_text(5) and finish is not None
        finally:
            await client.aclose()

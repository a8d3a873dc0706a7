"""The warm-up at start: the first message finds the token counter and the client ready (issue #11, P2)."""

from __future__ import annotations

import asyncio

import pytest

from backend.chat import counters
from backend.chat import service as service_mod
from backend.settings import load_settings
from tests.fakes.openai_server import FakeServer


def external_service(fake: FakeServer) -> service_mod.Service:
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "test"}
    return service_mod.Service(load_settings(env=env))


@pytest.mark.asyncio
async def test_start_loads_the_counter_and_warms_the_client_before_the_first_message(monkeypatch):
    opened: list[str] = []
    real_open = counters.open_counter

    async def counting_open(**kw):
        opened.append(kw.get("model", ""))
        return await real_open(**kw)

    monkeypatch.setattr(counters, "open_counter", counting_open)
    async with FakeServer(max_model_len=262_144) as fake:
        service = external_service(fake)
        try:
            await service.start()
            assert service._warm is not None
            await asyncio.wait_for(service._warm, 60)
            assert opened == ["fake-qwen"]  # opened once, for the model the server serves (not a guess)
            assert service._counter is not None
            warmed = service.client._api.__dict__.get("chat")  # the SDK's cached chat resources
            assert warmed is not None
            # The first message: no counter to open, no warm-up again.
            await service.start()
            fitted = await service.fit([{"role": "user", "content": "hello"}])
            assert fitted.prompt_tokens > 0 and opened == ["fake-qwen"]
            assert [r for r in fake.records if r.stream] == []  # no chat answer was spent on warming
        finally:
            await service.client.aclose()


@pytest.mark.asyncio
async def test_a_failing_warm_up_is_logged_and_the_first_message_still_works(monkeypatch, caplog):
    async def broken(self):
        raise ConnectionError("models list refused")

    monkeypatch.setattr(service_mod.ChatClient, "warm_up", broken)
    async with FakeServer() as fake:
        service = external_service(fake)
        try:
            await service.start()
            assert service._warm is not None
            await asyncio.wait_for(service._warm, 60)  # does not raise
            assert "warm-up failed" in caplog.text
            fitted = await service.fit([{"role": "user", "content": "hello"}])
            assert fitted.prompt_tokens > 0
        finally:
            await service.client.aclose()

"""Which token counter a fleet uses: the local tokenizer of the served model folder, never a replica's /tokenize
through the router (which reaches whichever replica it picks). The "router" here is a tiny server that answers
/tokenize and counts how often it was asked."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from backend.chat import counters, health
from backend.chat.service import Service
from backend.settings import FleetSettings, ModelSettings, Settings


class Router:
    def __init__(self) -> None:
        self.tokenize_calls = 0
        self.url = ""

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        body = await request.json()
        n = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) + len(str(body.get("prompt", "")))
        return web.json_response({"count": n + 3, "max_model_len": 8192, "tokens": []})


@contextlib.asynccontextmanager
async def router(make: type[Router] = Router) -> AsyncIterator[Router]:
    """A /tokenize server on a free loopback port (``make``: the class that answers)."""
    r = make()
    app = web.Application()
    app.router.add_post("/tokenize", r.tokenize)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    r.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield r
    finally:
        await runner.cleanup()


async def counter_of(settings: Settings) -> counters.TokenCounter:
    await health.reset_shared()
    try:
        return await Service(settings).counter()
    finally:
        await health.reset_shared()


MESSAGES = [{"role": "user", "content": "How many tokens is this? 你好"}]


@pytest.mark.asyncio
async def test_a_launched_fleet_counts_with_the_served_folders_tokenizer_and_never_asks_the_router(qwen_dir):
    async with router() as r:
        settings = Settings(model=ModelSettings(path=str(qwen_dir)), fleet=FleetSettings(local=2))
        service = Service(settings)
        service.base_url = r.url  # the router, where a /tokenize would go
        await health.reset_shared()
        try:
            counter = await service.counter()
            assert isinstance(counter, counters.LocalCounter) and counter.exact
            assert str(qwen_dir) in counter.source
            assert await counter.count_messages(MESSAGES) > 5
            await service.fit(list(MESSAGES))
        finally:
            await health.reset_shared()
        assert r.tokenize_calls == 0


@pytest.mark.asyncio
async def test_a_launched_fleet_without_tokenizer_files_estimates_rather_than_asking_the_router(tmp_path):
    async with router() as r:
        settings = Settings(model=ModelSettings(path=str(tmp_path)), fleet=FleetSettings(local=2))
        service = Service(settings)
        service.base_url = r.url
        await health.reset_shared()
        try:
            counter = await service.counter()
        finally:
            await health.reset_shared()
        assert not counter.exact and r.tokenize_calls == 0


@pytest.mark.asyncio
async def test_external_behind_a_router_prefers_a_local_tokenizer_named_by_model_path(qwen_dir, tmp_path):
    folder = tmp_path / "qwen-tokenizer"
    shutil.copytree(qwen_dir, folder)
    async with router() as r:
        fleet = FleetSettings(remote=("http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"))
        local = await counter_of(Settings(model=ModelSettings(path=str(folder)), fleet=fleet, base_url=r.url))
        assert isinstance(local, counters.LocalCounter) and r.tokenize_calls == 0

        # no [model] path: the router's /tokenize (every replica serves the same model), as before
        remote = await counter_of(Settings(fleet=fleet, base_url=r.url))
        assert isinstance(remote, counters.RemoteCounter) and r.tokenize_calls > 0

        # no fleet: external mode is unchanged, a [model] path or not
        before = r.tokenize_calls
        plain = await counter_of(Settings(model=ModelSettings(path=str(folder)), base_url=r.url))
        assert isinstance(plain, counters.RemoteCounter) and r.tokenize_calls > before


def test_the_model_folder_in_the_test_is_a_tokenizer_folder(qwen_dir):
    assert counters.has_tokenizer(Path(qwen_dir))

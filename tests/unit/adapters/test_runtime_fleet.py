"""A runtime LoRA load/unload in a fleet (``backend/adapters/runtime.py``): sent to every replica directly, all or
nothing. Replicas are ``tests.fakes.openai_server`` instances (vLLM's /v1/(un)load_lora_adapter answers), one
refusing or stopped mid-test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend.adapters import runtime
from backend.errors import AdapterFleetPartial, AdapterRejected
from tests.fakes.openai_server import FakeServer

KEY = "fleet-key"
PATH = "/srv/adapters/poet"


@contextlib.asynccontextmanager
async def replicas(n: int = 3) -> AsyncIterator[list[FakeServer]]:
    servers = [await FakeServer(model="base").start() for _ in range(n)]
    try:
        yield servers
    finally:
        for s in servers:
            await s.stop()


def urls(servers: list[FakeServer]) -> list[str]:
    return [s.base_url for s in servers]


def addr(s: FakeServer) -> str:
    return f"127.0.0.1:{s.port}"


@pytest.mark.asyncio
async def test_a_load_reaches_every_replica_directly_with_the_key():
    async with replicas() as servers:
        await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        for s in servers:
            assert s.runtime_adapters == {"poet": PATH}
            assert [(p, b["lora_name"], auth) for p, b, auth in s.lora_calls] == [
                ("/v1/load_lora_adapter", "poet", f"Bearer {KEY}")
            ]
        await runtime.unload_on_replicas(urls(servers), KEY, "poet")
        assert all(s.runtime_adapters == {} for s in servers)


@pytest.mark.asyncio
async def test_a_load_refused_by_one_replica_is_undone_on_the_others_and_names_the_replica_and_why():
    async with replicas() as servers:
        servers[1].lora_fault = 500
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        assert all(s.runtime_adapters == {} for s in servers)  # uniform again: nowhere
        for s in (servers[0], servers[2]):  # loaded, then unloaded again
            assert [p for p, _, _ in s.lora_calls] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
        err = caught.value
        assert err.failed == (2,)
        text = err.user_text("en")
        assert text.startswith(
            f"could not load adapter 'poet' on every replica of the fleet: replica 2 ({addr(servers[1])}): "
        )
        assert "fake LoRA fault 500" in text and "replica 1 (" not in text and "replica 3 (" not in text
        assert "unloaded again from replicas 1, 3" in text
        zh = err.user_text("zh-CN")
        assert zh.startswith("无法在集群的每个副本上加载适配器 'poet'：副本 2（") and "副本 1, 3" in zh


@pytest.mark.asyncio
async def test_the_undo_leaves_a_replica_that_had_the_adapter_before_as_it_was():
    async with replicas() as servers:
        servers[2].runtime_adapters["poet"] = PATH  # loaded there already (e.g. by another UI process)
        servers[1].lora_fault = 503
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        assert servers[0].runtime_adapters == {} and servers[2].runtime_adapters == {"poet": PATH}
        assert "unloaded again from replicas 1," in caught.value.user_text()


@pytest.mark.asyncio
async def test_a_replica_stopped_mid_test_fails_the_load_which_is_undone_on_the_live_ones():
    async with replicas() as servers:
        await runtime.load_on_replicas(urls(servers), KEY, "first", PATH)
        await servers[0].stop()  # replica 1 dies
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        assert [s.runtime_adapters for s in servers[1:]] == [{"first": PATH}, {"first": PATH}]
        text = caught.value.user_text()
        assert f"replica 1 ({addr(servers[0])}): " in text and "unloaded again from replicas 2, 3" in text


@pytest.mark.asyncio
async def test_every_replica_failing_alike_is_the_engines_own_error_as_with_one_engine():
    async with replicas(2) as servers:
        for s in servers:
            s.lora_fault = 500
        with pytest.raises(AdapterRejected) as caught:
            await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        assert not isinstance(caught.value, AdapterFleetPartial)
        assert all(len(s.lora_calls) == 1 for s in servers)  # nothing loaded: nothing undone


@pytest.mark.asyncio
async def test_an_undo_that_fails_too_says_which_replicas_now_differ(monkeypatch):
    async with replicas() as servers:
        servers[1].lora_fault = 500
        real_unload = runtime.unload_adapter

        async def unload(url, key, name, **kw):
            if url == servers[2].base_url:
                servers[2].lora_fault = 500  # replica 3 refuses the undo
            return await real_unload(url, key, name, **kw)

        monkeypatch.setattr(runtime, "unload_adapter", unload)
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.load_on_replicas(urls(servers), KEY, "poet", PATH)
        assert servers[0].runtime_adapters == {} and servers[2].runtime_adapters == {"poet": PATH}
        text = caught.value.user_text()
        assert "unloaded again from replicas 1," in text
        assert f"Undoing it failed on replica 3 ({addr(servers[2])})" in text and "restart the fleet" in text


@pytest.mark.asyncio
async def test_an_unload_counts_a_replica_without_the_adapter_as_done():
    async with replicas() as servers:
        for s in servers[:2]:
            s.runtime_adapters["poet"] = PATH
        await runtime.unload_on_replicas(urls(servers), KEY, "poet")
        assert all(s.runtime_adapters == {} for s in servers)
        assert all(len(s.lora_calls) == 1 for s in servers)


@pytest.mark.asyncio
async def test_an_unload_refused_by_one_replica_is_loaded_back_on_the_others(tmp_path: Path):
    async with replicas() as servers:
        for s in servers:
            s.runtime_adapters["poet"] = PATH
        servers[0].lora_fault = 500
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.unload_on_replicas(urls(servers), KEY, "poet", reload_path=PATH)
        assert [s.runtime_adapters for s in servers] == [{"poet": PATH}] * 3  # still served everywhere
        text = caught.value.user_text()
        assert text.startswith("could not unload adapter 'poet' from every replica of the fleet: replica 1 (")
        assert "loaded back on replicas 2, 3" in text and "try /unload again later" in text


@pytest.mark.asyncio
async def test_an_unload_refused_by_one_replica_without_a_folder_to_reload_from_says_where_it_is_gone():
    async with replicas() as servers:
        for s in servers:
            s.runtime_adapters["poet"] = PATH
        servers[2].lora_fault = 503
        with pytest.raises(AdapterFleetPartial) as caught:
            await runtime.unload_on_replicas(urls(servers), KEY, "poet")
        assert [bool(s.runtime_adapters) for s in servers] == [False, False, True]
        assert "gone from replicas 1, 2 only" in caught.value.user_text()

"""Runtime adapters in a fleet, through the ``Service`` (what the picker and /unload call): a load or unload goes to
every replica (``tests.fakes.openai_server`` instances), eviction is fleet-wide, a partial failure leaves the fleet
uniform and its message names the replicas but no server path. Real adapter folders and the real doctor."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat.health import HealthStatus, ModelEntry
from backend.chat.service import Loaded, Service
from backend.errors import AdapterFleetPartial
from backend.settings import LoggingSettings, LoraSettings, ModelSettings, Settings
from tests.fakes import adapter_zoo as zoo
from tests.fakes.openai_server import FakeServer

KEY = "fleet-key"


class RouterPoller:
    """The router's /v1/models: one replica's list (here always replica 1's, as a router may pick it)."""

    def __init__(self, replica: FakeServer) -> None:
        self.replica = replica

    @property
    def status(self) -> HealthStatus:
        return HealthStatus(
            models=(ModelEntry("base"), *[ModelEntry(n, parent="base") for n in self.replica.runtime_adapters]),
            base_model="base",
        )

    async def refresh(self) -> HealthStatus:
        return self.status


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    base = zoo.make_base_model(tmp_path / "tiny-llama")
    lora_dir = tmp_path / "lora-dir"
    for name in ("a", "b"):
        zoo.make_adapter(lora_dir / name, r=8, base_name="tiny-llama")
    return {"base": base, "lora_dir": lora_dir, "root": tmp_path}


async def fleet_service(layout: dict[str, Path], servers: list[FakeServer], max_cpu_loras: int = 4) -> Service:
    settings = Settings(
        model=ModelSettings(path=str(layout["base"]), served_model_name="base"),
        lora=LoraSettings(
            dir=str(layout["lora_dir"]), modules={}, max_loras=1, max_cpu_loras=max_cpu_loras, max_lora_rank=16
        ),
        logging=LoggingSettings(dir=str(layout["root"] / "logs")),
        api_key=KEY,
    )
    service = Service(settings)
    service.replica_urls = tuple(s.base_url for s in servers)
    service._poller = RouterPoller(servers[0])  # type: ignore[assignment]
    return service


@pytest_asyncio.fixture
async def servers():
    started = [await FakeServer(model="base").start() for _ in range(2)]
    yield started
    for s in started:
        await s.stop()


@pytest.mark.asyncio
async def test_a_load_from_the_picker_reaches_every_replica(layout, servers):
    service = await fleet_service(layout, servers)
    assert await service.ensure_loaded("a") == Loaded("a")
    for s in servers:
        assert list(s.runtime_adapters) == ["a"] and s.runtime_adapters["a"].endswith("lora-dir/a")
        assert s.lora_calls[-1][2] == f"Bearer {KEY}"


@pytest.mark.asyncio
async def test_a_load_one_replica_refuses_is_undone_and_the_message_names_it_without_server_paths(layout, servers):
    servers[1].lora_fault = 500
    service = await fleet_service(layout, servers)
    with pytest.raises(AdapterFleetPartial) as caught:
        await service.ensure_loaded("a")
    assert servers[0].runtime_adapters == {} and servers[1].runtime_adapters == {}
    text = caught.value.user_text("en")
    assert f"replica 2 (127.0.0.1:{servers[1].port})" in text and "unloaded again from replicas 1," in text
    assert str(layout["root"]) not in text and str(layout["root"]) not in caught.value.user_text("zh")


@pytest.mark.asyncio
async def test_eviction_unloads_the_least_recently_used_adapter_from_every_replica(layout, servers):
    service = await fleet_service(layout, servers, max_cpu_loras=1)
    await service.ensure_loaded("a")
    assert await service.ensure_loaded("b") == Loaded("b", evicted="a")
    assert [list(s.runtime_adapters) for s in servers] == [["b"], ["b"]]


@pytest.mark.asyncio
async def test_unload_refused_by_one_replica_is_loaded_back_on_the_other_from_the_adapters_folder(layout, servers):
    service = await fleet_service(layout, servers)
    await service.ensure_loaded("a")
    servers[1].lora_fault = 503
    with pytest.raises(AdapterFleetPartial) as caught:
        await service.unload("a", service.poller.status)
    assert [list(s.runtime_adapters) for s in servers] == [["a"], ["a"]]  # served by both, as before
    text = caught.value.user_text("en")
    assert text.startswith("could not unload adapter 'a' from every replica of the fleet: replica 2 (")
    assert "loaded back on replicas 1," in text and str(layout["root"]) not in text

    servers[1].lora_fault = None
    await service.unload("a", service.poller.status)
    assert [s.runtime_adapters for s in servers] == [{}, {}]

"""An adapter added while the product runs by hub id (/adapters owner/name[@revision], #19): downloaded by the
launcher's own downloader (python -m backend download-model --adapter, a child process of the UI), checked by the
adapter doctor, then loaded at run time; each failure is one message naming what to fix. Against the fake hub
(tests/fakes/hub_server.py) serving the tiny Qwen3's LoRA, and a fake vLLM's load route."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend import hub
from backend.chat.service import Loaded, Service
from backend.errors import AdapterError, AdapterNameTaken, AdapterRejected
from backend.settings import LoggingSettings, LoraSettings, ModelSettings, Settings
from tests.conftest import free_port
from tests.support.fake_engine import on_fake_engine
from tests.unit.adapters.test_runtime import FakeVLLM, serve
from tests.unit.engine import test_hub_adapter as hub_adapter

# the fake hub's repos and the hub's environment, as for [lora] modules by hub id (the same adapters)
GOOD, GATED, BROKEN = hub_adapter.GOOD, hub_adapter.GATED, hub_adapter.BROKEN
repos, fake_hub = hub_adapter.repos, hub_adapter.fake_hub


def service_for(test_models: Path, tmp_path: Path, url: str, fake: FakeVLLM) -> Service:
    settings = Settings(
        model=ModelSettings(path=str(test_models / "tiny-qwen3"), served_model_name="tiny-qwen3"),
        lora=LoraSettings(modules={}, dir=str(tmp_path / "lora-dir"), max_lora_rank=8, max_cpu_loras=4),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )
    (tmp_path / "lora-dir").mkdir(exist_ok=True)
    return on_fake_engine(settings, url, fake)


@contextlib.asynccontextmanager
async def hub_service(test_models: Path, tmp_path: Path) -> AsyncIterator[tuple[FakeVLLM, Service]]:
    """A fake vLLM serving, and a Service (a UI process) adding hub adapters to it."""
    fake = FakeVLLM()
    async with serve(fake) as url:
        yield fake, service_for(test_models, tmp_path, url, fake)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_an_adapter_added_by_hub_id_is_downloaded_checked_and_loaded_under_owner_and_name(
    test_models, tmp_path, fake_hub
):
    fake = FakeVLLM()
    seen: list[tuple[int, int, int]] = []

    async def progress(done: int, total: int, rate: int) -> None:
        seen.append((done, total, rate))

    async def go() -> None:
        async with serve(fake) as url:
            service = service_for(test_models, tmp_path, url, fake)
            assert await service.add_hub_adapter(f" `{GOOD}` ", progress) == (GOOD, Loaded(GOOD))
            snapshot = hub.complete_snapshot(hub.HubModel(GOOD, adapter=True))
            assert snapshot is not None and fake.loaded == {GOOD: str(snapshot)}
            # only the adapter's own files, and the last progress report says all of them
            assert sorted(p.name for p in snapshot.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
            assert seen and seen[-1][0] == seen[-1][1] == sum(p.stat().st_size for p in snapshot.iterdir())

            # evicted, or lost in an engine restart: offered in the dropdown and loaded again, from the cache
            served = fake_hub.served
            fake.loaded.clear()
            assert [a.name for a in await service.local_adapters(service.poller.status)] == [GOOD]
            assert await service.needs_runtime_load(GOOD)
            assert await service.ensure_loaded(GOOD) == Loaded(GOOD)
            # added again: served already, nothing fetched
            assert await service.add_hub_adapter(GOOD) == (GOOD, None)
            assert fake_hub.served == served

    run(go())


@pytest.mark.parametrize(
    "typed, words",
    [
        ("acme/no-such-lora", ["there is no adapter acme/no-such-lora", "HTTP 404", "check the id after /adapters"]),
        (GATED, ["HTTP 401", "HF_TOKEN"]),
        ("acme/a/b", ["'acme/a/b' is not a hub id", "/adapters owner/name"]),
        ("two words", ["'two words' is not a hub id"]),
    ],
    ids=["404", "gated", "three-parts", "spaces"],
)
def test_an_adapter_the_hub_cannot_give_is_one_message_naming_what_to_fix_and_nothing_is_loaded(
    test_models, tmp_path, fake_hub, typed, words
):
    async def go() -> AdapterError:
        async with hub_service(test_models, tmp_path) as (fake, service):
            with pytest.raises(AdapterError) as caught:
                await service.add_hub_adapter(typed)
            assert fake.calls == [] and await service.local_adapters(service.poller.status) == []
            return caught.value

    error = run(go())
    text = error.user_text("en")
    assert text.startswith("the adapter ") and "was not added" in text, text
    for word in words:
        assert word in text, text
    assert "[lora] modules" not in text and str(tmp_path) not in text, text
    zh = error.user_text("zh-CN")
    assert "适配器" in zh and "未添加" in zh, zh


@pytest.mark.parametrize(
    "key, params, words",
    [
        ("download.no_adapter_revision", {"revision": "v9"}, ["has no revision v9", "the @revision after /adapters"]),
        ("download.not_an_adapter", {"files": "config.json"}, ["has no adapter_config.json", "not a LoRA adapter"]),
        ("download.needs_token", {"status": 401}, ["HTTP 401", "HF_TOKEN"]),  # no [lora] modules in it: kept as is
    ],
)
def test_the_downloaders_words_that_name_lora_modules_name_the_adapters_command_instead(key, params, words):
    from backend.adapters import hub_runtime

    line = hub.ERROR_PREFIX + json.dumps({"key": key, "params": {"id": GOOD, "endpoint": "https://hub", **params}})
    text = hub_runtime.download_failed(hub.HubModel(GOOD, adapter=True), 2, ["x", line, "[qwenchat] …"]).user_text()
    assert text.startswith(f"the adapter {GOOD} was not added: ") and "[lora] modules" not in text, text
    for word in words:
        assert word in text, text


def test_a_downloader_that_dies_without_its_error_line_is_said_with_its_last_words():
    from backend.adapters import hub_runtime

    error = hub_runtime.download_failed(hub.HubModel(GOOD, adapter=True), -9, ["Traceback …", "MemoryError", ""])
    assert "exit code -9: MemoryError" in error.user_text("en") and "退出码 -9" in error.user_text("zh-CN")


def test_an_adapter_the_doctor_refuses_is_not_loaded_and_not_offered(test_models, tmp_path, fake_hub):
    async def go() -> None:
        async with hub_service(test_models, tmp_path) as (fake, service):
            with pytest.raises(AdapterRejected) as caught:
                await service.add_hub_adapter(BROKEN)
            text = caught.value.user_text("en")
            assert "broken-lora" in text and "64" in text and "max_lora_rank" in text, text
            assert str(tmp_path) not in text, text  # the snapshot folder is not shown to the browser
            assert fake.calls == [] and await service.local_adapters(service.poller.status) == []

    run(go())


def test_offline_an_adapter_in_the_cache_is_added_and_one_that_is_not_names_the_cache_and_how_to_copy_it_in(
    test_models, tmp_path, fake_hub, monkeypatch
):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            await service_for(test_models, tmp_path, url, fake).add_hub_adapter(GOOD)
            fake.loaded.clear()
            monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens: no network
            service = service_for(test_models, tmp_path, url, fake)  # a new UI process
            assert await service.add_hub_adapter(GOOD) == (GOOD, Loaded(GOOD))
            with pytest.raises(AdapterError) as caught:
                await service.add_hub_adapter("acme/other-lora")
            text = caught.value.user_text("en")
            assert "cannot reach" in text and "acme/other-lora" in text and "hf download acme/other-lora" in text
            assert "models--acme--other-lora" in text and "<huggingface_hub's cache>" in text, text

    run(go())


def test_a_hub_adapter_named_like_a_folder_adapter_is_served_beside_it_under_owner_and_name(
    test_models, tmp_path, fake_hub
):
    async def go() -> None:
        async with hub_service(test_models, tmp_path) as (fake, service):
            fake.loaded["tiny-lora"] = str(tmp_path / "lora-dir" / "tiny-lora")  # the folder adapter, served
            assert await service.add_hub_adapter(GOOD) == (GOOD, Loaded(GOOD))
            assert fake.loaded["tiny-lora"] == str(tmp_path / "lora-dir" / "tiny-lora")  # not replaced
            assert sorted(fake.loaded) == sorted(["tiny-lora", GOOD])

    run(go())


def test_a_hub_adapter_whose_name_another_source_serves_is_refused_naming_it_and_nothing_is_replaced(
    test_models, tmp_path, fake_hub
):
    async def go() -> None:
        async with hub_service(test_models, tmp_path) as (fake, service):
            assert await service.add_hub_adapter(GOOD) == (GOOD, Loaded(GOOD))  # alice adds it
            before = dict(fake.loaded)
            with pytest.raises(AdapterNameTaken) as caught:  # bob: the same name at another revision
                await service.add_hub_adapter(f"{GOOD}@other-branch")
            text = caught.value.user_text("en")
            assert f"{GOOD} is served already (from {GOOD})" in text and "nothing was replaced" in text, text
            assert fake.loaded == before
            # a name served by the engine from elsewhere ([lora] modules): refused too, before any download
            fake.loaded["acme/static-lora"] = "/models/static"
            with pytest.raises(AdapterNameTaken) as caught:
                await service.add_hub_adapter("acme/static-lora")
            assert "from [lora] modules" in caught.value.user_text("en")
            assert fake.loaded["acme/static-lora"] == "/models/static"

    run(go())

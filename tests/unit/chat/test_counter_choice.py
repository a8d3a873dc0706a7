"""The token counter is chosen again while it is an estimate and something better appears (#19): the model's
tokenizer files (converted or downloaded after the UI started), or an engine that has become ready (its /tokenize)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from aiohttp import web

from backend import hub
from backend.chat import counters, health, turn
from backend.chat.health import EngineState, HealthPoller, HealthStatus
from backend.chat.service import Service
from backend.settings import ModelSettings, Settings
from tests.unit.chat.test_counter_fleet import Router, router
from tests.unit.chat.test_turn import Recorder, chat

MESSAGES = [{"role": "user", "content": "How many tokens is this? 你好"}]


@pytest.fixture
def engine_state(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The state every poller reports, set by the test (the poller's own polling is not what is tested here):
    ``now``, and optionally ``since`` (when that state began) and ``base`` (the model the engine serves)."""
    state: dict[str, Any] = {"now": EngineState.STARTING}

    def status(self: HealthPoller) -> HealthStatus:
        return HealthStatus(state=state["now"], since=state.get("since", 0.0), base_model=state.get("base"))

    monkeypatch.setattr(HealthPoller, "status", property(status))
    return state


@pytest.mark.asyncio
async def test_a_cold_start_estimates_then_counts_exactly_once_the_model_folder_has_its_tokenizer(
    qwen_dir, tmp_path, engine_state
):
    folder = tmp_path / "model"  # the launcher converts the model here after the UI started
    service = Service(Settings(model=ModelSettings(path=str(folder))))
    service.base_url = "http://127.0.0.1:9/v1"  # the engine, still down: nothing listens
    await health.reset_shared()
    try:
        first = await service.counter()
        assert not first.exact
        assert (await service.fit(list(MESSAGES))).exact is False
        assert await service.counter() is first  # nothing new: the same estimate, no new attempt

        shutil.copytree(qwen_dir, folder)
        again = await service.counter()
        assert isinstance(again, counters.LocalCounter) and again.exact
        assert (await service.fit(list(MESSAGES))).exact is True
        assert await service.counter() is again
    finally:
        await health.reset_shared()


@pytest.mark.asyncio
async def test_a_hub_id_counts_exactly_once_its_download_has_every_file(qwen_dir, tmp_path, monkeypatch, engine_state):
    """[model] path = a hub id: the counter's folder is the snapshot in huggingface_hub's cache, and only a
    complete one (a download stopped midway has the tokenizer but not the weights its listing names)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    model = hub.HubModel("qwen/tiny")
    service = Service(Settings(model=ModelSettings(path=str(model))))
    service.base_url = "http://127.0.0.1:9/v1"  # the engine, still down: nothing listens
    await health.reset_shared()
    try:
        assert not (await service.counter()).exact  # nothing downloaded yet

        store, commit = hub.storage_dir(model), "a" * 40
        (store / "refs").mkdir(parents=True)
        (store / "refs" / "main").write_text(commit)
        snapshot = store / "snapshots" / commit
        shutil.copytree(qwen_dir, snapshot)  # the tokenizer files are in; config and weights still on their way
        listing = {p.name: p.stat().st_size for p in snapshot.iterdir()} | {"config.json": 2, "model.safetensors": 9}
        (store / "trees").mkdir()
        tree = {"format_version": 1, "files": {n: {"size": size, "blob_id": "b"} for n, size in listing.items()}}
        (store / "trees" / f"{commit}.json").write_text(json.dumps(tree))
        assert not (await service.counter()).exact

        (snapshot / "config.json").write_text("{}")
        (snapshot / "model.safetensors").write_bytes(b"x" * 9)
        again = await service.counter()
        assert isinstance(again, counters.LocalCounter) and again.exact and str(snapshot) in again.source
    finally:
        await health.reset_shared()


class LoadingEngine(Router):
    """An engine's /tokenize that refuses while the model loads (503), then answers like the router."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = True

    async def tokenize(self, request: web.Request) -> web.Response:
        if self.loading:
            self.tokenize_calls += 1
            return web.json_response({"error": {"message": "loading", "type": "x", "code": 503}}, status=503)
        return await super().tokenize(request)


@pytest.mark.asyncio
async def test_an_external_engine_that_becomes_ready_is_asked_for_exact_counts_once_then_kept(engine_state):
    async with router(LoadingEngine) as server:
        service = Service(Settings(base_url=server.url, model=ModelSettings(served_model_name="m")))
        await health.reset_shared()
        try:
            first = await service.counter()  # the engine is loading: /tokenize refuses, so an estimate
            assert not first.exact
            tried = server.tokenize_calls
            # still starting: not asked again
            assert await service.counter() is first and server.tokenize_calls == tried

            server.loading = False
            engine_state["now"] = EngineState.READY
            again = await service.counter()
            assert isinstance(again, counters.RemoteCounter) and again.exact
            assert (await service.fit(list(MESSAGES))).exact is True
        finally:
            await health.reset_shared()


@pytest.mark.asyncio
async def test_a_tokenize_that_stays_broken_after_ready_is_tried_once_more_not_per_message(engine_state):
    async with router(LoadingEngine) as server:
        service = Service(Settings(base_url=server.url, model=ModelSettings(served_model_name="m")))
        await health.reset_shared()
        try:
            await service.counter()
            engine_state["now"] = EngineState.READY
            assert not (await service.counter()).exact  # one more try, still refused
            tried = server.tokenize_calls
            for _ in range(3):
                assert not (await service.counter()).exact
            assert server.tokenize_calls == tried
        finally:
            await health.reset_shared()


@pytest.mark.asyncio
async def test_an_engine_restart_unseen_by_the_poller_costs_exact_counts_only_until_it_is_ready_again(engine_state):
    """/tokenize refuses (the engine restarts) while the poller still says ready: the counts fall back to the
    estimate for that message, and are exact again once the engine is ready again (a new ready state), not never."""
    async with router(LoadingEngine) as server:
        service = Service(Settings(base_url=server.url, model=ModelSettings(served_model_name="m")))
        await health.reset_shared()
        try:
            server.loading = False
            engine_state.update(now=EngineState.READY, since=1.0)
            assert (await service.fit(list(MESSAGES))).exact is True

            server.loading = True  # the engine went away between two polls
            assert (await service.fit(asked("a new message"))).exact is False
            assert (await service.fit(asked("another one"))).exact is False  # the same ready state: not asked again

            engine_state.update(now=EngineState.STARTING, since=2.0)
            server.loading = False
            engine_state.update(now=EngineState.READY, since=3.0)
            assert (await service.fit(list(MESSAGES))).exact is True
        finally:
            await health.reset_shared()


@pytest.mark.asyncio
async def test_an_external_server_that_changes_its_model_is_asked_for_the_new_ones_counts(engine_state):
    async with router() as server:
        service = Service(Settings(base_url=server.url, model=ModelSettings(served_model_name="m")))
        await health.reset_shared()
        try:
            engine_state.update(now=EngineState.READY, base="m")
            first = await service.counter()
            assert isinstance(first, counters.RemoteCounter) and first.model == "m"
            assert await service.counter() is first

            engine_state.update(base="m2")  # the server was restarted with another model
            again = await service.counter()
            assert isinstance(again, counters.RemoteCounter) and again.model == "m2"
        finally:
            await health.reset_shared()


def asked(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


class ColdStartPoller:
    """The engine being prepared: two progress reports of the wait, the model's tokenizer files appearing between
    them (the conversion or download finished), then down (so the turn ends without an answer to wait for)."""

    def __init__(self, status: HealthStatus, between) -> None:
        self.status, self.between = status, between

    async def wait_until_ready(self, timeout: float, on_progress=None, **kwargs: Any) -> HealthStatus:
        await on_progress(0.0, self.status)
        self.outputs = [self.step_output()]
        self.between()
        await on_progress(1.0, self.status)
        self.outputs.append(self.step_output())
        return HealthStatus(state=EngineState.DOWN)


@pytest.mark.asyncio
async def test_a_message_waiting_for_the_engine_shows_its_estimated_context_then_the_exact_one_once_the_tokenizer_is_there(
    qwen_dir, tmp_path, monkeypatch, engine_state
):
    folder = tmp_path / "model"
    service = Service(Settings(model=ModelSettings(path=str(folder))))
    service.base_url = "http://127.0.0.1:9/v1"  # the engine, still down: nothing listens
    view = Recorder()
    poller = ColdStartPoller(
        HealthStatus(state=EngineState.STARTING, reason=None, phase="install_engine"),
        lambda: shutil.copytree(qwen_dir, folder),
    )
    poller.step_output = lambda: view.steps[-1].output  # type: ignore[attr-defined]
    monkeypatch.setattr(service, "_poller", poller)
    await health.reset_shared()
    try:
        session = chat(service, MESSAGES[0]["content"])
        await turn.answer(session, service, view)
        estimated, exact = poller.outputs
        assert estimated.startswith("context: ≈") and estimated.endswith("/ 7,168 tokens"), estimated
        counted = await (await counters.load_local_counter(folder)).count_messages(MESSAGES)
        assert exact == f"context: {counted} / 7,168 tokens", exact
    finally:
        await health.reset_shared()

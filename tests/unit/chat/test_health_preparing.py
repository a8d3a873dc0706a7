"""The health poller while the launcher prepares (contract PREPARING: installing the engine, converting the
model): "starting" with the step as the reason, no HTTP to an engine that does not exist, no start-up limit, and a
message waiting meanwhile goes through once the engine is ready."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

from backend.chat.health import EngineState, HealthPoller, HealthSettings
from backend.contract import PHASE_CONVERT_MODEL, PHASE_INSTALL_ENGINE, EngineStatus, SupervisorState
from tests.fakes.vllm_server import FakeEngine
from tests.unit.chat.test_health import KEY, until

FAST = HealthSettings(
    poll_starting=0.05,
    poll_ready=0.05,
    probe_every=0.1,
    probe_timeout=0.4,
    probe_slow=0.3,
    request_timeout=0.3,
    startup_limit=0.5,  # short: preparing must not count against it
)


def preparing(path, phase: str, progress: int | None, since: float) -> None:
    EngineStatus(state=SupervisorState.PREPARING, phase=phase, progress=progress, since=since).write(path)


@pytest_asyncio.fixture
async def engine():
    e = FakeEngine(api_key=KEY)
    await e.start()  # listening from the start: a poller that asked it anything while preparing would be seen
    yield e
    await e.stop()


@pytest.mark.asyncio
async def test_preparing_is_starting_with_the_step_in_both_languages_and_no_engine_requests(engine, tmp_path):
    status_file = tmp_path / "engine-status.json"
    since = time.time() - 100  # preparing for 100 s already, far beyond startup_limit
    preparing(status_file, PHASE_INSTALL_ENGINE, 40, since)
    poller = HealthPoller(engine.url, KEY, FAST, status_file=status_file)
    await poller.start()
    try:
        st = await until(poller, lambda s: s.phase == PHASE_INSTALL_ENGINE, what="preparing")
        assert st.state is EngineState.STARTING
        assert (st.text("en"), st.text("zh")) == ("installing the engine 40 %", "正在安装引擎 40%")
        assert st.starting_elapsed >= 99  # counted from the launcher's "since"

        preparing(status_file, PHASE_INSTALL_ENGINE, 60, since)
        st = await until(poller, lambda s: "60 %" in s.text("en"), what="60 %")
        preparing(status_file, PHASE_CONVERT_MODEL, None, since)
        st = await until(poller, lambda s: s.phase == PHASE_CONVERT_MODEL, what="converting")
        assert (st.text("en"), st.text("zh")) == ("converting the model", "正在转换模型")
        await asyncio.sleep(0.6)  # longer than startup_limit: still starting, never "did not become ready"
        st = poller.status
        assert st.state is EngineState.STARTING and st.phase == PHASE_CONVERT_MODEL
        assert st.starting_elapsed >= 99  # one clock for the whole preparation: no reset between steps
        assert engine.seen == [] and engine.probes == 0  # no engine process yet: nothing was asked
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_an_unknown_phase_still_reads_as_preparing(engine, tmp_path):
    status_file = tmp_path / "engine-status.json"
    preparing(status_file, "warming_up", None, time.time())
    poller = HealthPoller(engine.url, KEY, FAST, status_file=status_file)
    await poller.start()
    try:
        st = await until(poller, lambda s: s.phase == "warming_up", what="an unknown phase")
        assert (st.state, st.text("en"), st.text("zh")) == (
            EngineState.STARTING,
            "preparing the engine",
            "正在准备引擎",
        )
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_a_message_sent_while_preparing_waits_and_goes_through_once_ready(engine, tmp_path):
    status_file = tmp_path / "engine-status.json"
    preparing(status_file, PHASE_INSTALL_ENGINE, 10, time.time() - 50)
    settings = HealthSettings(**{**FAST.__dict__, "startup_limit": 30.0})
    poller = HealthPoller(engine.url, KEY, settings, status_file=status_file)
    await poller.start()
    try:
        await until(poller, lambda s: s.phase == PHASE_INSTALL_ENGINE, what="preparing")
        seen: list[tuple[EngineState, str]] = []
        waiter = asyncio.create_task(
            poller.wait_until_ready(
                10, on_progress=lambda e, s: seen.append((s.state, s.text("en"))), progress_every=0.05
            )
        )
        await asyncio.sleep(0.3)
        assert not waiter.done()  # it waits, as during loading
        # the launcher is done: the supervisor launches the engine (a new life: the clock starts over)
        EngineStatus(state=SupervisorState.STARTING, pid=4242, since=time.time()).write(status_file)
        st = await until(poller, lambda s: s.phase is None and s.starting_elapsed < 5, what="engine starting")
        assert st.state in (EngineState.STARTING, EngineState.READY)
        EngineStatus(state=SupervisorState.RUNNING, pid=4242, since=time.time()).write(status_file)
        final = await waiter
        assert final.state is EngineState.READY and final.phase is None
        reasons = [reason for _, reason in seen]
        assert "installing the engine 10 %" in reasons and reasons[-1] == "the model is ready"
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_time_spent_preparing_does_not_count_against_the_wait(engine, tmp_path):
    """[ui] wait_for_ready is about the model loading: a cold start's install (minutes) must not use it up."""
    status_file = tmp_path / "engine-status.json"
    preparing(status_file, PHASE_INSTALL_ENGINE, 10, time.time())
    settings = HealthSettings(**{**FAST.__dict__, "startup_limit": 30.0})
    poller = HealthPoller(engine.url, KEY, settings, status_file=status_file)
    await poller.start()
    try:
        await until(poller, lambda s: s.phase == PHASE_INSTALL_ENGINE, what="preparing")
        waiter = asyncio.create_task(poller.wait_until_ready(0.5, progress_every=0.05))
        await asyncio.sleep(1.2)  # more than the 0.5 s wait, all of it preparing
        assert not waiter.done()
        EngineStatus(state=SupervisorState.STARTING, pid=4242, since=time.time()).write(status_file)
        st = await asyncio.wait_for(waiter, 5)  # the engine is launched: the wait ends (ready, or its 0.5 s)
        assert st.phase is None
    finally:
        await poller.stop()

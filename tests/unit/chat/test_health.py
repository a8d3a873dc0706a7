"""The shared health poller against a fake engine whose behaviour changes while it runs."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat import health
from backend.chat.health import EngineState, HealthPoller, HealthSettings, get_poller, reset_shared
from backend.errors import ConfigError
from backend.settings import replace
from backend.text import Text, t
from tests.fakes.vllm_server import FakeEngine, adapter

FAST = HealthSettings(
    poll_starting=0.05,
    poll_ready=0.05,
    probe_every=0.1,
    probe_timeout=0.4,
    probe_slow=0.3,
    request_timeout=2.0,  # /health and /v1/models answer at once, or are refused; a busy machine once took 0.3 s
    startup_limit=30.0,
)
# A probe slower than probe_slow but well within probe_timeout: FAST's window (0.3 to 0.4 s) is narrower than the
# hiccups of a loaded machine, where a 0.35 s answer can arrive after 0.4 s and read as a timeout.
SLOW_OK = replace(FAST, probe_timeout=3.0)
KEY = "test-key"


async def until(poller: HealthPoller, pred, timeout: float = 30.0, what: str = ""):
    """Wait (bounded) until pred(status) holds; fail with the last status otherwise. The bound is generous: a loaded
    machine can stall this process for seconds, and FAST's probe then reads as slow until the next one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = poller.status
        if pred(status):
            return status
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out waiting for {what or pred}: last status {poller.status}")


def transitions(caplog, arrow: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "backend.chat.health" and arrow in r.getMessage()]


@pytest_asyncio.fixture
async def engine():
    e = FakeEngine(api_key=KEY)
    yield e
    await e.stop()


@pytest_asyncio.fixture
async def poller(engine):
    p = HealthPoller(engine.url, KEY, FAST)
    yield p
    await p.stop()


@pytest.mark.asyncio
async def test_starting_while_refused_then_ready_once_the_server_listens_on_the_port(engine, poller):
    await poller.start()
    st = await until(poller, lambda s: "not listening" in s.text("en"), what="refused → starting")
    assert st.state is EngineState.STARTING and st.models == () and st.version == 0
    await asyncio.sleep(0.2)
    assert poller.status.state is EngineState.STARTING  # refused, never ready: still starting, not down
    assert poller.status.starting_elapsed >= 0.2

    progress: list[tuple[float, EngineState]] = []
    waiter = asyncio.create_task(
        poller.wait_until_ready(5, on_progress=lambda e, s: progress.append((e, s.state)), progress_every=0.05)
    )
    await asyncio.sleep(0.3)
    await engine.start()  # same port, now listening
    final = await waiter

    assert final.state is EngineState.READY, final
    assert final.base_model == "base-model" and final.max_model_len == 8192 and final.version == 1
    assert final.last_probe_latency is not None and final.last_probe_latency < FAST.probe_slow
    assert progress[0][1] is EngineState.STARTING and progress[-1][1] is EngineState.READY
    assert len(progress) >= 4 and [e for e, _ in progress] == sorted(e for e, _ in progress)


@pytest.mark.asyncio
async def test_health_200_but_hung_generation_is_degraded_with_the_timeout_in_the_reason(engine, poller):
    await engine.start()
    await poller.start()
    await until(poller, lambda s: s.ready, what="ready")
    engine.probe = "hang"
    st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="degraded")
    assert "health 200" in st.text("en") and "timed out after 0.4 s" in st.text("en")
    assert "0.4" in st.text("zh") and st.answering and not st.ready
    engine.probe = "ok"
    await until(poller, lambda s: s.ready, what="ready again once the engine answers")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "mode, words", [("slow", ["slowly", "0.3 s"]), ("error", ["failed", "HTTP 500", "EngineCore"])]
)
async def test_slow_or_failing_probe_is_degraded_and_says_why(engine, mode, words):
    engine.probe, engine.probe_delay = mode, 0.35  # slower than probe_slow 0.3, faster than probe_timeout 3
    await engine.start()
    poller = HealthPoller(engine.url, KEY, SLOW_OK)
    await poller.start()
    try:
        st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="degraded")
        for w in words:
            assert w in st.text("en"), st.text("en")
        if mode == "slow":
            assert st.last_probe_latency is not None and st.last_probe_latency >= 0.3
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_flapping_logs_each_transition_once_and_a_steady_state_never(engine, poller, caplog):
    caplog.set_level(logging.INFO, logger="backend.chat.health")
    await engine.start()
    await poller.start()
    await until(poller, lambda s: s.ready, what="ready")
    for _ in range(2):
        await engine.stop()
        await until(poller, lambda s: s.state is EngineState.DOWN, what="down")
        await engine.start()
        await until(poller, lambda s: s.ready, what="ready")

    n_logged = len(caplog.records)
    await asyncio.sleep(0.5)  # ~10 polls and ~5 probes while steady
    assert len(caplog.records) == n_logged, [r.getMessage() for r in caplog.records[n_logged:]]

    assert len(transitions(caplog, "starting → ready")) == 1
    assert len(transitions(caplog, "→ down")) == 2
    assert len(transitions(caplog, "down → ready")) == 2
    downs = transitions(caplog, "→ down")
    assert all("connection refused" in m or "unhealthy" in m for m in downs)


@pytest.mark.asyncio
async def test_down_after_ready_recovers_by_itself_and_keeps_the_model_list_stale_meanwhile(engine, poller):
    engine.models.append(adapter("pirate"))
    await engine.start()
    await poller.start()
    ready = await until(poller, lambda s: s.ready, what="ready")
    assert [m.id for m in ready.models] == ["base-model", "pirate"] and not ready.models_stale

    await engine.stop()
    down = await until(poller, lambda s: s.state is EngineState.DOWN, what="down")
    assert "stopped answering" in down.text("en") and "connection refused" in down.text("en")
    assert down.models == ready.models and down.models_stale
    assert down.version == ready.version and down.base_model == "base-model"
    assert [a.id for a in down.adapters] == ["pirate"]

    await engine.start()
    back = await until(poller, lambda s: s.ready, what="ready again")
    assert not back.models_stale and back.version == ready.version  # same list: the dropdown need not refresh


@pytest.mark.asyncio
async def test_version_increments_when_an_adapter_appears_or_disappears_and_subscribers_see_it(engine):
    slow_polls = HealthSettings(
        poll_starting=0.05, poll_ready=30, probe_every=30, probe_timeout=3, probe_slow=2, request_timeout=2
    )
    poller = HealthPoller(engine.url, KEY, slow_polls)
    await engine.start()
    await poller.start()
    try:
        first = await until(poller, lambda s: s.ready, what="ready")
        sub = poller.subscribe()
        assert (await asyncio.wait_for(sub.__anext__(), 1)).version == first.version  # current status first

        engine.models.append(adapter("pirate"))
        st = await poller.refresh()  # no natural poll for 30 s: refresh() is what finds it
        assert st.version == first.version + 1 and [a.id for a in st.adapters] == ["pirate"]
        pushed = await asyncio.wait_for(sub.__anext__(), 1)
        assert pushed.version == st.version and pushed.adapters[0].parent == "base-model"

        engine.models.pop()
        st = await poller.refresh()
        assert st.version == first.version + 2 and st.adapters == ()
        await sub.aclose()
    finally:
        await poller.stop()


def write_status(path: Path, **fields) -> None:
    data = {
        "state": "running",
        "pid": 4242,
        "attempt": 1,
        "max_attempts": 5,
        "reason": None,
        "cause": None,
        "log_path": "/logs/engine.log",
        "since": time.time(),
        "updated": time.time(),
    }
    data.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


@pytest.mark.asyncio
async def test_status_file_restarting_attempt_2_of_5_is_what_the_user_is_told(engine, tmp_path):
    status_file = tmp_path / "engine-status.json"
    write_status(
        status_file,
        state="restarting",
        pid=4242,
        attempt=2,
        cause="oom_gpu",
        reason=Text("cause.cpu_out_of_memory", {"size": "2 GiB"}).to_json(),
    )
    poller = HealthPoller(engine.url, KEY, FAST, status_file=status_file)
    await poller.start()
    try:
        st = await until(poller, lambda s: "restarting" in s.text("en"), what="restarting")
        assert st.state is EngineState.STARTING
        assert st.text("en") == t("cause.cpu_out_of_memory", size="2 GiB") + "; it is restarting — attempt 2 of 5"
        assert st.text("zh-CN").startswith(t("cause.cpu_out_of_memory", "zh-CN", size="2 GiB")) and "2/5" in st.text(
            "zh"
        )
        assert (st.cause, st.attempt, st.max_attempts, st.log_path) == ("oom_gpu", 2, 5, "/logs/engine.log")

        # a message waiting now is told at once why, then answered once the engine is back
        waiter = asyncio.create_task(poller.wait_until_ready(5))
        write_status(status_file, state="running", pid=5151, attempt=2)
        await engine.start()
        assert (await waiter).state is EngineState.READY

        write_status(
            status_file,
            state="down",
            pid=5151,
            attempt=5,
            cause="lora_load_failed",
            reason="adapter 'pirate' was not found",  # a file an older launcher wrote: English words, kept
            reason_zh="找不到适配器 'pirate'",
        )
        down = await until(poller, lambda s: s.state is EngineState.DOWN, what="supervisor gave up")
        assert down.text("en") == "adapter 'pirate' was not found; it is down after 5 attempts"
        assert down.models_stale and down.cause == "lora_load_failed"
        t0 = time.monotonic()
        assert (await poller.wait_until_ready(120)).state is EngineState.DOWN  # no waiting on a dead engine
        assert time.monotonic() - t0 < 60  # at once, not after the 120 s it was offered (a busy machine is slow)
    finally:
        await poller.stop()


@pytest.mark.parametrize("state", ["starting", "restarting"])
@pytest.mark.asyncio
async def test_an_engine_that_answers_is_not_ready_until_its_supervisor_says_running(engine, tmp_path, state):
    """Issue #28: a restarted engine answers /health and a probe before its supervisor's next check writes "running"
    (it checks every half second, later on a busy machine). A UI that called it ready then answered through it while
    the launcher's status still said "restarting" for that very engine (seen in tests/e2e/test_recovery.py). Ready is
    only ever said once the status file agrees."""
    status_file = tmp_path / "engine-status.json"
    write_status(status_file, state=state, pid=5151, attempt=1 if state == "restarting" else 0)
    await engine.start()  # answers everything, the probe included
    poller = HealthPoller(engine.url, KEY, FAST, status_file=status_file)
    await poller.start()
    try:
        probes = engine.probes
        await until(poller, lambda s: s.checked_at > 0, what="a first poll")
        for _ in range(5):  # several polls: none of them calls it ready, none probes it
            st = await poller.refresh()
            assert st.state is EngineState.STARTING, st
        assert engine.probes == probes
        write_status(status_file, state="running", pid=5151, attempt=1)
        assert (await poller.wait_until_ready(30)).state is EngineState.READY
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_never_up_within_the_startup_limit_is_down_and_waiting_gives_up_at_its_timeout(engine):
    # the limit well after the wait's own timeout: a loaded machine may return from the wait late
    poller = HealthPoller(engine.url, KEY, HealthSettings(poll_starting=0.05, request_timeout=0.3, startup_limit=2))
    await poller.start()
    try:
        st = await poller.wait_until_ready(0.25)
        assert st.state is EngineState.STARTING  # returned at its own timeout, still starting
        down = await until(poller, lambda s: s.state is EngineState.DOWN, timeout=10, what="startup limit")
        assert "did not become ready within 2 s" in down.text("en")
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_bearer_key_goes_on_every_request_and_a_wrong_key_is_down_with_the_fix(engine):
    await engine.start()
    wrong = HealthPoller(engine.url, "not-the-key", FAST)
    await wrong.start()
    try:
        st = await until(wrong, lambda s: s.state is EngineState.DOWN, what="401 → down")
        assert "HTTP 401" in st.text("en") and "OPENAI_API_KEY" in st.text("en")
    finally:
        await wrong.stop()

    engine.seen.clear()
    right = HealthPoller(engine.url, KEY, FAST)
    await right.start()
    try:
        await until(right, lambda s: s.ready, what="ready")
    finally:
        await right.stop()
    paths = {p for p, _ in engine.seen}
    assert paths - {"/metrics"} == {"/health", "/v1/models", "/v1/chat/completions"}  # /metrics: the load (#20)
    assert all(auth == f"Bearer {KEY}" for _, auth in engine.seen)


@pytest.mark.asyncio
async def test_probe_runs_every_probe_every_seconds_not_every_poll(engine):
    poller = HealthPoller(
        engine.url,
        KEY,
        HealthSettings(
            poll_starting=0.05, poll_ready=0.05, probe_every=30, probe_timeout=3, probe_slow=2, request_timeout=2
        ),
    )
    await engine.start()
    await poller.start()
    try:
        await until(poller, lambda s: s.ready, what="ready")
        probes, health_calls = engine.probes, sum(p == "/health" for p, _ in engine.seen)
        await asyncio.sleep(0.4)
        assert sum(p == "/health" for p, _ in engine.seen) >= health_calls + 4  # still polling
        assert engine.probes == probes  # but not generating
        await poller.refresh(probe=True)
        assert engine.probes == probes + 1
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_a_503_health_while_loading_is_starting_and_after_ready_is_down(engine, poller):
    engine.health_status = 503
    await engine.start()
    await poller.start()
    st = await until(poller, lambda s: s.text("en") == "the model is loading", what="503 → loading")
    assert st.state is EngineState.STARTING
    engine.health_status = 200
    await until(poller, lambda s: s.ready, what="ready")
    engine.health_status = 503  # what vLLM answers for ~3 s after its EngineCore is killed
    st = await until(poller, lambda s: s.state is EngineState.DOWN, what="unhealthy")
    assert "unhealthy" in st.text("en") and "503" in st.text("en")


@pytest.mark.asyncio
async def test_a_supervised_engine_that_stops_answering_is_coming_back_until_its_launcher_says_otherwise(
    engine, tmp_path, monkeypatch
):
    """Issue #28: vLLM whose EngineCore was killed answers /health with 503 for seconds while its launcher's status
    still says "running"; a message sent then failed at once ("unhealthy, press Retry") although the restart was
    seconds away. Now that is STARTING, saying the launcher restarts it, and a wait goes on through the restart;
    the launcher silent past the grace (here 1 s) makes it DOWN again."""
    from backend.chat import health_classify

    status_file = tmp_path / "engine-status.json"
    write_status(status_file, state="running", pid=5151, attempt=0)
    await engine.start()
    poller = HealthPoller(engine.url, KEY, FAST, status_file=status_file)
    await poller.start()
    try:
        await until(poller, lambda s: s.ready, what="ready")
        engine.health_status = 503
        st = await until(poller, lambda s: s.state is not EngineState.READY, what="not ready")
        assert st.state is EngineState.STARTING, st
        assert (
            st.text("en")
            == "the model server reports it is unhealthy (health HTTP 503); waiting for the launcher to restart it"
        )
        assert "等待启动器重启" in st.text("zh-CN")
        waiter = asyncio.create_task(poller.wait_until_ready(30))
        write_status(status_file, state="restarting", pid=6161, attempt=1, cause="crashed")
        await until(poller, lambda s: s.attempt == 1, what="restarting")
        assert not waiter.done()
        engine.health_status = 200
        write_status(status_file, state="running", pid=6161, attempt=1)
        assert (await waiter).state is EngineState.READY

        monkeypatch.setattr(health_classify, "SUPERVISED_GRACE_S", 1.0)
        engine.health_status = 503  # and the launcher never notices
        await until(poller, lambda s: s.state is EngineState.STARTING, what="coming back")
        down = await until(poller, lambda s: s.state is EngineState.DOWN, what="down after the grace")
        assert down.text("en") == "the model server reports it is unhealthy (health HTTP 503)"
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_stop_ends_subscriptions_and_waits_and_leaves_no_task(engine):
    poller = HealthPoller(engine.url, KEY, FAST)
    await poller.start()
    await poller.start()  # idempotent
    sub = poller.subscribe()
    collected = []

    async def read():
        async for s in sub:
            collected.append(s)

    reader = asyncio.create_task(read())
    waiter = asyncio.create_task(poller.wait_until_ready(30))
    await asyncio.sleep(0.15)
    await poller.stop()
    await asyncio.wait_for(reader, 1)
    assert (await asyncio.wait_for(waiter, 1)).state is EngineState.STARTING
    assert collected and not poller.running
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert leftover == []
    await poller.stop()  # idempotent


@pytest.mark.asyncio
async def test_one_shared_poller_per_process():
    await reset_shared()
    try:
        a = get_poller("http://127.0.0.1:9/v1", "k", FAST)
        assert get_poller("http://127.0.0.1:9/v1/") is a
        assert HealthPoller.shared("http://127.0.0.1:9") is a  # root or /v1 spelling: same engine
        with pytest.raises(ValueError, match="127.0.0.1:8"):
            get_poller("http://127.0.0.1:8/v1")
        await a.start()
        await reset_shared()
        assert not a.running
        assert get_poller("http://127.0.0.1:8/v1") is not a
    finally:
        await reset_shared()
    assert health._shared is None


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"poll_ready": 0}, "health.poll_ready"),
        ({"probe_timeout": -1}, "health.probe_timeout"),
        ({"probe_slow": 20, "probe_timeout": 10}, "health.probe_slow"),
    ],
)
def test_health_settings_refuse_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        HealthSettings(**kwargs)


@pytest.mark.asyncio
async def test_an_engine_behind_a_proxy_without_health_is_judged_by_models_and_probe(engine, poller):
    engine.health_status = 404  # OPENAI_BASE_URL pointing at a proxy that only forwards /v1
    await engine.start()
    await poller.start()
    st = await until(poller, lambda s: s.ready, what="ready without /health")
    assert st.base_model == "base-model"
    engine.probe = "error"
    await until(poller, lambda s: s.state is EngineState.DEGRADED, what="degraded: the probe still counts")


@pytest.mark.asyncio
async def test_refresh_without_start_polls_once(engine):
    await engine.start()
    poller = HealthPoller(engine.url, KEY, FAST)
    try:
        st = await poller.refresh()
        assert st.ready and not poller.running and engine.probes == 1
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_a_slow_but_answering_engine_is_probed_every_probe_every_not_every_poll(engine):
    """A 4B model on CPU answers the probe slowly: degraded, but not probed on every 0.05 s poll."""
    settings = HealthSettings(
        poll_starting=0.05, poll_ready=0.05, probe_every=30, probe_timeout=3, probe_slow=0.1, request_timeout=2
    )
    engine.probe, engine.probe_delay = "slow", 0.15
    await engine.start()
    poller = HealthPoller(engine.url, KEY, settings)
    await poller.start()
    try:
        st = await until(poller, lambda s: s.state is EngineState.DEGRADED and "slowly" in s.text("en"), what="slow")
        probes, health_calls = engine.probes, sum(p == "/health" for p, _ in engine.seen)
        await asyncio.sleep(0.6)
        assert engine.probes == probes == 1, f"a slow probe was repeated before probe_every: {engine.probes}"
        assert sum(p == "/health" for p, _ in engine.seen) >= health_calls + 4  # still polling /health
        assert poller.status.state is EngineState.DEGRADED and poller.status.text("en") == st.text("en")
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_an_engine_that_only_ever_answered_slowly_is_down_when_it_crashes_not_starting(engine):
    engine.probe, engine.probe_delay = "slow", 0.35  # slower than probe_slow 0.3, faster than probe_timeout 3
    await engine.start()
    poller = HealthPoller(engine.url, KEY, SLOW_OK)
    await poller.start()
    try:
        await until(poller, lambda s: s.state is EngineState.DEGRADED and "slowly" in s.text("en"), what="slow")
        await engine.stop()
        st = await until(poller, lambda s: s.state is not EngineState.DEGRADED, what="the crash noticed")
        assert st.state is EngineState.DOWN, st
        assert "stopped answering" in st.text("en") and "not listening yet" not in st.text("en")
    finally:
        await poller.stop()


@pytest.mark.asyncio
async def test_after_health_fails_a_ready_state_is_not_replayed_without_a_new_probe(engine):
    """Between probes the last answer is replayed, but not across an outage: the engine must answer again."""
    # Generous timeouts: the outage is a refused connection (at once); a busy machine once took 0.3 s for /health.
    settings = HealthSettings(
        poll_starting=0.05, poll_ready=0.05, probe_every=30, probe_timeout=3, probe_slow=2, request_timeout=2
    )
    poller = HealthPoller(engine.url, KEY, settings)
    await engine.start()
    await poller.start()
    try:
        await until(poller, lambda s: s.ready, what="ready")
        probes = engine.probes
        await engine.stop()
        await until(poller, lambda s: s.state is EngineState.DOWN, what="down")
        engine.probe = "error"
        await engine.start()
        st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="probe fails after restart")
        assert "test generation failed" in st.text("en") and engine.probes > probes
    finally:
        await poller.stop()

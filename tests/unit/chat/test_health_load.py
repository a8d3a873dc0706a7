"""The queue, visible (issue #20): the shared poller reads vLLM's own request gauges (``GET /metrics``) at each
poll, a fleet's replicas summed, and the status line says "busy · 8 running, 3 waiting" while requests wait."""

from __future__ import annotations

import pytest
import pytest_asyncio

from backend import settings as settings_mod
from backend.chat import health
from backend.chat.health import EngineLoad, HealthPoller, parse_load
from backend.chat.service import Service
from backend.settings import Settings
from tests.fakes.vllm_server import FakeEngine
from tests.unit.chat.test_health import FAST, KEY, until

pytestmark = pytest.mark.asyncio

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 8.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0
vllm:num_requests_running_total 1.0
"""


async def test_parse_load_reads_both_gauges_summed_over_label_sets_and_nothing_else():
    assert parse_load(VLLM_METRICS) == EngineLoad(8, 3)
    two_names = VLLM_METRICS + 'vllm:num_requests_waiting{engine="0",model_name="pirate"} 2.0\n'
    assert parse_load(two_names) == EngineLoad(8, 5)
    assert parse_load("vllm:num_requests_running 1\nvllm:num_requests_waiting 0e0\n") == EngineLoad(1, 0)
    assert parse_load("# HELP x\nprocess_cpu_seconds_total 3.0\n") is None  # not a vLLM: unknown, not 0
    assert parse_load("vllm:num_requests_waiting NaN\n") is None
    assert parse_load("") is None


@pytest_asyncio.fixture
async def engine():
    e = FakeEngine(api_key=KEY)
    await e.start()
    yield e
    await e.stop()


async def test_the_poller_reads_the_load_with_the_key_and_publishes_each_change(engine):
    engine.running, engine.waiting = 8, 3
    poller = HealthPoller(engine.url, KEY, FAST)
    sub = poller.subscribe()
    try:
        await poller.start()
        status = await until(poller, lambda s: s.load == EngineLoad(8, 3), what="the load read")
        assert status.load_text() == "busy · 8 running, 3 waiting"
        assert status.load_text("zh-CN") == "繁忙 · 8 个生成中，3 个排队"
        assert ("/metrics", f"Bearer {KEY}") in engine.seen
        engine.running, engine.waiting = 2, 0  # nothing waits: nothing said
        status = await until(poller, lambda s: s.load == EngineLoad(2, 0), what="the queue emptied")
        assert status.load_text() == ""
        seen = []
        while not sub._queue.empty():
            item = sub._queue.get_nowait()
            if item is not None:
                seen.append(item.load)
        assert EngineLoad(8, 3) in seen and EngineLoad(2, 0) in seen  # subscribers (the wait steps) see both
        engine.metrics = False  # a server without the gauges: unknown
        await until(poller, lambda s: s.load is None, what="the load unknown")
    finally:
        await sub.aclose()
        await poller.stop()


async def test_a_server_without_metrics_is_not_asked_at_every_poll(engine):
    """An external server that is no vLLM answers /metrics with 404: asked once, then again only after
    METRICS_RETRY_S (it used to be asked at every poll: one wasted request per poll, for good)."""
    engine.metrics = False
    poller = HealthPoller(engine.url, KEY, FAST)
    try:
        await poller.start()
        await until(poller, lambda s: s.state is health.EngineState.READY, what="ready")
        polls = poller._poll_seq
        await until(poller, lambda s: poller._poll_seq >= polls + 10, what="ten more polls")
        asked = [path for path, _ in engine.seen if path == "/metrics"]
        assert len(asked) == 1, f"/metrics asked {len(asked)} times in {poller._poll_seq} polls"
        assert poller.status.load is None
        engine.metrics, engine.running, engine.waiting = True, 4, 1  # became a vLLM behind the same URL
        poller.load_gauges.no_metrics_until = {
            root: 0.0 for root in poller.load_gauges.no_metrics_until
        }  # its minute is over
        await until(poller, lambda s: s.load == EngineLoad(4, 1), what="the load read once it is there")
    finally:
        await poller.stop()


async def test_a_fleet_sums_its_replicas_load_and_asks_them_not_the_router():
    router, replicas = FakeEngine(api_key=KEY), [FakeEngine(api_key=KEY) for _ in range(2)]
    for e in (router, *replicas):
        await e.start()
    router.running, router.waiting = 100, 100  # vllm-router's own /metrics is not vLLM's: never read
    replicas[0].running, replicas[0].waiting = 5, 1
    replicas[1].running, replicas[1].waiting = 3, 2
    poller = HealthPoller(router.url, KEY, FAST, replicas=[r.url for r in replicas])
    try:
        await poller.start()
        status = await until(poller, lambda s: s.load is not None, what="the load read")
        assert status.load == EngineLoad(8, 3) and status.load_text() == "busy · 8 running, 3 waiting"
        assert not [p for p, _ in router.seen if p == "/metrics"]
        await replicas[1].stop()  # a replica gone: the others' load
        await until(poller, lambda s: s.load == EngineLoad(5, 1), what="one replica's load")
    finally:
        await poller.stop()
        for e in (router, *replicas):
            await e.stop()


async def test_the_status_line_json_carries_the_load_in_the_viewers_language(engine):
    engine.running, engine.waiting = 8, 3
    await health.reset_shared()
    service = Service(settings_mod.replace(Settings(), base_url=engine.url, api_key=KEY), health=FAST)
    try:
        await service.start()
        await until(service.poller, lambda s: s.ready and s.load is not None, what="ready with its load")
        body, zh = service.status_json(), service.status_json("zh-CN")
    finally:
        await health.reset_shared()
        if service._warm is not None:
            service._warm.cancel()
    assert (body["running"], body["waiting"], body["load_text"]) == (8, 3, "busy · 8 running, 3 waiting")
    assert zh["load_text"] == "繁忙 · 8 个生成中，3 个排队"

"""The shared health poller in front of a fleet: the router (one fake engine) plus each replica's own /health
(more fake engines, stopped and restarted mid-test)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import pytest_asyncio

from backend import settings as settings_mod
from backend.chat import health
from backend.chat.health import EngineState, HealthPoller
from backend.chat.service import Service
from backend.settings import FleetSettings, Settings
from backend.text import Text, t
from tests.fakes.vllm_server import FakeEngine, adapter
from tests.unit.chat.test_health import FAST, KEY, until


@pytest_asyncio.fixture
async def fleet():
    """(router, [replica 1, 2, 3]), all listening."""
    router = FakeEngine(api_key=KEY)
    replicas = [FakeEngine(api_key=KEY) for _ in range(3)]
    for e in (router, *replicas):
        await e.start()
    yield router, replicas
    for e in (router, *replicas):
        await e.stop()


@pytest_asyncio.fixture
async def poller(fleet):
    router, replicas = fleet
    p = HealthPoller(router.url, KEY, FAST, replicas=[r.url for r in replicas])
    yield p
    await p.stop()


def addr(engine: FakeEngine) -> str:
    return f"127.0.0.1:{engine.port}"


@pytest.mark.asyncio
async def test_all_replicas_ready_is_ready_with_the_count_and_each_replica_polled_directly_with_the_key(fleet, poller):
    router, replicas = fleet
    await poller.start()
    st = await until(poller, lambda s: s.ready and s.replicas_ready == 3, what="ready, 3 replicas")
    assert st.replicas_total == 3 and st.text("en") == "the model is ready"
    assert st.replicas_text("en") == "3 of 3 replicas ready" and st.replicas_text("zh") == "3 个副本中 3 个就绪"
    assert [(r.number, r.address, r.ready) for r in st.replicas] == [
        (i + 1, addr(e), True) for i, e in enumerate(replicas)
    ]
    for r in replicas:  # /health, /v1/models (and /metrics: the load) only on a replica (the probe goes through
        # the router), with the key
        assert r.seen and {p for p, _ in r.seen} - {"/metrics"} == {"/health", "/v1/models"}
        assert all(auth == f"Bearer {KEY}" for _, auth in r.seen)
        assert r.probes == 0
    assert router.probes >= 1


@pytest.mark.asyncio
async def test_one_replica_down_is_degraded_naming_it_and_ready_again_when_it_returns(fleet, poller, caplog):
    router, replicas = fleet
    caplog.set_level(logging.INFO, logger="backend.chat.health")
    await poller.start()
    await until(poller, lambda s: s.ready and s.replicas_ready == 3, what="all ready")

    await replicas[1].stop()  # kill replica 2
    st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="one replica down → degraded")
    assert st.answering  # messages still go: the router has the other two
    assert (st.replicas_ready, st.replicas_total) == (2, 3)
    assert st.text("en") == f"2 of 3 replicas ready; replica 2 ({addr(replicas[1])}): connection refused"
    assert st.text("zh-CN") == f"3 个副本中 2 个就绪；副本 2（{addr(replicas[1])}）：连接被拒绝"  # all in Chinese
    assert [r.ready for r in st.replicas] == [True, False, True]
    await asyncio.sleep(0.3)  # steady: logged once, not every poll
    down_logs = [r for r in caplog.records if "replica 2" in r.getMessage() and "not ready" in r.getMessage()]
    assert len(down_logs) == 1 and down_logs[0].levelno == logging.WARNING
    assert replicas[1].url.removesuffix("/v1") in down_logs[0].getMessage()  # the log names the whole URL

    await replicas[1].start()
    st = await until(poller, lambda s: s.ready, what="replica back → ready")
    assert st.replicas_ready == 3 and st.text("en") == "the model is ready"


@pytest.mark.asyncio
async def test_no_replica_ready_and_the_router_failing_is_down(fleet, poller):
    router, replicas = fleet
    await poller.start()
    await until(poller, lambda s: s.ready, what="ready")
    router.probe = "error"
    for r in replicas:
        await r.stop()
    st = await until(poller, lambda s: s.state is EngineState.DOWN, what="no replica → down")
    assert st.text("en").startswith("no replica is ready (0 of 3); replica 1 (") and st.replicas_ready == 0
    assert st.text("en").count("connection refused") == 3


@pytest.mark.asyncio
async def test_replicas_out_of_reach_while_the_router_answers_is_degraded_not_down(fleet, poller):
    """A remote fleet whose replicas this process cannot reach: the probe through the router still answers."""
    router, replicas = fleet
    for r in replicas:
        await r.stop()
    await poller.start()
    st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="degraded")
    await asyncio.sleep(0.3)
    st = poller.status
    assert st.state is EngineState.DEGRADED and st.answering  # steady, not flapping to DOWN between probes
    assert "the router answers, but this app reaches none of its 3 replicas directly" in st.text("en")


@pytest.mark.asyncio
async def test_a_replica_answering_503_is_not_ready_with_the_status_in_the_detail(fleet, poller):
    router, replicas = fleet
    replicas[0].health_status = 503
    await poller.start()
    st = await until(poller, lambda s: s.state is EngineState.DEGRADED, what="degraded")
    assert st.replicas[0].detail_in("en") == "HTTP 503" and "replica 1" in st.text("en") and "HTTP 503" in st.text("en")


@pytest.mark.asyncio
async def test_the_status_route_json_carries_the_counts_and_never_a_replica_url_or_its_credentials(fleet):
    router, replicas = fleet
    secret_urls = [r.url.replace("http://", "http://user:s3cret@") for r in replicas]
    settings = settings_mod.replace(
        Settings(), fleet=FleetSettings(remote=tuple(secret_urls)), base_url=router.url, api_key=KEY
    )
    await health.reset_shared()
    service = Service(settings, health=FAST)
    try:
        await service.start()
        await until(service.poller, lambda s: s.ready and s.replicas_ready == 3, what="ready")
        await replicas[2].stop()
        await until(service.poller, lambda s: s.replicas_ready == 2, what="one down")
        body = service.status_json()
    finally:
        await health.reset_shared()
        if service._warm is not None:
            service._warm.cancel()
    assert (body["replicas_ready"], body["replicas_total"]) == (2, 3)
    assert body["state"] == "degraded" and "2 of 3 replicas ready" in body["reason"]
    assert body["replicas_text"] == "2 of 3 replicas ready"
    assert body["replicas"][2] == {
        "replica": 3,
        "address": addr(replicas[2]),
        "ready": False,
        "detail": "connection refused",
        "attempt": None,  # a remote replica: no supervisor of ours to ask
        "cause": None,
    }
    text = repr(body)
    assert "s3cret" not in text and "user" not in text and KEY not in text and "/v1" not in text


@pytest.mark.asyncio
async def test_without_a_fleet_the_counts_are_zero_and_nothing_else_is_polled(fleet):
    router, replicas = fleet
    p = HealthPoller(router.url, KEY, FAST)
    try:
        await p.start()
        st = await until(p, lambda s: s.ready, what="ready")
    finally:
        await p.stop()
    assert (st.replicas_ready, st.replicas_total, st.replicas_text()) == (0, 0, "")
    assert all(not r.seen for r in replicas)


@pytest.mark.asyncio
async def test_the_routers_503_while_one_replica_is_down_is_degraded_not_down(fleet, poller):
    """vllm-router answers /health 503 as soon as one worker is unhealthy, and still routes to the others."""
    router, replicas = fleet
    await poller.start()
    await until(poller, lambda s: s.ready, what="ready")
    await replicas[0].stop()
    router.health_status = 503
    st = await until(poller, lambda s: s.replicas_ready == 2 and s.checked_at > 0, what="replica 1 down")
    await asyncio.sleep(0.3)
    st = poller.status
    assert st.state is EngineState.DEGRADED and st.answering, st
    assert st.text("en").startswith("2 of 3 replicas ready; replica 1 (")

    for r in replicas[1:]:  # all gone: the 503 is the engine being down
        await r.stop()
    router.probe = "error"
    st = await until(poller, lambda s: s.state is EngineState.DOWN, what="down")
    assert st.replicas_ready == 0


# ---------------------------------------------------------------- ready means routable (#20)


@pytest.mark.asyncio
async def test_a_router_answering_health_while_chat_through_it_fails_is_not_ready_until_a_request_routes(fleet, poller):
    """Issue #20: after a router restart the UI said "ready" while messages through the router still failed. Its
    /health 200 and every replica ready are not enough: the one-token probe through the router decides."""
    router, replicas = fleet
    await poller.start()
    await until(poller, lambda s: s.ready, what="ready")
    poller._life_started -= 3600  # the UI has been up for an hour
    await router.stop()
    router.probe = "error"  # restarted: /health 200, each replica ready, but chat through it fails (HTTP 500)
    await router.start()
    st = await until(poller, lambda s: s.state is EngineState.STARTING and s.replicas_ready == 3, what="not routable")
    assert not st.answering  # a message waits with the loading step instead of failing
    assert st.starting_elapsed < 600, st  # "starting" counts from when the router stopped routing, not an hour
    assert st.text("en").startswith("the router answers, but a test generation through it failed (HTTP 500: ")
    assert st.text("zh-CN").startswith("路由器有响应，但经由它的测试生成失败（HTTP 500: ")
    waiting = asyncio.create_task(poller.wait_until_ready(30))  # what a message sent now does (the loading step)
    probes = router.probes
    await until(poller, lambda s: router.probes >= probes + 3, what="probes on every poll")
    assert not poller.status.answering and not waiting.done()  # steady: never "ready" on /health alone

    router.probe = "ok"  # it routes now
    st = await asyncio.wait_for(waiting, 30)
    assert st.ready and st.text("en") == "the model is ready" and router.probes > probes


# ---------------------------------------------------------------- the model list: what every ready replica serves


def ids(status) -> list[str]:
    return [m.id for m in status.models]


@pytest.mark.asyncio
async def test_the_model_list_is_what_every_ready_replica_serves_with_lineage_and_the_smallest_max_model_len(
    fleet, poller
):
    router, replicas = fleet
    router.models = [{"id": "router-only", "object": "model"}]  # the router's list (one worker's) is not used
    for r in replicas:
        r.models.extend([adapter("pirate"), adapter("poet")])
    replicas[2].models[0] = {**replicas[2].models[0], "max_model_len": 4096}
    replicas[2].models.append(adapter("extra"))
    replicas[2].models.remove(adapter("poet"))
    await poller.start()
    st = await until(poller, lambda s: s.ready and "pirate" in ids(s), what="ready with the fleet's list")
    assert ids(st) == ["base-model", "pirate"]  # poet and extra: not on every replica
    assert st.base_model == "base-model" and st.max_model_len == 4096  # the smallest a replica states
    assert [m.parent for m in st.models] == [None, "base-model"]  # lineage from the replicas' own parent fields
    assert dict(st.partial_models) == {"poet": (3,), "extra": (1, 2)}
    assert all(p == "/health" for p, _ in router.seen if p != "/v1/chat/completions")  # never the router's list


@pytest.mark.asyncio
async def test_an_adapter_one_replica_lacks_is_not_offered_said_once_then_offered_when_it_serves_it(
    fleet, poller, caplog
):
    router, replicas = fleet
    caplog.set_level(logging.INFO, logger="backend.chat.health")
    for e in (router, *replicas):
        e.models.append(adapter("pirate"))
    await poller.start()
    st = await until(poller, lambda s: s.ready and "pirate" in ids(s), what="pirate offered")
    version = st.version
    updates: list = []

    async def watch():
        async for s in poller.subscribe():
            updates.append(s)

    watcher = asyncio.create_task(watch())
    try:
        replicas[1].models.remove(adapter("pirate"))  # e.g. replica 2 restarted without its runtime adapters
        st = await until(poller, lambda s: s.partial_models, what="pirate partial")
        assert ids(st) == ["base-model"] and st.adapters == () and st.version > version  # the picker drops it
        assert st.partial_models == (("pirate", (2,)),) and st.lacking("pirate") == (2,) and st.lacking("x") == ()
        assert st.ready  # the fleet still answers: nothing else changes
        where = f"replica 2 ({addr(replicas[1])})"
        assert st.partial_text("en") == f"pirate not offered: not served by {where}"
        assert st.partial_text("zh") == f"pirate 未提供：副本 2（{addr(replicas[1])}）未加载它"
        await asyncio.sleep(0.3)  # steady: said once, not every poll
        said = [r for r in caplog.records if "fleet: adapter 'pirate'" in r.getMessage()]
        assert [r.getMessage() for r in said] == [
            f"fleet: adapter 'pirate' is not served by {where}; it is not offered until every ready replica serves it"
        ]
        assert said[0].levelno == logging.WARNING
        assert any(s.partial_models == (("pirate", (2,)),) for s in updates)  # subscribers were told

        replicas[1].models.append(adapter("pirate"))  # loaded back on replica 2
        st = await until(poller, lambda s: "pirate" in ids(s), what="pirate offered again")
        assert st.partial_models == () and st.partial_text() == "" and st.ready
        assert any("served by every ready replica again" in r.getMessage() for r in caplog.records)
    finally:
        watcher.cancel()


@pytest.mark.asyncio
async def test_a_replica_down_is_left_out_of_the_list_and_the_others_decide(fleet, poller):
    router, replicas = fleet
    for r in replicas:
        r.models.append(adapter("pirate"))
    await poller.start()
    await until(poller, lambda s: s.ready and "pirate" in ids(s), what="pirate offered")
    await replicas[0].stop()  # its last list (with pirate) no longer counts
    replicas[2].models.remove(adapter("pirate"))
    st = await until(poller, lambda s: s.partial_models, what="pirate partial")
    assert st.partial_models == (("pirate", (3,)),)  # only replica 3 lacks it: replica 1 is down, not counted
    replicas[1].models.remove(adapter("pirate"))
    st = await until(poller, lambda s: not s.partial_models, what="gone from every ready replica")
    assert ids(st) == ["base-model"] and st.replicas_ready == 2
    # down replicas are not asked for a list; a ready one lacking it while a down one had it is not "partial"
    replicas[1].models.append(adapter("pirate"))
    replicas[2].models.append(adapter("pirate"))
    st = await until(poller, lambda s: "pirate" in ids(s), what="offered by the two ready replicas")
    assert st.partial_models == () and st.state is EngineState.DEGRADED  # one replica down: degraded, not partial


@pytest.mark.asyncio
async def test_no_replica_list_readable_falls_back_to_the_routers_list(fleet, poller):
    router, replicas = fleet
    router.models.append(adapter("pirate"))
    for r in replicas:
        r.models.append(adapter("poet"))
        r.api_key = "another-key"  # /health answers (no key check, as vLLM's); /v1/models refuses ours
    await poller.start()
    st = await until(poller, lambda s: s.ready and s.models, what="ready with a list")
    assert ids(st) == ["base-model", "pirate"] and st.partial_models == ()  # the router's, as without a fleet
    assert st.replicas_ready == 3


@pytest.mark.asyncio
async def test_the_routers_model_list_failing_while_replicas_answer_keeps_the_list(fleet, poller):
    """Right after a replica dies vllm-router's /v1/models fails until its health checker marks the worker."""
    router, replicas = fleet
    for e in (router, *replicas):
        e.models.append(adapter("pirate"))
    await poller.start()
    await until(poller, lambda s: s.ready and "pirate" in ids(s), what="ready")
    router.models_status = 503  # its /v1/models now fails
    await replicas[2].stop()
    st = await until(poller, lambda s: s.replicas_ready == 2, what="replica 3 down")
    await asyncio.sleep(0.3)
    st = poller.status
    assert ids(st) == ["base-model", "pirate"] and not st.models_stale
    assert st.state is EngineState.DEGRADED and st.text("en").startswith("2 of 3 replicas ready; replica 3 (")
    assert "model list" not in st.text("en")


@pytest.mark.asyncio
async def test_a_local_replica_restarting_is_named_with_its_supervisors_words_and_attempt(fleet, tmp_path):
    """The launcher's own replicas have status files next to the main one: a local replica that is down says what
    its supervisor says (restarting, attempt 1 of 5, why), not just "connection refused"; a remote one is polled
    over HTTP only."""
    from backend.contract import EngineStatus, SupervisorState, replica_status_file_name

    router, replicas = fleet
    main = tmp_path / "engine-status.json"
    EngineStatus(SupervisorState.RUNNING, pid=1, attempt=0).write(main)
    for i in range(2):
        EngineStatus(SupervisorState.RUNNING, pid=10 + i, attempt=0).write(tmp_path / replica_status_file_name(i))
    p = HealthPoller(router.url, KEY, FAST, main, replicas=[r.url for r in replicas], local_replicas=2)
    try:
        await p.start()
        st = await until(p, lambda s: s.ready and s.replicas_ready == 3, what="all ready")
        assert [(r.attempt, r.cause) for r in st.replicas] == [(0, ""), (0, ""), (None, "")]

        await replicas[1].stop()  # replica 2 killed; its supervisor restarts it
        reason = "the engine was killed (SIGKILL); if nobody killed it, the system may have run out of memory"
        restarting = EngineStatus(
            SupervisorState.RESTARTING,
            pid=11,
            attempt=1,
            max_attempts=5,
            cause="killed",
            reason=Text("supervisor.killed", {"signal": "SIGKILL"}),
        )
        restarting.write(tmp_path / replica_status_file_name(1))
        st = await until(p, lambda s: s.replicas_ready == 2 and s.replicas[1].attempt == 1, what="restarting")
        two = st.replicas[1]
        assert (two.ready, two.cause) == (False, "killed")
        detail = two.detail_in("en")
        assert "attempt 1 of 5" in detail and reason in detail and "connection refused" not in detail
        assert "attempt 1 of 5" in st.text("en") and f"replica 2 ({addr(replicas[1])})" in st.text("en")
        assert two.detail_in("zh-CN").startswith(t("supervisor.killed", "zh-CN", signal="SIGKILL"))  # in Chinese too

        await replicas[2].stop()  # replica 3 is remote: HTTP only
        st = await until(p, lambda s: s.replicas_ready == 1, what="remote down")
        assert st.replicas[2].detail_in("en") == "connection refused" and st.replicas[2].attempt is None

        await replicas[1].start()
        await replicas[2].start()
        EngineStatus(SupervisorState.RUNNING, pid=12, attempt=1, cause="killed").write(
            tmp_path / replica_status_file_name(1)
        )
        st = await until(p, lambda s: s.ready and s.replicas_ready == 3, what="back")
        assert (st.replicas[1].attempt, st.replicas[1].cause) == (1, "killed")  # the restart stays counted
    finally:
        await p.stop()


@pytest.mark.asyncio
async def test_a_local_replica_answering_before_its_supervisor_says_running_is_not_ready_yet(fleet, tmp_path):
    """Issue #28: a restarted replica answers /health before its supervisor's next check writes "running"; it counts
    as ready only then, as the router does (the status a test or a person reads never lags what the UI said)."""
    from backend.contract import EngineStatus, SupervisorState, replica_status_file_name

    router, replicas = fleet
    main = tmp_path / "engine-status.json"
    EngineStatus(SupervisorState.RUNNING, pid=1, attempt=0).write(main)
    EngineStatus(SupervisorState.RUNNING, pid=10, attempt=0).write(tmp_path / replica_status_file_name(0))
    EngineStatus(SupervisorState.RESTARTING, pid=12, attempt=1, max_attempts=5).write(
        tmp_path / replica_status_file_name(1)
    )
    p = HealthPoller(router.url, KEY, FAST, main, replicas=[r.url for r in replicas[:2]], local_replicas=2)
    try:
        await p.start()
        st = await until(p, lambda s: s.checked_at > 0 and s.replicas[0].ready, what="a first poll")
        for _ in range(3):  # replica 2 answers /health all along
            st = await p.refresh()
            assert [r.ready for r in st.replicas] == [True, False], st.replicas
            assert st.state is EngineState.DEGRADED and "attempt 1 of 5" in st.text("en")
        EngineStatus(SupervisorState.RUNNING, pid=12, attempt=1).write(tmp_path / replica_status_file_name(1))
        await until(p, lambda s: s.ready and s.replicas_ready == 2, what="ready once its supervisor says so")
    finally:
        await p.stop()

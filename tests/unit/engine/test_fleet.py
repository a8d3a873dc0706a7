"""The engine fleet, launcher side (issue #13 item 2): replica and router commands by construction, the dry run,
and the preflight of remote replicas against real local HTTP servers (the fault server and small aiohttp apps)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from backend.contract import ENV_ENGINE_API_KEY
from backend.errors import ConfigError, EngineStartFailed, FleetModelsDiffer, ReplicaKeyRefused, ReplicaNotOpenAI
from backend.launcher import command, fleet
from backend.settings import (
    ROOT,
    FleetSettings,
    LoraSettings,
    ModelSettings,
    NetworkSettings,
    Settings,
    VllmSettings,
    load_settings,
    replace,
)
from tests.conftest import free_port
from tests.fakes.openai_server import FakeServer
from tests.unit.engine.test_launch import fake_gpus, run

#: it runs `python -m backend serve` (refusals) and vllm-router (tests/support/marks.py)
pytestmark = pytest.mark.product


def argv_value(argv, flag):
    return argv[list(argv).index(flag) + 1]


def cpu_fleet(local: int = 2, **fleet_kw) -> Settings:
    return Settings(
        model=ModelSettings(path="/models/tiny", served_model_name="tiny"),
        network=NetworkSettings(engine_port=9100),
        vllm=VllmSettings(cpu_kvcache_gib=2),
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
    return Settings(
        model=base.model, vllm=base.vllm, network=base.network, lora=base.lora, fleet=FleetSettings(local=local)
    )


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
    assert text.startswith("config error: fleet.local = 2: expected fleet.local × [vllm] tensor_parallel_size")
    assert "(2 × 2 = 4 GPUs) within the 2 GPU(s) visible here" in text


def test_router_command_lists_replica_roots_uses_the_policy_and_gets_no_key():
    s = cpu_fleet(2, remote=("http://gpu-b:8000/v1",), policy="power_of_two")
    cmd = fleet.build_router_command(s, python="/env/bin/python", api_key="secret")
    argv = list(cmd.argv)
    assert argv[:3] == ["/env/bin/python", "-m", "backend.engine_plugins.router_gate"]  # vllm-router behind the key
    assert cmd.env[ENV_ENGINE_API_KEY] == "secret" and "secret" not in argv and "secret" not in cmd.render()
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
        QWENCHAT_NETWORK_ENGINE_PORT=str(port),
        QWENCHAT_VLLM_API_KEY="do-not-print-me",
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
    assert "[vllm] api_key" in exc.value.user_text("en")


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
            QWENCHAT_NETWORK_UI_PORT=str(free_port()),
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
        s = Settings(network=NetworkSettings(engine_port=port), fleet=FleetSettings(local=2))
        with pytest.raises(PortInUse) as exc:
            fleet.check_ports(s)
    assert f"port {port + 2} on 127.0.0.1 is already in use" in exc.value.user_text("en")
    assert "fleet replica 1 listens on [network].engine_port + 2" in exc.value.user_text("en")


def test_each_replica_and_the_router_get_their_own_supervisor_log_and_status_file(tmp_path):
    s = cpu_fleet(2)
    p = fleet.plan(s, engine="cpu", python="p", api_key="k", adapters={}, cpus=[0, 1], router_python="/r/python")
    f = fleet.build_fleet(s, p, api_key="k", log_dir=tmp_path, status_path=tmp_path / "engine-status.json")
    assert [r.name for r in f.replicas] == ["replica 0", "replica 1"]
    assert [r.health_url for r in f.replicas] == ["http://127.0.0.1:9101/health", "http://127.0.0.1:9102/health"]
    assert [r.status_path.name for r in f.replicas] == ["engine-status-replica-0.json", "engine-status-replica-1.json"]
    assert [r.log_path.name for r in f.replicas] == ["engine-replica-0.log", "engine-replica-1.log"]
    assert all(r.probe is not None and r.probe.base_url == s.replica_url(i) for i, r in enumerate(f.replicas))
    assert f.router.name == "router" and f.router.probe is None  # a hung replica is its own supervisor's to restart
    assert f.router.health_url == "http://127.0.0.1:9100/liveness"  # /health is 503 while any replica is down
    assert f.router.health_key == "k"  # the gate asks for the key on /liveness too
    assert f.router.status_path.name == "engine-status.json" and f.router.cmd is p.router


@pytest.mark.asyncio
async def test_a_launched_fleet_of_remote_replicas_only_is_checked_against_model_too():
    """No local replica, but the launcher starts the router and the UI: [model] is the model the UI expects (and
    counts tokens with), so a remote replica serving another is refused; in external mode the server's word wins."""
    async with FakeServer(model="qwen-b") as b:
        with pytest.raises(FleetModelsDiffer) as exc:
            await check(remote_fleet(b.base_url, model="qwen-a"))
        external = replace(remote_fleet(b.base_url, model="qwen-a"), base_url="http://router:8000/v1")
        assert await check(external) == []
    text = exc.value.user_text("en")
    assert "[model] (the model this UI expects and counts tokens with) serves 'qwen-a'" in text
    assert f"{b.base_url} serves 'qwen-b'" in text


# ---------------------------------------------------------------- a password in a remote URL (issue #18)

PASSWORD = "pw-never-shown-9f3"
SECRET_URL = f"http://alice:{PASSWORD}@gpu-b:8000/v1"


def test_a_password_in_a_remote_url_is_in_no_command_nor_dry_run_line():
    s = cpu_fleet(2, remote=(SECRET_URL,))
    p = fleet.plan(s, engine="cpu", python="/env/bin/python", api_key="k", adapters={}, cpus=[0, 1])
    for cmd in [*p.replicas, p.router]:
        assert not any(PASSWORD in a for a in cmd.argv), cmd.argv
        assert not any(PASSWORD in v for v in cmd.env.values())
    assert "http://gpu-b:8000" in p.router.argv  # the replica is still routed to, by its public root
    text = "\n".join(fleet.describe(s, p, "cpu"))
    assert PASSWORD not in text and "# remote replica http://gpu-b:8000/v1 " in text


def test_a_password_in_a_remote_url_is_neither_sent_nor_said_nor_logged_by_the_start_check(caplog):
    asked: list[str] = []

    def refused_connection(url: str, key: str, timeout: float) -> tuple[int, str, bytes]:
        asked.append(url)
        raise OSError(f"connection refused: {url}")  # what urllib's message would carry: the URL it was given

    caplog.set_level("DEBUG")
    warnings = fleet.check_remote(remote_fleet(SECRET_URL), "k", fetch=refused_connection)
    assert asked == ["http://gpu-b:8000/v1/models"]
    assert PASSWORD not in "\n".join(warnings) + caplog.text
    assert any("user:password in the URL of the replica http://gpu-b:8000/v1 is not used" in w for w in warnings)
    assert any("http://gpu-b:8000/v1 does not answer now" in w for w in warnings)


def test_dry_run_of_a_remote_replica_with_a_password_does_not_print_it(tmp_path):
    out = run(["serve", "--dry-run"], tmp_path, QWENCHAT_FLEET_LOCAL="1", QWENCHAT_FLEET_REMOTE=SECRET_URL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "http://gpu-b:8000" in out.stdout and PASSWORD not in out.stdout + out.stderr


# ---------------------------------------------------------------- the router's doors (issue #18), for real

KEY = "router-door-key"


class Recorder:
    """A worker that answers like vLLM (health, models, a chat) and records every request but /health."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        self.runner: web.AppRunner | None = None
        self.root = ""

    async def _any(self, request: web.Request) -> web.Response:
        if request.path == "/health":
            return web.Response(status=200)
        self.requests.append((request.method, request.path_qs, request.headers.get("Authorization", "")))
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "fake-qwen", "object": "model"}]})
        message = {"role": "assistant", "content": f"from {self.name}"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"id": "c", "object": "chat.completion", "model": "fake-qwen", "choices": [choice]})

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.root = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


#: Routes vllm-router 0.1.17 serves (its admin and OpenAI ones): the scrape of its binary must find at least these.
KNOWN_ROUTER_PATHS = frozenset(
    {"/add_worker", "/remove_worker", "/list_workers", "/flush_cache", "/health", "/v1/chat/completions", "/v1/models"}
)


def router_paths() -> list[str]:
    """Every path the router's binary may serve, read from the binary itself (its route literals sit side by side,
    so every run of /segments is cut into its pieces of 1 to 4 segments): a route a new release adds is probed
    without being listed here. ``{param}`` segments get a value."""
    import re

    import vllm_router_rs  # type: ignore[import-untyped]

    data = Path(vllm_router_rs.__file__).read_bytes()
    segment = rb"(?:[a-z][a-z0-9_]{2,}|v[0-9]|\{[a-z_]+\})"
    paths: set[str] = set()
    for run_ in set(re.findall(rb"(?:/" + segment + rb")+", data)):
        parts = run_.decode().split("/")[1:]
        for i in range(len(parts)):
            for j in range(i + 1, min(len(parts), i + 4) + 1):
                paths.add("/" + "/".join(re.sub(r"^\{.*\}$", "x", p) for p in parts[i:j]))
    return sorted(paths)


def ask(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers={"Content-Type": "application/json", **(headers or {})})
        return conn.getresponse().status
    finally:
        conn.close()


def ask_all(port: int, requests: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """(method, path) -> status, without any key, a few at a time."""
    import concurrent.futures
    import http.client
    import threading

    local = threading.local()

    def one(req: tuple[str, str]) -> int:
        if getattr(local, "conn", None) is None:
            local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            local.conn.request(req[0], req[1], body=b"{}", headers={"Content-Type": "application/json"})
            resp = local.conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            local.conn.close()
            local.conn = None
            return ask(port, *req, body=b"{}")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(zip(requests, pool.map(one, requests), strict=True))


async def start_router(tmp_path: Path, *remote: str) -> tuple[int, subprocess.Popen[bytes], fleet.Plan]:
    """The fleet's router as the launcher starts it (fleet.plan's command), in front of ``remote`` replicas."""
    from backend.launcher.supervisor import start_process
    from tests.support.ports import free_block

    port = free_block(2)  # the router's, its metrics'
    s = replace(remote_fleet(*remote), network=NetworkSettings(engine_port=port))
    p = fleet.plan(s, engine="cpu", python="unused", api_key=KEY, adapters={})
    proc = start_process(p.router, tmp_path / "router.log")
    for _ in range(600):  # it listens once a worker answers /health
        if proc.poll() is not None:
            pytest.fail(f"the router exited: {(tmp_path / 'router.log').read_text()[-2000:]}")
        try:
            await asyncio.to_thread(ask, port, "GET", "/liveness")
            return port, proc, p
        except OSError:
            await asyncio.sleep(0.1)
    pytest.fail("the router did not listen within 60 s")


def get_text(url: str) -> str:
    import urllib.request

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as resp:
        return resp.read().decode()


def workers(port: int) -> list[str]:
    import json
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/list_workers", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as resp:
        return list(json.loads(resp.read())["urls"])


@pytest.mark.asyncio
async def test_without_the_key_no_route_of_the_router_answers_and_nobody_changes_its_workers(tmp_path):
    """The real vllm-router as the fleet starts it: every path its binary names, with GET, POST and DELETE and no
    key, is refused (no 2xx/3xx); the worker-management routes, well formed, without the key, with a wrong one or
    with the key in the query, are 401; the worker list is the same after it all, and the attacker's worker got
    nothing. With the key, chat goes to the real worker (the key reaches it, and only it)."""
    from urllib.parse import quote

    from backend.launcher.supervisor import stop_process_group

    async with Recorder("replica") as real, Recorder("attacker") as evil:
        port, proc, _ = await start_router(tmp_path, real.root + "/v1")
        try:
            assert await asyncio.to_thread(workers, port) == [real.root]
            paths = router_paths()
            missed = KNOWN_ROUTER_PATHS - set(paths)
            assert not missed, f"the scrape of the router's binary missed {sorted(missed)}: the probes prove nothing"
            probes = [(m, path) for path in paths for m in ("GET", "POST", "DELETE")]
            answered = await asyncio.to_thread(ask_all, port, probes)
            opened = {req: code for req, code in answered.items() if code < 400}
            assert not opened, f"{len(opened)} of {len(probes)} keyless requests not refused: {sorted(opened)[:20]}"
            print(f"\n[router] {len(probes)} keyless requests ({len(probes) // 3} paths from the binary), all refused")

            admin = [
                ("POST", f"/add_worker?url={quote(evil.root)}", b""),
                ("POST", f"/remove_worker?url={quote(real.root)}", b""),
                ("GET", "/list_workers", b""),
                ("POST", "/flush_cache", b""),
                ("GET", "/get_loads", b""),
                ("GET", "/scheduling/diagnostics", b""),
                ("POST", "/finish_session?session_id=s", b""),
                ("POST", "/workers", f'{{"url": "{evil.root}"}}'.encode()),
                ("GET", "/workers", b""),
                ("GET", f"/workers/{quote(real.root, safe='')}", b""),
                ("DELETE", f"/workers/{quote(real.root, safe='')}", b""),
                ("GET", "/liveness", b""),
                ("GET", "/metrics", b""),
            ]
            for method, path, body in admin:
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                    code = await asyncio.to_thread(ask, port, method, path, headers, body)
                    assert code == 401, (method, path, headers, code)
                sep = "&" if "?" in path else "?"
                code = await asyncio.to_thread(ask, port, method, f"{path}{sep}api_key={KEY}", {}, body)
                assert code == 401, (method, path, "key in the query", code)
            assert await asyncio.to_thread(workers, port) == [real.root]  # unchanged

            chat = b'{"model": "fake-qwen", "messages": [{"role": "user", "content": "hi"}]}'
            code = await asyncio.to_thread(
                ask, port, "POST", "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}, chat
            )
            assert code == 200
            assert ("POST", "/v1/chat/completions", f"Bearer {KEY}") in real.requests
            assert evil.requests == []
        finally:
            stop_process_group(proc, grace=5)


@pytest.mark.asyncio
async def test_the_router_started_with_a_password_in_a_remote_url_shows_it_nowhere(tmp_path):
    """ps (its command line), its log and its metrics port: the password of a remote replica's URL is in none."""
    from backend.launcher.supervisor import stop_process_group

    async with Recorder("replica") as real:
        secret = real.root.replace("http://", f"http://alice:{PASSWORD}@") + "/v1"
        port, proc, p = await start_router(tmp_path, secret)
        try:
            assert await asyncio.to_thread(workers, port) == [real.root]
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
            metrics = await asyncio.to_thread(get_text, f"http://127.0.0.1:{port + 1}/metrics")  # no local replica
        finally:
            stop_process_group(proc, grace=5)
    assert real.root in cmdline and PASSWORD not in cmdline
    assert PASSWORD not in (tmp_path / "router.log").read_text()
    assert real.root in metrics and PASSWORD not in metrics  # the router names its workers there

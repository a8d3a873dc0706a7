"""`python -m backend merge` with the engine env: the merged model answers exactly like base + adapter, and bad
input is refused. What needs no model and no engine env is in tests/unit/engine/test_merge.py.

Runs in the app env (no torch). Model building, merging and the equivalence check run with the engine
env's python ($QWENCHAT_ENGINE_PYTHON, set by test.sh) in subprocesses, on the tiny random Qwen3
(real Qwen tokenizer) and a random non-zero LoRA built fresh for this session.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from backend.adapters.doctor import diagnose_adapter
from backend.tools import merge
from tests.conftest import need_env

pytestmark = [pytest.mark.integration, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # one subprocess; each takes 4-10 s here

# Runs in the engine env: base + PeftModel (unmerged) vs the merged folder, float32, same chat prompt.
EQUIVALENCE_SCRIPT = r"""
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base, adapter, merged = sys.argv[1:4]
torch.set_grad_enabled(False)
messages = [{"role": "user", "content": "What is the capital of France?"}]

def prompt_ids(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False, return_tensors="pt").input_ids

def load(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

def greedy(model, ids, n=10):
    for _ in range(n):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids

ids = prompt_ids(merged)
peft = PeftModel.from_pretrained(load(base), adapter).eval()
adapter_seq = greedy(peft, ids)
adapter_logits = peft(adapter_seq).logits
with peft.disable_adapter():
    base_seq = greedy(peft, ids)
    base_logits = peft(adapter_seq).logits
merged_model = load(merged)
merged_seq = greedy(merged_model, ids)
merged_logits = merged_model(adapter_seq).logits
n = ids.shape[1]
print(json.dumps({
    "prompt_len": n,
    "same_prompt_ids_as_base_tokenizer": prompt_ids(base).tolist() == ids.tolist(),
    "base_tokens": base_seq[0, n:].tolist(),
    "adapter_tokens": adapter_seq[0, n:].tolist(),
    "merged_tokens": merged_seq[0, n:].tolist(),
    "merged_vs_adapter": (merged_logits - adapter_logits).abs().max().item(),
    "adapter_vs_base": (adapter_logits - base_logits).abs().max().item(),
}))
"""


@dataclass(frozen=True)
class Tiny:
    base: Path
    adapter: Path


@dataclass(frozen=True)
class Merged:
    out: Path
    proc: subprocess.CompletedProcess


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def header(path: Path) -> dict:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}


def weights_header(folder: Path) -> dict:
    out: dict = {}
    for st in sorted(folder.glob("*.safetensors")):
        out.update(header(st))
    return out


def merge_argv(tiny: Tiny, out: Path, *extra: str) -> list[str]:
    return ["--base", str(tiny.base), "--adapter", str(tiny.adapter), "--out", str(out), *extra]


@pytest.fixture(scope="session")
def engine_python() -> str:
    return need_env("QWENCHAT_ENGINE_PYTHON")


@pytest.fixture(scope="session")
def tiny(test_models, tmp_path_factory) -> Tiny:
    """A copy of the test models ./test.sh built (built once per run, not again here): no test can touch theirs."""
    root = tmp_path_factory.mktemp("merge-models")
    for name in ("tiny-qwen3", "tiny-qwen3-lora"):
        shutil.copytree(test_models / name, root / name)
    return Tiny(root / "tiny-qwen3", root / "tiny-qwen3-lora")


@pytest.fixture(scope="session")
def merged_f32(engine_python, tiny, tmp_path_factory) -> Merged:
    """Merged in float32 by the engine env's python directly."""
    out = tmp_path_factory.mktemp("merged") / "tiny-merged-f32"
    return Merged(out, run([engine_python, "-m", "backend", "merge", *merge_argv(tiny, out, "--dtype", "float32")]))


@pytest.fixture(scope="session")
def merged_auto(engine_python, tiny, tmp_path_factory) -> Merged:
    """Merged from the app env's python (re-executes in the engine env), over a non-empty --out with --force."""
    out = tmp_path_factory.mktemp("merged-auto") / "tiny-merged"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")
    env_python = sys.executable
    return Merged(out, run([env_python, "-m", "backend", "merge", *merge_argv(tiny, out, "--force")]))


@pytest.fixture(scope="session")
def equivalence(engine_python, tiny, merged_f32) -> dict:
    assert merged_f32.proc.returncode == 0, merged_f32.proc.stderr
    proc = run([engine_python, "-c", EQUIVALENCE_SCRIPT, str(tiny.base), str(tiny.adapter), str(merged_f32.out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the merge works


def test_merge_exits_0_with_progress_and_how_to_serve(merged_f32):
    proc = merged_f32.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("loading base", "merging", "saving", "verifying", "merged model ready"):
        assert step in proc.stdout, f"no {step!r} progress line in:\n{proc.stdout}"
    assert f"QWENCHAT_MODEL_PATH={merged_f32.out} ./start.sh" in proc.stdout
    assert f"-m vllm.entrypoints.openai.api_server --model {merged_f32.out}" in proc.stdout


def test_merged_folder_has_config_tokenizer_and_weights_without_lora_keys(merged_f32, tiny):
    out = merged_f32.out
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert not (out / "adapter_config.json").exists()  # else vLLM takes the folder for an adapter
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        assert (out / name).read_bytes() == (tiny.base / name).read_bytes(), name
    template = json.loads((out / "tokenizer_config.json").read_text()).get("chat_template")
    assert template and template == json.loads((tiny.base / "tokenizer_config.json").read_text())["chat_template"]
    merged, base = weights_header(out), weights_header(tiny.base)
    assert merged, "no *.safetensors in the merged folder"
    assert [k for k in merged if "lora_" in k] == []
    assert {k: v["shape"] for k, v in merged.items()} == {k: v["shape"] for k, v in base.items()}
    assert {v["dtype"] for v in merged.values()} == {"F32"}  # --dtype float32 (the base is BF16)
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")], "temp folder left behind"


def test_merged_model_output_equals_base_plus_adapter(equivalence):
    e = equivalence
    # The adapter must change the base's output, else equality below proves nothing.
    assert e["adapter_vs_base"] > 0.1 and e["adapter_tokens"] != e["base_tokens"], e
    assert e["merged_tokens"] == e["adapter_tokens"], e
    assert e["merged_vs_adapter"] < 1e-3, e
    assert len(e["merged_tokens"]) == 10 and e["same_prompt_ids_as_base_tokenizer"], e


def test_merge_from_app_env_runs_in_engine_env_keeps_base_dtype_and_replaces_out_with_force(merged_auto):
    proc, out = merged_auto.proc, merged_auto.out
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if not merge.have_torch():  # the app env: the command must have re-run itself with the engine python
        assert "merging with the engine env" in proc.stdout
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    merged = weights_header(out)
    assert {v["dtype"] for v in merged.values()} == {"BF16"} and not [k for k in merged if "lora_" in k]
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name], "temp or old folder left behind"


def test_failed_merge_leaves_nothing_behind(engine_python, tiny, tmp_path):
    # Header intact (the doctor passes), tensor data cut off: PEFT fails while loading it.
    adapter = tmp_path / "truncated-lora"
    shutil.copytree(tiny.adapter, adapter)
    st = adapter / "adapter_model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    out = tmp_path / "out" / "merged"
    proc = run(
        [
            engine_python,
            "-m",
            "backend",
            "merge",
            "--base",
            str(tiny.base),
            "--adapter",
            str(adapter),
            "--out",
            str(out),
        ]
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "merge failed" in proc.stderr and str(out) in proc.stderr
    assert not out.exists()
    assert list(out.parent.iterdir()) == [], "half-written temp folder left behind"


# ---------------------------------------------------------------- refused before any heavy work


def _rename_lora_a(folder: Path) -> None:
    st = folder / "adapter_model.safetensors"
    tensors = load_file(str(st))
    save_file({k.replace(".lora_A.weight", ".lora_down.weight"): v for k, v in tensors.items()}, str(st))


@pytest.mark.parametrize("breakage", ["no adapter_config.json", "renamed lora_A keys"])
def test_adapter_with_doctor_errors_is_refused_with_the_doctors_text(tiny, tmp_path, capsys, breakage):
    adapter = tmp_path / "broken-lora"
    shutil.copytree(tiny.adapter, adapter)
    if breakage == "no adapter_config.json":
        (adapter / "adapter_config.json").unlink()
    else:
        _rename_lora_a(adapter)
    out = tmp_path / "merged"
    rc = merge.merge_main(["--base", str(tiny.base), "--adapter", str(adapter), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    errors = diagnose_adapter(adapter, tiny.base, max_rank=512).errors
    assert errors
    for finding in errors:
        assert finding.message in err
    assert f"--adapter {adapter}" in err and not out.exists()


def test_missing_base_is_refused_naming_the_path(tiny, tmp_path, capsys):
    base = tmp_path / "no-such-model"
    rc = merge.merge_main(["--base", str(base), "--adapter", str(tiny.adapter), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"--base {base} does not exist" in err
    assert not (tmp_path / "m").exists()


def test_non_empty_out_is_refused_without_force(tiny, tmp_path, capsys):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc = merge.merge_main(merge_argv(tiny, out))
    err = capsys.readouterr().err
    assert rc == 1
    assert f"--out {out} already exists and is not empty" in err and "--force" in err
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("target", ["base", "adapter", "parent of base"])
def test_out_that_would_overwrite_the_inputs_is_refused_even_with_force(tiny, capsys, target):
    out = {"base": tiny.base, "adapter": tiny.adapter, "parent of base": tiny.base.parent}[target]
    before = sorted(p.name for p in out.iterdir())
    rc = merge.merge_main(merge_argv(tiny, out, "--force"))
    assert rc == 1
    assert "would overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before


def test_without_torch_and_without_engine_python_says_which_python_to_use(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(merge, "have_torch", lambda: False)
    monkeypatch.delenv("QWENCHAT_ENGINE_PYTHON", raising=False)
    monkeypatch.delenv("QWENCHAT_MERGE_CHILD", raising=False)
    rc = merge.merge_main(merge_argv(tiny, tmp_path / "m"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "needs torch and peft" in err and "engine environment's python" in err and "-m backend merge" in err
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- free disk space


def test_disk_estimate_scales_with_dtype_and_counts_the_tokenizer(tiny):
    weights = (tiny.base / "model.safetensors").stat().st_size  # stored as BF16
    tokenizer = sum(p.stat().st_size for p in merge.tokenizer_files(tiny.base))
    assert tokenizer > 10**6  # tokenizer.json, vocab.json, merges.txt
    assert merge.estimate_output_bytes(tiny.base, "auto") == pytest.approx(weights * 1.1 + tokenizer, abs=2)
    assert merge.estimate_output_bytes(tiny.base, "bfloat16") == merge.estimate_output_bytes(tiny.base, "auto")
    assert merge.estimate_output_bytes(tiny.base, "float32") == pytest.approx(2 * weights * 1.1 + tokenizer, abs=4)


def test_too_little_disk_refuses_before_merging(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(merge, "_free_bytes", lambda path: 1000)
    rc = merge.merge_main(merge_argv(tiny, tmp_path / "m"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "not enough free disk space" in err and "1000 bytes" in err
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- what the doctor flags only for vLLM


def test_vllm_only_doctor_errors_do_not_block_a_merge(tiny, tmp_path):
    # DoRA is an error for serving (vLLM cannot) but exactly what merging is for; the doctor says so.
    adapter = tmp_path / "dora-lora"
    shutil.copytree(tiny.adapter, adapter)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    assert "dora" in diagnose_adapter(adapter, tiny.base, max_rank=512).codes
    plan = merge.preflight(tiny.base, adapter, tmp_path / "m")
    assert plan.diagnosis.errors and {f.code for f in plan.diagnosis.errors} <= merge.MERGE_FIXES

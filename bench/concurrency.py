"""P4 concurrency: N chat sessions streaming at once through Chainlit's real socket protocol (no browser).

    python -m bench.concurrency [--sessions 200] [--turns 2] [--tokens 64] [--rate 50] [--stream-interval 4]
                                [--profile] [--no-plain]

The product runs as start.sh runs it (`python -m backend serve`, external mode) against the fault-injecting
fake OpenAI server in this process (loopback only); every session (tests/support/socket_client.py) connects,
waits for its chat to open, then all send their messages at the same moment and stream the answers
(``--tokens`` tokens at ``--rate`` tokens/s each, in chunks of ``--stream-interval`` tokens after the first as
vLLM sends them under the launcher's ``--stream-interval``: 4 on a GPU, the meeting room of issue #20). Inside the
app process backend/web/loopstats.py samples the event-loop lag (QWENCHAT_LOOPSTATS); the window of the load is diffed from its snapshots. Printed: a table
(errors, lag p50/p99/max, first token and total time p50/p99, RSS before/after/peak) and a one-line summary.
The plain Chainlit streaming example (bench/plain_chainlit_app.py, with the same sampler) runs the same load
for comparison when it exists. ``--profile``: one more round with cProfile on the app's event loop (SIGUSR1),
its top entries printed. Bounded: every wait has a timeout; the whole run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.launcher import command
from backend.settings import ROOT
from backend.web import loopstats
from tests.e2e import support as e2e
from tests.fakes.openai_server import FakeServer, expected_text
from tests.support import live_app
from tests.support.socket_client import Session, Turn, percentile

TARGET_P99_MS = 20.0


@dataclass
class Round:
    app: str
    sessions: int
    turns: list[Turn]
    connect_errors: int
    expected: str
    lag: dict[str, float]
    rss_before_kb: int
    rss_after_kb: int
    peak_kb: int
    seconds: float
    uptime: str
    disconnects: int = 0  # sockets that closed under the load (the app's or the client's side)
    cpu_s: float = 0.0  # the app process's CPU time over the load (its own work, not inflated by others' load)

    @property
    def errors(self) -> int:
        bad = sum(1 for t in self.turns if not (t.answered and self.expected in t.answers[0]))
        return bad + self.connect_errors

    def row(self) -> str:
        first = [t.first_token_s * 1000 for t in self.turns if t.first_token_s is not None]
        total = [t.total_s for t in self.turns if t.total_s is not None]
        events = sum(t.token_events for t in self.turns)
        return (
            f"| {self.app} | {self.sessions} | {len(self.turns)} | {self.errors} | {self.disconnects} | "
            f"{self.lag['p50']:.1f} | "
            f"{self.lag['p99']:.1f} | {self.lag['max']:.0f} | {percentile(first, 50):.0f} | "
            f"{percentile(first, 99):.0f} | {percentile(total, 50):.2f} | {percentile(total, 99):.2f} | "
            f"{events} | {self.rss_before_kb / 1024:.0f} | {self.rss_after_kb / 1024:.0f} | "
            f"{self.peak_kb / 1024:.0f} | {1000 * self.cpu_s / max(1, len(self.turns)):.1f} | {self.uptime} |"
        )


HEADER = (
    "| app | sessions | answers | errors | disconnects | lag p50 ms | lag p99 ms | lag max ms | first token p50 ms | "
    "first token p99 ms | total p50 s | total p99 s | token events | RSS before MiB | RSS after MiB | "
    "peak MiB | app CPU ms per answer | load avg |\n|" + "---|" * 18
)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def connect_all(url: str, n: int, chat_start: bool) -> tuple[list[Session], int]:
    gate = asyncio.Semaphore(20)

    async def one() -> Session | None:
        async with gate:
            s = Session(url, chat_start=chat_start)
            try:
                return await s.connect(timeout=120)
            except (TimeoutError, OSError, Exception):  # noqa: BLE001 - a refused session is counted, not fatal
                with contextlib.suppress(Exception):
                    await s.close()
                return None

    made = await asyncio.gather(*(one() for _ in range(n)))
    ok = [s for s in made if s is not None]
    return ok, n - len(ok)


async def fresh_snapshot(path: Path, timeout: float = 30) -> dict[str, Any]:
    """The app's first loop-stats snapshot written from now on: the newest on disk can be seconds old on a loaded
    machine (its writer thread waits for a core), and a window between stale snapshots misses part of the load."""
    since = time.time()
    deadline = time.monotonic() + timeout
    while True:
        snap = loopstats.read(path)
        if float(snap.get("time", 0)) >= since or time.monotonic() > deadline:
            return snap
        await asyncio.sleep(0.05)


async def run_round(
    name: str, url: str, stats: Path, args: argparse.Namespace, *, chat_start: bool, profile: bool = False
) -> Round:
    sessions, refused = await connect_all(url, args.sessions, chat_start)
    spec = f"normal:tokens={args.tokens}:rate={args.rate}:interval={args.stream_interval}"
    try:
        await asyncio.sleep(1.0)  # let the chat starts settle; lag is measured for the load only
        before = await fresh_snapshot(stats)
        pid = int(before["pid"])
        if profile:
            os.kill(pid, signal.SIGUSR1)
        t0 = time.monotonic()
        turns: list[Turn] = []
        missed = 0  # turns not sent: the session was gone
        for k in range(args.turns):
            # A session whose socket closed, or whose last turn never ended, sends no more: its turns count as lost.
            live = [s for s in sessions if s.connected and (s.current is None or s.current.finished)]
            started = await asyncio.gather(*(s.start(f"bench turn {k} [[{spec}]]") for s in live))
            await asyncio.gather(*(s.wait(args.timeout) for s in live))
            turns.extend(started)
            missed += len(sessions) - len(live)
        seconds = time.monotonic() - t0
        after = await fresh_snapshot(stats)
        if profile:
            os.kill(pid, signal.SIGUSR1)
        uptime = load_average()
        disconnects = sum(s.disconnects for s in sessions)
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    return Round(
        app=name + (" (cProfile on)" if profile else ""),
        sessions=args.sessions,
        turns=turns,
        connect_errors=refused + missed,
        expected=expected_text(args.tokens).strip(),
        lag=loopstats.percentiles(loopstats.window(before, after)),
        rss_before_kb=int(before["rss_kb"]),
        rss_after_kb=int(after["rss_kb"]),
        peak_kb=int(after["peak_rss_kb"]),
        seconds=seconds,
        uptime=uptime,
        disconnects=disconnects,
        cpu_s=float(after.get("cpu_s", 0.0)) - float(before.get("cpu_s", 0.0)),
    )


def top_of_profile(path: Path, n: int = 15) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("tottime").print_stats(n)
    return out.getvalue()


def launch_plain(tmp: Path, base_url: str) -> tuple[subprocess.Popen[bytes], str]:
    """The plain example with the loop sampler (tests/support/live_app.py launches it as test_fidelity does)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {loopstats.ENV: str(tmp / "loop.json")}
    return live_app.launch_plain(tmp, base_url, "plain_with_loopstats.py", app_root=ROOT, env=env, timeout=60)


async def warm_up(url: str, chat_start: bool) -> None:
    """First-use costs (tokenizer, imports) are not part of the measured load."""
    async with Session(url, chat_start=chat_start) as s:
        turn = await s.send("warm-up [[normal:tokens=4]]", 60)
        if not turn.answered:
            raise RuntimeError(f"warm-up failed: {turn.summary()}")


async def main(args: argparse.Namespace) -> int:
    rounds: list[Round] = []
    profile_text = ""
    tmp = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    async with FakeServer() as srv:
        (tmp / "qwenchat").mkdir()
        # The sessions are one script without login: one "user" to [ui] max_answers_per_user (default 2), which
        # would refuse all but two of each round's answers. The load is many users': the limit off, as in tests/soak.
        app = await asyncio.to_thread(
            live_app.launch_external, tmp / "qwenchat", srv.base_url, {"QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0"}
        )
        try:
            await warm_up(app.url, True)
            stats = live_app.loop_file(app)
            rounds.append(await run_round("qwenchat", app.url, stats, args, chat_start=True))
            if args.profile:
                rounds.append(await run_round("qwenchat", app.url, stats, args, chat_start=True, profile=True))
                prof = stats.with_name(stats.name + ".prof")
                for _ in range(300):  # the app writes the file when the second signal arrives: whole, in a while
                    try:
                        profile_text = top_of_profile(prof)
                        break
                    except (OSError, EOFError, ValueError):
                        await asyncio.sleep(0.1)
            problems = live_app.problems(app)
        finally:
            await asyncio.to_thread(e2e.stop, app)
        plain = ROOT / "bench" / "plain_chainlit_app.py"
        if args.plain and plain.exists():
            (tmp / "plain").mkdir()
            proc, url = await asyncio.to_thread(launch_plain, tmp / "plain", srv.base_url)
            try:
                await warm_up(url, False)
                rounds.append(
                    await run_round("plain Chainlit example", url, tmp / "plain" / "loop.json", args, chat_start=False)
                )
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        elif args.plain:
            print("(no bench/plain_chainlit_app.py: the comparison with plain Chainlit is skipped)")
    print(
        f"\n{args.sessions} sessions x {args.turns} turns, {args.tokens} tokens at {args.rate} tok/s each "
        f"({args.stream_interval} a chunk after the first), "
        f"fake OpenAI server (loopback), {os.cpu_count()} CPUs; event-loop lag sampled every "
        f"{loopstats.INTERVAL * 1000:.0f} ms inside the app\n"
    )
    print(HEADER)
    for r in rounds:
        print(r.row())
    if profile_text:
        print("\ncProfile of the app's event loop under the same load (top by own time):\n" + profile_text)
    if problems:
        print(f"\n{len(problems)} tracebacks / unexpected failures in the app log, e.g.:\n{problems[0]}")
    main_round = rounds[0]
    clean = main_round.errors == 0 and main_round.disconnects == 0
    verdict = "PASS" if clean and main_round.lag["p99"] <= TARGET_P99_MS else "FAIL"
    plain_round = next((r for r in rounds if r.app.startswith("plain")), None)
    vs = f"; plain Chainlit p99 {plain_round.lag['p99']:.1f} ms ({plain_round.lag['n']:.0f})" if plain_round else ""
    print(
        f"\nsummary: {verdict}: {args.sessions} concurrent streaming sessions, {main_round.errors} errors, "
        f"{main_round.disconnects} disconnects, "
        f"event-loop lag p50 {main_round.lag['p50']:.1f} ms p99 {main_round.lag['p99']:.1f} ms "
        f"over {main_round.lag['n']:.0f} samples (target <= {TARGET_P99_MS:.0f}){vs}; RSS {main_round.rss_before_kb / 1024:.0f} -> "
        f"{main_round.rss_after_kb / 1024:.0f} MiB; load avg {main_round.uptime}"
    )
    return 0 if verdict == "PASS" else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.concurrency", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=2, help="messages per session (all sessions send at once)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    p.add_argument("--rate", type=float, default=50, help="tokens/s per answer (the fake server's pace)")
    p.add_argument(
        "--stream-interval",
        type=int,
        default=command.GPU_STREAM_INTERVAL,
        help="tokens per chunk after the first, as vLLM's --stream-interval (default: the product's on a GPU)",
    )
    p.add_argument("--timeout", type=float, default=180, help="seconds a turn may take before it counts as lost")
    p.add_argument("--profile", action="store_true", help="one more round with cProfile on the app's event loop")
    p.add_argument("--no-plain", dest="plain", action="store_false", help="skip the plain Chainlit comparison")
    args = p.parse_args(argv)
    if not 1 <= args.sessions <= 1000 or not 1 <= args.turns <= 50:
        p.error("--sessions must be 1..1000 and --turns 1..50 (a bounded load)")
    return args


def run(argv: list[str] | None = None) -> Any:
    return asyncio.run(main(parse(argv)))


if __name__ == "__main__":
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up, when run from the documented command alone
    sys.exit(run())

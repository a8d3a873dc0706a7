"""Fault soak: N sessions x M turns through Chainlit's socket protocol, 10 % of the requests faulted.

The product runs as start.sh runs it (`python -m backend serve`, external mode: the shared ``faults_app``) against
the shared fault-injecting server; each faulted turn picks a fault from the server's list (seeded: the same plan every
run). Short (CI): 20 x 5. Long (``QWENCHAT_SOAK=long``): 200 x 20.
Expected: no traceback or "unexpected failure" in the app log; every user message gets an answer or a clear
message back (none lost: the last request of each session carries all its user turns); every faulted turn
ends in an error message, an interrupted marker, or a whole answer (an anomaly the client tolerates); the
app's RSS grows by less than 10 % between the first and the last quarter of the run.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request

import pytest

from tests.fakes.openai_server import FAULTS, expected_text
from tests.support import live_app
from tests.support.socket_client import Session, Turn, percentile

pytestmark = [pytest.mark.soak, pytest.mark.product]

SEED = 20261130
SIZES = {"short": (20, 5), "long": (200, 20)}  # sessions, turns per session
DEADLINE = {"short": 120, "long": 1800}  # seconds for the whole run
FAULT_SHARE = 0.10
NORMAL_TOKENS = 16
NORMAL = f"normal:tokens={NORMAL_TOKENS}:rate=200"
FAULT_OPTS = f"stall=10:tokens={NORMAL_TOKENS}"  # a stall outlasts the client's timeouts (tests/conftest.py)
TURN_TIMEOUT = 60  # the longest fault (retries of a 503, a stall) ends within about ten seconds
NO_TEXT_FAULTS = {"tool-calls"}  # an answer without text by design of the fault (a tool call)
VISIBLE = {"answered", "error", "interrupted", "interrupted+error"}


def plan(sessions: int, turns: int) -> dict[tuple[int, int], str | None]:
    """(session, turn) -> the fault of that turn, or None; 10 % faulted, modes in a seeded shuffled cycle."""
    rng = random.Random(SEED)
    total = sessions * turns
    faulted = sorted(rng.sample(range(total), round(total * FAULT_SHARE)))
    modes = sorted(FAULTS)
    rng.shuffle(modes)
    out: dict[tuple[int, int], str | None] = {divmod(i, turns): None for i in range(total)}
    for k, i in enumerate(faulted):
        out[divmod(i, turns)] = modes[k % len(modes)]
    return out


def requests_seen(fake: str) -> list[dict]:
    """The chat requests the shared fake server got since its reset for this module (``GET /fake/requests``)."""
    with urllib.request.urlopen(fake + "/fake/requests", timeout=30) as resp:
        return list(json.loads(resp.read()))


def marker(s: int, t: int) -> str:
    return f"soak s{s} t{t} "


async def run_session(url: str, s: int, turns: int, faults: dict[tuple[int, int], str | None], gate) -> list[Turn]:
    async with gate:  # connect a few at a time, as tabs would open
        session = await Session(url).connect(timeout=60)
    try:
        out = []
        for t in range(turns):
            fault = faults[(s, t)]
            spec = NORMAL if fault is None else f"fault:{fault}:{FAULT_OPTS}"
            out.append(await session.send(f"{marker(s, t)}[[{spec}]]", TURN_TIMEOUT))
        return out
    finally:
        await session.close()


def check_turn(fault: str | None, turn: Turn) -> str | None:
    """What is wrong with this turn, if anything."""
    if not turn.finished or turn.disconnected:
        return f"no end of turn (disconnected={turn.disconnected})"
    if fault is None:
        if not (turn.answered and expected_text(NORMAL_TOKENS).strip() in turn.answers[0]):
            return "a normal turn without its whole answer"
        return None
    if turn.outcome not in VISIBLE:
        return f"faulted turn ended {turn.outcome!r}: nothing clear shown"
    whole = expected_text(NORMAL_TOKENS).strip() in turn.answers[0] if turn.answers else False
    if turn.outcome == "answered" and fault not in NO_TEXT_FAULTS and not whole:
        return "faulted turn 'answered' without the answer's text and without an error"
    return None


@pytest.mark.asyncio
async def test_sessions_x_turns_with_10_percent_faults(faults_app, fake_openai, soak_level):
    """On the shared faults product (tests/conftest.py: a stall is reported after 5 s, a first token waited for
    6 s)."""
    app = faults_app
    sessions, turns = SIZES[soak_level]
    faults = plan(sessions, turns)
    since = live_app.marks(app)
    async with Session(app.url) as warm:  # first-use costs (tokenizer, imports) before the measured run
        assert (await warm.send(f"warm-up [[{NORMAL}]]", 60)).answered
    sampler = live_app.RssSampler(app)
    sampling = asyncio.create_task(sampler.run())
    gate = asyncio.Semaphore(20)
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(DEADLINE[soak_level]):
            results = await asyncio.gather(*(run_session(app.url, s, turns, faults, gate) for s in range(sessions)))
        t1 = time.monotonic()
        await asyncio.sleep(0.5)  # a last RSS sample, and time for a late traceback to reach the log
    finally:
        sampling.cancel()
    final = live_app.snapshot(app)
    problems = live_app.problems(app, since)
    records = await asyncio.to_thread(requests_seen, fake_openai)

    wrong = []
    for s, session_turns in enumerate(results):
        for t, turn in enumerate(session_turns):
            why = check_turn(faults[(s, t)], turn)
            if why:
                wrong.append(f"s{s} t{t} fault={faults[(s, t)]}: {why}: {turn.summary()}")
    # no user turn lost: the newest request of each session carries every user turn of it, in order
    lost = []
    for s in range(sessions):
        last = [r for r in records if any(u.startswith(marker(s, turns - 1)) for u in r["user_starts"])]
        users = last[-1]["user_starts"] if last else []
        seen = [t for t in range(turns) for u in users if u.startswith(marker(s, t))]
        if seen != list(range(turns)):
            lost.append(f"s{s}: the last request carries turns {seen}, expected 0..{turns - 1}")
    rss_first, rss_last = sampler.quarters(t0, t1)
    outcomes: dict[str, int] = {}
    for session_turns in results:
        for turn in session_turns:
            outcomes[turn.outcome] = outcomes.get(turn.outcome, 0) + 1
    totals = [turn.total_s for st in results for turn in st if turn.total_s is not None]
    n_faulted = sum(1 for f in faults.values() if f)
    print(
        f"\n[soak] {soak_level}: {sessions} sessions x {turns} turns ({n_faulted} faulted, "
        f"{len({f for f in faults.values() if f})} modes) in {t1 - t0:.1f} s; outcomes {outcomes}; "
        f"turn time p50 {percentile(totals, 50):.2f} s p99 {percentile(totals, 99):.2f} s; "
        f"RSS first quarter {rss_first / 1024:.0f} MiB, last quarter {rss_last / 1024:.0f} MiB "
        f"({(rss_last / rss_first - 1) * 100:+.1f} %), peak {final['peak_rss_kb'] / 1024:.0f} MiB; "
        f"{len(records)} requests"
    )
    failures = []
    if problems:
        failures.append(f"{len(problems)} tracebacks / unexpected failures in the app log, e.g.:\n" + problems[0])
    if wrong:
        failures.append(f"{len(wrong)} of {sessions * turns} turns went wrong:\n" + "\n".join(wrong[:20]))
    if lost:
        failures.append("user turns lost:\n" + "\n".join(lost[:20]))
    if rss_last >= rss_first * 1.10:
        failures.append(f"RSS grew {rss_first:.0f} -> {rss_last:.0f} KiB (>= 10 %)")
    assert not failures, "\n\n".join(failures)

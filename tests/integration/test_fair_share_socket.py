"""Issue #20, fair share, over Chainlit's real socket protocol: the product launched as start.sh launches it (login
on, two accounts, history in SQLite) in external mode against the fake OpenAI server. A script signed in as one
user opens 100 sessions and sends in all of them at once: two answers stream, every other session gets one refusal
with its text quoted back, nothing of theirs is stored or sent to the model, and the other user's answer streams
meanwhile (its words per second alone and during the flood are printed, with -s)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.e2e.test_history import PASSWORD, USER
from tests.integration.test_message_ids import BOB, BOB_PW, history_db, step_rows, until
from tests.support.socket_client import Session, login_cookie

pytestmark = [pytest.mark.integration, pytest.mark.product, pytest.mark.asyncio]

SESSIONS = 100
LONG = "[[normal:tokens=200:rate=20]]"  # 10 s: the two admitted answers stream through the whole flood
BOBS = "[[normal:tokens=60:rate=20]]"  # 3 s
REFUSED_LOG = "fair share: 1 more answer(s) refused for user:demo"
REFUSED = "answers are still streaming, in this chat or another tab, and each user may have at most 2 at a time"


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai


def words_per_second(turn) -> float:
    words = sum(len(a.split()) for a in turn.answers)
    return words / max(1e-6, (turn.done_at or time.monotonic()) - (turn.first_token_at or turn.sent_at))


async def test_a_script_with_100_sessions_gets_two_answers_and_one_refusal_per_other_session(fake, socket_app):
    app, db = socket_app, history_db(socket_app)
    logged_before = app.log("ui").count(REFUSED_LOG)  # the shared product's log holds the modules' before
    sessions: list[Session] = []
    try:
        alice, bob_cookie = login_cookie(app.url, USER, PASSWORD), login_cookie(app.url, BOB, BOB_PW)
        async with Session(app.url, cookie=bob_cookie) as bob:
            alone = await bob.send(f"{BOBS} bob alone", timeout=60)
            assert alone.answered, alone.summary()
            for _ in range(0, SESSIONS, 20):  # the script's sessions, 20 connecting at a time
                batch = [Session(app.url, cookie=alice) for _ in range(20)]
                await asyncio.gather(*(s.connect(timeout=60) for s in batch))
                sessions += batch
            bob_turn = await bob.start(f"{BOBS} bob during the flood")
            turns = await asyncio.gather(*(s.start(f"{LONG} flood {i} ```x```") for i, s in enumerate(sessions)))
            await until(lambda: sum(1 for t in turns if t.errors) == SESSIONS - 2, 60, "98 refusals")
            streaming = [t for t in turns if not t.errors]
            assert len(streaming) == 2
            await until(lambda: all(t.first_token_at for t in streaming), 30, "the two answers streaming")
            for t in turns:
                if t.errors:
                    [error] = t.errors  # one clear message each
                    assert REFUSED in error and f"````text\n{t.text}\n````" in error, error
            await bob.wait(60)
            assert bob_turn.answered, bob_turn.summary()
            during = words_per_second(bob_turn)
            print(f"bob's words/s alone {words_per_second(alone):.1f}, during the flood {during:.1f}")
            assert not all(t.finished for t in streaming), "the admitted answers stream through the flood"
            await asyncio.gather(*(s.wait(60) for s in sessions if s.current in streaming))
            assert all(t.answered for t in streaming), [t.summary() for t in streaming]
        await asyncio.sleep(1)  # Chainlit stores steps from background tasks: give any write time to land
        stored = step_rows(db, 's."output" LIKE :t AND s."type" = :k', {"t": "%flood %", "k": "user_message"})
        assert sorted(r[3] for r in stored) == sorted(t.text for t in streaming)  # the refused: never stored
        assert len(flood_requests(fake)) == 2  # the refused never reached the model
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    ui_log = app.log("ui")
    assert "Traceback" not in ui_log, ui_log[-3000:]
    assert ui_log.count(REFUSED_LOG) - logged_before == SESSIONS - 2


def flood_requests(fake: str) -> list[dict]:
    """The chat requests the fake server got with the flood's answer spec (its JSON has no message texts)."""
    import json
    import urllib.request

    with urllib.request.urlopen(fake + "/fake/requests", timeout=10) as resp:
        return [r for r in json.loads(resp.read()) if "tokens=200" in str(r.get("spec"))]

"""An answer still streaming is in the history already, as a cut answer, until it ends (backend/ui/views.py,
FIRST_CHECKPOINT_S): a UI process that dies mid-answer (kill -9, the OOM killer) leaves its chat that cut answer, as
an engine that dies does, and not a question without an answer, which the model would answer in place of the next
message (seen in tests/e2e/test_recovery.py: a 2,048-token story written for "What is the capital of France?").

The product launched as start.sh launches it, login on, history in SQLite, over Chainlit's real socket protocol,
against the fake OpenAI server (its answers' pace set per message). The end-to-end UI kill is in test_recovery.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import text

from backend.storage import database
from backend.storage.history import META_KEY
from backend.ui import views
from tests.e2e.test_history import PASSWORD, USER
from tests.fakes.openai_server import expected_text
from tests.integration.test_message_ids import history_db, until
from tests.support.socket_client import Session, Turn, login_cookie

pytestmark = [pytest.mark.integration, pytest.mark.product]


TOKENS = 80
SLOW = f"[[normal:tokens={TOKENS}:rate=10]]"  # about 8 s of streaming: a checkpoint, then the end
MARK = "\n\n*⚠ "  # markdown.interrupted_marker's start


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


def stored(db: database.Database, step_id: str) -> tuple[str, dict] | None:
    """(output, our answer metadata) of the step ``step_id`` in the history, or None while it is not there."""
    query = text('SELECT "output", "metadata" FROM steps WHERE "id" = :i')
    rows = database.store(db).run(lambda c: c.execute(query, {"i": step_id}).all())
    if not rows:
        return None
    output, metadata = rows[0]
    meta = json.loads(metadata) if isinstance(metadata, str) else metadata
    return output, meta.get(META_KEY, {})


def answer_id(turn: Turn) -> str | None:
    ids = [i for i in turn.order if turn.steps[i].get("type") == "assistant_message"]
    return ids[-1] if ids else None


async def checkpointed(db: database.Database, turn: Turn) -> tuple[str, str, dict]:
    """(step id, output, metadata) of ``turn``'s answer once the history has it while it still streams."""
    await until(lambda: answer_id(turn) and turn.first_token_at is not None, 30, "the answer streaming")
    aid = answer_id(turn)
    assert aid is not None
    await until(lambda: stored(db, aid) is not None, views.FIRST_CHECKPOINT_S + 10, "the streaming answer stored")
    assert not turn.finished, "the answer ended before the history had it: nothing shows the checkpoint"
    found = stored(db, aid)
    assert found is not None
    return aid, *found


@pytest.mark.asyncio
async def test_a_streaming_answer_is_in_the_history_as_cut_until_its_end_or_stop_replaces_it(fake, socket_app):
    app, db = socket_app, history_db(socket_app)
    whole = expected_text(TOKENS)
    async with Session(app.url, cookie=login_cookie(app.url, USER, PASSWORD)) as s:
        # 1. It ends: the cut form while it streams, then the answer with its footer in the same step.
        turn = await s.start(f"{SLOW} a slow question")
        aid, output, meta = await checkpointed(db, turn)
        shown, _, marker = output.partition(MARK)
        assert marker.startswith("answer interrupted · `fake-qwen`"), output
        assert shown and whole.startswith(shown) and shown != whole, output  # the text so far, nothing else
        assert {k: meta[k] for k in ("raw", "model", "interrupted")} == {
            "raw": shown,
            "model": "fake-qwen",
            "interrupted": True,
        }
        assert meta["sig"]  # signed like any answer (datalayer.sign_answer)
        await s.wait(60)
        assert turn.answered, turn.summary()
        # Chainlit writes the final form from a background task: it lands a moment after the turn's end
        await until(lambda: MARK not in (stored(db, aid) or (MARK,))[0], 15, "the whole answer stored")
        final = stored(db, aid)
        assert final is not None and final[0].startswith(whole) and MARK not in final[0], final
        assert " tokens · " in final[0] and final[1]["interrupted"] is False and final[1]["raw"] == whole

        # 2. Stop: the stopped form replaces the checkpoint, whatever the timing of the two writes.
        cut = await s.start(f"{SLOW} another slow question")
        aid, output, _ = await checkpointed(db, cut)
        await s.sio.emit("stop")
        await s.wait(30)
        await until(lambda: "⚠ stopped" in (stored(db, aid) or ("",))[0], 15, "the stopped answer stored")
        await asyncio.sleep(views.FIRST_CHECKPOINT_S)  # a checkpoint that would land late has had its time
        stopped = stored(db, aid)
        assert stopped is not None and "⚠ stopped" in stopped[0] and "answer interrupted" not in stopped[0]
        assert stopped[1]["interrupted"] is True and whole.startswith(stopped[1]["raw"])
        assert len(stopped[1]["raw"]) >= len(output.partition(MARK)[0])  # the checkpoint's text, or more
    ui_log = app.log("ui")
    assert "Traceback" not in ui_log and "could not write the streaming answer" not in ui_log, ui_log[-3000:]

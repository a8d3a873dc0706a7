"""``[login] max_chats_per_account`` with the product launched as start.sh launches it (login on, history in SQLite),
over Chainlit's real socket protocol, against the fake OpenAI server (issue #29).

On the code before the cap the third chat was started and answered like the others."""

from __future__ import annotations

import json
import urllib.request

import pytest

from backend.storage import database
from tests.e2e import support as e2e
from tests.e2e.test_history import LOGIN, PASSWORD, USER
from tests.e2e.test_history import launch as launch_ready
from tests.integration.test_history_outage import ids, stored_within, thread_of, until
from tests.support.faults import Held
from tests.support.socket_client import Session, login_cookie

pytestmark = [pytest.mark.integration, pytest.mark.product]


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai


def delete_chat(app: e2e.LiveApp, cookie: str, thread_id: str) -> int:
    """The sidebar's delete: Chainlit's ``DELETE /project/thread``."""
    body = json.dumps({"threadId": thread_id}).encode()
    headers = {"Cookie": cookie, "Content-Type": "application/json"}
    req = urllib.request.Request(app.url + "/project/thread", data=body, headers=headers, method="DELETE")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(resp.status)


@pytest.mark.asyncio
async def test_at_the_cap_a_new_chat_is_refused_with_its_text_a_waiting_chat_counts_and_a_deleted_one_makes_room(
    fake, tmp_path
):
    app = launch_ready(fake, tmp_path, **LOGIN, QWENCHAT_LOGIN_MAX_CHATS_PER_ACCOUNT="2")
    path = tmp_path / "logs" / "history.sqlite3"
    lock: Held | None = None
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as first:
            kept = await first.send("the first chat")
            assert kept.answered, kept.summary()
            thread_id = thread_of(kept)
            await stored_within(database.sqlite_file(path), thread_id, ids(kept), 30, "the first chat stored")
            lock = Held(path)  # the second chat's writes wait in the outbox: it counts all the same
            async with Session(app.url, cookie=cookie) as second:
                waiting = await second.send("a chat whose writes wait")
                assert waiting.answered, waiting.summary()
            async with Session(app.url, cookie=cookie) as third:
                refused = await third.start("one chat too many, typed with care")
                said = await until(lambda: refused.errors, 30, "the third chat's message refused")
                assert "your account keeps 2 chats" in said[0] and "at most 2 per account" in said[0], said
                assert "Delete an old chat" in said[0] and "one chat too many, typed with care" in said[0], said
            goes_on = await first.send("an open chat goes on")  # the cap is on new chats only
            assert goes_on.answered, goes_on.summary()
            lock.release()
            lock = None
            assert delete_chat(app, cookie, thread_id) == 200
        async with Session(app.url, cookie=cookie) as fourth:
            room = await fourth.send("a new chat once one was deleted")
            assert room.answered, room.summary()
    finally:
        if lock is not None:
            lock.release()
        e2e.stop(app)

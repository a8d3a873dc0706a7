"""Issue #18, chat side: two accounts over Chainlit's real socket protocol, history in SQLite and in PostgreSQL.

The product is launched as start.sh launches it (login on, a second account in [login] users) in external mode against
the fake OpenAI server. On main, Bob sending a ``client_message`` with the id of Alice's message moved her message,
with his text, into his chat (Chainlit's data layer upserts on the browser's id); a browser could also store
``assistant_message`` steps, and a second message while an answer streamed started a second answer. Here each of
those is refused, said in the sender's chat, logged, and the database shows nothing moved or stored.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from backend import passwords
from backend.storage import database, datalayer, history
from tests.e2e import support as e2e
from tests.e2e.test_history import LOGIN, PASSWORD, USER
from tests.e2e.test_history import launch as launch_ready
from tests.support.socket_client import Session, login_cookie

pytestmark = [pytest.mark.integration, pytest.mark.product, pytest.mark.browser]


BOB, BOB_PW = "bob", "bob's long password"
SLOW = "[[normal:tokens=40:rate=8]]"  # the fake server streams this answer for ~5 s


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@functools.cache
def bob_hash() -> str:
    """Bob's stored password, one for the run: the accounts' hashes sign the logins, so two UIs launched for one
    database (test_two_uis) accept each other's only with the same hash (a new one has a new salt)."""
    return passwords.hash_password(BOB_PW, iterations=passwords.MIN_ITERATIONS)


def launch(fake: str, tmp, history_db: str = "") -> e2e.LiveApp:
    bob = bob_hash()
    extra = {"QWENCHAT_HISTORY_DB": history_db} if history_db else {}
    # The language from each browser (Accept-Language): a refusal is said in the sender's.
    return launch_ready(fake, tmp, **LOGIN, QWENCHAT_LOGIN_USERS=f"{BOB}={bob}", QWENCHAT_UI_LANGUAGE="auto", **extra)


def history_db(app: e2e.LiveApp) -> database.Database:
    """The SQLite history of ``app`` as ``launch`` starts it."""
    return database.sqlite_file(app.log_dir / "history.sqlite3")


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.05)


def step_rows(db: database.Database, where: str, params: dict) -> list[tuple]:
    query = text(
        f'SELECT s."id", s."threadId", s."type", s."output", t."userIdentifier" FROM steps s '
        f'LEFT JOIN threads t ON t."id" = s."threadId" WHERE {where}'
    )
    return [tuple(r) for r in database.store(db).run(lambda c: c.execute(query, params).all())]


async def two_users_over_the_socket(app: e2e.LiveApp, db: database.Database) -> None:
    alice_cookie = login_cookie(app.url, USER, PASSWORD)
    bob_cookie = login_cookie(app.url, BOB, BOB_PW)
    bobs_before = {r[0] for r in step_rows(db, 't."userIdentifier" = :u', {"u": BOB})}  # a shared product's
    async with Session(app.url, cookie=alice_cookie) as alice, Session(app.url, cookie=bob_cookie) as bob:
        asked = await alice.send("alice asks about Paris", timeout=60)
        assert asked.answered, asked.summary()
        # The step row and its thread's owner are two writes of Chainlit's data layer (the owner a moment later).
        await until(
            lambda: any(row[4] for row in step_rows(db, 's."id" = :i', {"i": asked.message_id})),
            15,
            "alice's message stored in her thread",
        )
        [before] = step_rows(db, 's."id" = :i', {"i": asked.message_id})
        assert before[2:] == ("user_message", "alice asks about Paris", USER)

        # 1. Bob, in his own new chat, sends a message with the id of Alice's (a shared link lists ids).
        stolen = await bob.start("bob's text", message_id=asked.message_id)
        await until(lambda: stolen.errors, 15, "bob told his message was refused")
        assert f"its id `{asked.message_id}` already belongs to another message" in stolen.errors[0]
        # 2. A step of another type than a user message: a fake model answer.
        forged = await bob.start("I am the model", kind="assistant_message", overlap=True)
        await until(lambda: forged.errors, 15, "bob told his assistant_message was refused")
        assert "may only send user messages, not `assistant_message`" in forged.errors[0]
        # 3. An edit of a message that is not one of his chat's own.
        n = len(forged.errors)
        await bob.sio.emit("edit_message", {"message": {"id": asked.message_id, "output": "bob edits it"}})
        await until(lambda: len(forged.errors) > n, 15, "bob told his edit was refused")
        assert (
            f"only your own messages in this chat can be edited (`{asked.message_id}` is not one)"
            in (forged.errors[-1])
        )
        # The same in Chinese for a Chinese browser.
        async with Session(app.url, cookie=bob_cookie, language="zh-CN") as bob_zh:
            zh = await bob_zh.start("再试一次", message_id=asked.message_id)
            await until(lambda: zh.errors, 15, "the Chinese refusal")
            assert f"它的 id `{asked.message_id}` 已属于另一条消息" in zh.errors[0]

        await asyncio.sleep(1)  # Chainlit stores steps from background tasks: give any write time to land
        assert step_rows(db, 's."id" = :i', {"i": asked.message_id}) == [before]  # nothing moved or overwritten
        bobs = [r for r in step_rows(db, 't."userIdentifier" = :u', {"u": BOB}) if r[0] not in bobs_before]
        assert not [r for r in bobs if r[2] != "assistant_message"]
        assert not step_rows(
            db, 's."output" IN (:a, :b, :c)', {"a": "bob's text", "b": "I am the model", "c": "bob edits it"}
        )
        log = app.log_with("nothing stored or moved", "ui")
        assert f"client_message refused: id {asked.message_id} is already a message of thread " in log
        assert f"(user '{USER}', a user_message); sent by user '{BOB}'" in log
        assert "client_message refused: type 'assistant_message' is not a user message (user 'bob'" in log
        assert f"edit_message refused: '{asked.message_id}' is none of this chat's user messages (user 'bob'" in log

        # 4. One answer streaming per chat: a second message meanwhile is refused, its text quoted back.
        ends = alice.events.get("task_end", 0)
        slow = await alice.start(f"{SLOW} a slow question")
        await until(lambda: slow.first_token_at is not None, 30, "the slow answer streaming")
        second = await alice.start("second question ```with a fence```", overlap=True)
        await until(lambda: second.errors, 15, "the second message refused")
        assert "The previous message is still being answered: this one was not sent" in second.errors[0]
        assert "````text\nsecond question ```with a fence```\n````" in second.errors[0]  # shown verbatim
        await until(lambda: alice.events.get("task_end", 0) > ends, 60, "the slow answer finished")
        third = await alice.start("third question", overlap=True)
        await alice.wait(60)
        assert third.answered, third.summary()  # the chat answers again once the answer ended
        assert not step_rows(db, 's."output" LIKE :t AND s."type" = :k', {"t": "second question%", "k": "user_message"})
    ui_log = app.log("ui")
    assert "Traceback" not in ui_log and "Task exception was never retrieved" not in ui_log, ui_log[-3000:]


@pytest.mark.asyncio
async def test_two_users_cannot_move_or_forge_messages_and_one_answer_streams_per_chat_sqlite(fake, socket_app):
    await two_users_over_the_socket(socket_app, history_db(socket_app))


@pytest.mark.asyncio
async def test_two_users_cannot_move_or_forge_messages_and_one_answer_streams_per_chat_postgres(
    fake, tmp_path, pg_history_app
):
    db = database.from_setting(pg_history_app.history_url, tmp_path / "unused.sqlite3")
    await two_users_over_the_socket(pg_history_app, db)


@pytest.mark.asyncio
async def test_the_data_layer_keeps_a_step_in_its_thread_and_type_on_postgresql(postgres, caplog):
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    from tests.unit.chat.test_datalayer import check_a_step_never_moves_to_another_thread_nor_changes_type

    db = database.from_setting(postgres.create_database(f"steps_{uuid.uuid4().hex[:8]}"), Path("unused.sqlite3"))
    history.ensure_schema(db)
    layer = datalayer.GuardedDataLayer(SQLAlchemyDataLayer(db.async_url, connect_args=db.connect_args))
    try:
        await check_a_step_never_moves_to_another_thread_nor_changes_type(layer, caplog)
    finally:
        await layer.close()


def test_the_leaderboard_query_counts_on_postgresql(postgres):
    from backend.storage.votes import Standing, Vote, VoteStore

    db = database.from_setting(postgres.create_database(f"votes_{uuid.uuid4().hex[:8]}"), Path("unused.sqlite3"))
    store = VoteStore(database.store(db))
    prompt = [{"role": "user", "content": "q"}]
    for i, (a, b, winner) in enumerate([("x", "y", "a"), ("x", "y", "b"), ("y", "x", "tie"), ("x", "x", "a")]):
        store.record(Vote("u", "th", f"t{i}", prompt, "A", "B", a, b, winner))  # type: ignore[arg-type]
    assert store.leaderboard() == [Standing("x", 1, 1, 1), Standing("y", 1, 1, 1)]

"""backend/storage/datalayer.py on Chainlit's real SQLAlchemyDataLayer and a real SQLite file."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from backend.storage import database, datalayer, history

pytestmark = pytest.mark.asyncio

SECRET = "my secret system prompt 7f3a"


def chainlit_layer(path):
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    history.ensure_schema(path)
    return SQLAlchemyDataLayer(history.database_url(path))


@pytest_asyncio.fixture
async def layer(tmp_path):
    guarded = datalayer.GuardedDataLayer(chainlit_layer(tmp_path / "history.sqlite3"))
    yield guarded
    await guarded.close()


async def new_thread(dl) -> str:
    from chainlit.context import init_http_context
    from chainlit.user import User

    user = await dl.create_user(User(identifier="admin"))
    thread_id = str(uuid.uuid4())
    init_http_context(thread_id=thread_id)
    await dl.update_thread(thread_id, name="chat", user_id=user.id)
    return thread_id


async def test_sqlite_runs_in_wal_with_a_busy_timeout_on_every_connection(layer):
    async with layer.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == database.BUSY_TIMEOUT_MS
    thread_id = await new_thread(layer)  # Chainlit's own statements run on such connections
    assert (await layer.get_thread(thread_id))["name"] == "chat"


async def test_sql_errors_never_carry_the_statement_parameters(layer, tmp_path):
    statement = text("INSERT INTO users (id, identifier) VALUES (:id, :identifier)")
    async with layer.engine.begin() as conn:
        await conn.execute(statement, {"id": "u1", "identifier": "admin"})
    with pytest.raises(IntegrityError) as hidden:  # a duplicate: SQLAlchemy wraps the DBAPI error
        async with layer.engine.begin() as conn:
            await conn.execute(statement, {"id": "u2", "identifier": SECRET})
            await conn.execute(statement, {"id": "u3", "identifier": SECRET})
    assert SECRET not in str(hidden.value) and "parameters hidden" in str(hidden.value)

    plain = chainlit_layer(tmp_path / "plain.sqlite3")  # what Chainlit does alone: the text is in the error
    try:
        with pytest.raises(IntegrityError) as shown:
            async with plain.engine.begin() as conn:
                await conn.execute(statement, {"id": "u2", "identifier": SECRET})
                await conn.execute(statement, {"id": "u3", "identifier": SECRET})
        assert SECRET in str(shown.value)
    finally:
        await plain.close()


async def test_a_lone_surrogate_in_a_user_message_is_stored_as_the_model_sees_it(layer, tmp_path):
    import chainlit as cl

    thread_id = await new_thread(layer)
    msg = cl.Message(content="a lone \ud800 surrogate", author="admin", type="user_message")
    await layer.create_step(msg.to_dict())
    msg.content = "edited \udfff too"
    await layer.update_step(msg.to_dict())
    thread = await layer.get_thread(thread_id)
    assert [s["output"] for s in thread["steps"]] == ["edited \ufffd too"]
    conv = history.conversation_from_thread(thread)
    assert conv.turns[0].content == "edited \ufffd too"

    plain = chainlit_layer(tmp_path / "plain.sqlite3")  # Chainlit alone loses the message
    try:
        plain_thread = await new_thread(plain)
        await plain.create_step(cl.Message(content="a lone \ud800", type="user_message").to_dict())  # only logged
        assert (await plain.get_thread(plain_thread))["steps"] == []
    finally:
        await plain.close()


BAD_IDS = [
    "1' OR '1'='1",
    "') UNION SELECT identifier FROM users --",
    "",
    "../../etc",
    "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4bx",
]  # a UUID and one more character


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_thread_id_that_is_not_a_uuid_never_reaches_sql(layer, monkeypatch, bad):
    import chainlit as cl
    from chainlit.data import acl
    from fastapi import HTTPException

    await new_thread(layer)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(f"{statement} {parameters}")

    event.listen(layer.engine.sync_engine, "before_cursor_execute", record)
    assert await layer.get_thread(bad) is None
    assert await layer.get_thread_author(bad) == ""
    assert await layer.get_element(bad, "e1") is None
    monkeypatch.setattr(acl, "get_data_layer", lambda: layer)
    with pytest.raises(HTTPException) as refused:  # what Chainlit's thread routes (open, rename, delete) call first
        await acl.is_thread_author("admin", bad)
    assert refused.value.status_code == 404
    for write in (
        layer.delete_thread(bad),
        layer.update_thread(bad, name="x"),
        layer.delete_element("e1", bad),
    ):
        with pytest.raises(datalayer.InvalidThreadId):
            await write
    step = cl.Message(content="hi", type="user_message").to_dict()
    step["threadId"] = bad
    with pytest.raises(datalayer.InvalidThreadId):
        await layer.create_step(step)
    with pytest.raises(datalayer.InvalidThreadId):
        await layer.update_step(step)
    assert statements == []
    event.remove(layer.engine.sync_engine, "before_cursor_execute", record)


async def test_a_valid_thread_id_goes_through_in_any_case(layer):
    thread_id = await new_thread(layer)
    assert datalayer.valid_thread_id(thread_id.upper())
    assert await layer.get_thread_author(thread_id) == "admin"
    await layer.delete_thread(thread_id)
    assert await layer.get_thread(thread_id) is None


# ---------------------------------------------------------------- issue #18: a step stays in its thread


async def thread_of(dl, identifier: str) -> str:
    from chainlit.context import init_http_context
    from chainlit.user import User

    user = await dl.create_user(User(identifier=identifier))
    thread_id = str(uuid.uuid4())
    init_http_context(thread_id=thread_id)
    await dl.update_thread(thread_id, name=f"{identifier}'s chat", user_id=user.id)
    return thread_id


async def stored_steps(dl, thread_id: str) -> dict[str, tuple[str, str]]:
    thread = await dl.get_thread(thread_id)
    return {s["id"]: (s["type"], s["output"]) for s in thread["steps"]}


async def check_a_step_never_moves_to_another_thread_nor_changes_type(dl, caplog) -> None:
    """Alice's message, written again with its id from Bob's thread (what Chainlit's upsert did on a browser's
    reused id: moved into Bob's chat with Bob's text), and her answer rewritten as a user message: both refused,
    logged, nothing moved or overwritten. Shared by the SQLite test here and the PostgreSQL one
    (tests/integration/test_message_ids.py)."""
    import chainlit as cl

    alice, bob = await thread_of(dl, "alice"), await thread_of(dl, "bob")
    question = cl.Message(content="alice's question", author="alice", type="user_message")
    question.thread_id = alice
    await dl.create_step(question.to_dict())
    answer = cl.Message(content="the answer", author="model", metadata=history.answer_metadata("the answer", "m"))
    answer.thread_id = alice
    await dl.create_step(answer.to_dict())
    before = await stored_steps(dl, alice)
    assert before == {question.id: ("user_message", "alice's question"), answer.id: ("assistant_message", "the answer")}

    stolen = {**question.to_dict(), "threadId": bob, "output": "bob's text"}
    caplog.clear()
    await dl.create_step(stolen)
    await dl.update_step(stolen)
    forged = {**answer.to_dict(), "type": "user_message", "output": "bob's text"}  # same thread, another type
    await dl.update_step(forged)
    await dl.create_step(forged)
    assert await stored_steps(dl, alice) == before
    assert await stored_steps(dl, bob) == {}
    said = [r.getMessage() for r in caplog.records if r.name == "backend.storage.datalayer"]
    assert (
        sum(f"step {question.id} belongs to thread {alice} (user 'alice'), not {bob}; nothing moved" in m for m in said)
        == 2
    )
    assert sum(f"step {answer.id} is stored as a assistant_message, not a user_message" in m for m in said) == 2
    owner = await dl.step_owner(question.id)
    assert (owner.thread_id, owner.type, owner.user) == (alice, "user_message", "alice")
    assert await dl.step_owner(str(uuid.uuid4())) is None

    question.content = "alice edits her own message"  # the normal path: an update in the same thread, same type
    await dl.update_step(question.to_dict())
    assert (await stored_steps(dl, alice))[question.id] == ("user_message", "alice edits her own message")


async def test_a_step_never_moves_to_another_thread_nor_changes_its_type(layer, caplog):
    await check_a_step_never_moves_to_another_thread_nor_changes_type(layer, caplog)


async def test_answers_are_signed_with_the_history_key_and_only_those_verify(tmp_path):
    import chainlit as cl

    path = tmp_path / "history.sqlite3"
    key = history.answer_key(database.sqlite_file(path))
    assert key and history.answer_key(database.sqlite_file(path)) == key  # created once, then read back
    assert history.answer_key(database.sqlite_file(path), create=False) == key
    signing = datalayer.GuardedDataLayer(chainlit_layer(path), answer_key=key)
    try:
        thread_id = await thread_of(signing, "alice")
        answer = cl.Message(content="shown", author="m", metadata=history.answer_metadata("raw text", "m"))
        await signing.create_step(answer.to_dict())
        note = cl.Message(content="a command's reply", author="m")  # no answer of ours: nothing to sign
        await signing.create_step(note.to_dict())
        steps = {s["id"]: s for s in (await signing.get_thread(thread_id))["steps"]}
        assert datalayer.signed_answer(key, steps[answer.id])
        assert not datalayer.signed_answer(key, steps[note.id])
        assert not datalayer.signed_answer(b"another key", steps[answer.id])
        moved = {**steps[answer.id], "threadId": str(uuid.uuid4())}  # a signature binds id, thread, text, model
        assert not datalayer.signed_answer(key, moved)
    finally:
        await signing.close()
    assert history.answer_key(database.sqlite_file(tmp_path / "none.sqlite3"), create=False) is None
    assert not (tmp_path / "none.sqlite3").exists()


async def test_a_step_whose_owner_cannot_be_checked_is_not_written_and_nothing_is_raised(layer, caplog, monkeypatch):
    """Chainlit writes steps from tasks nobody awaits: a database that fails the check is logged, never raised."""
    import chainlit as cl

    thread_id = await thread_of(layer, "alice")

    async def down(step_id: str):
        raise ConnectionRefusedError("[Errno 111] Connect call failed")

    monkeypatch.setattr(layer, "step_owner", down)
    msg = cl.Message(content="hello", author="alice", type="user_message")
    msg.thread_id = thread_id
    assert await layer.create_step(msg.to_dict()) is None
    monkeypatch.undo()
    assert await stored_steps(layer, thread_id) == {}
    assert any(
        f"create_step of chat {thread_id} not stored: connection refused" in r.getMessage() for r in caplog.records
    )


async def test_documents_given_before_the_messages_own_write_go_with_it_and_after_it_as_an_update(layer):
    """Chainlit writes a user message from a task of its own; the documents read for it must not be written first
    as an update that this write would then overwrite (its upsert sets the metadata column too)."""
    import chainlit as cl

    from backend.chat.documents import Document

    thread_id = await new_thread(layer)
    early = cl.Message(content="read this", author="admin", type="user_message")
    meta = history.documents_metadata([Document("notes.txt", "text", "the notes")])

    assert layer.carry_metadata(early.id, meta) is False  # nothing to write now: it goes with the message
    await layer.create_step(early.to_dict())  # Chainlit's own write, its metadata empty

    late = cl.Message(content="and this", author="admin", type="user_message")
    await layer.create_step(late.to_dict())
    assert layer.carry_metadata(late.id, meta) is True  # written already: the caller updates
    await layer.update_step({"id": late.id, "threadId": thread_id, "type": "user_message", "metadata": meta})

    thread = await layer.get_thread(thread_id)
    assert [[d.name for d in history.documents_of(s)] for s in thread["steps"]] == [["notes.txt"], ["notes.txt"]]
    conv = history.conversation_from_thread(thread)
    assert [t.documents[0].text for t in conv.turns] == ["the notes", "the notes"]


async def test_an_update_before_the_messages_own_write_would_be_overwritten_by_it(layer):
    """Why the documents are carried (above): the order the race could give, an update first, loses them."""
    import chainlit as cl

    from backend.chat.documents import Document

    thread_id = await new_thread(layer)
    msg = cl.Message(content="raced", author="admin", type="user_message")
    meta = history.documents_metadata([Document("notes.txt", "text", "the notes")])
    await layer.update_step({"id": msg.id, "threadId": thread_id, "type": "user_message", "metadata": meta})
    await layer.create_step(msg.to_dict())

    [step] = (await layer.get_thread(thread_id))["steps"]
    assert step["output"] == "raced" and history.documents_of(step) == ()

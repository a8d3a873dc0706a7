"""backend/chat/datalayer.py on Chainlit's real SQLAlchemyDataLayer and a real SQLite file."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from backend.chat import database, datalayer, history

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


BAD_IDS = ["1' OR '1'='1", "') UNION SELECT identifier FROM users --", "", "../../etc", str(uuid.uuid4()) + "x"]


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

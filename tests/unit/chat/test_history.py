"""backend/storage/history.py: the SQLite schema under Chainlit's real SQLAlchemyDataLayer, rebuilding a chat
from its stored thread, and ``prepare`` (the database and the login secret). The password check is in
test_login.py, settings remembered per user or browser in test_preferences.py.

The data layer is Chainlit 2.12's own class on a real SQLite file; messages and steps are built with
Chainlit's own ``Message`` / ``Step`` so the stored columns are exactly what the app writes.
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
import pytest_asyncio

from backend.settings import LoggingSettings, LoginSettings, Settings
from backend.storage import history
from backend.ui.markdown import footer, interrupted_marker
from backend.web.login import SECRET_FILE, auth_secret

RAW = "Arr, matey! Paris be the capital."


def columns(path, table: str) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[1] for row in db.execute(f'PRAGMA table_info("{table}")')}


# ---------------------------------------------------------------- schema


def test_the_schema_is_created_once_and_a_second_run_changes_nothing(tmp_path):
    path = tmp_path / "h.sqlite3"
    history.ensure_schema(path)
    with sqlite3.connect(path) as db:
        db.execute("""INSERT INTO users (id, identifier, metadata, "createdAt") VALUES ('u1', 'admin', '{}', 'now')""")
    before = {t: columns(path, t) for t in history.SCHEMA}
    history.ensure_schema(path)
    assert {t: columns(path, t) for t in history.SCHEMA} == before
    assert "autoCollapse" in before["steps"] and "defaultOpen" in before["steps"] and "modes" in before["steps"]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT identifier FROM users").fetchall() == [("admin",)]


def test_a_file_made_from_chainlits_documented_ddl_gets_the_missing_columns_and_keeps_its_rows(tmp_path):
    path = tmp_path / "docs.sqlite3"
    with sqlite3.connect(path) as db:  # the documented steps table: no "autoCollapse", "modes", "command"
        db.execute("""CREATE TABLE steps ("id" TEXT PRIMARY KEY, "name" TEXT NOT NULL, "type" TEXT NOT NULL,
                      "threadId" TEXT NOT NULL, "output" TEXT, "metadata" TEXT, "defaultOpen" BOOLEAN)""")
        db.execute("""INSERT INTO steps VALUES ('s1', 'User', 'user_message', 't1', 'hello', '{}', 0)""")
    history.ensure_schema(path)
    assert {"autoCollapse", "modes", "command", "generation"} <= columns(path, "steps")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT output FROM steps").fetchall() == [("hello",)]


# ---------------------------------------------------------------- Chainlit's data layer on our schema


@pytest_asyncio.fixture
async def layer(tmp_path):
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    path = tmp_path / "history.sqlite3"
    history.ensure_schema(path)
    dl = SQLAlchemyDataLayer(history.database_url(path))
    yield dl
    await dl.close()


async def store_chat(dl, turns: list[tuple[str, str, dict | None]], *, user: str = "admin") -> tuple[str, str]:
    """Store a chat as the app does: the user row, the thread, then each message's step. Returns (thread, user id)."""
    import chainlit as cl
    from chainlit.context import init_http_context
    from chainlit.user import User

    persisted = await dl.create_user(User(identifier=user))
    assert persisted is not None, "SQLAlchemyDataLayer could not create the user row"
    thread_id = str(uuid.uuid4())
    init_http_context(thread_id=thread_id)
    await dl.update_thread(thread_id, name="first question", user_id=persisted.id)
    for i, (role, content, metadata) in enumerate(turns):
        if role == "user":
            msg = cl.Message(content=content, author="admin", type="user_message")
            msg.modes = {"adapter": "pirate"}  # a dict and a list: SQLite cannot bind either as is
            msg.tags = ["demo"]
        else:
            msg = cl.Message(content=content, author="pirate", metadata=metadata)
            msg.parent_id = f"run-{i}"  # Chainlit nests answers under its on_message run step
        msg.created_at = f"2026-01-01T00:00:{i:02d}Z"
        await dl.create_step(msg.to_dict())
    tool = cl.Step(name="Loading adapter pirate…", type="tool", auto_collapse=True, default_open=False)
    tool.output = "loaded"
    await dl.create_step(tool.to_dict())  # a Step writes "autoCollapse", missing from Chainlit's documented DDL
    return thread_id, persisted.id


@pytest.mark.asyncio
async def test_chainlits_data_layer_stores_and_reads_back_a_thread_with_every_step(layer):
    from chainlit.types import Pagination, ThreadFilter

    shown = RAW + footer("pirate", None, None, 1.2, "en")
    thread_id, user_id = await store_chat(
        layer, [("user", "capital of France?", None), ("assistant", shown, history.answer_metadata(RAW, "pirate"))]
    )
    thread = await layer.get_thread(thread_id)
    assert thread is not None and thread["userIdentifier"] == "admin"
    assert [(s["type"], s["output"]) for s in thread["steps"]] == [
        ("user_message", "capital of France?"),
        ("assistant_message", shown),
        ("tool", "loaded"),
    ]
    assert json.loads(thread["steps"][1]["metadata"]) == history.answer_metadata(RAW, "pirate")  # a string on SQLite
    listed = await layer.list_threads(Pagination(first=10), ThreadFilter(userId=user_id))
    assert [t["id"] for t in listed.data] == [thread_id]  # what the history sidebar shows
    assert await layer.get_thread_author(thread_id) == "admin"


@pytest.mark.asyncio
async def test_thread_metadata_written_by_the_app_merges_with_chainlits_own(layer):
    thread_id, _ = await store_chat(layer, [("user", "hi", None)])
    state = history.chat_state("pirate", {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}, "be brief")
    await layer.update_thread(thread_id, metadata={"chat_settings": {"model": "pirate"}})  # what Chainlit persists
    await layer.update_thread(thread_id, metadata={history.META_KEY: state})  # what the app persists
    thread = await layer.get_thread(thread_id)
    assert history.state_from_thread(thread) == state
    assert json.loads(thread["metadata"])["chat_settings"] == {"model": "pirate"}


@pytest.mark.asyncio
async def test_a_resumed_thread_rebuilds_the_conversation_with_raw_text_and_the_model_that_answered(layer):
    shown1 = RAW + footer("pirate", None, None, 1.0, "en")
    shown2 = "w0 w1" + interrupted_marker("stopped", "smollm2")
    thread_id, _ = await store_chat(
        layer,
        [
            ("user", "capital of France?", None),
            ("assistant", shown1, history.answer_metadata(RAW, "pirate")),
            ("user", "and of Spain?", None),
            ("assistant", "Task manually stopped.", None),  # Chainlit's own note: not a turn
            ("assistant", shown2, history.answer_metadata("w0 w1", "smollm2", interrupted=True)),
            ("user", "again?", None),
        ],
    )
    thread = await layer.get_thread(thread_id)
    conv = history.conversation_from_thread(thread)
    assert [(t.role, t.content, t.model, t.interrupted) for t in conv.turns] == [
        ("user", "capital of France?", "", False),
        ("assistant", RAW, "pirate", False),
        ("user", "and of Spain?", "", False),
        ("assistant", "w0 w1", "smollm2", True),
        ("user", "again?", "", False),
    ]
    assert "*" not in json.dumps(conv.messages())  # no footer reaches the model
    assert history.state_from_thread(thread, conv) == {"model": "smollm2"}  # nothing saved: the last answer's model


def test_an_answer_retried_after_a_cut_keeps_only_the_retried_answer():
    thread = {
        "steps": [
            {"id": "u1", "type": "user_message", "output": "q"},
            {
                "id": "a1",
                "type": "assistant_message",
                "output": "x",
                "metadata": history.answer_metadata("w0", "m", interrupted=True),
            },
            {"id": "e1", "type": "assistant_message", "output": "error", "isError": True, "metadata": "{}"},
            {
                "id": "a2",
                "type": "assistant_message",
                "output": "y",
                "metadata": json.dumps(history.answer_metadata("full answer", "m")),
            },
        ]
    }
    conv = history.conversation_from_thread(thread)
    assert [(t.id, t.content) for t in conv.turns] == [("u1", "q"), ("a2", "full answer")]


# ---------------------------------------------------------------- prepare: the database and the login secret


def auth_settings(tmp_path, **login) -> Settings:
    return Settings(login=LoginSettings(enable=True, **login), logging=LoggingSettings(dir=str(tmp_path / "logs")))


def test_prepare_creates_the_database_and_a_login_secret_that_survives_a_restart(tmp_path):
    settings = auth_settings(tmp_path, password="pw")
    env: dict[str, str] = {}
    url = history.prepare(settings, env)
    path = tmp_path / "logs" / "history.sqlite3"
    assert url == f"sqlite+aiosqlite:///{path}" and "autoCollapse" in columns(path, "steps")
    secret = env["CHAINLIT_AUTH_SECRET"]
    assert len(secret) >= 32 and (path.parent / SECRET_FILE).stat().st_mode & 0o077 == 0
    again: dict[str, str] = {}
    history.prepare(settings, again)
    assert again["CHAINLIT_AUTH_SECRET"] == secret  # sessions survive a restart
    assert (
        history.prepare(settings, {"CHAINLIT_AUTH_SECRET": "given"})
        and auth_secret(path.parent, {"CHAINLIT_AUTH_SECRET": "given"}) == "given"
    )


def test_prepare_does_nothing_without_login(tmp_path):
    env: dict[str, str] = {}
    assert history.prepare(Settings(logging=LoggingSettings(dir=str(tmp_path / "logs"))), env) is None
    assert env == {} and not (tmp_path / "logs").exists()


@pytest.mark.asyncio
async def test_a_resumed_thread_leaves_out_composer_commands_marked_by_the_app(layer):
    import chainlit as cl

    thread_id, _ = await store_chat(
        layer,
        [
            ("user", "capital of France?", None),
            ("assistant", RAW, history.answer_metadata(RAW, "pirate")),
            ("user", "pirate", None),  # typed as "/unload pirate"
            ("assistant", "Adapter pirate unloaded; answers now come from base.", None),
        ],
    )
    thread = await layer.get_thread(thread_id)
    [command] = [s for s in thread["steps"] if s["output"] == "pirate"]
    msg = cl.Message(content="pirate", author="admin", type="user_message", id=command["id"])
    msg.created_at, msg.thread_id = command["createdAt"], thread_id
    msg.metadata = history.command_metadata("unload")  # what app.mark_command stores
    await layer.update_step(msg.to_dict())

    conv = history.conversation_from_thread(await layer.get_thread(thread_id))
    assert [(t.role, t.content) for t in conv.turns] == [("user", "capital of France?"), ("assistant", RAW)]


@pytest.mark.parametrize(
    "step",
    [
        {"id": "c", "type": "user_message", "output": "pirate", "metadata": history.command_metadata("unload")},
        {"id": "c", "type": "user_message", "output": "", "metadata": json.dumps(history.command_metadata("adapters"))},
    ],
)
def test_command_steps_are_not_chat_turns(step):
    thread = {"steps": [{"id": "u1", "type": "user_message", "output": "hi"}, step]}
    assert [t.content for t in history.conversation_from_thread(thread).turns] == ["hi"]


def test_a_starters_message_is_a_chat_turn_though_chainlit_calls_its_model_a_command():
    # set_starters sends the starter's model as Chainlit's "command"; only our own mark makes a step a command.
    step = {"id": "s", "type": "user_message", "output": "Tell me about ships", "command": "pirate"}
    assert [t.content for t in history.conversation_from_thread({"steps": [step]}).turns] == ["Tell me about ships"]


@pytest.mark.asyncio
async def test_documents_stored_with_a_user_message_come_back_with_the_resumed_chat(layer):
    """As backend/ui/attachments.store writes them: a partial upsert of the user message's step (its text kept)."""
    from backend.chat.documents import Document

    doc = Document("report.pdf", "pdf", "page one\n\npage two", pages=2, page_ends=(8, 18))
    thread_id, _ = await store_chat(layer, [("user", "what does it say?", None)])
    user_step = (await layer.get_thread(thread_id))["steps"][0]
    step = {"id": user_step["id"], "threadId": thread_id, "type": "user_message"}
    await layer.update_step({**step, "metadata": history.documents_metadata([doc])})

    conv = history.conversation_from_thread(await layer.get_thread(thread_id))

    [turn] = conv.turns
    assert (turn.content, turn.documents) == ("what does it say?", (doc,))
    assert conv.messages()[0]["content"].startswith('<document name="report.pdf" type="PDF" pages="2">\npage one')


def test_documents_that_cannot_be_read_back_are_left_out_not_fatal():
    step = {"id": "u1", "type": "user_message", "output": "q", "metadata": {history.META_KEY: {"documents": [{}]}}}

    [turn] = history.conversation_from_thread({"steps": [step]}).turns

    assert (turn.content, turn.documents) == ("q", ())

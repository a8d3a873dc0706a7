"""History on a real PostgreSQL (Debian's server, started for the session: tests/support/postgres.py).

The schema created twice, and upgraded from the previous version; a thread with steps and feedback through
Chainlit's own SQLAlchemyDataLayer (behind our GuardedDataLayer, as app.py builds it) on asyncpg; preferences,
votes and the shared login secret in the same database; two processes creating the schema at once; and the
bad inputs: a server that refuses, a wrong password, an unknown database: one clear log line without the
password, and the app's start goes on without history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from backend.errors import ConfigError
from backend.settings import HistorySettings, LoggingSettings, LoginSettings, Settings
from backend.storage import database, history, preferences
from backend.storage.datalayer import GuardedDataLayer
from backend.storage.votes import Vote, VoteStore
from tests.support.postgres import free_port

pytestmark = [pytest.mark.integration]


ROOT = Path(__file__).resolve().parents[2]
RAW = "Arr, matey! Paris be the capital."


def fresh(postgres) -> database.Database:
    """A new empty database on the session's server."""
    url = postgres.create_database("t" + uuid.uuid4().hex[:12])
    return database.from_setting(url, Path("/unused"))


def pg_settings(tmp_path: Path, url: str, wait: float = 30.0) -> Settings:
    return Settings(
        login=LoginSettings(enable=True, password="pw"),
        history=HistorySettings(db=url, wait=wait),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )


def columns(postgres, db: database.Database, table: str) -> set[str]:
    out = postgres.psql(
        f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'", db.url.database
    )
    return set(out.split())


# ---------------------------------------------------------------- the URL


def test_history_db_accepts_paths_and_sqlalchemy_urls_and_refuses_anything_else(tmp_path):
    default = tmp_path / "h.sqlite3"
    assert database.from_setting("", default).path == default
    assert database.from_setting(str(tmp_path / "x.db"), default).path == tmp_path / "x.db"
    assert database.from_setting(f"sqlite+aiosqlite:///{tmp_path}/y.db", default).path == tmp_path / "y.db"
    pg = database.from_setting("postgresql://u:s3cret@db.example:5433/chats", default)
    assert pg.is_postgres and pg.url.drivername == "postgresql+asyncpg" and pg.url.port == 5433
    assert "s3cret" not in pg.safe and pg.safe == "postgresql+asyncpg://u:***@db.example:5433/chats"
    for bad in ("mysql://u:s3cret@h/db", "postgres://u:s3cret@h/db", "postgresql+psycopg2://u:s3cret@h/db"):
        with pytest.raises(ConfigError) as err:
            database.from_setting(bad, default)
        assert err.value.key == "history.db" and "postgresql+asyncpg://" in err.value.expected
        assert "s3cret" not in str(err.value.value)
    with pytest.raises(ConfigError) as err:  # the settings check at load time: the scheme only, never the rest
        HistorySettings(db="mysql://u:s3cret@h/db")
    assert err.value.key == "history.db" and "s3cret" not in str(err.value.value)


# ---------------------------------------------------------------- schema


def test_the_schema_is_created_once_and_a_second_run_changes_nothing(postgres):
    db = fresh(postgres)
    first = history.ensure_schema(db)
    assert {"table users", "table threads", "table steps", "table elements", "table feedbacks"} <= set(first)
    before = {t: columns(postgres, db, t) for t in history.SCHEMA}
    assert "autoCollapse" in before["steps"] and "modes" in before["steps"]
    postgres.psql("INSERT INTO users (id, identifier) VALUES ('u1', 'admin')", db.url.database)
    assert history.ensure_schema(db) == []
    assert {t: columns(postgres, db, t) for t in history.SCHEMA} == before
    assert postgres.psql("SELECT identifier FROM users", db.url.database).split() == ["admin"]
    assert database.schema_version(database.store(db), "history") == history.SCHEMA_VERSION
    tags = postgres.psql(
        "SELECT data_type FROM information_schema.columns WHERE table_name = 'steps' AND column_name = 'tags'",
        db.url.database,
    )
    assert tags.strip() == "ARRAY"  # Chainlit binds a list


# The previous schema version: Chainlit's documented PostgreSQL DDL (no steps "autoCollapse", "modes",
# "command"), no index on feedbacks."forId", no qwenchat_schema row.
PREVIOUS_DDL = """
CREATE TABLE users ("id" TEXT PRIMARY KEY, "identifier" TEXT NOT NULL UNIQUE, "metadata" TEXT, "createdAt" TEXT);
CREATE TABLE threads ("id" TEXT PRIMARY KEY, "createdAt" TEXT, "name" TEXT,
  "userId" TEXT REFERENCES users("id") ON DELETE CASCADE, "userIdentifier" TEXT, "tags" TEXT[], "metadata" TEXT);
CREATE TABLE steps ("id" TEXT PRIMARY KEY, "name" TEXT NOT NULL, "type" TEXT NOT NULL,
  "threadId" TEXT NOT NULL REFERENCES threads("id") ON DELETE CASCADE, "parentId" TEXT, "streaming" BOOLEAN,
  "waitForAnswer" BOOLEAN, "isError" BOOLEAN, "metadata" TEXT, "tags" TEXT[], "input" TEXT, "output" TEXT,
  "createdAt" TEXT, "start" TEXT, "end" TEXT, "generation" TEXT, "showInput" TEXT, "language" TEXT,
  "indent" INT, "defaultOpen" BOOLEAN);
CREATE TABLE elements ("id" TEXT PRIMARY KEY, "threadId" TEXT REFERENCES threads("id") ON DELETE CASCADE,
  "type" TEXT, "url" TEXT, "chainlitKey" TEXT, "name" TEXT NOT NULL, "display" TEXT, "objectKey" TEXT,
  "size" TEXT, "page" INT, "language" TEXT, "forId" TEXT, "mime" TEXT, "props" TEXT);
CREATE TABLE feedbacks ("id" TEXT PRIMARY KEY, "forId" TEXT NOT NULL, "threadId" TEXT NOT NULL, "value" INT NOT NULL,
  "comment" TEXT);
INSERT INTO users VALUES ('u1', 'admin', '{}', '2026-01-01T00:00:00Z');
INSERT INTO threads ("id", "userId", "userIdentifier", "name") VALUES ('t1', 'u1', 'admin', 'old chat');
INSERT INTO steps ("id", "name", "type", "threadId", "output") VALUES ('s1', 'admin', 'user_message', 't1', 'hello');
"""


def test_a_database_of_the_previous_schema_version_is_upgraded_and_keeps_its_rows(postgres):
    db = fresh(postgres)
    postgres.psql(f"SET ROLE qwenchat; {PREVIOUS_DDL}", db.url.database)
    assert database.schema_version(database.store(db), "history") is None
    changed = history.ensure_schema(db)
    assert {"column steps.autoCollapse", "column steps.modes", "column steps.command"} <= set(changed)
    assert "table steps" not in changed
    assert {"autoCollapse", "modes", "command"} <= columns(postgres, db, "steps")
    indexes = postgres.psql("SELECT indexname FROM pg_indexes WHERE tablename = 'feedbacks'", db.url.database)
    assert "feedbacks_for" in indexes.split()
    assert database.schema_version(database.store(db), "history") == history.SCHEMA_VERSION
    assert postgres.psql("SELECT output FROM steps WHERE id = 's1'", db.url.database).strip() == "hello"
    assert history.ensure_schema(db) == []  # and again: nothing left to do


def test_two_processes_creating_the_schema_at_once_do_not_race(postgres):
    db = fresh(postgres)
    code = (
        "import sys; from pathlib import Path; from backend.storage import database, history; "
        "history.ensure_schema(database.from_setting(sys.argv[1], Path('/unused')))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, db.async_url], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    assert database.schema_version(database.store(db), "history") == history.SCHEMA_VERSION
    assert postgres.psql("SELECT count(*) FROM qwenchat_schema WHERE name = 'history'", db.url.database).strip() == "1"


# ---------------------------------------------------------------- Chainlit's data layer on PostgreSQL


@pytest.mark.asyncio
async def test_a_thread_with_steps_and_feedback_round_trips_through_chainlits_data_layer(postgres):
    import chainlit as cl
    from chainlit.context import init_http_context
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
    from chainlit.types import Feedback, Pagination, ThreadFilter
    from chainlit.user import User

    db = fresh(postgres)
    history.ensure_schema(db)
    layer = GuardedDataLayer(SQLAlchemyDataLayer(db.async_url, connect_args=db.connect_args))
    try:
        persisted = await layer.create_user(User(identifier="admin", metadata={"provider": "credentials"}))
        assert persisted is not None, "SQLAlchemyDataLayer could not create the user row on PostgreSQL"
        thread_id = str(uuid.uuid4())
        init_http_context(thread_id=thread_id)
        await layer.update_thread(thread_id, name="capital", user_id=persisted.id, tags=["demo"])
        question = cl.Message(content="capital of France?", author="admin", type="user_message")
        question.modes = {"adapter": "pirate"}  # a dict: asyncpg binds none to TEXT (GuardedDataLayer encodes it)
        question.tags = ["demo", "zh"]
        question.created_at = "2026-01-01T00:00:00Z"
        await layer.create_step(question.to_dict())
        answer = cl.Message(content=RAW + " *pirate*", author="pirate", metadata=history.answer_metadata(RAW, "pirate"))
        answer.created_at = "2026-01-01T00:00:01Z"
        await layer.create_step(answer.to_dict())
        tool = cl.Step(name="Loading adapter pirate…", type="tool", auto_collapse=True, default_open=False)
        tool.output = "loaded"
        await layer.create_step(tool.to_dict())
        state = history.chat_state("pirate", {"temperature": 0.7}, "be brief")
        await layer.update_thread(thread_id, metadata={history.META_KEY: state})
        feedback_id = await layer.upsert_feedback(Feedback(forId=answer.id, threadId=thread_id, value=1, comment="ok"))

        thread = await layer.get_thread(thread_id)
        assert thread is not None and thread["userIdentifier"] == "admin" and thread["tags"] == ["demo"]
        steps = thread["steps"]
        assert [(s["type"], s["output"]) for s in steps] == [
            ("user_message", "capital of France?"),
            ("assistant_message", RAW + " *pirate*"),
            ("tool", "loaded"),
        ]
        assert steps[0]["tags"] == ["demo", "zh"]
        assert steps[1]["feedback"]["value"] == 1 and steps[1]["feedback"]["comment"] == "ok"
        assert steps[1]["feedback"]["id"] == feedback_id
        conv = history.conversation_from_thread(thread)
        assert [(t.role, t.content, t.model) for t in conv.turns] == [
            ("user", "capital of France?", ""),
            ("assistant", RAW, "pirate"),
        ]
        assert history.state_from_thread(thread, conv) == state
        listed = await layer.list_threads(Pagination(first=10), ThreadFilter(userId=persisted.id))
        assert [t["id"] for t in listed.data] == [thread_id]  # the history sidebar
        modes = postgres.psql(f"SELECT modes FROM steps WHERE id = '{question.id}'", db.url.database)
        assert json.loads(modes) == {"adapter": "pirate"}
        await layer.delete_thread(thread_id)
        assert await layer.get_thread(thread_id) is None
    finally:
        await layer.close()


# ---------------------------------------------------------------- preferences, votes, the login secret


def test_preferences_and_votes_live_in_the_postgresql_database(postgres, tmp_path):
    db = fresh(postgres)
    settings = pg_settings(tmp_path, db.async_url)
    store = preferences.app_store(settings)
    assert store.db.is_postgres
    prefs = preferences.open_preferences(settings)
    prefs.set("user:admin", {"model": "pirate", "system_prompt": "be brief \ud800"})
    assert preferences.Preferences(store).get("user:admin") == {"model": "pirate", "system_prompt": "be brief \ufffd"}
    assert postgres.psql("SELECT key FROM preferences", db.url.database).split() == ["user:admin"]
    votes = VoteStore(store)
    vote = Vote("admin", "t1", "u1", [{"role": "user", "content": "q"}], "a", "b", "base", "pirate", "b")
    assert votes.record(vote) is False
    assert votes.record(Vote(**{**vote.__dict__, "winner": "tie", "created_at": ""})) is True  # the last vote wins
    [got] = VoteStore(store).all()
    assert (got.user, got.winner, got.prompt) == ("admin", "tie", [{"role": "user", "content": "q"}])
    assert [(s.model, s.ties) for s in votes.leaderboard()] == [("base", 1), ("pirate", 1)]
    assert not (tmp_path / "logs" / preferences.PREFS_DB).exists()  # nothing local


@pytest.mark.asyncio
async def test_export_feedback_reads_votes_and_thumbs_up_answers_from_postgresql(postgres, tmp_path):
    from backend.storage import feedback_export
    from tests.unit.chat.test_feedback_export import LIKED_EXAMPLES, store_liked_chat

    settings = pg_settings(tmp_path, fresh(postgres).async_url)
    await store_liked_chat(settings)
    VoteStore(preferences.app_store(settings)).record(
        Vote("admin", "t1", "u1", [{"role": "user", "content": "q"}], "plain", "arr", "base", "pirate", "b")
    )
    out, chat_out = tmp_path / "pairs.jsonl", tmp_path / "chat.jsonl"
    summary = await asyncio.to_thread(feedback_export.export_feedback, settings, out, chat_out)
    assert (summary.pairs, summary.chat_examples, summary.cut_left_out) == (1, 1, 1)
    assert [json.loads(line) for line in chat_out.read_text().splitlines()] == LIKED_EXAMPLES
    [pair] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (pair["chosen_model"], pair["chosen"][0]["content"]) == ("pirate", "arr")
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").glob("*.sqlite3"))  # nothing local


def test_two_ui_processes_on_one_database_share_the_login_secret(postgres, tmp_path):
    db = fresh(postgres)
    env_a: dict[str, str] = {}
    env_b: dict[str, str] = {}
    a = history.open_history(pg_settings(tmp_path / "a", db.async_url), env_a)
    b = history.open_history(pg_settings(tmp_path / "b", db.async_url), env_b)  # another machine: another log dir
    assert a.url == b.url == db.async_url and not a.off_reason
    assert env_a["CHAINLIT_AUTH_SECRET"] == env_b["CHAINLIT_AUTH_SECRET"]  # a login on A is valid on B
    assert not (tmp_path / "a" / "logs" / "chainlit-auth-secret").exists()


# ---------------------------------------------------------------- bad input: the start goes on without history


def bad_urls(postgres) -> dict[str, tuple[str, str]]:
    return {
        "refused": (postgres.url(port=free_port()), "connection refused"),
        "wrong password": (postgres.url(password="not-the-password"), "authentication failed"),
        "unknown database": (postgres.url("no_such_db"), "unknown database"),
    }


@pytest.mark.parametrize("case", ["refused", "wrong password", "unknown database"])
def test_an_unusable_database_is_one_clear_line_and_the_start_goes_on_without_history(postgres, tmp_path, caplog, case):
    """A refused connection is waited for ([history] wait, 1 s here), then given up; a wrong password or an
    unknown database is an answer from the server: no waiting."""
    url, cause = bad_urls(postgres)[case]
    settings = pg_settings(tmp_path, url, wait=1.0)
    env: dict[str, str] = {}
    with caplog.at_level(logging.INFO):
        started = history.open_history(settings, env)
        prefs = preferences.open_preferences(settings)  # what app.py does next
    assert started.url is None and cause in started.off_reason  # no data layer: Chainlit runs without history
    assert env["CHAINLIT_AUTH_SECRET"]  # login still works
    lines = [r.getMessage() for r in caplog.records if r.name == "backend.storage.history"]
    [line] = [m for m in lines if "history is off" in m]
    assert "history.db" in line and cause in line and "127.0.0.1:" in line and "***" in line
    waits = [m for m in lines if "waiting up to 1 s" in m]
    assert (len(waits), "(waited " in line) == ((1, True) if case == "refused" else (0, False)), lines
    assert postgres.password not in caplog.text and "not-the-password" not in caplog.text
    prefs.set("user:admin", {"model": "pirate"})  # remembered settings fall back to the local file
    assert prefs.get("user:admin") == {"model": "pirate"} and prefs.store.db.path is not None


@pytest.mark.asyncio
async def test_postgresql_going_away_later_is_logged_and_the_calls_return(postgres, tmp_path, caplog):
    """A database that stops answering after the start: preference reads log and give nothing; Chainlit's data
    layer logs and returns (its execute_sql catches everything); nothing hangs."""
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    gone = database.from_setting(postgres.url(port=free_port()), Path("/unused"))  # as good as a stopped server
    layer = GuardedDataLayer(SQLAlchemyDataLayer(gone.async_url, connect_args=gone.connect_args))
    try:
        with caplog.at_level(logging.WARNING):
            assert await asyncio.wait_for(layer.get_thread(str(uuid.uuid4())), 30) is None
            with pytest.raises(ValueError):  # Chainlit's "no such thread" (app.py's routes catch it)
                await asyncio.wait_for(layer.get_thread_author(str(uuid.uuid4())), 30)
    finally:
        await layer.close()
    assert "An unexpected error occurred" in caplog.text or "An error occurred" in caplog.text
    db = fresh(postgres)
    prefs = preferences.Preferences(database.store(db))
    prefs.set("user:admin", {"model": "pirate"})
    prefs.store = database.Store(gone)  # the database went away: the next read cannot connect
    assert await asyncio.to_thread(prefs.get, "user:admin") == {}
    assert "preferences: could not be read" in caplog.text


class Forwarder:
    """A TCP pass-through to the session's real server on a port of its own, that can be cut (every connection
    dropped, nothing listening: as a PostgreSQL restart or a proxy failover looks to the client) and restored."""

    def __init__(self, target: int) -> None:
        self.port, self.target = free_port(), target
        self.open: list[socket.socket] = []
        self.stopping = threading.Event()
        self.listening = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, after: float = 0.0) -> None:
        """Listen (after ``after`` s: a server that comes up a little after the UI; with none, listening on return)."""
        self.stopping.clear()
        self.listening = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(after,), daemon=True)
        self.thread.start()
        if not after and not self.listening.wait(10):
            raise RuntimeError(f"the forwarder did not listen on {self.port}")

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(10)
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.open = []

    def _serve(self, after: float) -> None:
        if self.stopping.wait(after):
            return
        with socket.create_server(("127.0.0.1", self.port)) as server:
            server.settimeout(0.2)
            self.listening.set()
            while not self.stopping.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection(("127.0.0.1", self.target))
                self.open += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := a.recv(65536):
            b.sendall(data)
    with contextlib.suppress(OSError):
        b.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def forwarded(postgres, after: float = 0.0) -> Iterator[tuple[Forwarder, database.Database]]:
    """A fresh database on the session's server, reached through a Forwarder."""
    db = fresh(postgres)
    forwarder = Forwarder(postgres.port)
    forwarder.start(after)
    try:
        yield forwarder, database.from_setting(db.url.set(port=forwarder.port).render_as_string(False), Path("/u"))
    finally:
        forwarder.stop()


def test_a_database_that_comes_up_after_the_ui_is_waited_for_and_the_history_is_on(postgres, tmp_path, caplog):
    """[history] wait: the database refuses connections for the first 3 s (nothing listens on its port yet),
    then answers: the start waits for it, says so once, and history is on, in that database."""
    env: dict[str, str] = {}
    with forwarded(postgres, after=3.0) as (forwarder, db), caplog.at_level(logging.INFO):
        port = forwarder.port
        started = history.open_history(pg_settings(tmp_path, db.url.render_as_string(False), wait=60.0), env)
        assert started.url is not None and not started.off_reason  # history on
        assert database.store(started.db).run(lambda c: c.execute(text("SELECT count(*) FROM threads")).scalar()) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "backend.storage.history"]
    [waiting] = [m for m in lines if "waiting up to 60 s" in m]
    assert "connection refused" in waiting and f"127.0.0.1:{port}" in waiting and "***" in waiting
    assert any("answered after" in m for m in lines), lines
    assert not any("history is off" in m for m in lines), lines
    assert postgres.password not in caplog.text


@pytest.mark.asyncio
async def test_a_postgresql_restart_between_two_answers_loses_neither(postgres, caplog):
    """Every connection dropped while the chat is idle (a restart, a proxy failover): the next answer is stored, at
    the first try (a pooled connection is checked before use), and nothing is logged as failed."""
    from chainlit.context import init_http_context
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

    with forwarded(postgres) as (forwarder, db):
        history.ensure_schema(db)
        layer = GuardedDataLayer(SQLAlchemyDataLayer(db.async_url, connect_args=db.connect_args))
        try:
            thread_id = str(uuid.uuid4())
            init_http_context(thread_id=thread_id)
            await layer.update_thread(thread_id, name="before the restart")
            first = {"id": str(uuid.uuid4()), "threadId": thread_id, "type": "assistant_message", "output": "one"}
            await layer.create_step({**first, "name": "a", "createdAt": "2026-01-01T00:00:00Z"})
            forwarder.stop()  # the server goes away with every open connection, and comes back
            forwarder.start()
            with caplog.at_level(logging.WARNING):
                second = {**first, "id": str(uuid.uuid4()), "output": "two", "createdAt": "2026-01-01T00:00:01Z"}
                await layer.create_step({**second, "name": "a"})
                thread = await layer.get_thread(thread_id)
        finally:
            await layer.close()
    assert thread is not None and [s["output"] for s in thread["steps"]] == ["one", "two"]
    assert "error occurred" not in caplog.text, caplog.text

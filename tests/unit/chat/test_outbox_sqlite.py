"""History writes through the outbox on Chainlit's real SQLAlchemyDataLayer and a real SQLite file (issue 32): an
exclusive lock held by another process, a disk that fills (SQLite's own SQLITE_FULL, made by a page limit set on each
connection the data layer takes: a fault injected at the driver), and a journal replayed twice without doubling.

On the code before the outbox each of these lost the turn: Chainlit's execute_sql logged "An error occurred:
(sqlite3.OperationalError) database is locked" (or "database or disk is full") and returned, and nothing kept it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import event

from backend.storage import datalayer, history, outbox, preferences
from backend.storage.outbox import Outbox
from backend.storage.votes import Vote, VoteStore
from tests.support.faults import Held

pytestmark = pytest.mark.asyncio


class History:
    """The data layer as the UI builds it (login.data_layer), with an outbox journalling in ``folder``."""

    def __init__(self, path: Path, folder: Path) -> None:
        from chainlit.data.sql_alchemy import SQLAlchemyDataLayer

        history.ensure_schema(path)
        self.path = path
        self.box = Outbox(folder, pending_max=1000)
        votes = VoteStore(path)

        async def record_vote(args: dict[str, Any]) -> None:  # as backend/ui/installation.py registers it
            await asyncio.to_thread(votes.record, Vote(**args))

        self.box.register("vote", record_vote)
        self.layer = datalayer.GuardedDataLayer(SQLAlchemyDataLayer(history.database_url(path)), outbox=self.box)

    async def close(self) -> None:
        for task in list(self.box._tasks.values()):  # a UI process that dies: its lanes stop, its journal stays
            task.cancel()
        self.box.close()
        await self.layer.inner.engine.dispose()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        import sqlite3

        with sqlite3.connect(self.path) as conn:
            return [tuple(r) for r in conn.execute(sql)]


@pytest_asyncio.fixture
async def store(tmp_path):
    h = History(tmp_path / "history.sqlite3", tmp_path / "logs")
    yield h
    await h.close()


async def new_thread(h: History, who: str = "admin") -> tuple[str, str]:
    from chainlit.context import init_http_context
    from chainlit.user import User

    user = await h.layer.create_user(User(identifier=who))
    thread_id = str(uuid.uuid4())
    init_http_context(thread_id=thread_id)
    await h.layer.update_thread(thread_id, name="chat", user_id=user.id)
    assert await h.box.drained(30)
    return thread_id, user.id


def turn(thread_id: str, question: str, answer: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A user message and its answer as Chainlit's Message.to_dict() gives them."""
    import chainlit as cl

    q = cl.Message(content=question, author="admin", type="user_message")
    a = cl.Message(content=answer + " · footer", author="fake-qwen", type="assistant_message")
    a.metadata = history.answer_metadata(answer, "fake-qwen")
    q.thread_id = a.thread_id = thread_id
    return dict(q.to_dict()), dict(a.to_dict())


async def until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.05)


def conversation(thread: Any) -> list[tuple[str, str, str]]:
    return [(t.role, t.id, t.content) for t in history.conversation_from_thread(thread).turns]


async def test_a_turn_written_under_another_process_s_exclusive_lock_is_seen_kept_and_stored_after_it(store):
    thread_id, _ = await new_thread(store)
    before_q, before_a = turn(thread_id, "What is the capital of France?", "Paris.")
    await store.layer.create_step(before_q)
    await store.layer.create_step(before_a)
    assert await store.box.drained(30)
    lock = Held(store.path)
    q, a = turn(thread_id, "And of Italy?", "The capital of Italy is Rome.")
    await store.layer.create_step(q)  # returns at once: the answer never waits for the database
    await store.layer.create_step(a)
    a["output"] = "The capital of Italy is Rome. · 7 tokens"
    await store.layer.update_step(a)  # the answer's end replaces its first form
    await until(lambda: store.box.state().cause == "locked", 60, "the lock seen as the cause")
    text_now = outbox.backlog_text(store.box.state(), "en")
    assert text_now == "history: 2 messages waiting to be saved · the database is locked"
    during = await store.layer.get_thread(thread_id)  # read-your-writes: a resume now sees the waiting turn
    ids = [before_q["id"], before_a["id"], q["id"], a["id"]]
    assert [s["id"] for s in during["steps"]] == ids
    assert conversation(during)[-1] == ("assistant", a["id"], "The capital of Italy is Rome.")
    assert store.rows(f"SELECT id FROM steps WHERE id = '{q['id']}'") == []  # really not stored yet
    released = lock.release()
    assert await store.box.drained(60), "the waiting turn not stored after the lock was released"
    print(f"\nlock released -> last waiting write stored: {store.box.last_stored_at - released:.2f} s")
    stored = await store.layer.get_thread(thread_id)
    assert [s["id"] for s in stored["steps"]] == ids  # the right order, the right ids, each once
    assert store.rows(f"SELECT output FROM steps WHERE id = '{a['id']}'") == [(a["output"],)]
    assert conversation(stored) == conversation(during)
    assert store.box.state() == outbox.Backlog() and outbox.backlog_text(store.box.state(), "en") == ""


async def test_a_disk_that_fills_keeps_the_turn_until_there_is_room(store):
    thread_id, _ = await new_thread(store)
    pages = store.rows("PRAGMA page_count")[0][0]
    limit = {"pages": pages + 2}  # a few pages of room: the 200 KB answer below does not fit

    def page_limit(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA max_page_count = {limit['pages']}")
        cursor.close()

    event.listen(store.layer.inner.engine.sync_engine, "checkout", page_limit)
    q, a = turn(thread_id, "Write a long story.", "Once upon a time " * 12_000)
    await store.layer.create_step(q)
    await store.layer.create_step(a)
    await until(lambda: store.box.state().cause == "full", 60, "the full disk seen as the cause")
    assert outbox.backlog_text(store.box.state(), "en").endswith("· the disk is full")
    limit["pages"] = 1_000_000  # room again (space freed)
    assert await store.box.drained(60), "the turn not stored once there was room"
    assert {r[0] for r in store.rows(f"SELECT id FROM steps WHERE \"threadId\" = '{thread_id}'")} == {q["id"], a["id"]}
    assert store.box.failures["full"] >= 1


async def every_kind_of_write(h: History, thread_id: str, user_id: str) -> dict[str, str]:
    """A turn, its answer's end, the thread's settings and name, a thumbs rating and a blind vote."""
    from chainlit.types import Feedback

    q, a = turn(thread_id, "hello", "hi there")
    await h.layer.create_step(q)
    await h.layer.create_step(a)
    a["output"] = "hi there · 3 tokens"
    await h.layer.update_step(a)
    await h.layer.update_thread(thread_id, metadata={history.META_KEY: {"model": "pirate"}})
    await h.layer.update_thread(thread_id, name="greetings", user_id=user_id)
    feedback_id = await h.layer.upsert_feedback(Feedback(forId=a["id"], value=1, threadId=thread_id, comment="ok"))
    vote = Vote("admin", thread_id, q["id"], [], "A", "B", "base", "pirate", "b", "", "2026-12-03T09:00:00.000+00:00")
    h.box.submit(thread_id, "vote", asdict(vote))
    return {"question": q["id"], "answer": a["id"], "feedback": feedback_id}


def snapshot(h: History) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "threads": h.rows('SELECT id, name, metadata, "userId" FROM threads ORDER BY id'),
        "steps": h.rows('SELECT id, "threadId", type, output FROM steps ORDER BY id'),
        "feedbacks": h.rows('SELECT id, "forId", value, comment FROM feedbacks ORDER BY id'),
        "votes": h.rows("SELECT thread_id, turn_id, winner, model_a, model_b FROM votes ORDER BY turn_id"),
    }


async def test_a_journal_replayed_twice_doubles_nothing(tmp_path):
    path, logs = tmp_path / "history.sqlite3", tmp_path / "logs"
    first = History(path, logs)
    thread_id, user_id = await new_thread(first)
    lock = Held(path)
    ids = await every_kind_of_write(first, thread_id, user_id)
    await until(lambda: first.box.state().cause == "locked", 60, "the lock seen")
    journal = first.box.journal.path
    await first.close()  # the UI dies with every write pending
    kept = tmp_path / "kept.jsonl"
    shutil.copy(journal, kept)
    lock.release()

    second = History(path, logs)  # started again: the journal replays
    assert await second.box.start() == 7
    assert await second.box.drained(60)
    once = snapshot(second)
    assert [r[0] for r in once["steps"]] == sorted([ids["question"], ids["answer"]])
    assert once["feedbacks"] == [(ids["feedback"], ids["answer"], 1, "ok")]
    assert len(once["votes"]) == 1 and once["threads"][0][1] == "greetings"
    assert "pirate" in once["threads"][0][2]
    await second.close()

    shutil.copy(kept, logs / f"{outbox.JOURNAL_PREFIX}0-0.jsonl")  # stored, but died before marking it done
    third = History(path, logs)
    assert await third.box.start() == 7
    assert await third.box.drained(60)
    assert snapshot(third) == once  # every write an upsert or a delete by id: nothing doubled, nothing changed
    await third.close()


async def test_a_chat_none_of_whose_writes_is_stored_is_read_from_them_in_order():
    """The database down since the chat began: a resume in this process builds it from the pending writes alone, its
    author from the login that made it, a rating on its answer, and a step deleted since gone."""
    from chainlit.context import init_http_context

    thread_id = str(uuid.uuid4())
    init_http_context(thread_id=thread_id)
    q, a = turn(thread_id, "hello", "hi there")
    cut = {**a, "output": "hi th", "metadata": history.answer_metadata("hi th", "fake-qwen", interrupted=True)}
    tool = {**q, "id": str(uuid.uuid4()), "type": "tool"}
    writes = [
        outbox.Write(1, thread_id, "update_thread", {"name": "greetings", "user_id": "u1", "metadata": None}),
        outbox.Write(2, thread_id, "create_step", {"step": q}),
        outbox.Write(3, thread_id, "create_step", {"step": tool}),
        outbox.Write(4, thread_id, "create_step", {"step": cut}),
        outbox.Write(5, thread_id, "update_step", {"step": a}),
        outbox.Write(6, thread_id, "delete_step", {"id": tool["id"]}),
        outbox.Write(7, thread_id, "upsert_feedback", {"feedback": {"forId": a["id"], "value": 1, "id": "f1"}}),
    ]
    thread = datalayer.with_pending(None, thread_id, writes, {"u1": "admin"})
    assert thread["name"] == "greetings" and thread["userIdentifier"] == "admin"
    assert [s["id"] for s in thread["steps"]] == [q["id"], a["id"]]
    assert thread["steps"][1]["feedback"]["value"] == 1
    assert conversation(thread) == [("user", q["id"], "hello"), ("assistant", a["id"], "hi there")]
    assert datalayer.with_pending(thread, thread_id, [outbox.Write(8, thread_id, "delete_thread", {})], {}) is None


async def test_a_rating_given_and_taken_back_while_its_answer_waits_ends_taken_back(store):
    """A thumbs up on an answer not stored yet, then removed: the removal waits behind the rating in the chat's lane
    (else the rating, stored later, would come back); while it waits, the answer's chat is known for the owner
    check (routes.author_of_step)."""
    from chainlit.types import Feedback

    thread_id, _ = await new_thread(store)
    lock = Held(store.path)
    q, a = turn(thread_id, "hello", "hi there")
    await store.layer.create_step(q)
    await store.layer.create_step(a)
    assert store.layer.pending_thread_of_step(a["id"]) == thread_id
    feedback_id = await store.layer.upsert_feedback(Feedback(forId=a["id"], value=1, threadId=thread_id))
    assert (await store.layer.get_thread(thread_id))["steps"][1]["feedback"]["value"] == 1
    await store.layer.delete_feedback(feedback_id)
    assert [w.op for w in store.box.pending(thread_id)][-2:] == ["upsert_feedback", "delete_feedback"]
    lock.release()
    assert await store.box.drained(60)
    assert store.rows("SELECT id FROM feedbacks") == []
    assert len(store.rows(f"SELECT id FROM steps WHERE \"threadId\" = '{thread_id}'")) == 2


async def test_the_owner_check_finds_a_rating_whose_write_still_waits(store, monkeypatch):
    """DELETE /feedback names a rating by id; its owner check (routes.answer_of_feedback) must find the rated answer
    also while the rating's write waits. It read the database alone: a rating taken back right after it was given was
    refused as gone (404), seen in test_share where a viewer's delete of it got 404, not 403."""
    from chainlit.types import Feedback

    from backend.ui import routes

    thread_id, _ = await new_thread(store)
    q, a = turn(thread_id, "hello", "hi there")
    await store.layer.create_step(q)
    await store.layer.create_step(a)
    assert await store.box.drained(30)
    monkeypatch.setattr(routes, "get_data_layer", lambda: store.layer)
    lock = Held(store.path)
    try:
        feedback_id = await store.layer.upsert_feedback(Feedback(forId=a["id"], value=1, threadId=thread_id))
        assert datalayer.pending_answer_of_feedback(store.layer, feedback_id) == a["id"]
        # what the database says while the write waits (its reads would wait for the lock here)
        monkeypatch.setattr(store.layer, "execute_sql", _no_rows, raising=False)
        assert await routes.answer_of_feedback(feedback_id) == a["id"]
        assert await routes.answer_of_feedback("no-such-rating") is None
    finally:
        lock.release()
    assert await store.box.drained(60)
    monkeypatch.undo()
    monkeypatch.setattr(routes, "get_data_layer", lambda: store.layer)
    assert datalayer.pending_answer_of_feedback(store.layer, feedback_id) is None
    assert await routes.answer_of_feedback(feedback_id) == a["id"]  # stored: read from the database


async def _no_rows(*_args: Any, **_kwargs: Any) -> list[dict[str, Any]]:
    return []


async def test_a_write_stored_while_a_read_runs_is_seen_by_that_read(store, monkeypatch):
    """Read-your-writes at the edge: the owner unshares (the write is pending), a viewer's read starts on the database
    before the write is stored and ends after it. The read must see the chat unshared: the pending writes are taken
    before the database read (taken after it, the list was empty by then and the read had the old row: a share link
    that still opened right after "unshare" returned, seen in test_share)."""
    thread_id, _ = await new_thread(store)
    await store.layer.update_thread(thread_id, metadata={"is_shared": True})
    assert await store.box.drained(30)
    real_read = store.layer.inner.get_thread

    async def read_then_let_the_write_finish(tid: str) -> Any:
        old = await real_read(tid)  # the row as it is before the write is stored
        assert await store.box.drained(30)  # ... which is stored now, while this read is still running
        return old

    monkeypatch.setattr(store.layer.inner, "get_thread", read_then_let_the_write_finish)
    await store.layer.update_thread(thread_id, metadata={"is_shared": False})
    thread = await store.layer.get_thread(thread_id)
    assert datalayer.json_dict(thread["metadata"]).get("is_shared") is False


async def test_remembered_settings_changed_under_a_lock_wait_in_the_outbox_and_are_read_back_then_stored(store):
    """A settings change (the model picked, a system prompt) remembered while the database is locked: ``remember``
    returns without waiting (the turn that changed it goes on), a new chat of the same user already reads the new
    settings, and they are stored once the lock goes. The code before wrote them straight to the database, in the
    turn's path: with every statement slow the turn did not end."""
    prefs = preferences.Preferences(store.path)
    prefs.through(store.box)
    await prefs.remember("user:admin", {"model": "before"})
    assert await store.box.drained(30)
    lock = Held(store.path)
    try:
        await prefs.remember("user:admin", {"model": "pirate", "system_prompt": "Speak like a pirate."})
        await until(lambda: store.box.state().cause == "locked", 60, "the lock seen as the cause")
        assert prefs.get("user:admin") == {"model": "before"}  # the database still holds the old settings …
        assert (await prefs.recall("user:admin"))["model"] == "pirate"  # … and a new chat reads it from there
        with pytest.raises(preferences.SystemPromptRefused):  # a refusal is still said at once, nothing queued
            await prefs.remember("user:admin", {"system_prompt": "x" * (preferences.MAX_SYSTEM_PROMPT_BYTES + 1)})
        assert len(store.box.pending()) == 1
    finally:
        lock.release()
    assert await store.box.drained(60), "the remembered settings not stored after the lock was released"
    assert prefs.get("user:admin") == {"model": "pirate", "system_prompt": "Speak like a pirate."}

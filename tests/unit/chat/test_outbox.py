"""backend/storage/outbox.py: the one path of history writes, journalled, retried per chat in order, replayed at start.

The operations here are plain functions that fail on command (the fault), the journal a real file; the data layer on
a real SQLite database under a real lock and a real "disk is full" is in test_outbox_sqlite.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from backend.storage import outbox
from backend.storage.outbox import Backlog, Outbox, backlog_text

pytestmark = pytest.mark.asyncio

A, B = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


class Flaky:
    """An operation that records what it stored and fails with ``error`` while ``failing`` holds for the chat."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, int]] = []
        self.failing: set[str] = set()
        self.error: Exception = ConnectionRefusedError(111, "Connect call failed")
        self.changed = asyncio.Event()

    async def __call__(self, args: dict[str, Any]) -> None:
        if args["thread"] in self.failing:
            raise self.error
        self.stored.append((args["thread"], args["n"]))
        self.changed.set()


async def until(check: Any, seconds: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.02)


def box_with(folder: Path, op: Flaky, pending_max: int = 100) -> Outbox:
    box = Outbox(folder, pending_max=pending_max)
    box.register("put", op)
    return box


async def test_writes_of_one_chat_are_stored_in_order_after_failures_and_other_chats_go_on(tmp_path):
    op = Flaky()
    box = box_with(tmp_path, op)
    op.failing = {A}
    for n in range(3):
        box.submit(A, "put", {"thread": A, "n": n})
    box.submit(B, "put", {"thread": B, "n": 0})
    await until(lambda: (B, 0) in op.stored, 10, "chat B stored while chat A fails")
    await until(lambda: box.state().cause == "down", 10, "chat A's failure seen")
    assert box.state() == Backlog(writes=3, messages=0, cause="down")
    assert [w.args["n"] for w in box.pending(A)] == [0, 1, 2]  # nothing overtook the failed write
    op.failing = set()
    assert await box.drained(30), "chat A's writes not stored once the database is back"
    assert [n for t, n in op.stored if t == A] == [0, 1, 2]
    assert box.state() == Backlog() and box.journal.path.read_bytes() == b""  # emptied once nothing is pending
    assert box.failures["down"] >= 1
    box.close()


async def test_the_journal_is_written_before_the_attempt(tmp_path):
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(args: dict[str, Any]) -> None:
        started.set()
        await release.wait()

    box = Outbox(tmp_path, pending_max=10)
    box.register("put", slow)
    box.submit(A, "put", {"n": 1})
    await asyncio.wait_for(started.wait(), 10)
    lines = box.journal.path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["args"] == {"n": 1}  # a UI killed now loses nothing
    release.set()
    assert await box.drained(10)
    box.close()


async def left_journal(folder: Path, count: int) -> Path:
    """A journal as a UI process killed with ``count`` writes of chat A pending leaves it (its flock gone)."""
    op = Flaky()
    op.failing = {A}
    box = box_with(folder, op)
    for n in range(count):
        box.submit(A, "put", {"thread": A, "n": n})
    await until(lambda: box.state().cause, 10, "the first failure")
    path = box.journal.path
    for task in list(box._tasks.values()):  # the process dies: its lanes stop, the file stays
        task.cancel()
    box.close()
    return path


async def test_a_journal_left_by_a_dead_process_is_replayed_once_and_removed(tmp_path):
    path = await left_journal(tmp_path, 3)
    op = Flaky()
    box = box_with(tmp_path, op)
    assert await box.start() == 3
    assert await box.drained(10)
    assert op.stored == [(A, 0), (A, 1), (A, 2)]
    assert not path.exists()
    box.close()


async def test_a_journal_held_by_a_live_process_is_left_alone(tmp_path):
    op = Flaky()
    op.failing = {A}
    live = box_with(tmp_path, op)
    live.submit(A, "put", {"thread": A, "n": 0})
    other = box_with(tmp_path, Flaky())
    assert await other.start() == 0  # the live process's flock: not adopted
    assert live.journal.path.exists()
    op.failing = set()
    assert await live.drained(10)
    live.close()
    other.close()


async def test_a_truncated_and_a_corrupt_journal_line_are_set_aside_and_the_good_ones_replayed(tmp_path, caplog):
    path = await left_journal(tmp_path, 4)
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 5 and lines[-1] == b""  # four entries, each ending in a newline
    lines[1] = lines[1].replace(b'"n": 1', b'"n": 7')  # changed on disk: its checksum no longer matches
    lines[3] = lines[3][: len(lines[3]) // 2]  # the process died while writing it
    path.write_bytes(b"\n".join(lines[:4]))
    op = Flaky()
    box = box_with(tmp_path, op)
    with caplog.at_level(logging.ERROR):
        assert await box.start() == 2
    assert await box.drained(10)
    assert op.stored == [(A, 0), (A, 2)]  # the good ones, in order; nothing guessed for the bad
    rejected = [json.loads(r) for r in (tmp_path / outbox.REJECTED).read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rejected] == [(path.name, 2), (path.name, 4)]
    assert "checksum" in rejected[0]["reason"] and "truncated" in rejected[1]["reason"]
    assert f"journal {path.name} line 2 set aside" in caplog.text and "line 4" in caplog.text
    assert oct(os.stat(tmp_path / outbox.REJECTED).st_mode & 0o777) == "0o600"
    box.close()


async def test_a_write_inside_sqlites_own_lock_wait_is_not_called_slow(tmp_path):
    """SQLite waits ``BUSY_TIMEOUT_MS`` on a lock before it fails "database is locked". "Slow" used to show after the
    same 5 s: on a busy machine the status line said "the database is slow" before "locked" (the e2e lock test read
    the first). A write still inside that wait, plus room, is not slow; one pending past ``SLOW_AFTER_S`` is."""
    from backend.storage import outbox as outbox_mod
    from backend.storage.database import BUSY_TIMEOUT_MS

    never = asyncio.Event()

    async def waiting(_args: dict[str, Any]) -> None:  # an attempt still waiting on the database
        await never.wait()

    box = Outbox(tmp_path, pending_max=100)
    box.register("put", waiting)
    box.submit(A, "put", {"thread": A, "n": 0})
    [write] = box.pending(A)
    write.submitted -= BUSY_TIMEOUT_MS / 1000 + 1.0  # past the lock wait; its failure not in yet
    assert box.state() == Backlog(writes=1, messages=0, cause="")
    write.submitted -= outbox_mod.SLOW_AFTER_S
    assert box.state().cause == "slow"
    never.set()
    assert await box.drained(10)
    box.close()


async def test_an_unknown_operation_is_refused_at_submit(tmp_path):
    box = Outbox(tmp_path, pending_max=10)
    with pytest.raises(ValueError, match="'put' has no operation registered"):
        box.submit(A, "put", {})
    box.close()


async def test_past_pending_max_the_outbox_says_full_until_it_drains(tmp_path):
    op = Flaky()
    op.failing = {A}
    box = box_with(tmp_path, op, pending_max=10)
    for n in range(10):
        box.submit(A, "put", {"thread": A, "n": n})
    assert box.full
    op.failing = set()
    assert await box.drained(30)
    assert not box.full
    box.close()


async def test_a_write_that_keeps_failing_for_no_cure_is_set_aside_after_its_attempts(tmp_path, monkeypatch):
    monkeypatch.setattr(outbox, "FIRST_RETRY_S", 0.001)
    monkeypatch.setattr(outbox, "MAX_RETRY_S", 0.001)
    op = Flaky()
    op.failing = {A}
    op.error = ValueError("a row the database refuses")
    box = box_with(tmp_path, op)
    box.submit(A, "put", {"thread": A, "n": 0})
    box.submit(B, "put", {"thread": B, "n": 0})
    assert await box.drained(30)
    assert op.stored == [(B, 0)] and box.failures["error"] == outbox.GIVE_UP
    rejected = json.loads((tmp_path / outbox.REJECTED).read_text())
    assert "failed 20 times" in rejected["reason"] and json.loads(rejected["text"])["n"] == 0
    box.close()


@pytest.mark.parametrize(
    ("backlog", "lang", "want"),
    [
        (Backlog(5, 3, "locked"), "en", "history: 3 messages waiting to be saved · the database is locked"),
        (Backlog(3, 1, "slow"), "en", "history: 1 message waiting to be saved · the database is slow"),
        (Backlog(2, 0, "down"), "en", "history: 2 changes waiting to be saved · the database is not answering"),
        (Backlog(4, 2, "full"), "zh-CN", "历史记录：2 条消息等待保存 · 磁盘已满"),
        (Backlog(4, 2, ""), "en", ""),  # writes in flight, none failed nor slow yet: nothing to tell
    ],
)
async def test_the_status_line_names_the_waiting_messages_and_the_cause(backlog, lang, want):
    assert backlog_text(backlog, lang) == want

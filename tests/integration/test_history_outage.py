"""History while the database is locked, down or slow, with the product launched as start.sh launches it (login on),
over Chainlit's real socket protocol, against the fake OpenAI server (issue 32).

Three launches of the product serve the module, each test in a chat of its own: one on SQLite (the lock tests, with a
``pending_max`` the first test stays far below), one on PostgreSQL (stopped mid-answer, the UI killed while it is
down, and UI A of the two-UI test), and one behind the slow-database proxy; the two-UI test launches its UI B.
Each test checks only the log its own turns wrote (``LiveApp.mark``).

Before the outbox (backend/storage/outbox.py) the turn sent during the fault was answered on screen and lost: Chainlit's
data layer logged "An error occurred: (sqlite3.OperationalError) database is locked" (or the connection error) and
returned, and nothing kept the write. Each test here fails on that code where it checks the waiting turn stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import text

from backend.storage import database
from tests.e2e import support as e2e
from tests.e2e.test_history import LOGIN, PASSWORD, USER
from tests.e2e.test_history import launch as launch_ready
from tests.fakes.openai_server import expected_text
from tests.support.faults import Held
from tests.support.postgres import Postgres, free_port, running_postgres
from tests.support.socket_client import Session, Turn, login_cookie

pytestmark = [pytest.mark.integration, pytest.mark.product]

TOKENS = 80
SLOW = f"[[normal:tokens={TOKENS}:rate=10]]"  # about 8 s of streaming
LOCK_S = 40.0  # the lock: a backup tool or a sqlite3 shell left in a transaction
WRITE_DELAY_S = 5.0  # the slow database: each write statement reaches PostgreSQL this late
PACED = "[[normal:tokens=40:rate=100]]"  # the slow-database test's answers: about 0.4 s of streaming each


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    """A server of this module's own: its tests stop and start it (pg_ctl), which the session's shared one must not
    see. In the system temp dir: the postgres OS user cannot enter pytest's folders."""
    with running_postgres() as server:
        yield server


async def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds:.0f} s: {what}")
        await asyncio.sleep(0.1)
    return found


class Product(NamedTuple):
    app: e2e.LiveApp
    db: database.Database  # its history, read by the test directly


@pytest.fixture(scope="module")
def sqlite_app(fake, tmp_path_factory) -> Iterator[Product]:
    app = launch_ready(fake, tmp_path_factory.mktemp("sqlite"), **LOGIN, QWENCHAT_HISTORY_PENDING_MAX="10")
    try:
        yield Product(app, database.sqlite_file(app.log_dir / "history.sqlite3"))
    finally:
        e2e.stop(app)


@pytest.fixture(scope="module")
def pg_app(fake, pg, tmp_path_factory) -> Iterator[Product]:
    env = pg_env(pg, "shared")
    app = launch_ready(fake, tmp_path_factory.mktemp("pg"), **env)
    try:
        yield Product(app, database.from_setting(env["QWENCHAT_HISTORY_DB"], Path("/unused")))
    finally:
        e2e.stop(app)


def get(app: e2e.LiveApp, path: str, cookie: str) -> Any:
    req = urllib.request.Request(app.url + path, headers={"Cookie": cookie})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def history_text(app: e2e.LiveApp, cookie: str) -> str:
    return str(get(app, "/qwenchat/status?lang=en", cookie).get("history_text", "<no history_text>"))


def chat_steps(db: database.Database, thread_id: str) -> list[tuple[str, str, str]]:
    """(id, type, output) of the chat's user messages and answers as stored, in Chainlit's order (createdAt); [] when
    the database does not answer."""
    query = text(
        'SELECT "id", "type", "output" FROM steps WHERE "threadId" = :t '
        "AND \"type\" IN ('user_message', 'assistant_message') ORDER BY \"createdAt\""
    )
    try:
        return [tuple(r) for r in database.store(db).run(lambda c: c.execute(query, {"t": thread_id}).all())]
    except Exception:  # noqa: BLE001 - down: nothing readable yet
        return []


def ids(turn: Turn) -> list[str]:
    """The user message's id, then its answer's."""
    answers = [i for i in turn.order if turn.steps[i].get("type") == "assistant_message"]
    return [turn.message_id, answers[-1]]


def thread_of(turn: Turn) -> str:
    return str(turn.steps[ids(turn)[1]]["threadId"])


def clean_log(app: e2e.LiveApp, since: int, *, reads_failed: bool = False) -> None:
    """No traceback of the history's write path in ``app``'s ui.log after ``since`` (a ``mark``); and, unless the
    server was down (``reads_failed``: Chainlit's own reads log "An error occurred: ..." then), no traceback and no
    write swallowed by Chainlit at all."""
    log = app.log("ui", since=since)
    if not reads_failed:
        assert "Traceback" not in log, log[-3000:]
        assert "An error occurred" not in log, log[-3000:]
    # with the server down, Chainlit's login lookup and the remembered preferences log their own tracebacks
    assert "outbox.py" not in log and "datalayer.py" not in log, log[-3000:]


def journal_empty(folder: Path) -> bool:
    return all(j.stat().st_size == 0 for j in folder.glob("history-pending-*.jsonl"))


async def stored_within(db: database.Database, thread_id: str, want: list[str], seconds: float, what: str) -> float:
    """Wait until the chat's stored messages are exactly ``want`` (ids, in order); when that was seen."""
    await until(lambda: [s[0] for s in chat_steps(db, thread_id)] == want, seconds, what)
    return time.monotonic()


# ---------------------------------------------------------------- SQLite: another process's exclusive lock


@pytest.mark.asyncio
async def test_a_turn_answered_under_a_40_s_exclusive_lock_is_stored_after_it_and_the_status_line_said_so(
    sqlite_app,
):
    app, db = sqlite_app
    path, mark = app.log_dir / "history.sqlite3", app.mark("ui")
    lock: Held | None = None
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as s:
            first = await s.send("What is the capital of France?")
            assert first.answered, first.summary()
            thread_id = thread_of(first)
            await stored_within(db, thread_id, ids(first), 30, "the first turn stored")
            lock, locked_at = Held(path), time.monotonic()
            second = await s.start(f"{SLOW} And of Italy?")
            await s.wait(120)  # the answer streams and ends under the lock: it never waits for the database
            assert second.answered, second.summary()
            said = await until(lambda: "waiting" in (t := history_text(app, cookie)) and t, 60, "the status line")
            assert said == "history: 2 messages waiting to be saved · the database is locked"
            metrics = urllib.request.urlopen(urllib.request.Request(app.url + "/metrics", headers={"Cookie": cookie}))
            assert 'qwenchat_history_write_failures_total{cause="locked"}' in metrics.read().decode()
            shown = get(app, f"/project/thread/{thread_id}", cookie)  # a resume or a reload now
            assert [st["id"] for st in shown["steps"] if st["type"] in ("user_message", "assistant_message")] == [
                *ids(first),
                *ids(second),
            ]
            assert [st[0] for st in chat_steps(db, thread_id)] == ids(first)  # really not stored yet
            await asyncio.sleep(max(0.0, LOCK_S - (time.monotonic() - locked_at)))  # the lock's length: the scenario
            released = lock.release()
            lock = None
            back = await stored_within(db, thread_id, [*ids(first), *ids(second)], 120, "the locked turn stored")
            print(f"\nSQLite lock released -> the waiting turn stored: {back - released:.1f} s (polled every 0.1 s)")
            await until(lambda: history_text(app, cookie) == "", 30, "the status line cleared")
            third = await s.send("And of Spain?")
            await stored_within(db, thread_id, [*ids(first), *ids(second), *ids(third)], 30, "the next turn after it")
            answer = chat_steps(db, thread_id)[3][2]
            assert answer.startswith(expected_text(TOKENS)) and " tokens · " in answer, answer  # its final form
    finally:
        if lock is not None:
            lock.release()
    clean_log(app, mark)


def pending_writes(app: e2e.LiveApp, cookie: str) -> float:
    req = urllib.request.Request(app.url + "/metrics", headers={"Cookie": cookie})
    with urllib.request.urlopen(req, timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("qwenchat_history_pending_writes "):
                return float(line.split()[1])
    return 0.0


@pytest.mark.asyncio
async def test_past_pending_max_a_new_chat_is_refused_with_its_text_and_the_open_chat_goes_on(sqlite_app):
    app, db = sqlite_app
    path, mark = app.log_dir / "history.sqlite3", app.mark("ui")
    lock: Held | None = None
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as s:
            turns = [await s.send("What is the capital of France?")]
            thread_id = thread_of(turns[0])
            await stored_within(db, thread_id, ids(turns[0]), 30, "the first turn stored")
            lock = Held(path)
            while pending_writes(app, cookie) < 10:
                assert len(turns) < 12, f"{pending_writes(app, cookie)} writes pending after {len(turns)} turns"
                turns.append(await s.send(f"turn {len(turns)} while locked"))
                assert turns[-1].answered, turns[-1].summary()
            await until(lambda: "locked" in history_text(app, cookie), 60, "the lock named as the cause")
            async with Session(app.url, cookie=cookie) as other:
                refused = await other.start("a new chat while the history is behind")
                said = await until(lambda: refused.errors, 30, "the new chat's message refused")
                assert "New chats are paused" in said[0] and "a new chat while the history is behind" in said[0]
                assert "the database is locked" in said[0], said
            goes_on = await s.send("the open chat goes on")
            assert goes_on.answered, goes_on.summary()
            lock.release()
            lock = None
            want = [i for t in [*turns, goes_on] for i in ids(t)]
            await stored_within(db, thread_id, want, 120, "every turn of the open chat stored")
            async with Session(app.url, cookie=cookie) as later:
                fine = await later.send("a new chat once the history caught up")
                assert fine.answered, fine.summary()
    finally:
        if lock is not None:
            lock.release()
    clean_log(app, mark)


# ---------------------------------------------------------------- PostgreSQL stopped and started


def pg_env(pg: Postgres, name: str) -> dict[str, str]:
    return {**LOGIN, "QWENCHAT_HISTORY_DB": pg.create_database(name)}


@pytest.mark.asyncio
async def test_postgresql_stopped_mid_answer_then_started_again_gets_the_turn_in_order(pg_app, pg):
    app, db = pg_app
    mark, stopped = app.mark("ui"), False
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as s:
            first = await s.send("What is the capital of France?")
            thread_id = thread_of(first)
            await stored_within(db, thread_id, ids(first), 30, "the first turn stored")
            second = await s.start(f"{SLOW} And of Italy?")
            await until(lambda: second.first_token_at is not None, 30, "the second answer streaming")
            pg.stop()
            stopped = True
            await s.wait(120)
            assert second.answered, second.summary()
            said = await until(lambda: "waiting" in (t := history_text(app, cookie)) and t, 60, "the status line")
            assert said.endswith("· the database is not answering"), said
            pg.start()
            started, stopped = time.monotonic(), False
            back = await stored_within(db, thread_id, [*ids(first), *ids(second)], 120, "the waiting turn stored")
            print(f"\nPostgreSQL started -> the waiting turn stored: {back - started:.1f} s (polled every 0.1 s)")
            await until(lambda: history_text(app, cookie) == "", 30, "the status line cleared")
            third = await s.send("And of Spain?")
            await stored_within(db, thread_id, [*ids(first), *ids(second), *ids(third)], 30, "the next turn after it")
            shown = get(app, f"/project/thread/{thread_id}", cookie)  # what a resume and /export read
            assert [st["id"] for st in shown["steps"] if st["type"] in ("user_message", "assistant_message")] == [
                *ids(first),
                *ids(second),
                *ids(third),
            ]
    finally:
        if stopped:
            pg.start()
    clean_log(app, mark, reads_failed=True)


@pytest.mark.asyncio
async def test_the_ui_killed_while_postgresql_is_down_replays_its_journal_once_both_are_back(pg_app, pg):
    """PostgreSQL stopped, a turn answered (kept in the journal), the UI killed (kill -9; the launcher starts a new
    one), PostgreSQL started: the new UI replays the journal, and every step is stored once."""
    app, db = pg_app
    mark, stopped = app.mark("ui"), False
    messages_before = message_rows(db)
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as s:
            first = await s.send("What is the capital of France?")
            thread_id = thread_of(first)
            await stored_within(db, thread_id, ids(first), 30, "the first turn stored")
            pg.stop()
            stopped = True
            second = await s.send("And of Italy?")
            assert second.answered, second.summary()
            await until(lambda: "waiting" in history_text(app, cookie), 60, "the status line")
        journals = list(app.log_dir.glob("history-pending-*.jsonl"))
        assert journals and any(ids(second)[0] in j.read_text() for j in journals), journals
        victim = e2e.ui_pid(app)
        os.kill(victim, signal.SIGKILL)
        pg.start()
        started, stopped = time.monotonic(), False
        want = [*ids(first), *ids(second)]
        back = await stored_within(db, thread_id, want, 180, "the journal replayed by the new UI")
        print(f"\nUI killed, PostgreSQL started -> the journal's turn stored: {back - started:.1f} s")
        assert e2e.ui_pid(app) != victim
        await until(lambda: journal_empty(app.log_dir), 60, "the journal emptied: every write stored")
        assert [st[0] for st in chat_steps(db, thread_id)] == want  # each message once, in order
        assert message_rows(db) - messages_before == 4  # and nowhere else: no chat got a copy
    finally:
        if stopped:
            pg.start()
    assert "writes from an earlier run queued again" in app.log("ui", since=mark)
    clean_log(app, mark, reads_failed=True)


def message_rows(db: database.Database) -> int:
    """The user messages and answers stored, in every chat."""
    query = text("SELECT count(*) FROM steps WHERE \"type\" IN ('user_message', 'assistant_message')")
    return int(database.store(db).run(lambda c: c.execute(query).scalar_one()))


# ---------------------------------------------------------------- a slow database: 5 s per write


class SlowWrites:
    """A TCP proxy in front of PostgreSQL that holds each client packet ``WRITE_DELAY_S`` before passing it on, in
    order, while ``slow`` is set: a database that takes that long for every statement, writes and reads."""

    def __init__(self, target: int) -> None:
        self.port, self.target, self.slow = free_port(), target, False
        self._server: asyncio.AbstractServer | None = None
        self._relays: set[asyncio.Task[None]] = set()
        self.held: list[tuple[float, float]] = []  # (arrived, passed on), time.monotonic(), of each packet held

    def waited_on(self, since: float, until: float) -> list[tuple[float, float]]:
        """The held packets that came after ``since`` and were passed on by ``until``: a round trip to the database
        that something between those two moments could have waited for."""
        return [(a, b) for a, b in list(self.held) if a >= since and b <= until]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def close(self) -> None:
        """Stop listening and end every relayed connection, so its loop can stop with nothing left open."""
        if self._server is not None:
            self._server.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
            self._relays.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: bool) -> None:
        try:
            while chunk := await src.read(65536):
                # Every packet, reads too: the statements' text is not there to tell a write by (asyncpg prepares
                # each once per connection, then sends only Bind/Execute; holding packets with "INSERT" in them
                # let the prepared writes through at once, and the test failed on a database that was not slow).
                if client and self.slow:
                    arrived = time.monotonic()
                    await asyncio.sleep(WRITE_DELAY_S)
                    self.held.append((arrived, time.monotonic()))
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()


def proxy_thread(target: int) -> tuple[SlowWrites, asyncio.AbstractEventLoop]:
    """The proxy on a loop of its own (a thread), so the test's own waiting never holds it up."""
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    proxy = SlowWrites(target)
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    return proxy, loop


@pytest.mark.asyncio
async def test_a_database_that_takes_5_s_per_write_does_not_hold_up_the_answers(fake, tmp_path, pg):
    """Turns answered with the writes healthy, then with each write held 5 s: each slow turn's answer has ended before
    its user message is stored (the answer did not wait), and all are stored after. The latencies are printed.
    Fails on the code where the turn's remembered settings were written straight to the database: the answer streamed
    in 0.4 s, and its turn did not end within 60 s."""
    name = "slowwrites"
    pg.create_database(name)
    proxy, loop = proxy_thread(pg.port)
    env = {**LOGIN, "QWENCHAT_HISTORY_DB": pg.url(name, port=proxy.port)}
    db = database.from_setting(pg.url(name), Path("/unused"))  # the test reads around the proxy
    app = launch_ready(fake, tmp_path, **env)
    mark = app.mark("ui")
    healthy: list[float] = []
    slow: list[float] = []
    try:
        cookie = login_cookie(app.url, USER, PASSWORD)
        async with Session(app.url, cookie=cookie) as s:
            turns = []
            for n in range(3):
                turn = await s.send(f"{PACED} healthy question {n}")
                assert turn.answered, turn.summary()
                healthy.append(turn.total_s or 0.0)
                turns.append(turn)
            thread_id = thread_of(turns[0])
            await stored_within(db, thread_id, [i for t in turns for i in ids(t)], 30, "the healthy turns stored")
            proxy.slow = True
            for n in range(3):
                turn = await s.send(f"{PACED} slow question {n}")
                assert turn.answered, turn.summary()
                slow.append(turn.total_s or 0.0)
                stored_now = [st[0] for st in chat_steps(db, thread_id)]
                assert turn.message_id not in stored_now, "the answer ended after its question was stored"
                # Ordered events, not a speed limit: no database round trip begun after the question was sent had
                # come back before its answer ended, so nothing in the turn waited for the database.
                waited = proxy.waited_on(turn.sent_at, turn.done_at or 0.0)
                assert not waited, f"the turn waited for {len(waited)} database round trip(s): {turn.summary()}"
                turns.append(turn)
            proxy.slow = False
            await stored_within(db, thread_id, [i for t in turns for i in ids(t)], 180, "every slow turn stored")
    finally:
        e2e.stop(app)
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    print(f"\nanswer latency, healthy database: {[round(x, 2) for x in healthy]} s")
    print(f"answer latency, 5 s per write:    {[round(x, 2) for x in slow]} s")
    print(f"median ratio slow/healthy: {sorted(slow)[1] / max(sorted(healthy)[1], 1e-6):.2f}")
    clean_log(app, mark)


# ---------------------------------------------------------------- two UI processes on one PostgreSQL


@pytest.mark.asyncio
async def test_two_uis_on_one_postgresql_one_with_a_pending_journal(fake, tmp_path, pg, pg_app):
    """UIs A (the module's product on PostgreSQL) and B (launched here, its own folder, the same database).
    PostgreSQL stops; A answers a turn it must keep; the server starts again and B chats at once, while A's journal
    drains: each turn is stored once, in its chat, and B reads A's chat whole."""
    a, db = pg_app
    mark_a, stopped = a.mark("ui"), False
    b = launch_ready(fake, tmp_path, **LOGIN, QWENCHAT_HISTORY_DB=pg.url("shared"))
    try:
        cookie_a, cookie_b = login_cookie(a.url, USER, PASSWORD), login_cookie(b.url, USER, PASSWORD)
        async with Session(a.url, cookie=cookie_a) as sa, Session(b.url, cookie=cookie_b) as sb:
            first = await sa.send("What is the capital of France?")
            thread_a = thread_of(first)
            await stored_within(db, thread_a, ids(first), 30, "A's first turn stored")
            pg.stop()
            stopped = True
            second = await sa.send("And of Italy?")
            assert second.answered, second.summary()
            await until(lambda: "waiting" in history_text(a, cookie_a), 60, "A's status line")
            assert not journal_empty(a.log_dir)
            pg.start()
            stopped = False
            other = await sb.send("What is the capital of Spain?")
            assert other.answered, other.summary()
            await stored_within(db, thread_a, [*ids(first), *ids(second)], 120, "A's waiting turn stored")
            await stored_within(db, thread_of(other), ids(other), 60, "B's turn stored")
            seen_by_b = get(b, f"/project/thread/{thread_a}", cookie_b)
            assert [st["id"] for st in seen_by_b["steps"] if st["type"] in ("user_message", "assistant_message")] == [
                *ids(first),
                *ids(second),
            ]
            await until(lambda: journal_empty(a.log_dir), 60, "A's journal emptied")
            assert journal_empty(b.log_dir)
    finally:
        if stopped:
            pg.start()
        e2e.stop(b)
    clean_log(a, mark_a, reads_failed=True)
    clean_log(b, 0, reads_failed=True)

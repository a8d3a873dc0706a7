"""The one path of every history write: journalled first, tried in the background, retried until stored, in order per
chat (issue 32: a turn written while the database was locked, full or down was lost for good).

    box = Outbox(folder, pending_max=1000)       # the journal: folder/history-pending-<pid>-<ns>.jsonl
    box.register("create_step", write_step)      # async fn(args) that RAISES when the write failed
    box.submit(thread_id, "create_step", {...})  # journalled, queued behind that chat's earlier writes; never waits
    await box.start()                            # at start: journals left by an earlier UI process replayed
    box.pending(thread_id)                       # writes not stored yet, oldest first (a resume merges them in)
    box.state()                                  # Backlog(writes, messages, cause) for the status line and /metrics

- **Journal before the attempt.** ``submit`` appends the write to the journal (flushed to the OS, no fsync: what it
  guards against is the UI process dying, kill -9 or the OOM killer, not the machine losing power) before any
  attempt, so a write in flight to a slow database when the UI dies is replayed too. A stored write appends
  ``{"done": seq}``; the file is emptied whenever nothing is pending.
- **One lane per chat.** Writes of one thread id run one at a time, in submit order; a failed write is retried (0.5 s
  doubling to ``MAX_RETRY_S``, sooner as soon as any other write succeeds) and nothing behind it overtakes it. Other
  chats' lanes go on. A write that fails ``GIVE_UP`` times for a cause other than a lock, a full disk, a server down
  or slow (a bug, a refused row) is set aside with the journal's rejects and logged; nothing else is ever dropped.
- **Replay is idempotent.** Each write carries its own ids (step ids, feedback ids, vote keys), and every operation is
  an upsert or a delete by id: a write stored just before a crash and replayed after it changes nothing.
- **A bad journal line is never guessed.** At start each ``history-pending-*.jsonl`` no live process holds (flock)
  is read line by line; a line that is not whole JSON, lacks a field, fails its checksum or names an unknown
  operation is copied to ``history-pending.rejected.jsonl`` with its file, line number and reason, and logged; the
  good lines are replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from backend.storage.database import BUSY_TIMEOUT_MS, failure
from backend.storage.database import cause as cause_of
from backend.text import t
from backend.web.metrics import METRICS

logger = logging.getLogger(__name__)

JOURNAL_PREFIX = "history-pending-"
REJECTED = "history-pending.rejected.jsonl"
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0
WRITE_TIMEOUT_S = 60.0  # one attempt; a database that has not answered by then is retried ("slow")
# A write pending this long without a failure yet shows as "the database is slow". Longer than SQLite's own wait on a
# lock (its busy timeout), with room for a busy machine: a lock is told as "locked" once that wait fails, never first
# as "slow" (with the two equal, which one the status line showed first was a race).
SLOW_AFTER_S = BUSY_TIMEOUT_MS / 1000 + 5.0
GIVE_UP = 20  # attempts of a write that fails for a cause no wait cures ("error")
RETRYABLE = ("locked", "full", "down", "slow")
MESSAGE_OPS = ("create_step", "update_step")

Operation = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass
class Write:
    """One history write: its operation and JSON arguments, in the lane of one chat."""

    seq: int
    thread: str
    op: str
    args: dict[str, Any]
    submitted: float = field(default_factory=time.monotonic)
    attempts: int = 0
    cause: str = ""  # why its last attempt failed ("" before any failure)

    def message_id(self) -> str | None:
        """The chat message (user question or answer) this write stores, if it stores one."""
        step = self.args.get("step") if self.op in MESSAGE_OPS else None
        if isinstance(step, dict) and step.get("type") in ("user_message", "assistant_message"):
            return str(step.get("id"))
        return None


@dataclass(frozen=True)
class Backlog:
    """What the status line says: writes waiting, the chat messages among them, and why (a ``database.CAUSES``)."""

    writes: int = 0
    messages: int = 0
    cause: str = ""  # "" while nothing has failed or been slow: nothing to tell


def _checksum(entry: dict[str, Any]) -> str:
    body = json.dumps(entry, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class BadLine:
    file: Path
    line: int
    reason: str
    text: str


def read_journal(path: Path, known_ops: set[str]) -> tuple[list[dict[str, Any]], list[BadLine]]:
    """The journal's writes not marked done, in order, and its unreadable lines (never guessed at)."""
    entries: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    bad: list[BadLine] = []
    raw = path.read_bytes()
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        reason, entry = _parse(line, known_ops)
        if reason:
            bad.append(BadLine(path, number, reason, line.decode("utf-8", "replace")[:100_000]))
        elif "done" in entry:
            done.add(int(entry["done"]))
        else:
            entries[int(entry["seq"])] = entry
    return [e for seq, e in sorted(entries.items()) if seq not in done], bad


def _parse(line: bytes, known_ops: set[str]) -> tuple[str, dict[str, Any]]:
    try:
        entry = json.loads(line)
    except ValueError:
        return "not whole JSON (a truncated or corrupt line)", {}
    if not isinstance(entry, dict):
        return "not a JSON object", {}
    if set(entry) == {"done"} and isinstance(entry["done"], int):
        return "", entry
    body = {k: v for k, v in entry.items() if k != "sum"}
    if set(body) != {"seq", "thread", "op", "args"} or not isinstance(body["args"], dict):
        return "fields missing or unknown", {}
    if not isinstance(body["seq"], int) or not isinstance(body["thread"], str):
        return "seq or thread of the wrong type", {}
    if entry.get("sum") != _checksum(body):
        return "checksum does not match (changed or corrupt)", {}
    if body["op"] not in known_ops:
        return f"unknown operation {body['op']!r}", {}
    return "", body


class Journal:
    """This process's journal file, held with an exclusive flock while the process lives."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.path = folder / f"{JOURNAL_PREFIX}{os.getpid()}-{time.time_ns()}.jsonl"  # unique: a reused pid too
        self._file: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - held for the process's life
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.chmod(self.path, 0o600)  # chat text: owner only, like the history itself

    def append(self, entry: dict[str, Any]) -> None:
        line = entry if "done" in entry else {**entry, "sum": _checksum(entry)}
        self._file.write(json.dumps(line, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
        self._file.flush()

    def empty(self) -> None:
        self._file.truncate(0)

    def set_aside(self, bad: list[BadLine]) -> Path:
        rejected = self.folder / REJECTED
        with open(rejected, "ab") as out:
            for b in bad:
                row = {"file": b.file.name, "line": b.line, "reason": b.reason, "text": b.text}
                out.write(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
        os.chmod(rejected, 0o600)
        return rejected

    def close(self) -> None:
        self._file.close()


class Outbox:
    """History writes, journalled and retried per chat (see the module docstring)."""

    def __init__(self, folder: Path, *, pending_max: int) -> None:
        self.folder = folder
        self.pending_max = pending_max
        self._ops: dict[str, Operation] = {}
        self._journal: Journal | None = None
        self._lanes: dict[str, deque[Write]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._seq = 0
        self._recovered = asyncio.Event()
        self.failures: Counter[str] = Counter()  # by cause, since start (/metrics)
        self.stored = 0
        self.last_stored_at = 0.0  # time.monotonic() of the last write stored (tests measure recovery with it)

    def register(self, op: str, fn: Operation) -> None:
        self._ops[op] = fn

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self.folder)
        return self._journal

    # ------------------------------------------------------------ writing

    def submit(self, thread: str, op: str, args: dict[str, Any]) -> None:
        """Journal the write, queue it behind the chat's earlier ones and return: the caller never waits for the
        database."""
        if op not in self._ops:
            raise ValueError(f"history write {op!r} has no operation registered; known: {', '.join(self._ops)}")
        self._seq += 1
        write = Write(self._seq, thread, op, args)
        self.journal.append({"seq": write.seq, "thread": thread, "op": op, "args": args})
        self._lanes.setdefault(thread, deque()).append(write)
        METRICS.history_pending(self._count())
        if thread not in self._tasks:
            self._tasks[thread] = asyncio.create_task(self._drain(thread), name=f"history-{thread[:8]}")

    async def _drain(self, thread: str) -> None:
        lane = self._lanes[thread]
        delay = FIRST_RETRY_S
        try:
            while lane:
                write = lane[0]
                if await self._attempt(write):
                    lane.popleft()
                    delay = FIRST_RETRY_S
                    continue
                await self._pause(delay)
                delay = min(delay * 2, MAX_RETRY_S)
        finally:
            del self._lanes[thread], self._tasks[thread]

    async def _attempt(self, write: Write) -> bool:
        """True when ``write`` is done with: stored, or set aside after ``GIVE_UP`` failures no wait cures."""
        write.attempts += 1
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S) as limit:
                await self._ops[write.op](write.args)
        except Exception as exc:  # noqa: BLE001 - every failure is kept and retried; none reaches the chat
            slow = isinstance(exc, TimeoutError) and limit.expired()
            return self._failed(write, "slow" if slow else cause_of(exc), exc)
        self._done(write)
        if write.cause:
            logger.info("history: %s of chat %s stored after %d attempts", write.op, write.thread, write.attempts)
            self._recovered.set()  # other chats' lanes retry now, not at the end of their backoff
            self._recovered = asyncio.Event()
        return True

    def _failed(self, write: Write, cause: str, exc: BaseException) -> bool:
        self.failures[cause] += 1
        METRICS.history_failed(cause)
        first = not write.cause
        write.cause = cause
        if cause not in RETRYABLE and write.attempts >= GIVE_UP:
            logger.error(
                "history: %s of chat %s set aside in %s after %d failures: %s",
                write.op,
                write.thread,
                REJECTED,
                write.attempts,
                failure(exc),
            )
            bad = BadLine(
                self.journal.path, 0, f"failed {write.attempts} times: {failure(exc)}", json.dumps(write.args)
            )
            self.journal.set_aside([bad])
            self._done(write)
            return True
        if first:
            logger.warning(
                "history: %s of chat %s not stored (%s: %s); kept and retried",
                write.op,
                write.thread,
                cause,
                failure(exc),
            )
        return False

    def _done(self, write: Write) -> None:
        self.stored += 1
        self.last_stored_at = time.monotonic()
        METRICS.history_pending(self._count() - 1)
        if self._count() > 1:  # ``write`` still heads its lane
            self.journal.append({"done": write.seq})
        else:
            self.journal.empty()  # it was the last pending write

    def _count(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._recovered.wait(), seconds * random.uniform(0.8, 1.2))

    # ------------------------------------------------------------ start and reading

    async def start(self) -> int:
        """Replay every journal no live process holds (this one's earlier runs, a killed UI's); returns how many
        writes were queued again."""
        replayed = 0
        for path in sorted(self.folder.glob(f"{JOURNAL_PREFIX}*.jsonl")):
            if path == self.journal.path:
                continue
            replayed += self._adopt(path)
        if replayed:
            logger.info("history: %d writes from an earlier run queued again (journal replay)", replayed)
        return replayed

    def _adopt(self, path: Path) -> int:
        with open(path, "rb") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # a live UI process owns it
            entries, bad = read_journal(path, set(self._ops))
            if bad:
                rejected = self.journal.set_aside(bad)
                for b in bad:
                    logger.error(
                        "history: journal %s line %d set aside in %s: %s", path.name, b.line, rejected, b.reason
                    )
            for entry in entries:
                self.submit(entry["thread"], entry["op"], entry["args"])
            path.unlink()
        return len(entries)

    def pending(self, thread: str | None = None) -> list[Write]:
        """The writes not stored yet, oldest first: of one chat, or of all."""
        if thread is not None:
            return list(self._lanes.get(thread, ()))
        return [w for lane in list(self._lanes.values()) for w in lane]

    def state(self) -> Backlog:
        writes = [w for lane in self._lanes.values() for w in lane]
        if not writes:
            return Backlog()
        messages = len({m for w in writes if (m := w.message_id())})
        causes = [w.cause for w in writes if w.cause]
        slow = time.monotonic() - min(w.submitted for w in writes) > SLOW_AFTER_S
        return Backlog(len(writes), messages, causes[-1] if causes else ("slow" if slow else ""))

    @property
    def full(self) -> bool:
        """Past ``[history] pending_max`` writes: new chats are refused until the backlog drains."""
        return self._count() >= self.pending_max

    async def drained(self, timeout: float) -> bool:
        """Wait until nothing is pending (tests, shutdown); False when ``timeout`` s passed first."""
        deadline = time.monotonic() + timeout
        while self._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._tasks

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()


def cause_text(backlog: Backlog, lang: str) -> str:
    """Why writes wait, in ``lang`` ("the database is locked")."""
    return t(f"history.cause.{backlog.cause or 'slow'}", lang)


def backlog_text(backlog: Backlog, lang: str) -> str:
    """The status line's part about the history ("" when there is nothing to tell): "history: 3 messages waiting to
    be saved · the database is locked"."""
    if not backlog.cause:
        return ""
    if backlog.messages == 1:
        return t("history.waiting_message", lang, cause=cause_text(backlog, lang))
    if backlog.messages:
        return t("history.waiting_messages", lang, count=backlog.messages, cause=cause_text(backlog, lang))
    return t("history.waiting_writes", lang, count=backlog.writes, cause=cause_text(backlog, lang))

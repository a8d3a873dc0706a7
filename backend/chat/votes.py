"""Blind-compare votes: who won each compared turn, per user and thread; the leaderboard; export input.

store = VoteStore(preferences.db_path(settings))   # the same SQLite file as the remembered settings
replaced = store.record(Vote(...))                # True: an earlier vote on (thread_id, turn_id) was replaced
store.leaderboard()                               # [Standing(model, wins, losses, ties)], most wins first
store.all()                                       # every vote, oldest first (export-feedback reads it)

Each call opens its own connection (callers run it in a thread: ``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast

from .client import sanitize_text
from .preferences import sqlite_transaction

Winner = Literal["a", "b", "tie"]
WINNERS: tuple[Winner, ...] = ("a", "b", "tie")


@dataclass(frozen=True)
class Vote:
    user: str
    thread_id: str
    turn_id: str
    prompt: list[dict[str, str]]  # the messages sent to both models (OpenAI format, ending with the user turn)
    answer_a: str
    answer_b: str
    model_a: str
    model_b: str
    winner: Winner
    comment: str = ""
    created_at: str = ""  # ISO 8601 (UTC), set by VoteStore.record when empty


@dataclass(frozen=True)
class Standing:
    model: str
    wins: int
    losses: int
    ties: int


class VoteStore:
    """One SQLite row per (thread_id, turn_id): a later vote on the same turn replaces the earlier one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS votes ("
                " thread_id TEXT NOT NULL, turn_id TEXT NOT NULL, user TEXT NOT NULL, prompt TEXT NOT NULL,"
                " answer_a TEXT NOT NULL, answer_b TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL,"
                " winner TEXT NOT NULL CHECK (winner IN ('a', 'b', 'tie')), comment TEXT NOT NULL DEFAULT '',"
                " created_at TEXT NOT NULL, seq INTEGER NOT NULL DEFAULT 0,"
                " PRIMARY KEY (thread_id, turn_id))"
            )

    def _db(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return sqlite_transaction(self.path)

    def record(self, vote: Vote) -> bool:
        """Store ``vote``; True when it replaced an earlier vote on the same (thread_id, turn_id) (the last wins)."""
        if vote.winner not in WINNERS:
            raise ValueError(f"winner must be one of {', '.join(WINNERS)}, not {vote.winner!r}")
        if not vote.created_at:
            vote = replace(vote, created_at=datetime.now(UTC).isoformat(timespec="milliseconds"))
        s = sanitize_text  # a lone surrogate in an answer (a cut stream) must not make the write fail: U+FFFD
        row = (
            s(vote.thread_id),
            s(vote.turn_id),
            s(vote.user),
            s(json.dumps(vote.prompt, ensure_ascii=False)),
            s(vote.answer_a),
            s(vote.answer_b),
            s(vote.model_a),
            s(vote.model_b),
            vote.winner,
            s(vote.comment),
            vote.created_at,
        )
        with self._db() as db:
            before = db.execute("SELECT 1 FROM votes WHERE thread_id = ? AND turn_id = ?", (row[0], row[1])).fetchone()
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM votes").fetchone()[0]
            db.execute(
                "INSERT OR REPLACE INTO votes (thread_id, turn_id, user, prompt, answer_a, answer_b, model_a, model_b,"
                " winner, comment, created_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, seq),
            )
        return before is not None

    def all(self) -> list[Vote]:
        """Every vote, oldest first (a replaced vote counts from its last recording)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT user, thread_id, turn_id, prompt, answer_a, answer_b, model_a, model_b, winner, comment,"
                " created_at FROM votes ORDER BY seq"
            ).fetchall()
        return [_vote(r) for r in rows]

    def leaderboard(self) -> list[Standing]:
        """Wins, losses and ties per model, most wins first (then fewest losses, then the name).

        A turn with the same model on both sides counts once for it (a tie, or a win and a loss).
        """
        tally: dict[str, list[int]] = {}
        for v in self.all():
            a, b = tally.setdefault(v.model_a, [0, 0, 0]), tally.setdefault(v.model_b, [0, 0, 0])
            if v.winner == "tie":
                a[2] += 1
                if b is not a:
                    b[2] += 1
            else:
                win, lose = (a, b) if v.winner == "a" else (b, a)
                win[0] += 1
                lose[1] += 1
        board = [Standing(m, w, lo, ti) for m, (w, lo, ti) in tally.items()]
        return sorted(board, key=lambda s: (-s.wins, s.losses, s.model))


def _vote(row: tuple[Any, ...]) -> Vote:
    user, thread_id, turn_id, prompt, answer_a, answer_b, model_a, model_b, winner, comment, created_at = row
    try:
        messages = json.loads(prompt)
    except ValueError:
        messages = []
    return Vote(
        user=user,
        thread_id=thread_id,
        turn_id=turn_id,
        prompt=messages if isinstance(messages, list) else [],
        answer_a=answer_a,
        answer_b=answer_b,
        model_a=model_a,
        model_b=model_b,
        winner=cast(Winner, winner),
        comment=comment,
        created_at=created_at,
    )

"""Blind-compare votes: who won each compared turn, per user and thread; the leaderboard; export input.

store = VoteStore(preferences.app_store(settings))  # where the remembered settings are (SQLite or PostgreSQL)
replaced = store.record(Vote(...))                # True: an earlier vote on (thread_id, turn_id) was replaced
store.leaderboard()                               # [Standing(model, wins, losses, ties)], counted in SQL
store.all()                                       # every vote, oldest first (export-feedback reads it)

Each call is one transaction (callers run it in a thread: ``asyncio.to_thread``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import CheckConstraint, Column, Index, Integer, MetaData, Table, Text, text
from sqlalchemy.engine import Connection

from backend.chat.sanitize import sanitize_text
from backend.storage import database
from backend.storage.database import Store

Winner = Literal["a", "b", "tie"]
WINNERS: tuple[Winner, ...] = ("a", "b", "tie")


@dataclass(frozen=True)
class Vote:
    user: str
    thread_id: str
    turn_id: str
    prompt: list[dict[str, str]]  # the turn's own prompt: the system prompt (if any) and the user message
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


VOTE_TABLES = MetaData()
Table(
    "votes",
    VOTE_TABLES,
    Column("thread_id", Text(), primary_key=True),
    Column("turn_id", Text(), primary_key=True),
    *(
        Column(name, Text(), nullable=False)
        for name in ("user", "prompt", "answer_a", "answer_b", "model_a", "model_b")
    ),
    Column("winner", Text(), CheckConstraint("winner IN ('a', 'b', 'tie')"), nullable=False),
    Column("comment", Text(), nullable=False, server_default=""),
    Column("created_at", Text(), nullable=False),
    Column("seq", Integer(), nullable=False, server_default="0"),
    # Version 2: /leaderboard reads only these columns; with the index it never touches a row's prompt and answers
    # (SQLite stores the columns after them in their overflow pages: a table scan read every vote whole).
    Index("votes_standings", "model_a", "model_b", "winner"),
)


def _q(name: str) -> str:
    return '"user"' if name == "user" else name  # a reserved word on PostgreSQL


_COLUMNS = '"user", thread_id, turn_id, prompt, answer_a, answer_b, model_a, model_b, winner, comment, created_at'


class VoteStore:
    """One row per (thread_id, turn_id): a later vote on the same turn replaces the earlier one. SQLite
    (a file path) or PostgreSQL (a ``database.Store``: the history database)."""

    def __init__(self, where: Path | Store) -> None:
        self.store = database.store_at(where)
        self.path = self.store.db.path  # None on PostgreSQL
        database.ensure_tables(self.store, VOTE_TABLES, "votes", 2)

    def record(self, vote: Vote) -> bool:
        """Store ``vote``; True when it replaced an earlier vote on the same (thread_id, turn_id) (the last wins)."""
        if vote.winner not in WINNERS:
            raise ValueError(f"winner must be one of {', '.join(WINNERS)}, not {vote.winner!r}")
        if not vote.created_at:
            vote = replace(vote, created_at=datetime.now(UTC).isoformat(timespec="milliseconds"))
        s = sanitize_text  # a lone surrogate in an answer (a cut stream) must not make the write fail: U+FFFD
        row = {
            "user": s(vote.user),
            "thread_id": s(vote.thread_id),
            "turn_id": s(vote.turn_id),
            "prompt": s(json.dumps(vote.prompt, ensure_ascii=False)),
            "answer_a": s(vote.answer_a),
            "answer_b": s(vote.answer_b),
            "model_a": s(vote.model_a),
            "model_b": s(vote.model_b),
            "winner": vote.winner,
            "comment": s(vote.comment),
            "created_at": vote.created_at,
        }

        def write(db: Connection) -> bool:
            key = {"t": row["thread_id"], "u": row["turn_id"]}
            before = db.execute(text("SELECT 1 FROM votes WHERE thread_id = :t AND turn_id = :u"), key).first()
            seq = db.execute(text("SELECT COALESCE(MAX(seq), 0) + 1 FROM votes")).scalar_one()
            names = [n for n in row]
            cols = ", ".join(_q(n) for n in names)
            updates = ", ".join(f"{_q(n)} = excluded.{_q(n)}" for n in names if n not in ("thread_id", "turn_id"))
            db.execute(
                text(
                    f"INSERT INTO votes ({cols}, seq) VALUES ({', '.join(':' + n for n in names)}, :seq) "
                    f"ON CONFLICT (thread_id, turn_id) DO UPDATE SET {updates}, seq = excluded.seq"
                ),
                {**row, "seq": seq},
            )
            return before is not None

        return self.store.run(write)

    def all(self) -> list[Vote]:
        """Every vote, oldest first (a replaced vote counts from its last recording)."""
        rows = self.store.run(lambda db: db.execute(text(f"SELECT {_COLUMNS} FROM votes ORDER BY seq")).all())
        return [_vote(tuple(r)) for r in rows]

    def leaderboard(self) -> list[Standing]:
        """Wins, losses and ties per model, most wins first (then fewest losses, then the name).

        Counted by the database (one grouped query over the model and winner columns): no prompt or answer is
        read, however many votes there are. A turn with the same model on both sides is no comparison and is not
        counted (issue #22: it showed as a win and a loss of that model from one vote).
        """
        per_side = (
            "SELECT {m} AS model, "
            "CASE WHEN winner = '{w}' THEN 1 ELSE 0 END AS won, "
            "CASE WHEN winner = '{lo}' THEN 1 ELSE 0 END AS lost, "
            "CASE WHEN winner = 'tie' THEN 1 ELSE 0 END AS tied "
            "FROM votes WHERE model_a <> model_b"
        )
        query = (
            "SELECT model, SUM(won) AS wins, SUM(lost) AS losses, SUM(tied) AS ties FROM ("
            + per_side.format(m="model_a", w="a", lo="b")
            + " UNION ALL "
            + per_side.format(m="model_b", w="b", lo="a")
            + ") sides GROUP BY model"
        )
        rows = self.store.run(lambda db: db.execute(text(query)).all())
        board = [Standing(str(m), int(w), int(lo), int(ti)) for m, w, lo, ti in rows]  # one row per model
        return sorted(board, key=lambda s: (-s.wins, s.losses, s.model))  # in Python: one order on both databases


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

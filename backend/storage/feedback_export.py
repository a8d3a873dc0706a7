"""``python -m backend export-feedback``: the demo's judgements as training data.

- Blind votes (``votes.VoteStore``, in the preferences file) become preference pairs, one JSON object a
  line, in TRL's conversational preference format (what ``DPOTrainer`` reads):
  ``{"prompt": [messages], "chosen": [{"role": "assistant", ...}], "rejected": [...], "chosen_model", "rejected_model"}``.
  A tie is no pair, nor is a vote on a pair with the same model on both sides (issue #22): both are counted in
  the summary.
- Thumbs-up answers (Chainlit's ``feedbacks`` table in the history database, SQLite or PostgreSQL, ``value = 1``; the feedback is
  on the ``on_message`` run step, the answer is its ``assistant_message`` child) become chat examples,
  ``{"messages": [system?, ..., user, assistant], "model": ...}``: the conversation up to that answer,
  rebuilt like a resumed chat (``history.conversation_from_thread``). Cut answers are left out, and so is an
  example with any answer the server did not sign (``datalayer.signed_answer``: stored before signing existed,
  or not written by the server — issue #18: the browser could once store steps of any type).

Both are what ``train-demo --data`` reads (``backend/training_data.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from backend.settings import Settings
from backend.storage import history, preferences
from backend.storage.database import Database, sqlite_file, store
from backend.storage.datalayer import signed_answer
from backend.storage.votes import Vote, VoteStore


class NothingToExport(Exception):
    """No blind vote that makes a pair: the message says what was found and how to get votes."""


@dataclass(frozen=True)
class ExportSummary:
    pairs: int
    ties: int
    chat_examples: int
    cut_left_out: int
    pairs_path: Path
    chat_path: Path | None  # None: no thumbs-up answer, no file written
    same_model: int = 0  # votes on a pair with the same model on both sides: no preference
    unsigned: int = 0  # thumbs-up examples with an answer the server did not sign

    def text(self) -> str:
        left = [f"{self.ties} tie{'s' if self.ties != 1 else ''} left out: a tie is no pair"] if self.ties else []
        if self.same_model:
            s = "s" if self.same_model != 1 else ""
            left.append(f"{self.same_model} vote{s} on the same model on both sides skipped: no preference")
        ties = f" ({'; '.join(left)})" if left else ""
        line = f"wrote {self.pairs} preference pair{'s' if self.pairs != 1 else ''}{ties} to {self.pairs_path}"
        if self.chat_path is not None:
            line += f"; {self.chat_examples} thumbs-up answer{'s' if self.chat_examples != 1 else ''} as chat "
            line += f"examples to {self.chat_path}"
        else:
            line += "; no thumbs-up answers (no chat examples file)"
        if self.cut_left_out:
            line += f"; {self.cut_left_out} thumbs-up on a cut answer left out"
        if self.unsigned:
            line += (
                f"; {self.unsigned} thumbs-up left out: an answer in it was not signed by the server "
                "(stored before answers were signed, or not written by the server)"
            )
        return line


@dataclass(frozen=True)
class Pairs:
    """What the votes gave: the preference records, and the votes that gave none."""

    records: list[dict[str, Any]]
    ties: int
    same_model: int  # the same model on both sides: no preference between two models


def preference_pairs(votes: Iterable[Vote]) -> Pairs:
    """TRL's conversational preference records for the decided votes between two models."""
    pairs: list[dict[str, Any]] = []
    ties = same = 0
    for v in votes:
        if v.model_a == v.model_b:
            same += 1
            continue
        if v.winner == "tie":
            ties += 1
            continue
        won_a = v.winner == "a"
        chosen, rejected = (v.answer_a, v.answer_b) if won_a else (v.answer_b, v.answer_a)
        pairs.append(
            {
                "prompt": v.prompt,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
                "chosen_model": v.model_a if won_a else v.model_b,
                "rejected_model": v.model_b if won_a else v.model_a,
            }
        )
    return Pairs(pairs, ties, same)


@dataclass(frozen=True)
class Liked:
    """The thumbs-up answers as chat examples, and those left out."""

    examples: list[dict[str, Any]]
    cut: int  # the liked answer was cut (Stop, an error)
    unsigned: int  # an answer in it was not signed by the server (datalayer.signed_answer)


def thumbs_up_examples(db: Path | Database) -> Liked:
    """Chat examples for every thumbs-up answer in the history database (a SQLite file, or PostgreSQL)."""
    if isinstance(db, Path):
        db = sqlite_file(db)
    if db.path is not None and not db.path.is_file():
        return Liked([], 0, 0)
    key = history.answer_key(db, create=False)
    return store(db).run(lambda conn: _thumbs_up(conn, key))


def _thumbs_up(conn: Connection, key: bytes | None) -> Liked:
    examples: list[dict[str, Any]] = []
    cut = unsigned = 0
    liked = conn.execute(
        text(
            'SELECT f."forId" AS run_id, s."threadId" AS thread_id FROM feedbacks f '
            'JOIN steps s ON s."id" = f."forId" WHERE f."value" = 1 ORDER BY s."createdAt"'
        )
    ).all()
    for row in liked:
        steps = [
            dict(r._mapping)
            for r in conn.execute(
                text('SELECT * FROM steps WHERE "threadId" = :t ORDER BY "createdAt", "start"'), {"t": row.thread_id}
            )
        ]
        answers = [
            s
            for s in steps
            if s.get("parentId") == row.run_id
            and s.get("type") == "assistant_message"
            and "raw" in history.json_dict(s.get("metadata")).get(history.META_KEY, {})
        ]
        if not answers:
            continue  # thumbs on a command's reply or an error bubble: not a model answer
        answer = answers[-1]
        upto = steps[: steps.index(answer) + 1]
        conv = history.conversation_from_thread({"steps": upto})
        last = conv.turns[-1] if conv.turns else None
        if last is None or last.id != str(answer["id"]) or not last.content.strip():
            continue
        if last.interrupted:
            cut += 1
            continue
        said = {t.id for t in conv.turns if t.role == "assistant"}  # every answer the example would teach
        if not all(signed_answer(key, s) for s in upto if str(s["id"]) in said):
            unsigned += 1
            continue
        thread = conn.execute(text('SELECT metadata FROM threads WHERE "id" = :t'), {"t": row.thread_id}).first()
        state = history.state_from_thread({"metadata": thread.metadata if thread else None})
        messages = conv.messages(str(state.get("system_prompt") or ""))
        if messages and messages[-1]["role"] == "assistant" and any(m["role"] == "user" for m in messages):
            examples.append({"messages": messages, "model": last.model})
    return Liked(examples, cut, unsigned)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def export_feedback(settings: Settings, out: Path, chat_out: Path) -> ExportSummary:
    """Write the pairs to ``out`` and the thumbs-up examples to ``chat_out``.

    No decided vote: NothingToExport, and ``out`` is not written (the thumbs-up examples still are).
    """
    db = history.database(settings) if settings.login.enable else None
    # The votes: tables in a PostgreSQL history, else the preferences file (not created by an export).
    has_votes = (db is not None and db.is_postgres) or preferences.db_path(settings).is_file()
    votes = VoteStore(preferences.app_store(settings)).all() if has_votes else []
    pairs = preference_pairs(votes)
    liked = thumbs_up_examples(db) if db is not None else Liked([], 0, 0)
    examples = liked.examples
    if examples:
        _write_jsonl(chat_out, examples)
    if not pairs.records:
        found = "no blind votes yet"
        if votes:
            why = "all ties" if pairs.ties == len(votes) else "all on the same model on both sides"
            if pairs.ties and pairs.same_model:
                why = f"{pairs.ties} ties and {pairs.same_model} on the same model on both sides"
            found = f"{len(votes)} vote{'s' if len(votes) != 1 else ''}, {why}"
        wrote = f"; {len(examples)} thumbs-up answers written to {chat_out}" if examples else ""
        raise NothingToExport(
            f"{found}: no preference pairs, {out} not written{wrote}. Vote in blind compare mode "
            "(/compare blind with two different models, then A, B or tie under the answers) and run this again."
        )
    _write_jsonl(out, pairs.records)
    chat_path = chat_out if examples else None
    return ExportSummary(
        len(pairs.records), pairs.ties, len(examples), liked.cut, out, chat_path, pairs.same_model, liked.unsigned
    )

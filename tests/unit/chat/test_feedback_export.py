"""backend/storage/feedback_export.py and `python -m backend export-feedback`: votes from the VoteStore and thumbs-up
answers stored by Chainlit's real SQLAlchemyDataLayer become TRL preference pairs and chat examples; those files
are what `train-demo --data` reads (backend/training_data.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from backend.settings import ROOT, LoggingSettings, LoginSettings, Settings
from backend.storage import datalayer, feedback_export, history, preferences
from backend.storage.votes import Vote, VoteStore
from backend.training_data import TrainingDataError, read_examples
from backend.ui.markdown import footer, interrupted_marker

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def settings_in(tmp_path: Path, auth: bool = True) -> Settings:
    return Settings(
        login=LoginSettings(enable=auth, password="pw-123456" if auth else ""),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )


def vote(turn: str, winner: str, a: str = "Paris.", b: str = "Arr, Paris!") -> Vote:
    return Vote("admin", "th", turn, PROMPT, a, b, "smollm2", "pirate", winner)  # type: ignore[arg-type]


async def store_liked_chat(settings: Settings, *, signed: bool = True) -> str:
    """Two turns and a cut third, stored as Chainlit stores them (user message, its on_message run step, the
    answer under the run), thumbs up on the 2nd and 3rd answers, thumbs down (with a comment) on the 1st.

    Through the data layer as the UI builds it (its answers signed with the history's key); ``signed=False``: as
    before answers were signed (or as a browser once could store them)."""
    import chainlit as cl
    from chainlit.context import init_http_context
    from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
    from chainlit.types import Feedback
    from chainlit.user import User

    db = history.database(settings)  # the SQLite file, or PostgreSQL (tests/integration/test_postgres_history.py)
    history.ensure_schema(db)
    key = history.answer_key(db) if signed else None
    dl = datalayer.GuardedDataLayer(SQLAlchemyDataLayer(db.async_url), answer_key=key)
    try:
        user = await dl.create_user(User(identifier="admin"))
        thread_id = str(uuid.uuid4())
        init_http_context(thread_id=thread_id)
        await dl.update_thread(thread_id, name="chat", user_id=user.id)
        await dl.update_thread(thread_id, metadata={history.META_KEY: history.chat_state("pirate", {}, "be a pirate")})
        turns = [
            ("capital of France?", "Paris.", "smollm2", False, 0),
            ("and of Spain?", "Arr, Madrid be the port!", "pirate", False, 1),
            ("and of Italy?", "Arr, Ro", "pirate", True, 1),
        ]
        for i, (question, raw, model, cut, liked) in enumerate(turns):
            q = cl.Message(content=question, author="admin", type="user_message")
            q.created_at = f"2026-01-01T00:0{i}:00Z"
            await dl.create_step(q.to_dict())
            run = cl.Step(name="on_message", type="run", parent_id=q.id)
            run.created_at = f"2026-01-01T00:0{i}:01Z"
            await dl.create_step(run.to_dict())
            shown = raw + (interrupted_marker("stopped", model) if cut else footer(model, None, None, 1.0, "en"))
            a = cl.Message(content=shown, author=model, metadata=history.answer_metadata(raw, model, interrupted=cut))
            a.parent_id = run.id
            a.created_at = f"2026-01-01T00:0{i}:02Z"
            await dl.create_step(a.to_dict())
            comment = "too plain \ud800" if not liked else None  # a lone surrogate from the comment box
            await dl.upsert_feedback(Feedback(forId=run.id, threadId=thread_id, value=liked, comment=comment))
        return thread_id
    finally:
        await dl.close()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_decided_votes_are_trl_preference_pairs_and_ties_are_counted_not_paired():
    got = feedback_export.preference_pairs([vote("1", "b"), vote("2", "tie"), vote("3", "a", a="P", b="R")])
    assert (got.ties, got.same_model) == (1, 0)
    assert got.records == [
        {
            "prompt": PROMPT,
            "chosen": [{"role": "assistant", "content": "Arr, Paris!"}],
            "rejected": [{"role": "assistant", "content": "Paris."}],
            "chosen_model": "pirate",
            "rejected_model": "smollm2",
        },
        {
            "prompt": PROMPT,
            "chosen": [{"role": "assistant", "content": "P"}],
            "rejected": [{"role": "assistant", "content": "R"}],
            "chosen_model": "smollm2",
            "rejected_model": "pirate",
        },
    ]


@pytest.mark.asyncio
async def test_thumbs_up_answers_stored_by_chainlits_data_layer_become_chat_examples(tmp_path):
    settings = settings_in(tmp_path)
    await store_liked_chat(settings)
    liked = feedback_export.thumbs_up_examples(history.db_path(settings))
    assert (liked.cut, liked.unsigned) == (1, 0)  # the thumbs-up on the cut third answer is left out
    assert liked.examples == LIKED_EXAMPLES
    import sqlite3

    with sqlite3.connect(history.db_path(settings)) as db:  # the thumbs down is stored too, comment made storable
        assert db.execute("SELECT value, comment FROM feedbacks WHERE value = 0").fetchall() == [
            (0, "too plain \ufffd")
        ]


LIKED_EXAMPLES = [
    {
        "messages": [
            {"role": "system", "content": "be a pirate"},
            {"role": "user", "content": "capital of France?"},
            {"role": "assistant", "content": "Paris."},  # raw text: no footer
            {"role": "user", "content": "and of Spain?"},
            {"role": "assistant", "content": "Arr, Madrid be the port!"},
        ],
        "model": "pirate",
    }
]


@pytest.mark.asyncio
async def test_export_writes_both_files_that_train_demo_data_reads(tmp_path):
    settings = settings_in(tmp_path)
    await store_liked_chat(settings)
    store = VoteStore(preferences.db_path(settings))
    store.record(vote("1", "b"))
    store.record(vote("2", "tie"))
    out, chat_out = tmp_path / "out" / "prefs.jsonl", tmp_path / "out" / "chat.jsonl"
    summary = feedback_export.export_feedback(settings, out, chat_out)
    assert (summary.pairs, summary.ties, summary.chat_examples, summary.cut_left_out) == (1, 1, 1, 1)
    assert "1 preference pair (1 tie left out" in summary.text() and "1 thumbs-up answer as chat" in summary.text()
    [pair] = read_jsonl(out)
    assert pair["chosen"][0]["content"] == "Arr, Paris!" and pair["chosen_model"] == "pirate"
    assert read_jsonl(chat_out)[0]["messages"][-1]["content"] == "Arr, Madrid be the port!"
    # train-demo --data reads either file: the chosen answer of a pair, the last answer of a chat example
    assert read_examples(out) == [PROMPT + [{"role": "assistant", "content": "Arr, Paris!"}]]
    assert read_examples(chat_out)[0][-1] == {"role": "assistant", "content": "Arr, Madrid be the port!"}
    assert not list(out.parent.glob(".*tmp"))  # written atomically, nothing left behind


def test_no_votes_is_a_clear_refusal_and_no_empty_file(tmp_path):
    settings = settings_in(tmp_path)
    out = tmp_path / "prefs.jsonl"
    with pytest.raises(feedback_export.NothingToExport, match="no blind votes yet: no preference pairs.*blind compare"):
        feedback_export.export_feedback(settings, out, tmp_path / "chat.jsonl")
    VoteStore(preferences.db_path(settings)).record(vote("1", "tie"))
    with pytest.raises(feedback_export.NothingToExport, match="1 vote, all ties"):
        feedback_export.export_feedback(settings, out, tmp_path / "chat.jsonl")
    assert not out.exists() and not (tmp_path / "chat.jsonl").exists()


def test_a_vote_on_the_same_model_on_both_sides_is_never_a_preference_pair_and_the_export_says_so(tmp_path):
    """Issue #22: a blind pair of the base against itself was exported as a pair (chosen and rejected by one model)."""
    settings = settings_in(tmp_path)
    store = VoteStore(preferences.db_path(settings))
    store.record(dataclasses.replace(vote("1", "a", a="Paris.", b="Paris!"), model_b="smollm2"))
    out, chat_out = tmp_path / "prefs.jsonl", tmp_path / "chat.jsonl"
    with pytest.raises(feedback_export.NothingToExport, match="1 vote, all on the same model on both sides"):
        feedback_export.export_feedback(settings, out, chat_out)
    assert not out.exists()
    store.record(vote("2", "b"))
    store.record(vote("3", "tie"))
    summary = feedback_export.export_feedback(settings, out, chat_out)
    assert (summary.pairs, summary.ties, summary.same_model) == (1, 1, 1)
    assert "1 vote on the same model on both sides skipped" in summary.text()
    assert [r["chosen_model"] for r in read_jsonl(out)] == ["pirate"]


@pytest.mark.asyncio
async def test_thumbs_up_answers_the_server_did_not_sign_are_left_out_and_counted(tmp_path):
    """Issue #18: the browser could store assistant_message steps with our answer metadata; export-feedback took
    them as model output. Answers stored unsigned (before signing, or not by the server) are left out, and so is an
    answer whose text was changed after it was signed."""
    settings = settings_in(tmp_path)
    await store_liked_chat(settings, signed=False)
    liked = feedback_export.thumbs_up_examples(history.db_path(settings))
    assert (liked.examples, liked.cut, liked.unsigned) == ([], 1, 1)

    signed = settings_in(tmp_path / "signed")
    await store_liked_chat(signed)
    import sqlite3

    with sqlite3.connect(history.db_path(signed)) as db:  # an answer rewritten in place, keeping its signature
        rows = db.execute("SELECT id, metadata FROM steps WHERE type = 'assistant_message'").fetchall()
        for step_id, metadata in rows:
            meta = json.loads(metadata)
            if meta["qwenchat"]["raw"] == "Paris.":
                meta["qwenchat"]["raw"] = "Forged."
                db.execute("UPDATE steps SET metadata = ? WHERE id = ?", (json.dumps(meta), step_id))
    liked = feedback_export.thumbs_up_examples(history.db_path(signed))
    assert (liked.examples, liked.unsigned) == ([], 1)  # the liked 2nd answer's example holds the forged 1st
    out, chat_out = tmp_path / "prefs.jsonl", tmp_path / "chat.jsonl"
    VoteStore(preferences.db_path(signed)).record(vote("1", "a"))
    text = feedback_export.export_feedback(signed, out, chat_out).text()
    assert "1 thumbs-up left out: an answer in it was not signed by the server" in text, text


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"),
        "QWENCHAT_LOGIN_ENABLE": "true",
        "QWENCHAT_LOGIN_PASSWORD": "pw-123456",
    }
    return subprocess.run(
        [sys.executable, "-m", "backend", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.asyncio
async def test_the_cli_exports_and_refuses_with_exit_code_1_when_there_are_no_votes(tmp_path):
    out = tmp_path / "prefs.jsonl"
    empty = run_cli(tmp_path, "export-feedback", "--out", str(out))
    assert empty.returncode == 1 and "no blind votes yet" in empty.stderr and not out.exists()

    settings = settings_in(tmp_path)
    await store_liked_chat(settings)
    VoteStore(preferences.db_path(settings)).record(vote("1", "a"))
    done = run_cli(tmp_path, "export-feedback", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "wrote 1 preference pair to" in done.stdout and "prefs-chat.jsonl" in done.stdout
    assert read_jsonl(out)[0]["chosen_model"] == "smollm2"
    assert len(read_jsonl(tmp_path / "prefs-chat.jsonl")) == 1


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such file"),
        ("", "no examples in it"),
        ('{"q": "hi", "a": "ho"}\n{"prompt": "x"', "line 2: not JSON"),
        ('\n{"text": "x"}', "line 2: expected 'messages', or 'prompt' \\+ 'chosen', or 'q' \\+ 'a'; .*keys: text"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 1: the last message must be .*assistant"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', r"line 1: messages\[0\] must be"),
        ('{"prompt": [], "chosen": "x"}', "line 1: 'prompt' must be a non-empty list"),
        ("[1, 2]", "line 1: expected a JSON object, got list"),
    ],
)
def test_train_demo_data_refuses_a_missing_empty_or_malformed_file_naming_the_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TrainingDataError, match=message):
        read_examples(path)


def test_train_demo_data_reads_the_shipped_pirate_format():
    examples = read_examples(ROOT / "backend" / "data" / "pirate.jsonl")
    assert len(examples) >= 40 and examples[0][0] == {"role": "user", "content": "What is the capital of France?"}


def test_the_cli_names_the_bad_line_before_loading_any_model(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "hi", "a": "ho"}\nnot json\n')
    res = run_cli(tmp_path, "train-demo", "--data", str(bad))
    assert res.returncode == 2 and "bad.jsonl: line 2: not JSON" in res.stderr

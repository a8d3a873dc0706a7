"""backend/storage/votes.py: blind-compare votes in SQLite (the remembered-settings file), the leaderboard."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from backend.storage.votes import Standing, Vote, VoteStore

PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is the capital of France?"}]


def vote(turn: str = "t1", winner: str = "a", thread: str = "th1", **kw: str) -> Vote:
    fields = {
        "user": "admin",
        "thread_id": thread,
        "turn_id": turn,
        "prompt": PROMPT,
        "answer_a": "Paris.",
        "answer_b": "Arr, Paris be the port!",
        "model_a": "smollm2",
        "model_b": "pirate",
        "winner": winner,
    }
    return Vote(**{**fields, **kw})  # type: ignore[arg-type]


def test_a_vote_is_stored_with_everything_and_a_creation_time(tmp_path):
    store = VoteStore(tmp_path / "prefs.sqlite3")
    assert store.record(vote(comment="more pirate please")) is False
    [got] = VoteStore(tmp_path / "prefs.sqlite3").all()  # a new instance reads the file
    assert got.prompt == PROMPT and got.answer_b == "Arr, Paris be the port!"
    assert (got.user, got.thread_id, got.turn_id, got.model_a, got.model_b) == (
        "admin",
        "th1",
        "t1",
        "smollm2",
        "pirate",
    )
    assert got.winner == "a" and got.comment == "more pirate please"
    assert got.created_at.startswith("20") and "T" in got.created_at


def test_the_last_vote_on_a_turn_wins_and_record_says_it_replaced_one(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    assert store.record(vote("t1", "a")) is False
    assert store.record(vote("t2", "b")) is False
    assert store.record(vote("t1", "tie", comment="changed my mind")) is True
    assert store.record(vote("t1", "b", thread="other")) is False  # same turn id, another thread: another vote
    votes = store.all()
    assert [(v.thread_id, v.turn_id, v.winner) for v in votes] == [
        ("th1", "t2", "b"),
        ("th1", "t1", "tie"),  # the replaced vote counts from its last recording
        ("other", "t1", "b"),
    ]
    assert votes[1].comment == "changed my mind"


def test_all_is_oldest_first_and_keeps_a_given_creation_time(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    for i in range(5):
        store.record(vote(f"t{i}", created_at=f"2026-01-0{i + 1}T00:00:00+00:00"))
    assert [v.turn_id for v in store.all()] == ["t0", "t1", "t2", "t3", "t4"]
    assert store.all()[2].created_at == "2026-01-03T00:00:00+00:00"


def test_leaderboard_counts_wins_losses_and_ties_per_model_most_wins_first(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    assert store.leaderboard() == []
    store.record(vote("1", "b"))  # pirate beats smollm2
    store.record(vote("2", "b"))
    store.record(vote("3", "a"))  # smollm2 beats pirate
    store.record(vote("4", "tie"))
    store.record(vote("5", "a", model_a="other", model_b="smollm2"))  # other beats smollm2
    store.record(vote("6", "tie", model_a="other", model_b="other"))  # the same model on both sides: not counted
    store.record(vote("1", "a"))  # changed: smollm2 beats pirate on turn 1 (the last vote wins)
    assert store.leaderboard() == [
        Standing("smollm2", wins=2, losses=2, ties=1),
        Standing("other", wins=1, losses=0, ties=0),
        Standing("pirate", wins=1, losses=2, ties=1),
    ]


@pytest.mark.parametrize("winner", ["a", "b", "tie"])
def test_a_pair_of_the_same_model_is_never_counted_so_one_vote_is_never_a_win_and_a_loss(tmp_path, winner):
    """Issue #22: a blind pair of the base against itself showed, from one vote, 1 win and 1 loss of the base."""
    store = VoteStore(tmp_path / "v.sqlite3")
    store.record(vote("same", winner, model_a="smollm2", model_b="smollm2"))
    assert store.leaderboard() == []
    assert len(store.all()) == 1  # the vote itself is kept (the chat said it was stored)
    store.record(vote("two", winner))
    board = {s.model: s for s in store.leaderboard()}
    assert set(board) == {"smollm2", "pirate"}
    for s in board.values():  # one vote: one win or one loss or one tie per model, never two of them
        assert s.wins + s.losses + s.ties == 1, s
    assert sum(s.wins for s in board.values()) == sum(s.losses for s in board.values()) == (winner != "tie")


def test_the_leaderboard_is_counted_by_one_sql_query_that_reads_no_prompt_or_answer(tmp_path):
    """Issue #18: /leaderboard loaded every vote with its prompt and both answers into the UI process."""
    from sqlalchemy import event

    store = VoteStore(tmp_path / "v.sqlite3")
    big = [{"role": "user", "content": "x" * 100_000}]
    for i in range(30):
        store.record(vote(f"t{i}", "ab"[i % 2] if i % 3 else "tie", prompt=big, answer_a="A" * 50_000))
    statements: list[str] = []
    engine = store.store._engine
    assert engine is not None

    def seen(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        board = store.leaderboard()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(statements) == 1, statements
    assert not any(col in statements[0] for col in ("prompt", "answer_a", "answer_b", "comment")), statements[0]
    assert "GROUP BY" in statements[0]
    with engine.connect() as conn:  # and SQLite reads no row itself, only the index (a row's big text comes first)
        plan = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statements[0])]
    scans = [p for p in plan if p.startswith("SCAN votes")]
    assert len(scans) == 2 and all("USING COVERING INDEX votes_standings" in p for p in scans), plan
    # what the votes say, counted by hand: turns 0, 3, 6, ... are ties; of the rest, odd i -> b wins, even i -> a
    ties = len(range(0, 30, 3))
    a_wins = sum(1 for i in range(30) if i % 3 and i % 2 == 0)
    b_wins = sum(1 for i in range(30) if i % 3 and i % 2 == 1)
    assert {s.model: (s.wins, s.losses, s.ties) for s in board} == {
        "smollm2": (a_wins, b_wins, ties),
        "pirate": (b_wins, a_wins, ties),
    }


def test_a_lone_surrogate_in_an_answer_is_stored_safely(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    store.record(vote(answer_a="cut \ud83d", comment="x\udfff", prompt=[{"role": "user", "content": "hi \ud800"}]))
    [got] = store.all()
    assert got.answer_a == "cut \ufffd" and got.comment == "x\ufffd" and got.prompt[0]["content"] == "hi \ufffd"
    assert got.answer_b == "Arr, Paris be the port!"
    store.record(vote("t2", answer_a="pair \ud83d\ude00 kept"))  # a valid pair is joined, not replaced
    assert store.all()[1].answer_a == "pair \U0001f600 kept"


def test_an_unknown_winner_is_refused(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    with pytest.raises(ValueError, match="'left'"):
        store.record(vote(winner="left"))
    assert store.all() == []


def test_a_fresh_file_in_a_new_folder_and_an_existing_file_shared_with_preferences(tmp_path):
    from backend.storage.preferences import Preferences

    fresh = tmp_path / "new" / "folder" / "v.sqlite3"
    VoteStore(fresh).record(vote())
    assert fresh.is_file() and len(VoteStore(fresh).all()) == 1  # created once, opened again idempotently

    shared = tmp_path / "preferences.sqlite3"
    prefs = Preferences(shared)
    prefs.set("user:admin", {"model": "pirate"})
    store = VoteStore(shared)
    store.record(vote())
    assert Preferences(shared).get("user:admin") == {"model": "pirate"} and len(VoteStore(shared).all()) == 1
    with sqlite3.connect(shared) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"preferences", "votes"} <= tables
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_votes_from_threads_are_all_kept(tmp_path):
    store = VoteStore(tmp_path / "v.sqlite3")
    threads = [threading.Thread(target=store.record, args=(vote(f"t{i}"),)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(v.turn_id for v in store.all()) == [f"t{i}" for i in range(8)]


def test_service_votes_opens_the_preferences_file(tmp_path):
    from backend.chat.service import Service
    from backend.settings import LoggingSettings, Settings
    from backend.storage import preferences

    settings = Settings(logging=LoggingSettings(dir=str(tmp_path / "logs")))
    service = Service(settings)
    service.votes.record(vote())
    assert service.votes is service.votes and service.votes.path == preferences.db_path(settings)
    assert preferences.db_path(settings).is_file()

"""backend/chat/replay.py: what a reconnected browser is sent again (issue #20, "Wi-Fi blips lose nothing")."""

from __future__ import annotations

from backend.chat.replay import PRUNE_MIN, Journal


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def journal(window: float = 50) -> tuple[Journal, Clock]:
    clock = Clock()
    return Journal(window, clock), clock


def step(sid: str, output: str = "", **more: object) -> dict[str, object]:
    return {"id": sid, "type": "assistant_message", "output": output, **more}


def test_a_streamed_step_is_sent_again_whole_with_the_tokens_it_got():
    j, _ = journal()
    j.record("stream_start", step("a", "w0 ", streaming=True))
    for token in ("w1 ", "w2 "):
        j.record("stream_token", {"id": "a", "token": token, "isSequence": False, "isInput": False})
    j.disconnected()
    assert list(j.replay()) == [("new_message", step("a", "w0 w1 w2 ", streaming=True))]


def test_the_final_send_replaces_the_streamed_text_and_a_sequence_token_replaces_it_too():
    j, _ = journal()
    j.record("stream_start", step("a", "w0 "))
    j.record("stream_token", {"id": "a", "token": "w1 ", "isSequence": False, "isInput": False})
    j.record("new_message", step("a", "w0 w1 w2\n\n*footer*"))
    j.record("stream_start", step("b", "x"))
    j.record("stream_token", {"id": "b", "token": "whole", "isSequence": True, "isInput": False})
    j.record("stream_token", {"id": "b", "token": "in", "isSequence": False, "isInput": True})
    assert list(j.replay()) == [
        ("new_message", step("a", "w0 w1 w2\n\n*footer*")),
        ("new_message", {**step("b", "whole"), "input": "in"}),
    ]


def test_removed_things_are_removed_and_buttons_are_removed_before_they_are_added_again():
    j, _ = journal()
    j.record("new_message", step("a", "gone"))
    j.record("new_message", step("e", "error", isError=True))
    retry = {"id": "r", "forId": "e", "name": "retry"}
    j.record("action", retry)
    j.record("action", {"id": "old", "forId": "e", "name": "vote"})
    j.record("remove_action", {"id": "old", "forId": "e", "name": "vote"})
    j.record("delete_message", step("a"))
    j.record("element", {"id": "f", "name": "export.md"})
    j.record("set_commands", [{"id": "compare"}])
    j.record("task_start", {})  # not a thing on the screen: the reconnect sets it from the task
    assert list(j.replay()) == [
        ("delete_message", step("a", "gone")),  # by its id
        ("new_message", step("e", "error", isError=True)),
        ("remove_action", retry),
        ("remove_action", {"id": "old", "forId": "e", "name": "vote"}),
        ("element", {"id": "f", "name": "export.md"}),
        ("set_commands", [{"id": "compare"}]),
        ("action", retry),
    ]


def test_only_what_changed_since_the_window_before_the_cut_is_sent_and_the_next_cut_starts_afresh():
    j, clock = journal(window=50)
    j.record("new_message", step("old", "long ago"))
    clock.now += 100
    j.record("new_message", step("recent", "just before the cut"))
    clock.now += 10
    j.disconnected()
    clock.now += 300  # away for five minutes: what changed meanwhile counts, however long
    j.record("new_message", step("meanwhile", "while away"))
    assert [d["id"] for _, d in list(j.replay())] == ["recent", "meanwhile"]
    clock.now += 200
    j.record("new_message", step("later", "after"))
    j.disconnected()
    assert [d["id"] for _, d in list(j.replay())] == ["later"]


def test_a_cut_the_server_did_not_notice_counts_back_from_the_reconnect():
    j, clock = journal(window=50)
    j.record("new_message", step("old", ""))
    clock.now += 60
    j.record("new_message", step("recent", ""))
    clock.now += 30
    assert [d["id"] for _, d in list(j.replay())] == ["recent"]


def test_the_journal_forgets_what_no_reconnect_can_need():
    j, clock = journal(window=50)
    for i in range(PRUNE_MIN * 3):
        j.record("new_message", step(f"s{i}", "x"))
        clock.now += 1
    assert len(j.entries) < PRUNE_MIN * 2
    assert f"s{PRUNE_MIN * 3 - 1}" in {key for _, key in j.entries}


def test_what_is_not_a_dict_or_not_known_is_ignored():
    j, _ = journal()
    j.record("new_message", "not a dict")
    j.record("stream_token", {"id": "nobody", "token": "x"})
    j.record("token_usage", 3)
    assert list(j.replay()) == []


def test_each_things_state_is_taken_when_its_event_is_sent_not_before():
    """A token emitted while the replay is being sent (to the new socket) must not be overwritten by an older
    state of its step sent after it."""
    j, _ = journal()
    j.record("new_message", step("a", "done"))
    j.record("stream_start", step("b", "w0 "))
    events = j.replay()
    assert next(events) == ("new_message", step("a", "done"))
    j.record("stream_token", {"id": "b", "token": "w1 ", "isSequence": False, "isInput": False})  # sent live
    j.record("new_message", step("c", "new"))  # first emitted during the replay: sent live, not again
    assert list(events) == [("new_message", step("b", "w0 w1 "))]


def test_what_changes_between_the_new_socket_and_the_replay_is_held_for_the_replay_however_long_that_takes():
    j, clock = journal(window=10)
    kept = j.record("stream_start", step("a", "w0 "))
    assert kept and not j.holds(kept)  # connected: sent live
    j.hold()  # the session is on its new socket
    clock.now += 5
    token = {"id": "a", "token": "w1 ", "isSequence": False, "isInput": False}
    assert j.holds(j.record("stream_token", token))  # waits for the replay
    assert not j.holds(j.record("stream_token", {**token, "id": "unknown"}))  # not kept: goes out live
    assert not j.holds(j.record("task_start", {}))
    clock.now += 100  # the browser asks long after (its socket was cut again meanwhile)
    j.disconnected()
    assert list(j.replay()) == [("new_message", step("a", "w0 w1 "))]  # older than the window, held: sent
    assert not j.holds(j.record("stream_token", token))  # after the replay: live again

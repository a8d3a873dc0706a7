"""Conversation state: edits replace stale turns, partial answers are kept and marked, retries resend."""

from __future__ import annotations

from backend.chat.conversation import Conversation


def test_new_turns_append_in_order():
    conv = Conversation()
    conv.add_user("u1", "hi")
    conv.add_assistant("a1", "hello", "base")
    conv.add_user("u2", "more")
    assert [m["content"] for m in conv.messages()] == ["hi", "hello", "more"]


def test_editing_a_message_drops_it_and_everything_after_it():
    conv = Conversation()
    conv.add_user("u1", "first")
    conv.add_assistant("a1", "answer one", "base")
    conv.add_user("u2", "second")
    conv.add_assistant("a2", "answer two", "base")
    conv.add_user("u1", "first, edited")  # Chainlit re-runs on_message with the same id
    assert conv.messages() == [{"role": "user", "content": "first, edited"}]


def test_system_prompt_first_and_omitted_when_blank():
    conv = Conversation()
    conv.add_user("u1", "hi")
    assert conv.messages("Be brief.")[0] == {"role": "system", "content": "Be brief."}
    assert conv.messages("   ")[0]["role"] == "user"


def test_partial_answer_is_kept_marked_and_sent_back_as_shown():
    conv = Conversation()
    conv.add_user("u1", "tell me")
    turn = conv.add_assistant("a1", "half an ans", "pirate", interrupted=True)
    assert turn.interrupted and conv.turns[-1].model == "pirate"
    assert conv.messages()[-1] == {"role": "assistant", "content": "half an ans"}


def test_retry_resends_the_last_user_turn_without_the_failed_answer():
    conv = Conversation()
    conv.add_user("u1", "q1")
    conv.add_assistant("a1", "ok", "base")
    conv.add_user("u2", "q2")
    conv.add_assistant("a2", "cut", "base", interrupted=True)
    conv.drop_answers_after_last_user()
    assert conv.last_user().content == "q2"
    assert [m["content"] for m in conv.messages()] == ["q1", "ok", "q2"]


def test_reasoning_is_kept_out_of_the_history_sent_back():
    conv = Conversation()
    conv.add_user("u1", "q")
    conv.add_assistant("a1", "<think>secret plan</think>The answer.", "base")
    assert "secret" not in conv.messages()[-1]["content"]


def test_round_trip_for_resume():
    conv = Conversation()
    conv.add_user("u1", "q")
    conv.add_assistant("a1", "a", "pirate", interrupted=True)
    again = Conversation.from_list(conv.to_list())
    assert again.turns == conv.turns


def test_lone_surrogates_reach_the_model_as_replacement_characters_but_stay_in_the_history():
    conv = Conversation()
    conv.add_user("u1", "a lone \ud800 surrogate")
    conv.add_assistant("a1", "echo \udfff", "base")
    sent = conv.messages("sys \ud801")
    assert [m["content"] for m in sent] == ["sys \ufffd", "a lone \ufffd surrogate", "echo \ufffd"]
    for m in sent:
        m["content"].encode("utf-8")  # what the Rust tokenizer and the HTTP body need
    assert conv.turns[0].content == "a lone \ud800 surrogate"


def test_a_retry_of_a_message_with_a_lone_surrogate_sends_it_sanitized_again():
    conv = Conversation()
    conv.add_user("u1", "bad \udc00")
    conv.add_assistant("a1", "cut", "base", interrupted=True)
    conv.drop_answers_after_last_user()
    assert conv.messages() == [{"role": "user", "content": "bad \ufffd"}]

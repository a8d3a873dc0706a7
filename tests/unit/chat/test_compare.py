"""backend/chat/compare.py without Chainlit: the /compare and /vote grammar, sides, picks, hiding, the leaderboard."""

from __future__ import annotations

import random

import pytest

from backend.chat import compare
from backend.chat.conversation import Conversation
from backend.storage.votes import Standing
from backend.ui import markdown

SERVED = ["base", "pirate"]


@pytest.mark.parametrize(
    ("text", "chosen", "expected"),
    [
        ("", None, compare.CompareMode("base", "pirate")),  # default: the base against the first adapter
        ("", "pirate", compare.CompareMode("base", "pirate")),  # ... or the chosen one
        ("", "local", compare.CompareMode("base", "local")),
        ("pirate", None, compare.CompareMode("base", "pirate")),
        ("pirate base", None, compare.CompareMode("pirate", "base")),
        ("blind", None, compare.CompareMode("base", "pirate", blind=True)),
        ("BLIND `pirate` base", None, compare.CompareMode("pirate", "base", blind=True)),
        ("base base", None, compare.CompareMode("base", "base")),
        ("off", None, None),
    ],
)
def test_compare_command_grammar(text, chosen, expected):
    assert compare.parse_command(text, SERVED, ["local"], chosen, "base") == expected


@pytest.mark.parametrize(
    ("text", "chosen", "used", "expected"),
    [
        ("", "base", [], ("base", "pirate")),  # the base chosen: the first adapter served
        ("blind", "base", [], ("base", "pirate")),
        ("base", "base", [], ("base", "pirate")),  # the base named alone is not the base twice
        ("blind base", None, [], ("base", "pirate")),
        ("", "base", ["pirate", "local", "base"], ("base", "local")),  # the adapter this chat used last
        ("blind base", "base", ["local", "base"], ("base", "local")),
        ("", "pirate", ["local"], ("base", "pirate")),  # an adapter chosen: that one
        ("", "base", ["gone", "base"], ("base", "pirate")),  # one no longer served or loadable: the first served
        ("base base", "base", ["local"], ("base", "base")),  # both names given: as asked
    ],
)
def test_the_base_chosen_is_compared_with_an_adapter_never_with_itself(text, chosen, used, expected):
    mode = compare.parse_command(text, SERVED, ["local"], chosen, "base", used)
    assert mode is not None and (mode.model_a, mode.model_b) == expected


def test_with_only_the_base_served_compare_says_so_whatever_is_named():
    for text in ("", "blind", "base", "blind base"):
        with pytest.raises(compare.CompareRefused) as one:
            compare.parse_command(text, ["base"], [], "base", "base", ["base"])
        assert one.value.key == "compare.one_model" and "only `base` is served" in one.value.user_text("en")


def test_compare_refusals_name_the_value_and_the_fix():
    with pytest.raises(compare.CompareRefused) as unknown:
        compare.parse_command("nosuch", SERVED, [], None, "base")
    assert "`nosuch` is not a served model or adapter; choose from `base`, `pirate`" in unknown.value.user_text("en")
    assert "`nosuch`" in unknown.value.user_text("zh")
    with pytest.raises(compare.CompareRefused) as one:
        compare.parse_command("", ["base"], [], None, "base")
    assert "only `base` is served" in one.value.user_text("en") and "/compare base base" in one.value.user_text("en")
    with pytest.raises(compare.CompareRefused) as usage:
        compare.parse_command("a b c", SERVED, [], None, "base")
    assert "`a b c`" in usage.value.user_text("en")


def test_the_same_model_on_both_sides_is_allowed_and_labelled():
    mode = compare.CompareMode("base", "base")
    assert mode.same and "Same model on both sides (`base`)" in mode.announcement("en")
    pair = compare.new_pair(mode, "u1", [])
    assert "same model on both sides" in compare.title(pair, pair.sides[0], "en")
    assert "两侧同一模型" in compare.title(pair, pair.sides[1], "zh")


def test_blind_pairs_are_shuffled_and_hide_the_names_until_the_vote():
    mode = compare.CompareMode("base", "pirate", blind=True)
    orders = {tuple(s.model for s in compare.new_pair(mode, "u", [], random.Random(i)).sides) for i in range(20)}
    assert orders == {("base", "pirate"), ("pirate", "base")}  # random order, both seen
    pair = compare.new_pair(mode, "u", [], random.Random(1))
    a, b = pair.sides
    assert (a.label, b.label) == ("A", "B") and not pair.revealed
    assert compare.title(pair, a, "en") == "**A**" and compare.author(pair, a) == "A"
    assert compare.shown_model(pair, b, "en") == "B (hidden)"
    assert markdown.mask(f"loading adapter {b.model} and {a.model}", pair, b, "en") == (
        "loading adapter B (hidden) and A (hidden)"
    )
    assert compare.side_metadata(pair, a)["qwenchat"]["model"] == ""
    assert "revealed after your vote" in markdown.note(pair, "en")


def test_a_vote_reveals_the_names_and_the_winner_is_what_the_chat_continues_from():
    conv = Conversation()
    conv.add_user("u1", "q")
    pair = compare.new_pair(compare.CompareMode("base", "pirate", blind=True), "u1", [], random.Random(0))
    for side, text in zip(pair.sides, ("one", "two"), strict=True):
        side.keep(f"m-{side.label}", text, side.model, False)
    compare.settle(pair, conv)
    assert conv.turns[-1].content == "one"  # A by default
    compare.apply_vote(pair, "b", conv)
    assert pair.revealed and conv.turns[-1].content == "two" and len(conv.turns) == 2
    assert compare.author(pair, pair.sides[1]) == f"B · {pair.sides[1].model}"
    note = markdown.note(pair, "en")
    assert f"**A** was `{pair.sides[0].model}`, **B** was `{pair.sides[1].model}`" in note
    vote = compare.to_vote(pair, "b", "alice", "t1", "nice")
    assert (vote.answer_a, vote.answer_b, vote.model_b, vote.winner, vote.comment) == (
        "one",
        "two",
        pair.sides[1].model,
        "b",
        "nice",
    )
    compare.apply_vote(pair, "tie", conv)
    assert conv.turns[-1].content == "one"  # a tie continues from A


def test_a_pick_after_the_chat_moved_on_is_refused():
    conv = Conversation()
    conv.add_user("u1", "q")
    pair = compare.new_pair(compare.CompareMode("base", "pirate"), "u1", [])
    for side in pair.sides:
        side.keep(f"m-{side.label}", side.model, side.model, False)
    compare.settle(pair, conv)
    conv.add_user("u2", "next")
    assert compare.pick(pair, "B", conv) is False
    assert [t.content for t in conv.turns] == ["q", "base", "next"]


def test_a_side_without_text_is_not_picked():
    conv = Conversation()
    conv.add_user("u1", "q")
    pair = compare.new_pair(compare.CompareMode("base", "pirate"), "u1", [])
    pair.sides[1].keep("m-B", "only b", "pirate", False)
    pair.picked = compare.default_pick(pair)
    compare.settle(pair, conv)
    assert pair.picked == 1 and conv.turns[-1].model == "pirate"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("A", ("a", "")), ("b  clearer answer", ("b", "clearer answer")), ("TIE", ("tie", ""))],
)
def test_vote_grammar(text, expected):
    assert compare.parse_vote(text) == expected


def test_a_bad_vote_names_the_value():
    with pytest.raises(compare.CompareRefused) as bad:
        compare.parse_vote("maybe later")
    assert "`maybe later`" in bad.value.user_text("en")


def test_the_leaderboard_is_a_markdown_table_in_both_languages():
    board = [Standing("pirate", 3, 1, 2), Standing("base", 1, 3, 2)]
    en = markdown.leaderboard_markdown(board, "en")
    assert "| model | wins | losses | ties |" in en and "| `pirate` | 3 | 1 | 2 |" in en
    assert en.index("pirate") < en.index("`base`")
    assert "| 模型 | 胜 | 负 | 平 |" in markdown.leaderboard_markdown(board, "zh")
    assert "No blind votes yet" in markdown.leaderboard_markdown([], "en")


def test_a_chat_keeps_a_bounded_number_of_pairs():
    pairs: dict[str, compare.Pair] = {}
    for i in range(compare.MAX_PAIRS + 5):
        compare.remember(pairs, compare.new_pair(compare.CompareMode("a", "b"), f"u{i}", []))
    assert len(pairs) == compare.MAX_PAIRS and "u0" not in pairs


def test_a_pair_and_its_vote_keep_the_turns_own_prompt_not_the_whole_conversation():
    """Issue #18: each kept pair and each stored vote held every earlier turn of the chat (a long chat, voted on
    turn after turn, filled the memory and the votes table with copies of itself)."""
    conv = Conversation()
    for i in range(200):
        conv.add_user(f"u{i}", f"question {i} " + "x" * 1000)
        conv.add_assistant(f"a{i}", f"answer {i} " + "y" * 1000, "base")
    conv.add_user("last", "which is better?")
    pair = compare.new_pair(compare.CompareMode("base", "pirate", blind=True), "last", conv.messages("be brief"))
    expected = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "which is better?"}]
    assert pair.prompt == expected
    assert compare.to_vote(pair, "a", "alice", "t1").prompt == expected
    no_system = compare.new_pair(compare.CompareMode("base", "pirate"), "last", conv.messages(""))
    assert no_system.prompt == [{"role": "user", "content": "which is better?"}]

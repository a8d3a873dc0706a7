"""backend/chat/export.py: /export's Markdown (the handler itself: tests/unit/test_app_export.py)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

from backend.chat.conversation import Conversation
from backend.chat.export import conversation_markdown, export_filename

NOW = datetime(2026, 1, 2, 3, 4)


def chat() -> Conversation:
    conv = Conversation()
    conv.add_user("u1", "capital of France?")
    conv.add_assistant("a1", "<think>hmm</think>Paris.", "smollm2")
    conv.add_user("u2", "and of Spain?")
    conv.add_assistant("a2", "Arr, Ma", "pirate", interrupted=True)
    return conv


def test_each_answer_is_headed_by_its_model_and_a_cut_answer_is_marked():
    md = conversation_markdown(chat(), "en", system_prompt="be brief\nreally", now=NOW)
    assert md.startswith("# Chat\n\n*exported 2026-01-02 03:04*\n\n**System prompt:**\n\n> be brief\n> really\n")
    assert "## You\n\ncapital of France?\n\n## Answer · `smollm2`\n\nParis.\n\n" in md  # no reasoning
    assert "## Answer · `pirate`\n\nArr, Ma\n\n*⚠ answer interrupted*\n" in md
    assert "hmm" not in md and export_filename(NOW) == "chat-20260102-0304.md"


def test_chinese_headings():
    md = conversation_markdown(chat(), "zh", now=NOW)
    assert md.startswith("# 对话") and "## 你" in md and "## 回答 · `pirate`" in md and "回答被中断" in md


def side(label: str, model: str, text: str, mid: str, cut: bool = False) -> SimpleNamespace:
    return SimpleNamespace(label=label, model=model, text=text, message_id=mid, interrupted=cut)


def test_a_compared_turn_shows_both_sides_the_picked_one_and_the_vote_once():
    conv = chat()
    conv.add_user("u3", "and of Italy?")
    conv.add_assistant("s3b", "Arr, Rome!", "pirate")  # the picked side, added to the history once settled
    conv.add_user("u4", "and of Greece?")
    pairs = {
        "u3": SimpleNamespace(
            sides=[side("A", "smollm2", "Rome.", "s3a"), side("B", "pirate", "Arr, Rome!", "s3b")],
            revealed=True,
            picked=1,
            vote="b",
        ),
        "u4": SimpleNamespace(  # blind, not voted yet: the names stay hidden in the export too
            sides=[side("A", "pirate", "Arr, Ath", "s4a", cut=True), side("B", "smollm2", "Athens.", "s4b")],
            revealed=False,
            picked=0,
            vote=None,
        ),
    }
    md = conversation_markdown(conv, "en", pairs=pairs, now=NOW)
    assert (
        "### Answer A · `smollm2`\n\nRome.\n\n### Answer B · `pirate` · the chat continued from this one\n\nArr, Rome!"
        in md
    )
    assert "*vote: Answer B*" in md and md.count("Arr, Rome!") == 1
    assert "### Answer A · model hidden until the vote · the chat continued from this one\n\nArr, Ath" in md
    assert "### Answer B · model hidden until the vote\n\nAthens." in md
    tail = md[md.index("and of Greece?") :]
    assert "pirate" not in tail and "smollm2" not in tail


def test_a_lone_surrogate_is_made_writable():
    conv = Conversation()
    conv.add_user("u1", "hi \ud800")
    md = conversation_markdown(conv, "en", now=NOW)
    assert "hi \ufffd" in md and md.encode("utf-8")


def test_a_message_with_documents_exports_them_as_the_model_read_them():
    from backend.chat.documents import Document

    conv = Conversation()
    conv.add_user("u1", "what is in it?", (Document("r.pdf", "pdf", "code ``` word", pages=1, page_ends=(13,)),))

    md = conversation_markdown(conv, "en", now=NOW)

    heading = "### 📎 r.pdf: PDF · 1 page · 13 characters"
    assert f"## You\n\nwhat is in it?\n\n{heading}\n\n````text\ncode ``` word\n````" in md

"""Files attached to a message, through Chainlit's own socket handler (``fileReferences``, as the browser sends
them after an upload) against the in-process fake server (tests/unit/test_app_handlers.py's harness): the documents
reach the model, the footer's meter lists them; a refused file says why with the typed text quoted back and nothing
sent; the "send the part that fits" button sends the cut."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.documents_build import make_docx, make_pdf
from tests.unit.test_app_handlers import Chat, Screen, chat, fake, marker, ui  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


def attach(chat: Chat, path: Path, mime: str = "application/octet-stream") -> dict[str, str]:  # noqa: F811
    """What Chainlit's upload route leaves in the session (``persist_file``); the reference the browser sends."""
    file_id = str(uuid.uuid4())
    chat.session.files[file_id] = {"id": file_id, "path": path, "name": path.name, "type": mime, "size": 1}
    return {"id": file_id}


async def send_with(chat: Chat, text: str, refs: list[dict[str, str]], timeout: float = 60) -> Screen:  # noqa: F811
    from chainlit import socket

    n = len(chat.events)
    await socket.message(chat.sid, {"message": chat.payload(text), "fileReferences": refs})
    await asyncio.wait_for(chat.session.current_task, timeout)
    return chat.screen(n)


def tool_steps(screen: Screen) -> list[dict[str, Any]]:
    return [s for s in screen.steps.values() if s.get("type") == "tool"]


async def test_attached_documents_reach_the_model_and_the_footer_lists_each(chat, tmp_path):  # noqa: F811
    m = marker()
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(make_pdf([f"code word {m}-PDF", "page two"]))
    docx = tmp_path / "notes.docx"
    docx.write_bytes(make_docx([f"code word {m}-DOCX"]))

    screen = await send_with(chat, f"which code words? {m}", [attach(chat, pdf), attach(chat, docx)])

    assert screen.errors == []
    [rec] = chat.received(m)
    sent = rec.messages[-1]["content"]
    assert f"{m}-PDF" in sent and f"{m}-DOCX" in sent and sent.endswith(f"which code words? {m}")
    assert "report.pdf " in screen.answers[-1] and "notes.docx " in screen.answers[-1]  # the meter's shares
    [step] = tool_steps(screen)
    assert "report.pdf: PDF · 2 pages" in step["output"] and "notes.docx: DOCX" in step["output"]
    assert chat.conversation.turns[-2].documents[0].name == "report.pdf"
    follow = await chat.send(f"and again? {m}x")  # a follow-up keeps the documents in the context
    assert f"{m}-PDF" in str(chat.received(f"{m}x")[-1].messages) and "report.pdf " in follow.answers[-1]


async def test_a_refused_file_says_why_quotes_the_typed_text_and_sends_nothing(chat, fake, tmp_path):  # noqa: F811
    m = marker()
    fake_txt = tmp_path / "notes.txt"
    fake_txt.write_bytes(bytes(range(256)) * 16)
    turns = len(chat.conversation.turns)

    screen = await send_with(chat, f"read this {m}", [attach(chat, fake_txt)])

    [error] = screen.errors
    assert "notes.txt" in error and "binary data" in error and f"read this {m}" in error
    assert chat.received(m) == [] and len(chat.conversation.turns) == turns


async def test_a_document_too_long_is_offered_cut_and_the_button_sends_the_part_that_fits(chat, tmp_path):  # noqa: F811
    m = marker()
    big = tmp_path / "big.pdf"
    big.write_bytes(make_pdf([f"page {i} " + "lorem ipsum dolor sit amet " * 60 for i in range(120)]))

    screen = await send_with(chat, f"summarise {m}", [attach(chat, big)])

    assert chat.received(m) == []
    [cut] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "send_cut"]
    part = cut["payload"]["part"]
    assert 0 < part < 120 and cut["label"] == f"Send pages 1–{part} of 120"

    sent = await chat.click(cut, timeout=120)

    assert sent.errors == []
    [rec] = chat.received(m)
    assert f'pages="1-{part} of 120"' in rec.messages[-1]["content"]
    assert any(f"sending big.pdf: pages 1–{part} of 120" in s.get("name", "") for s in tool_steps(sent))
    assert chat.conversation.turns[-2].documents[0].cut == part


async def test_an_upload_while_the_engine_is_down_is_kept_and_sent_by_retry_once_it_is_back(chat, fake, ui, tmp_path):  # noqa: F811
    """Like a typed message: read and kept with the turn, the engine's state said with Retry, nothing sent; Retry
    once the engine answers again sends the message with its document."""
    from backend.chat.health import EngineState

    m = marker()
    notes = tmp_path / "notes.txt"
    notes.write_text(f"the code word is {m}-TXT\n")
    fake.down = True
    try:
        assert (await ui.service.poller.refresh()).state is EngineState.DOWN
        screen = await send_with(chat, f"which code word? {m}", [attach(chat, notes)])
    finally:
        fake.down = False

    [error] = screen.errors
    assert "The engine is not answering" in error and "press Retry when it is back" in error
    assert chat.received(m) == []
    assert [d.name for d in chat.conversation.last_user().documents] == ["notes.txt"]  # kept with the turn
    [step] = tool_steps(screen)
    assert "notes.txt: text" in step["output"]
    [retry] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "retry"]
    assert (await ui.service.poller.refresh()).answering

    again = await chat.click(retry)

    assert again.errors == []
    [rec] = chat.received(m)
    assert f"the code word is {m}-TXT" in rec.messages[-1]["content"]
    assert rec.messages[-1]["content"].endswith(f"which code word? {m}")
    assert "notes.txt " in again.answers[-1]  # the meter's share

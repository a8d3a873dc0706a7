"""A turn with documents (backend/chat/turn.py, budget.py) against the fake OpenAI server: the documents framed before
the question in what the server receives, each one's share in the meter, an earlier one left out said, and a
document that does not fit never cut silently: the part that fits is offered, named by its pages."""

from __future__ import annotations

import uuid

import pytest

from backend.chat import turn
from backend.chat.documents import Document
from backend.chat.service import Service
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome
from tests.unit.chat.test_turn import Recorder, fake, marker, received, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


def pdf(name: str, pages: list[str]) -> Document:
    ends, pos = [], 0
    for i, page in enumerate(pages):
        pos += len(page) + (2 if i else 0)
        ends.append(pos)
    return Document(name, "pdf", "\n\n".join(pages), pages=len(pages), page_ends=tuple(ends))


def with_documents(svc: Service, question: str, *docs: Document) -> ChatSession:
    session = ChatSession(system_prompt="", sampling=svc.default_sampling())
    session.conversation.add_user(str(uuid.uuid4()), question, docs)
    return session


async def test_documents_reach_the_model_framed_before_the_question_and_the_meter_lists_each(service, fake):  # noqa: F811 - fixtures
    m = marker()
    report = pdf("report.pdf", [f"the code word is {m}", "second page"])
    notes = Document("notes.docx", "docx", "some notes")
    session = with_documents(service, f"what is the code word? {m}", report, notes)
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    [rec] = received(fake, m)
    sent = rec.messages[-1]["content"]
    assert sent.index('<document name="report.pdf" type="PDF" pages="2">') < sent.index(f"the code word is {m}")
    assert sent.index('<document name="notes.docx" type="DOCX">') < sent.index(f"what is the code word? {m}")
    fitted = view.reply().fitted
    assert [name for name, _ in fitted.documents] == ["report.pdf", "notes.docx"]
    assert all(0 < tokens < fitted.prompt_tokens for _, tokens in fitted.documents)
    meter = fitted.meter_text("en")
    assert f"report.pdf {fitted.documents[0][1]:,}" in meter and "notes.docx" in meter


async def test_an_earlier_document_left_out_is_named_in_the_meter(service, fake):  # noqa: F811 - fixtures
    session = with_documents(service, "first question", pdf("old.pdf", ["lorem ipsum dolor sit amet " * 3_000]))
    session.conversation.add_assistant("a1", "an answer", "fake-qwen")
    session.conversation.add_user(str(uuid.uuid4()), "lorem ipsum " * 3_000 + marker())
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    fitted = view.reply().fitted
    assert fitted.documents == () and fitted.documents_left_out == ("old.pdf",)
    assert "old.pdf left out" in fitted.meter_text("en")


async def test_a_document_too_long_is_never_cut_silently_the_part_that_fits_is_offered(service, fake):  # noqa: F811 - fixtures
    m = marker()
    pages = [f"page {i} " + "lorem ipsum dolor sit amet " * 60 for i in range(200)]  # far above 8,192 tokens
    big = pdf("big.pdf", pages)
    session = with_documents(service, f"summarise {m}", big)
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert received(fake, m) == []  # nothing sent
    [(kind, text, document, part, label)] = [e for e in view.events if e[0] == "offer_cut"]
    assert document == 0 and 0 < part < 200
    assert f"pages 1–{part} of 200" in text and "Nothing was sent" in text and label == f"Send pages 1–{part} of 200"
    assert session.conversation.turns[0].documents == (big,)  # nothing stored cut

    session.conversation.add_user(session.conversation.turns[0].id, f"summarise {m}", (big.first(part),))
    view = Recorder()
    assert await turn.answer(session, service, view) is Outcome.ANSWERED  # the part offered does fit
    [rec] = received(fake, m)
    sent = rec.messages[-1]["content"]
    assert f'pages="1-{part} of 200"' in sent and f"page {part - 1} " in sent and f"page {part} " not in sent

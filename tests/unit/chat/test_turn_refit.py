"""vLLM's 400 naming a context smaller than the one we fitted to (backend/chat/turn.py ``_refit``): the turn fits the
conversation again to the length the server named, earlier turns first, says so in a step and asks once more before
any token; a document that no longer fits is offered cut, never cut silently. Against the fake OpenAI server, whose
``overflow-400`` answers vLLM's exact body with ``limit`` as the length it names."""

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
# The fake server counts attempts per mode spec (``fail=1``: the first one fails): each test has its own spec.

TURN = "lorem ipsum dolor sit amet " * 200  # an earlier turn: about 1,100 tokens


@pytest.fixture(autouse=True)
def forget_learned_limit(service):  # noqa: F811 - fixtures
    """Each test starts from the length the fake server reports (8,192), not from one a test taught the service."""
    service._server_limit = None
    yield
    service._server_limit = None


def long_chat(svc: Service, question: str, *docs: Document) -> ChatSession:
    """Four earlier turns of about 1,100 tokens each (they fit 8,192 tokens, not 4,096), then ``question``."""
    session = ChatSession(system_prompt="", sampling=svc.default_sampling())
    for i in range(4):
        session.conversation.add_user(str(uuid.uuid4()), f"turn {i} {TURN}")
        session.conversation.add_assistant(f"a{i}", f"answer {i}", "fake-qwen")
    session.conversation.add_user(str(uuid.uuid4()), question, docs)
    return session


async def test_a_smaller_server_context_is_fitted_again_and_asked_once_more_saying_so(service, fake):  # noqa: F811
    m = marker()
    session = long_chat(service, f"[[fault:overflow-400:fail=1:limit=4096:tokens=5]] the question {m}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    first, second = received(fake, m)
    assert len(first.messages) == 9  # everything fitted 8,192 tokens
    assert 1 < len(second.messages) < 9 and "turn 0" not in str(second.messages)  # the oldest turns went first
    assert second.messages[-1] == first.messages[-1]  # the question itself, whole
    fitted = view.reply().fitted
    assert fitted.max_model_len == 4096 and fitted.prompt_tokens <= 4096 - service.reply_tokens()
    assert fitted.left_out > 0 and view.errors() == []
    [step] = view.steps
    assert (
        step.name == f"the server's context is 4,096 tokens; {fitted.left_out} earlier turns left out, sent once more"
    )
    assert service.max_model_len() == 4096  # the next message is fitted to it at once


async def test_the_retry_is_once_a_second_refusal_is_said(service, fake):  # noqa: F811 - fixtures
    m = marker()
    session = long_chat(service, f"[[fault:overflow-400:fail=2:limit=4096]] the question {m}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert len(received(fake, m)) == 2
    [(text, retry, _)] = view.errors()
    assert "maximum context length is 4096 tokens" in text and not retry


async def test_a_refusal_naming_no_smaller_context_is_not_asked_again(service, fake):  # noqa: F811 - fixtures
    m = marker()
    session = long_chat(service, f"[[fault:overflow-400:fail=1:limit=8192]] the question {m}")
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert len(received(fake, m)) == 1 and view.steps == []
    assert service.max_model_len() == 8192


async def test_a_document_that_no_longer_fits_is_offered_cut_not_cut_silently(service, fake):  # noqa: F811
    m = marker()
    pages = [f"page {i} " + "lorem ipsum dolor sit amet " * 60 for i in range(12)]  # about 4,500 tokens
    ends = tuple(sum(len(p) + 2 for p in pages[: i + 1]) - 2 for i in range(len(pages)))
    doc = Document("report.pdf", "pdf", "\n\n".join(pages), pages=len(pages), page_ends=ends)
    session = long_chat(service, f"[[fault:overflow-400:fail=1:limit=4096:tokens=6]] summarise {m}", doc)
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.FAILED

    assert len(received(fake, m)) == 1  # the refused request only: nothing cut was sent
    [(_, text, document, part, _)] = [e for e in view.events if e[0] == "offer_cut"]
    assert document == 0 and 0 < part < 12 and f"pages 1–{part} of 12" in text

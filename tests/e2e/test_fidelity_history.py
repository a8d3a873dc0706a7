"""End to end, in real Chromium: a chat read back from the history shows the text as written and its compare sides
in columns (#22): the owner's resumed chat and another user's shared view.

The shared login-on product (tests/e2e/conftest.py ``login_app``: the history database), in external mode on
the fake server (scripted answers). The
owner types a message Chainlit's renderer used to cut, gets an answer of the same kind, then a compared turn
whose A side ends after its B side;
the chat is reloaded from the database (a resumed chat) and opened through its share link by a second account.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e import fidelity_corpus as corpus
from tests.e2e import support as e2e
from tests.e2e.test_compare import command
from tests.e2e.test_compare_columns import SIDE_JS
from tests.e2e.test_fidelity import ANSWERS, USERS, expected, post, shown
from tests.e2e.test_share import api, logged_in

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

OWNER, OWNER_PW, VIEWER, VIEWER_PW = e2e.OWNER, e2e.OWNER_PW, e2e.VIEWER, e2e.VIEWER_PW
TYPED = corpus.source("typed-directive")
ANSWER = ["word-colon-word", "technical-pairs", "fenced-block", "colons-only", "colon-line-starts"]
COMPARED = corpus.CORPUS["word-colon-word"]


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@pytest.fixture(scope="module")
def live(login_app):
    return login_app  # shared with test_share (tests/e2e/conftest.py): login on for the owner and the viewer


def answer_text() -> str:
    return "\n\n".join(corpus.source(name) for name in ANSWER)


@pytest.fixture(scope="module")
def chat(browser, live, fake):
    """The owner's chat: a typed message, its answer, a compared turn; (thread id, owner's page)."""
    page = logged_in(browser, live, OWNER, OWNER_PW)
    post(fake + "/fake/script", {"chunks": [c for name in ANSWER for c in [*corpus.CORPUS[name], "\n\n"]][:-1]})
    e2e.send(page, TYPED, timeout_ms=60_000)
    page.wait_for_url("**/thread/*")  # the chat's first message moves the page to its thread: then type the command
    command(page, "compare")
    post(fake + "/fake/script", {"chunks": COMPARED})
    # A starts 2 s late and so ends after B: read back, A must still come first (left).
    e2e.send(page, "[[fault:stall-first:stall=2:model=fake-qwen]] compare these", timeout_ms=60_000)
    page.wait_for_function(
        "() => ['a', 'b'].every(l => (SIDE)([l]) && (SIDE)([l]).text.includes(' · context: '))".replace("SIDE", SIDE_JS)
    )
    post(fake + "/fake/script", {"chunks": None})
    page.wait_for_url("**/thread/*")
    yield page.url.rsplit("/", 1)[-1], page
    page.context.close()


def assert_shown_as_written(page) -> None:
    """The typed message, the answer and both compared sides, each as written; A and B in columns."""
    page.locator(USERS).first.wait_for()
    page.wait_for_function("() => ['a', 'b'].every(l => (SIDE)([l]))".replace("SIDE", SIDE_JS))
    assert shown(page, USERS)[0] == expected(page, TYPED)
    want = expected(page, answer_text())
    # the page renders the thread's steps one by one: the answer may come a moment after the user message and the
    # compare's sides (a shared view read none the first time it was looked at)
    deadline = time.monotonic() + 30
    answers = shown(page, ANSWERS)
    while not any(a.startswith(want + " fake-qwen · ") for a in answers):
        assert time.monotonic() < deadline, f"{answers}\nexpected: {want!r}"
        page.wait_for_timeout(200)
        answers = shown(page, ANSWERS)
    a, b = page.evaluate(SIDE_JS, ["a"]), page.evaluate(SIDE_JS, ["b"])
    assert " ".join(a["text"].split()).startswith("A · fake-qwen w0 w1 "), a  # the stalled side's own tokens
    want_b = "B · fake-adapter " + expected(page, corpus.source("word-colon-word"))
    assert " ".join(b["text"].split()).startswith(want_b), b
    assert a["right"] <= b["left"] and abs(a["top"] - b["top"]) < 4, (a, b)


def test_a_resumed_chat_shows_the_text_as_written_and_the_compare_in_columns(chat):
    thread_id, page = chat
    page.goto(page.url.rsplit("/thread/", 1)[0] + f"/thread/{thread_id}")  # read back from the database
    assert_shown_as_written(page)


def test_a_shared_view_shows_the_text_as_written_and_the_compare_in_columns(chat, browser, live):
    thread_id, owner = chat
    status, _ = api(owner, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": True})
    assert status == 200
    viewer = logged_in(browser, live, VIEWER, VIEWER_PW)
    try:
        viewer.goto(f"{live.url}/share/{thread_id}")
        assert_shown_as_written(viewer)
    finally:
        viewer.context.close()

"""End to end: two UI processes on one PostgreSQL database behave like one app — in real Chromium.

Two real app processes (`python -m backend serve`, different ports, different log folders as on two machines)
in external mode against the fake OpenAI server, both with ``[history] db`` = one database on the session's
real PostgreSQL (tests/support/postgres.py): A is the shared ``pg_history_app`` (tests/conftest.py), B is launched
here on A's database. Log in on A and chat; open B (the login is valid there: the login secret is in the database),
resume the same thread from B's history sidebar and continue; A shows the continued thread after a reload.
"""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e
from tests.e2e.test_history import LOGIN, launch, log_in, requests_seen, user_messages
from tests.fakes.openai_server import expected_text
from tests.integration.test_message_ids import launch as launch_like_a

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

FULL = expected_text(8).strip()
BAD = ("Traceback", "error occurred")


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@pytest.fixture(scope="module")
def uis(fake, pg_history_app, tmp_path_factory):
    a = pg_history_app
    # B as A was launched (the same accounts: they are part of what signs a login, so A's cookie is B's too)
    b = launch_like_a(fake, tmp_path_factory.mktemp("ui-b"), a.history_url)
    yield a, b
    e2e.stop(b)


def test_a_thread_started_on_one_ui_is_resumed_and_continued_on_the_other(uis, fake, postgres, browser):
    a, b = uis
    # the whole ui.log (A is shared: its first lines are long past LiveApp.log's tail); what this test's turns
    # write is what follows ``since``
    since = {ui.url: ui.mark("ui") for ui in (a, b)}
    for ui in (a, b):
        log = ui.log_with("chats kept in", "ui", since=0)
        assert "chats kept in postgresql+asyncpg://qwenchat:***@127.0.0.1:" in log
        assert postgres.password not in log and postgres.password not in ui.log()

    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    context.set_default_timeout(60_000)
    page_a = context.new_page()
    log_in(page_a, a.url)
    e2e.wait_ready_ui(page_a, timeout_ms=60_000)
    first, second = "two uis one: capital?", "two uis two: continued on B"
    answer = e2e.send(page_a, first, timeout_ms=60_000)
    assert answer.startswith(FULL) and "fake-qwen ·" in answer
    page_a.wait_for_url("**/thread/*")
    thread_url_a = page_a.url
    thread_id = thread_url_a.rsplit("/", 1)[-1]

    # B on another port: the browser sends the same login cookie, and B accepts it (one secret, in the database)
    page_b = context.new_page()
    page_b.goto(b.url)
    e2e.wait_ready_ui(page_b, timeout_ms=60_000)
    assert page_b.locator("#email").count() == 0, "B asked for a login: the login secret is not shared"
    thread = page_b.locator(f"#thread-{thread_id}")
    thread.wait_for(timeout=30_000)  # B's history sidebar lists the chat made on A
    assert "two uis one" in thread.inner_text()
    thread.click()
    page_b.wait_for_function("() => document.querySelectorAll('.step[data-step-type=\"user_message\"]').length >= 1")
    e2e.wait_ready_ui(page_b, timeout_ms=60_000)
    assert [m.strip() for m in user_messages(page_b)] == [first]
    assert e2e.assistant_messages(page_b)[0].startswith(FULL)
    n = len(requests_seen(fake))
    answer = e2e.send(page_b, second, timeout_ms=60_000)
    assert answer.startswith(FULL) and "fake-qwen ·" in answer
    [req] = requests_seen(fake)[n:]
    # B sent A's turn along: both user messages and A's raw answer (no footer)
    assert req["message_chars"] == len(first) + len(expected_text(8)) + len(second), req
    assert page_b.url.endswith(thread_id)  # the same thread, not a new one

    page_a.goto(thread_url_a)  # A again, after a reload: the thread as B left it
    e2e.wait_ready_ui(page_a, timeout_ms=60_000)
    page_a.wait_for_function("() => document.querySelectorAll('.step[data-step-type=\"user_message\"]').length >= 2")
    assert [m.strip() for m in user_messages(page_a)] == [first, second]
    shown = e2e.assistant_messages(page_a)
    assert len(shown) == 2 and all(s.startswith(FULL) for s in shown)
    rows = postgres.psql(
        f"SELECT count(*) FROM steps WHERE \"threadId\" = '{thread_id}' AND type = 'user_message'", a.history_name
    )
    assert rows.strip() == "2"
    for ui in (a, b):  # Chainlit's data layer only logs a failed INSERT: none may have failed on PostgreSQL
        bad = [ln for ln in ui.log("ui", since=since[ui.url]).splitlines() if any(w in ln for w in BAD)]
        assert not bad, bad
    context.close()


def test_a_ui_whose_database_is_down_says_it_waits_then_chats_without_history(fake, postgres, browser, tmp_path):
    """PostgreSQL refuses connections: the launcher says the UI waits for it ([history] wait, 2 s here, never
    the password), the UI then starts without history, login and chat work, and the chat says history is off."""
    from tests.support.postgres import free_port

    down = postgres.url("qwenchat", port=free_port())
    app = launch(
        fake,
        tmp_path,
        **LOGIN,
        QWENCHAT_HISTORY_DB=down,
        QWENCHAT_HISTORY_WAIT="2",
    )
    try:
        said = app.log()
        assert "the UI waits for its history database before it listens: history: history.db = " in said
        assert "connection refused" in said and "waiting up to 2 s" in said
        assert "the UI starts without history: history: history.db = postgresql+asyncpg://qwenchat:***@" in said
        assert postgres.password not in said and postgres.password not in app.log("ui")
        assert "history is off" in app.log_with("history is off", "ui")
        page = browser.new_page(locale="en-US")
        try:
            log_in(page, app.url)
            e2e.wait_ready_ui(page, timeout_ms=60_000)
            page.get_by_text("History is off").first.wait_for(timeout=30_000)  # the chat says so
            assert e2e.send(page, "no history here", timeout_ms=60_000).startswith(FULL)
        finally:
            page.close()
    finally:
        e2e.stop(app)

"""End to end: login, chat history, and the chosen model surviving a reload — in real Chromium.

The product is launched as start.sh launches it (`python -m backend serve`) in external mode against
the fake OpenAI server (`python -m tests.fakes.openai_server`), whose ``GET /fake/requests`` says which model
each request named and how many characters of messages it carried (so the test sees whether the
earlier turns — and only their raw text, no footers — were sent after a reload).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from sqlalchemy import text

from backend.probe import PROBE_MESSAGES, probe_body
from backend.storage import database
from tests.e2e import support as e2e
from tests.fakes.openai_server import expected_text
from tests.support.faults import Held

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

USER, PASSWORD = "demo", "correct horse battery"
# [ui] login on, as USER with PASSWORD: launch(fake, tmp, **LOGIN, ...)
LOGIN = {"QWENCHAT_LOGIN_ENABLE": "true", "QWENCHAT_LOGIN_USERNAME": USER, "QWENCHAT_LOGIN_PASSWORD": PASSWORD}
FULL = expected_text(8).strip()  # the fake server's normal answer


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


def is_probe(record: dict) -> bool:
    """The UI's health probe (backend/probe.py: one token, not streamed, "ping"), not a chat request."""
    return (
        not record["stream"]
        and record["max_tokens"] == probe_body("")["max_tokens"]
        and record["message_chars"] == sum(len(m["content"]) for m in PROBE_MESSAGES)
    )


def requests_seen(fake: str) -> list[dict]:
    """The chat requests the fake server got, oldest first. The health probes are left out: the UI's poller sends
    one every [health] probe_every s, at any moment, so with them the last request (or the count of new ones
    around a message) would depend on when the poller last probed."""
    with urllib.request.urlopen(fake + "/fake/requests", timeout=5) as resp:
        return [r for r in json.loads(resp.read()) if not is_probe(r)]


def status_of(app: e2e.LiveApp, login: bool) -> dict:
    """GET /qwenchat/status; with [login].enable it needs a login, so log in first as the page does."""
    if not login:
        return e2e.status(app)
    form = urllib.parse.urlencode({"username": USER, "password": PASSWORD}).encode()
    with urllib.request.urlopen(urllib.request.Request(app.url + "/login", data=form), timeout=5) as resp:
        cookies = [c.split(";")[0] for c in resp.headers.get_all("set-cookie") or []]
    req = urllib.request.Request(app.url + "/qwenchat/status", headers={"Cookie": "; ".join(cookies)})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def launch(fake: str, tmp, **env: str) -> e2e.LiveApp:
    """The product in external mode against ``fake`` with ``env`` on top, ready (``wait_ready``)."""
    app = e2e.launch(
        tmp,
        {"OPENAI_BASE_URL": fake + "/v1", "OPENAI_API_KEY": "test", "QWENCHAT_UI_LANGUAGE": "en", **env},
        wait_engine=False,
        timeout=120,
    )
    return wait_ready(app, fake, login=env.get("QWENCHAT_LOGIN_ENABLE") == "true")


def wait_ready(app: e2e.LiveApp, fake: str, *, login: bool = False) -> e2e.LiveApp:
    """``app`` once its status says ready on the fake server's model (stopped, and the test failed, after 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            state = status_of(app, login)
        except OSError as exc:
            state = {"unavailable": str(exc)}
        if state.get("state") == "ready" and state.get("model") == "fake-qwen":
            return app
        if time.monotonic() > deadline:
            e2e.stop(app)
            pytest.fail(
                f"the launched UI is not ready against {fake}/v1 after 60 s: {json.dumps(state)}\n"
                f"{app.log('ui')[-3000:]}"
            )
        time.sleep(0.5)


def new_page(browser):
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    return page


def log_in(page, url: str, password: str = PASSWORD) -> None:
    """Sign in on ``page``. A page already open at the app sends itself to /login: a navigation of its own, which
    interrupts a goto made meanwhile ("Navigation to / is interrupted by another navigation to /login", seen when
    the UI was slow to answer). So the form is awaited where the page goes, and the app opened only when it does
    not get there by itself."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if "/login" not in page.url:
        try:
            if page.url in ("", "about:blank"):
                raise PlaywrightTimeout("not open yet")
            page.wait_for_url("**/login**", timeout=15_000)
        except PlaywrightTimeout:
            page.goto(url, wait_until="commit")
    page.wait_for_selector("#email", timeout=60_000)
    page.fill("#email", USER)
    page.fill("#password", password)
    page.click("button[type=submit]")


def selected_model(page) -> str:
    """The model the settings panel shows as chosen."""
    page.click("#chat-settings-open-modal")
    text = page.locator("[role=dialog] button#model").inner_text()
    page.keyboard.press("Escape")
    page.wait_for_selector("[role=dialog]", state="detached")
    return text


def user_messages(page) -> list[str]:
    return page.locator('.step[data-step-type="user_message"]').all_inner_texts()


# ---------------------------------------------------------------- with login: history


@pytest.fixture(scope="module")
def live(fake, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e-history")
    app = launch(fake, tmp, **LOGIN)
    yield app
    e2e.stop(app)


@pytest.fixture(scope="module")
def page(live, browser):
    pg = new_page(browser)
    log_in(pg, live.url)
    e2e.wait_ready_ui(pg, timeout_ms=60_000)
    return pg


# ---------------------------------------------------------------- the history database locked (issue 32)

LOCK_S = 20.0  # four of SQLite's 5 s busy timeouts: the turn's write fails and is retried while the page says so
BADGE = "() => document.getElementById('qwenchat-status')?.textContent || ''"


def stored_messages(db: database.Database) -> int:
    query = text("SELECT COUNT(*) FROM steps WHERE \"type\" IN ('user_message', 'assistant_message')")
    return int(database.store(db).run(lambda c: c.execute(query).scalar()) or 0)


def test_a_turn_sent_under_a_20_s_lock_is_answered_told_kept_and_back_after_a_reload(live, fake, browser):
    """Issue 32 as a new user met it: another process holds an exclusive lock on history.sqlite3 while a turn is sent.
    Before the outbox the answer showed and the turn was gone after a reload (Chainlit logged "An error occurred:
    (sqlite3.OperationalError) database is locked"), and the page said nothing. The issue's 40 s lock is
    tests/integration/test_history_outage.py's (the stored rows and the status line, over the socket). First in the
    module: the chats after it are the newest in the sidebar, where the tests below look."""
    db = database.sqlite_file(live.log_dir / "history.sqlite3")
    since, before = live.mark("ui"), stored_messages(db)
    lock: Held | None = None
    first, second, third = "lock one: capital of France?", "lock two: and Italy?", "lock three: and Spain?"
    page = new_page(browser)
    try:
        log_in(page, live.url)
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        assert "fake-qwen ·" in e2e.send(page, first, timeout_ms=60_000)
        page.wait_for_url("**/thread/*")  # Chainlit moves a stored chat to its own URL
        deadline = time.monotonic() + 30
        while stored_messages(db) < before + 2:
            assert time.monotonic() < deadline, "the first turn not stored"
            time.sleep(0.2)

        lock, locked_at = Held(live.log_dir / "history.sqlite3"), time.monotonic()
        answer = e2e.send(page, second, timeout_ms=60_000)  # answered on screen while the history is locked
        assert answer.startswith(FULL) and "fake-qwen ·" in answer, answer
        page.wait_for_function(f"() => ({BADGE})().includes('waiting to be saved')", timeout=60_000)
        badge = page.evaluate(BADGE)
        assert "history: 2 messages waiting to be saved · the database is locked" in badge, badge
        page.screenshot(path=str(live.log_dir / "history-locked.png"))
        time.sleep(max(0.0, LOCK_S - (time.monotonic() - locked_at)))  # the lock's length: the scenario itself
        lock.release()
        lock = None
        page.wait_for_function(f"() => !({BADGE})().includes('waiting to be saved')", timeout=120_000)
        assert stored_messages(db) == before + 4

        page.reload()
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        page.wait_for_function("() => document.querySelectorAll('.step[data-step-type=\"user_message\"]').length >= 2")
        assert [m.strip() for m in user_messages(page)] == [first, second]
        answer = e2e.send(page, third, timeout_ms=60_000)
        assert answer.startswith(FULL)
        sent = requests_seen(fake)[-1]  # the model's context after the reload: the locked turn is in it
        assert sent["message_chars"] == len(first) + len(second) + len(third) + 2 * len(expected_text(8)), sent
    finally:
        if lock is not None:
            lock.release()
        page.context.close()
    log = live.log("ui", since=since)
    assert "Traceback" not in log and "An error occurred" not in log, log[-3000:]


def test_a_wrong_password_is_refused_with_a_message_and_no_chat(live, browser):
    pg = new_page(browser)
    # the login's answer, not a fixed wait: on a busy machine it can come after any wait that is "long enough"
    with pg.expect_response(lambda r: r.url.endswith("/login") and r.request.method == "POST") as answer:
        log_in(pg, live.url, password="wrong")
    assert answer.value.status == 401
    assert pg.locator("#chat-input").count() == 0 and pg.locator("#email").is_visible()
    assert "Traceback" not in pg.content()
    pg.context.close()


def test_with_login_the_status_line_is_not_readable_before_login_and_the_login_page_shows_no_badge(live, browser):
    with pytest.raises(urllib.error.HTTPError) as refused:
        e2e.status(live)  # no login cookie
    assert refused.value.code == 401
    assert status_of(live, True)["model"] == "fake-qwen"  # with one, it is
    pg = new_page(browser)
    pg.goto(live.url)
    pg.wait_for_selector("#email", timeout=60_000)
    pg.wait_for_function("() => document.getElementById('qwenchat-status')?.dataset.state === 'hidden'", timeout=15_000)
    badge = pg.evaluate(
        "() => { const el = document.getElementById('qwenchat-status');"
        " return {hidden: el.hidden, visible: el.offsetParent !== null, text: el.textContent}; }"
    )
    assert badge == {"hidden": True, "visible": False, "text": ""}, badge
    assert "undefined" not in pg.inner_text("body")
    pg.context.close()


def test_a_reloaded_chat_shows_its_messages_keeps_the_chosen_adapter_and_sends_the_earlier_turns(page, live, fake):
    first, second, third = "history one: capital?", "history two: and Spain?", "history three: after reload"
    assert "fake-qwen ·" in e2e.send(page, first, timeout_ms=60_000)
    page.wait_for_url("**/thread/*")  # Chainlit moves a stored chat to its own URL after the first answer
    e2e.choose_model(page, "fake-adapter")
    answer = e2e.send(page, second, timeout_ms=60_000)
    assert answer.startswith(FULL) and "fake-adapter ·" in answer
    before = requests_seen(fake)[-1]
    answer_chars = before["message_chars"] - len(first) - len(second)  # one raw answer, as the model said it
    assert answer_chars == len(expected_text(8)), before

    page.reload()
    e2e.wait_ready_ui(page, timeout_ms=60_000)
    # a function, not an expression: Playwright evals a bare expression in the page, which the CSP forbids
    page.wait_for_function("() => document.querySelectorAll('.step[data-step-type=\"user_message\"]').length >= 2")
    page.screenshot(path=str(live.log_dir / "after-reload.png"))
    assert [m.strip() for m in user_messages(page)] == [first, second]
    shown = e2e.assistant_messages(page)
    assert len(shown) == 2 and "fake-qwen ·" in shown[0] and "fake-adapter ·" in shown[1]
    assert selected_model(page).startswith("fake-adapter")

    answer = e2e.send(page, third, timeout_ms=60_000)
    assert answer.startswith(FULL) and "fake-adapter ·" in answer
    after = requests_seen(fake)[-1]
    assert after["model"] == "fake-adapter"
    # every earlier turn went along, as raw text: no footer, no error bubble, nothing twice
    assert after["message_chars"] == len(first) + len(second) + len(third) + 2 * answer_chars, after
    assert "Traceback" not in live.log("ui")


def test_a_chat_reopened_from_the_history_sidebar_in_another_browser_has_its_messages_and_model(
    page, live, fake, browser
):
    other = new_page(browser)  # another browser: no cookies, a fresh login
    log_in(other, live.url)
    e2e.wait_ready_ui(other, timeout_ms=60_000)
    assert selected_model(other).startswith("fake-adapter")  # remembered for this user on any browser
    thread = other.locator('[id^="thread-"]').first
    thread.wait_for(timeout=30_000)
    assert "history one" in thread.inner_text()
    thread.click()
    other.wait_for_function("() => document.querySelectorAll('.step[data-step-type=\"user_message\"]').length >= 3")
    e2e.wait_ready_ui(other, timeout_ms=60_000)
    other.screenshot(path=str(live.log_dir / "reopened.png"))
    assert [m.strip() for m in user_messages(other)][:3] == [
        "history one: capital?",
        "history two: and Spain?",
        "history three: after reload",
    ]
    assert selected_model(other).startswith("fake-adapter")
    n = len(requests_seen(fake))
    answer = e2e.send(other, "history four: from the sidebar", timeout_ms=60_000)
    assert "fake-adapter ·" in answer
    [req] = requests_seen(fake)[n:]
    assert req["model"] == "fake-adapter" and req["message_chars"] > 4 * len(expected_text(8))
    other.context.close()


def test_thumbs_down_with_a_comment_is_stored_and_a_thumbs_up_answer_is_exported_as_a_chat_example(
    page, live, tmp_path_factory
):
    """Chainlit's own feedback buttons (shown because login brings a data layer), stored in its feedbacks table
    on the answer's run step; `export-feedback` turns the thumbs-up answer into a chat example."""
    import sqlite3
    import subprocess
    import sys

    from backend.settings import ROOT

    answers = page.locator('.step[data-step-type="assistant_message"]')
    assert answers.count() >= 2
    answers.nth(0).hover()
    answers.nth(0).locator(".negative-feedback-off").click()
    page.locator("[role=dialog] textarea").fill("too plain, say it like a pirate")
    page.click("#submit-feedback")
    answers.nth(0).locator(".negative-feedback-on").wait_for(timeout=15_000)
    answers.nth(1).hover()
    answers.nth(1).locator(".positive-feedback-off").click()
    page.click("#submit-feedback")  # the comment is optional
    answers.nth(1).locator(".positive-feedback-on").wait_for(timeout=15_000)
    page.screenshot(path=str(live.log_dir / "feedback.png"))

    db = sqlite3.connect(live.log_dir / "history.sqlite3")
    rows = db.execute(
        'SELECT f.value, f.comment, a.metadata FROM feedbacks f JOIN steps a ON a."parentId" = f."forId" '
        "WHERE a.type = 'assistant_message' ORDER BY a.\"createdAt\""
    ).fetchall()
    db.close()
    assert [(value, comment) for value, comment, _ in rows] == [(0, "too plain, say it like a pirate"), (1, None)]
    assert json.loads(rows[0][2])["qwenchat"]["model"] == "fake-qwen"

    out = tmp_path_factory.mktemp("export") / "prefs.jsonl"
    env = {**os.environ, "QWENCHAT_LOGGING_DIR": str(live.log_dir), "QWENCHAT_LOGIN_ENABLE": "true"}
    env |= {"QWENCHAT_LOGIN_USERNAME": USER, "QWENCHAT_LOGIN_PASSWORD": PASSWORD}
    res = subprocess.run(
        [sys.executable, "-m", "backend", "export-feedback", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "no blind votes yet" in res.stderr  # no vote: no pairs file, said so
    assert not out.exists()
    [example] = [json.loads(line) for line in out.with_name("prefs-chat.jsonl").read_text().splitlines()]
    assert [m["content"] for m in example["messages"] if m["role"] == "user"] == [
        "history one: capital?",
        "history two: and Spain?",
    ]
    assert example["model"] == "fake-adapter" and example["messages"][-1]["content"].startswith(FULL)


def test_a_restart_keeps_the_login_and_the_history(live, fake, browser, tmp_path_factory, page):
    """The login secret is kept next to the database, so a restarted product accepts the same cookie."""
    e2e.stop(live)
    again = e2e.launch(
        live.log_dir.parent,
        {
            "OPENAI_BASE_URL": fake + "/v1",
            "OPENAI_API_KEY": "test",
            "QWENCHAT_UI_LANGUAGE": "en",
            **LOGIN,
        },
        wait_engine=False,
        timeout=120,
    )
    try:
        page.goto(again.url)  # cookies are per host, not per port: the same login cookie is sent
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        assert page.locator("#email").count() == 0, "the restart logged the user out"
        thread = page.locator('[id^="thread-"]').first
        thread.wait_for(timeout=30_000)
        assert "history one" in thread.inner_text()
    finally:
        e2e.stop(again)


# ---------------------------------------------------------------- without login: the model choice alone


def test_without_login_the_chosen_adapter_survives_a_page_reload(fake, browser, external_app):
    app = wait_ready(external_app, fake)  # login off: the shared external-mode product (tests/conftest.py)
    pg = new_page(browser)
    try:
        pg.goto(app.url)
        e2e.wait_ready_ui(pg, timeout_ms=60_000)
        assert selected_model(pg).startswith("fake-qwen")
        e2e.choose_model(pg, "fake-adapter")
        pg.reload()
        e2e.wait_ready_ui(pg, timeout_ms=60_000)
        assert selected_model(pg).startswith("fake-adapter")
        answer = e2e.send(pg, "no login: which adapter?", timeout_ms=60_000)
        assert "fake-adapter ·" in answer and requests_seen(fake)[-1]["model"] == "fake-adapter"

        fresh = new_page(browser)  # another browser (no cookie) starts from the default
        fresh.goto(app.url)
        e2e.wait_ready_ui(fresh, timeout_ms=60_000)
        assert selected_model(fresh).startswith("fake-qwen")
        fresh.context.close()
    finally:
        pg.context.close()

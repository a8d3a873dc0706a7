"""End to end: backend faults as a user sees them in real Chromium, and the chat keeps working.

The product is launched as start.sh launches it (`python -m backend serve`) in external mode
(OPENAI_BASE_URL) against the fault-injecting server (`python -m tests.fakes.openai_server`); each message
picks its fault with a `[[fault:...]]` directive, as a tester would type it.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import FAULTS_APP_ENV
from tests.e2e import support as e2e
from tests.fakes.openai_server import expected_text

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

# [client].idle_timeout for this app: a stall (20 s below) is reported after 5 s. Every normal answer in this module
# must also arrive without a gap this long, so it is not cut shorter: a loaded machine can pause a process for 2 s.
IDLE_TIMEOUT = int(FAULTS_APP_ENV["QWENCHAT_CLIENT_IDLE_TIMEOUT"])
FULL = expected_text(8).strip()  # the fake server's normal answer: "w0 w1 ... w7"
PARTIAL = expected_text(3).strip()  # what a mid-stream fault lets through (at=3)


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@pytest.fixture(scope="module")
def live(fake, faults_app):
    """The shared faults product (tests/conftest.py), once its status line's source says ready on the fake server's
    model."""
    deadline = time.monotonic() + 60
    while True:
        try:
            state = e2e.status(faults_app)
        except OSError as exc:
            state = {"unavailable": str(exc)}
        if state.get("state") == "ready" and state.get("model") == "fake-qwen":
            return faults_app
        if time.monotonic() > deadline:
            pytest.fail(
                f"the launched UI is not ready against OPENAI_BASE_URL={fake}/v1 (external mode) after "
                f"60 s; it reports {json.dumps(state)}\n{faults_app.log('ui')[-3000:]}"
            )
        time.sleep(0.5)


@pytest.fixture(scope="module")
def page(live, browser):
    with e2e.browser_page(live.url, browser=browser) as pg:
        e2e.wait_ready_ui(pg, timeout_ms=60_000)
        yield pg


def send(page, text: str) -> list[str]:
    """Send a message; return every assistant bubble (answers and errors) that appeared for it."""
    before = len(e2e.assistant_messages(page))
    e2e.send(page, text, timeout_ms=60_000)
    return e2e.assistant_messages(page)[before:]


def user_messages(page) -> list[str]:
    return page.locator('.step[data-step-type="user_message"]').all_inner_texts()


def assert_chat_keeps_working(page) -> None:
    after = send(page, "and now a normal question")
    assert len(after) == 1 and after[0].startswith(FULL), after


def test_an_empty_choices_first_chunk_still_shows_the_whole_answer(page):
    shown = send(page, "[[fault:empty-choices-first]] hello")
    assert len(shown) == 1, shown
    assert shown[0].startswith(FULL) and "fake-qwen ·" in shown[0]
    assert_chat_keeps_working(page)


def test_a_stall_mid_answer_keeps_the_partial_marked_and_names_the_idle_limit(page, live):
    shown = send(page, "[[fault:stall-mid:stall=20]] tell me a story")
    page.screenshot(path=str(live.log_dir / "stall-mid.png"))
    assert len(shown) == 2, shown
    partial, error = shown
    assert partial.startswith(PARTIAL) and "answer interrupted" in partial and expected_text(4) not in partial
    assert f"nothing arrived for {IDLE_TIMEOUT} s ([client].idle_timeout)" in error
    assert page.get_by_role("button", name="Retry").last.is_visible()
    assert_chat_keeps_working(page)


def test_a_dropped_connection_keeps_the_partial_says_the_connection_broke_and_retry_answers(page):
    shown = send(page, "[[fault:drop-mid:fail=1]] tell me more")  # fail=1: only the first attempt drops
    assert len(shown) == 2, shown
    partial, error = shown
    assert partial.startswith(PARTIAL) and "answer interrupted" in partial
    assert "the connection to the model server broke off" in error and "press Retry" in error

    before = len(e2e.assistant_messages(page))
    page.get_by_role("button", name="Retry").last.click()
    page.wait_for_function(
        """([n]) => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > n""",
        arg=[before],
        timeout=60_000,
    )
    page.wait_for_selector("#stop-button", state="detached", timeout=60_000)
    retried = e2e.assistant_messages(page)[before:]
    assert len(retried) == 1 and retried[0].startswith(FULL), retried
    assert_chat_keeps_working(page)


# Odd backend answers, by kind (issue #10): fault -> (what stays shown as the answer, the error's words or None)
ODD_ANSWERS = {
    "json-body": (FULL, None),  # stream: true ignored: the whole answer the server sent, not "empty"
    "eof-no-finish": (PARTIAL, "the model server ended the answer before it finished"),
    "html-200": ("", 'answered with a web page "Sign in - Corporate Proxy" (HTTP 200), not the OpenAI API'),
    "html-502": ("", 'answered with a web page "502 Bad Gateway" (HTTP 502), not the OpenAI API'),
    "tool-calls": ("", "carried no text: the model asked to call a tool (get_weather); this chat does not run tools"),
}


@pytest.mark.parametrize("kind", list(ODD_ANSWERS))
def test_an_odd_backend_answer_is_shown_for_what_it_is(page, fake, live, kind):
    answer, error = ODD_ANSWERS[kind]
    retry = page.get_by_role("button", name="Retry")
    retries_before = retry.count()
    shown = send(page, f"[[fault:{kind}]] an odd answer")
    page.screenshot(path=str(live.log_dir / f"odd-{kind}.png"))
    if error is None:
        assert len(shown) == 1, shown
        assert shown[0].startswith(FULL) and "fake-qwen ·" in shown[0]
        assert "without sending any text" not in shown[0] and "interrupted" not in shown[0]
        assert retry.count() == retries_before
    else:
        assert len(shown) == (2 if answer else 1), shown
        if answer:  # kept, marked as cut, nothing invented after the cut
            assert shown[0].startswith(answer) and "⚠ answer interrupted · fake-qwen" in shown[0], shown[0]
            assert expected_text(4).strip() not in shown[0] and "fake-qwen ·" not in shown[0]
        assert error in shown[-1], shown[-1]
        if kind.startswith("html"):
            assert f"{fake}/v1/chat/completions answered with a web page" in shown[-1]
            assert "a proxy or a login page in the way?" in shown[-1]
        assert retry.count() == retries_before + 1 and retry.last.is_visible()
    assert_chat_keeps_working(page)


def test_a_context_overflow_400_says_the_conversation_is_too_long(page):
    shown = send(page, "[[fault:overflow-400]] a very long question")
    assert len(shown) == 1, shown
    assert "the conversation is too long for the model" in shown[0]
    assert "maximum context length is 8192 tokens" in shown[0]  # vLLM's own words, kept as the detail
    assert_chat_keeps_working(page)


def test_a_settings_change_keeps_earlier_messages_and_the_next_answer_uses_the_new_adapter(page, live):
    send(page, "one more question before the switch")
    users_before = user_messages(page)
    answers_before = e2e.assistant_messages(page)
    e2e.choose_model(page, "fake-adapter")
    answer = e2e.send(page, "which adapter answers?")
    page.screenshot(path=str(live.log_dir / "after-settings.png"))
    assert "fake-adapter ·" in answer and answer.startswith(FULL)
    # Chainlit scrolls each new user message to the top of the chat pane, so earlier turns are out of
    # the viewport (and out of a full-page screenshot): they must still be on the page, unchanged.
    assert user_messages(page)[: len(users_before)] == users_before
    assert e2e.assistant_messages(page)[: len(answers_before)] == answers_before
    first = page.locator('.step[data-step-type="user_message"]').first
    first.scroll_into_view_if_needed()
    assert first.is_visible()


def test_the_composer_picker_and_the_settings_panel_stay_in_step(page):
    trigger = page.locator("#mode-picker-trigger-model")
    e2e.choose_in_composer(page, "fake-adapter")
    # the picker re-renders after the click: waited for, as for the settings panel below
    page.wait_for_function(
        "() => document.querySelector('#mode-picker-trigger-model').innerText.includes('fake-adapter')"
    )
    assert "fake-adapter" in trigger.inner_text()
    assert "fake-adapter ·" in e2e.send(page, "picked in the composer")
    e2e.choose_model(page, "fake-qwen")  # the settings panel wins from then on, and the picker follows
    page.wait_for_function("() => document.querySelector('#mode-picker-trigger-model').innerText.includes('fake-qwen')")
    assert "fake-qwen ·" in e2e.send(page, "picked in the settings panel")


def test_the_status_line_follows_the_forced_ui_language_not_the_browsers(page, live):
    context = page.context.browser.new_context(locale="zh-CN", viewport={"width": 1280, "height": 900})
    try:
        zh_page = context.new_page()
        zh_page.goto(live.url)
        zh_page.wait_for_selector('#qwenchat-status[data-state="ready"]', timeout=60_000)
        text = zh_page.inner_text("#qwenchat-status")
        assert zh_page.evaluate("navigator.language").startswith("zh")
        assert "fake-qwen — ready" in text and "就绪" not in text, text  # [ui].language = "en" here
    finally:
        context.close()


def test_compare_with_one_side_failing_shows_its_error_while_the_other_completes(page):
    """Compare mode (issue #12): the adapter's side fails mid-answer, the base model's side completes."""
    from tests.e2e.test_compare import command, new_sides, start_sending, wait_both_done

    command(page, "compare")
    n = start_sending(page, "[[fault:error-mid:model=fake-adapter]] hello")
    wait_both_done(page, n, timeout_ms=60_000)
    page.wait_for_function("() => document.body.innerText.includes('fake engine failure mid-stream')")
    a, b = new_sides(page, n)
    assert a.startswith("A · fake-qwen") and FULL in a and "fake-qwen · 8 tokens" in a, a
    assert b.startswith("B · fake-adapter") and PARTIAL in b and "⚠ answer interrupted · fake-adapter" in b, b
    errors = [m for m in e2e.assistant_messages(page) if m.startswith("B · fake-adapter:")]
    assert errors and "fake engine failure mid-stream" in errors[-1]
    assert page.get_by_role("button", name="Retry").count() >= 1
    command(page, "compare", "off")
    assert_chat_keeps_working(page)

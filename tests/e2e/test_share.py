"""End to end (issue 12): shareable read-only chats, second accounts, the welcome screen's starters, branding,
and the Chinese UI of both and of compare mode, in real Chromium.

The product is launched as start.sh launches it (`python -m backend serve`) with login on, an extra account
([login] users, a real PBKDF2 hash) and starters, in external mode against the fake OpenAI server: what is tested
here is the UI, the routes and the history database, not a model (the fake server serves "fake-qwen" and
"fake-adapter"; "pirate" is in [lora] modules by default but not served there, which makes it the unserved
starter).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from backend.text import t
from tests.e2e import support as e2e
from tests.e2e.test_documents import attach
from tests.e2e.test_history import requests_seen

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

OWNER, OWNER_PW, VIEWER, VIEWER_PW, STARTER = e2e.OWNER, e2e.OWNER_PW, e2e.VIEWER, e2e.VIEWER_PW, e2e.STARTER


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@pytest.fixture(scope="module")
def live(login_app):
    return login_app  # shared with test_fidelity_history (tests/e2e/conftest.py): login on, a viewer, branding


def logged_in(browser, live, user: str, password: str, locale: str = "en-US"):
    context = browser.new_context(locale=locale, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(live.url)
    page.wait_for_selector("#email")
    page.fill("#email", user)
    page.fill("#password", password)
    page.click("button[type=submit]")
    e2e.wait_ready_ui(page, timeout_ms=60_000)
    return page


def n_answers(page) -> int:
    return len(e2e.assistant_messages(page))


def click_starter(page, text: str, until: str = " tokens · ") -> str:
    """Click the welcome-screen starter whose label starts with ``text``; the newest bubble once it shows ``until``
    (an answer's footer by default: the Stop button may not have shown yet when the first words do, seen: 'w0 ')."""
    before = n_answers(page)
    page.locator("#starters button", has_text=text).first.click()
    page.wait_for_function(
        """([n, until]) => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                            return m.length > n && m[m.length - 1].innerText.includes(until); }""",
        arg=[before, until],
        timeout=120_000,
    )
    page.wait_for_selector("#stop-button", state="detached")
    return e2e.assistant_messages(page)[-1]


def api(page, method: str, path: str, body: dict | None = None):
    """A request with this browser's login cookie; (status, JSON body)."""
    parts = urllib.parse.urlsplit(page.url)
    response = page.context.request.fetch(f"{parts.scheme}://{parts.netloc}{path}", method=method, data=body)
    is_json = "json" in (response.headers.get("content-type") or "")
    return response.status, response.json() if is_json else response.text()


def notice(page) -> str:
    """The banner public/share.js shows for a refused share link (Chainlit's own toast says only 'Not Found')."""
    el = page.locator("#qwenchat-notice")
    el.wait_for(state="visible", timeout=30_000)
    return el.inner_text()


# ---------------------------------------------------------------- welcome screen


@pytest.fixture(scope="module")
def owner(browser, live):
    page = logged_in(browser, live, OWNER, OWNER_PW)
    yield page
    page.context.close()


def starter_labels(page) -> list[str]:
    """The welcome screen's starters, once shown (they come from their own request, not with the status line)."""
    page.locator("#starters button").first.wait_for()
    return page.locator("#starters button").all_inner_texts()


def test_the_welcome_screen_shows_starters_per_adapter_with_the_configured_name_and_accent(owner, live):
    labels = starter_labels(owner)
    assert f"{STARTER} · fake-adapter" in labels  # [lora.starters] fake-adapter = [...]
    assert "What is the capital of France? · pirate" in labels  # the demo adapter's built-in starters
    assert owner.title() == "Pirate Demo"
    primary = owner.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--primary').trim()")
    assert primary == "221 83% 53%"  # [branding] accent = "#2563eb"


def test_the_configured_logo_and_favicon_are_served(owner):
    for path in ("/favicon", "/logo?theme=dark", "/logo?theme=light"):
        status, body = api(owner, "GET", path)
        assert status == 200 and "qwenchat e2e logo" in body, path
    assert owner.locator("img[src*='/logo']").first.get_attribute("src")  # the welcome screen shows it


def test_a_starter_for_an_unserved_adapter_says_so_and_sends_nothing(owner, live, fake):
    n = len(requests_seen(fake))
    text = click_starter(owner, "What is the capital of France?", until="not served")
    assert "'pirate'" in text and "not served" in text and "fake-qwen, fake-adapter" in text
    assert len(requests_seen(fake)) == n  # nothing went to the model
    said = "[lora.starters] names 'pirate', which the engine does not serve"
    assert said in live.log_with(said, "ui")  # the UI's log reaches the file through the launcher's pipe
    owner.goto(live.url)  # a new chat for the next test
    e2e.wait_ready_ui(owner, timeout_ms=60_000)


def test_a_starter_chooses_its_adapter_for_the_chat(owner, fake):
    n = len(requests_seen(fake))
    text = click_starter(owner, STARTER)
    assert "fake-adapter ·" in text  # the footer names the adapter that answered
    assert [r["model"] for r in requests_seen(fake)[n:]] == ["fake-adapter"]
    assert "fake-adapter" in owner.locator("#mode-picker-trigger-model").inner_text()  # the picker follows


# ---------------------------------------------------------------- sharing


@pytest.fixture(scope="module")
def shared(owner, live):
    """The owner shares the chat of the starter test from the sidebar menu; the link the dialog shows."""
    # By its id, not as the sidebar's first entry: the sidebar is refreshed while the page is used, so "the first"
    # can be another chat (the unserved starter's) by the time it is clicked, and a locator is looked up anew at
    # each use. The starter test's chat is the one this page shows (Chainlit moves it to /thread/<id>).
    owner.wait_for_url("**/thread/*")
    thread_id = owner.url.rsplit("/", 1)[-1]
    thread = owner.locator(f"li#thread-{thread_id}")
    thread.wait_for(timeout=30_000)
    thread.hover()
    thread.locator("#thread-options").click()  # this thread's menu (the first in the page may be another's)
    owner.click("#share-thread")
    dialog = owner.locator("[role=dialog]")
    dialog.locator("button", has_text="Share").first.click()
    dialog.locator("button", has_text="Unshare").wait_for()
    link = dialog.locator("span[title*='/share/']").get_attribute("title")
    owner.keyboard.press("Escape")
    assert link == f"{live.url}/share/{thread_id}"
    return thread_id, link


@pytest.fixture(scope="module")
def viewer(browser, live):
    page = logged_in(browser, live, VIEWER, VIEWER_PW)
    yield page
    page.context.close()


def test_a_shared_link_opened_by_another_user_shows_the_chat_read_only(shared, viewer, live):
    thread_id, link = shared
    assert viewer.locator(f"li#thread-{thread_id}").count() == 0  # not in the viewer's history: no menu
    viewer.goto(link)
    viewer.locator(".step", has_text=STARTER).first.wait_for()
    viewer.locator('.step[data-step-type="assistant_message"]').first.wait_for()  # may render after the question
    answers = e2e.assistant_messages(viewer)
    assert any("fake-adapter ·" in a for a in answers)
    assert viewer.locator("#chat-input").count() == 0  # no composer: read-only
    status, body = api(viewer, "GET", f"/project/share/{thread_id}")
    assert status == 200 and body["metadata"] == {"is_shared": True, "shared_at": body["metadata"]["shared_at"]}


def user_messages_with_documents(page, route: str) -> dict[str, list[str]]:
    """{user message text: the names of the documents stored with it} of the thread ``route`` returns
    (``/project/thread/<id>`` for its owner, ``/project/share/<id>`` for a viewer), as its history holds them."""
    status, thread = api(page, "GET", route)
    assert status == 200, thread
    out = {}
    for step in thread["steps"]:
        if step["type"] == "user_message":
            meta = step["metadata"] if isinstance(step["metadata"], dict) else json.loads(step["metadata"] or "{}")
            out[step["output"]] = [d["name"] for d in meta.get("qwenchat", {}).get("documents", [])]
    return out


def new_chat_with_document(page, live, path, question: str) -> str:
    """A new chat whose first message carries ``path``; its thread id once the answer is there."""
    page.goto(live.url)
    e2e.wait_ready_ui(page, timeout_ms=60_000)
    attach(page, [path])
    e2e.send(page, question)
    e2e.whole_answer(page)
    page.wait_for_url("**/thread/*")
    return page.url.rsplit("/", 1)[-1]


def test_a_shared_chat_shows_its_documents_to_the_viewer(owner, viewer, live, tmp_path):
    notes = tmp_path / "field-notes.txt"
    notes.write_text("The code word is OSPREY-5.\nSecond line.\n")
    thread_id = new_chat_with_document(owner, live, notes, "What is the code word in the notes?")
    status, _ = api(owner, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": True})
    assert status == 200

    viewer.goto(f"{live.url}/share/{thread_id}")

    viewer.get_by_text("field-notes.txt").first.wait_for()  # the reading step, named by its file
    viewer.locator(".step", has_text="What is the code word in the notes?").first.wait_for()
    assert viewer.locator("#chat-input").count() == 0  # read-only
    assert user_messages_with_documents(viewer, f"/project/share/{thread_id}") == {
        "What is the code word in the notes?": ["field-notes.txt"]
    }
    status, thread = api(viewer, "GET", f"/project/share/{thread_id}")
    [reading] = [s for s in thread["steps"] if s["type"] == "tool" and s["name"] == "field-notes.txt"]
    assert "field-notes.txt: text · " in reading["output"]
    href = re.search(r"\[original\]\((/qwenchat/files/[^)]+)\)", reading["output"]).group(1)  # the kept original
    assert href.startswith(f"/qwenchat/files/{thread_id}/")
    status, body = api(viewer, "GET", href)
    assert status == 200 and body == notes.read_text()
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(live.url + href, timeout=10)
    assert anonymous.value.code == 401


def test_two_tabs_uploading_to_one_chat_at_once_each_keep_their_own_document(owner, live, fake, tmp_path):
    """One user, one chat open in two tabs, a file attached in each and both sent at once: each message reaches the
    model with its own document only, both are answered, and the history keeps each document with its message."""
    alpha, bravo = tmp_path / "alpha.txt", tmp_path / "bravo.txt"
    alpha.write_text("The code word is ALPHA-1.\n")
    bravo.write_text("The code word is BRAVO-2.\n")
    first = owner.context.new_page()
    second = owner.context.new_page()
    try:
        thread_id = new_chat_with_document(first, live, alpha, "tab one: the code word?")
        second.goto(f"{live.url}/thread/{thread_id}")
        e2e.wait_ready_ui(second, timeout_ms=60_000)
        attach(first, [bravo])
        attach(second, [alpha])
        before = [n_answers(first), n_answers(second)]
        first.fill("#chat-input", "tab one again: the code word?")
        second.fill("#chat-input", "tab two: the code word?")
        first.keyboard.press("Enter")
        second.keyboard.press("Enter")
        for page, n in zip((first, second), before, strict=True):
            page.wait_for_function(
                """([n]) => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                              return m.length > n && / tokens · /.test(m[m.length - 1].innerText); }""",
                arg=[n],
                timeout=120_000,
            )
    finally:
        first.close()
        second.close()

    seen = [r["last_message"] for r in requests_seen(fake) if r.get("last_message")]
    sent = {text.rsplit("\n\n", 1)[-1]: text for text in seen}  # question -> the message as the model got it
    assert "BRAVO-2" in sent["tab one again: the code word?"]
    assert "ALPHA-1" in sent["tab two: the code word?"] and "BRAVO-2" not in sent["tab two: the code word?"]
    stored = user_messages_with_documents(owner, f"/project/thread/{thread_id}")
    assert stored["tab one again: the code word?"] == ["bravo.txt"]
    assert stored["tab two: the code word?"] == ["alpha.txt"]
    assert stored["tab one: the code word?"] == ["alpha.txt"]


def test_a_non_owner_can_neither_share_nor_unshare_nor_rate_the_answers(shared, viewer, owner):
    thread_id, _ = shared
    for flag in (False, True):
        status, body = api(viewer, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": flag})
        assert status == 403 and body["detail"] == t("share.not_owner", "en")
    status, thread = api(viewer, "GET", f"/project/share/{thread_id}")
    assert status == 200  # still shared
    answer = next(s for s in thread["steps"] if s["type"] == "assistant_message")
    feedback = {"feedback": {"forId": answer["id"], "value": 0, "threadId": thread_id}, "sessionId": "x"}
    status, body = api(viewer, "PUT", "/feedback", feedback)
    assert status == 403 and body["detail"] == t("share.not_owner_feedback", "en")
    # nor overwrite or delete the owner's own rating by its id (Chainlit's routes check neither)
    mine = {"feedback": {"forId": answer["id"], "value": 1, "threadId": thread_id}, "sessionId": "x"}
    status, body = api(owner, "PUT", "/feedback", mine)
    assert status == 200 and body["feedbackId"], body
    feedback_id = body["feedbackId"]
    status, body = api(viewer, "DELETE", "/feedback", {"feedbackId": feedback_id})
    assert status == 403 and body["detail"] == t("share.not_owner_feedback", "en")
    moved = {"feedback": {"id": feedback_id, "forId": answer["id"], "value": 0}, "sessionId": "x"}
    status, body = api(viewer, "PUT", "/feedback", moved)
    assert status == 403
    status, body = api(owner, "DELETE", "/feedback", {"feedbackId": feedback_id})  # the owner may
    assert status == 200, body
    thumbs = viewer.locator(".step[data-step-type='assistant_message'] button:has(svg.lucide-thumbs-up)").first
    assert thumbs.is_disabled()  # the page offers no rating either; the route refuses a forged one


def test_a_share_link_needs_a_login(shared, live):
    thread_id, _ = shared
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{live.url}/project/share/{thread_id}", timeout=10)
    assert err.value.code == 401


def test_an_unshared_chat_is_refused_with_a_clear_message(shared, owner, viewer, live):
    thread_id, link = shared
    status, _ = api(owner, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": False})
    assert status == 200
    status, body = api(viewer, "GET", f"/project/share/{thread_id}")
    assert status == 403 and body["detail"] == t("share.not_shared", "en")
    viewer.goto(link)
    assert notice(viewer) == t("share.not_shared", "en")
    status, _ = api(owner, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": True})
    assert status == 200  # shared again: the link works again
    assert api(viewer, "GET", f"/project/share/{thread_id}")[0] == 200


def test_a_deleted_chats_link_says_it_no_longer_exists(shared, owner, viewer):
    thread_id, link = shared
    status, _ = api(owner, "DELETE", "/project/thread", {"threadId": thread_id})
    assert status == 200
    status, body = api(viewer, "GET", f"/project/share/{thread_id}")
    assert status == 404 and body["detail"] == t("share.gone", "en")
    viewer.goto(link)
    assert notice(viewer) == t("share.gone", "en")
    status, body = api(owner, "PUT", "/project/thread/share", {"threadId": thread_id, "isShared": True})
    assert status == 404 and body["detail"] == t("share.gone", "en")


# ---------------------------------------------------------------- Chinese


def test_the_welcome_screen_share_refusals_and_compare_labels_are_chinese_in_a_zh_cn_browser(browser, live, fake):
    page = logged_in(browser, live, OWNER, OWNER_PW, locale="zh-CN")
    try:
        labels = starter_labels(page)
        assert "法国的首都是哪里？ · pirate" in labels
        text = click_starter(page, "法国的首都是哪里？", until="未发送任何内容")
        assert "未发送任何内容" in text and "“pirate”" in text
        page.goto(live.url + "/share/00000000-0000-4000-8000-000000000000")  # a link to no chat
        assert notice(page) == t("share.gone", "zh")
        # compare mode's labels: /compare blind, then one message answered by A and B with vote buttons
        page.goto(live.url)
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        run_command(page, "compare", "blind")
        page.wait_for_function(
            "([s]) => document.body.innerText.includes(s)", arg=[t("compare.on_blind", "zh").split("：")[0]]
        )
        e2e.submit(page, "你好")
        for key in ("compare.vote_a", "compare.vote_b", "compare.vote_tie"):
            page.locator("button", has_text=t(key, "zh")).first.wait_for(timeout=60_000)
        page.screenshot(path=str(live.log_dir / "compare-zh.png"))
    finally:
        page.context.close()


def run_command(page, command: str, text: str = "") -> None:
    """A composer command as a user runs it: type "/", pick it from the menu, then its text."""
    page.fill("#chat-input", "/" + command)
    page.locator("[role=option], [cmdk-item]", has_text=command).first.click()
    if text:
        page.type("#chat-input", text)
    page.keyboard.press("Enter")
    time.sleep(0.5)

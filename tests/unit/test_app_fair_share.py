"""Issue #20, fair share, through Chainlit's own socket handlers against the fake server: at most
``[ui] max_answers_per_user`` (2 here, the default) answers streaming per user over all their tabs; one more is
refused at once, its text quoted back and nothing stored or sent to the model, while the answers already streaming
(and other users') go on; the count is given back on every ending (done, error, Stop, the tab closed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backend.storage import preferences
from tests.unit import test_app_handlers as handlers
from tests.unit.test_app_compare import compare_off, compare_on
from tests.unit.test_app_guards import guarded_send
from tests.unit.test_app_handlers import Chat, marker, wait_for

fake, ui = handlers.fake, handlers.ui

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOW = "[[normal:tokens=400:rate=20]]"  # 20 s of answer: streaming until the test stops it
REFUSED = "answers are still streaming, in this chat or another tab, and each user may have at most 2 at a time"


def browser() -> str:
    return uuid.uuid4().hex  # the cookie value the page sets (preferences.BrowserCookieMiddleware)


class Tabs:
    """Tabs opened in the test, each of a browser (its cookie) or of a signed-in user; closed at the end."""

    def __init__(self, ui, fake) -> None:
        self.ui, self.fake, self.open = ui, fake, []

    async def tab(self, cookie: str | None = None, user: str | None = None, language: str = "en-US") -> Chat:
        import chainlit as cl

        chat = Chat(self.ui, self.fake)
        chat.session.environ["HTTP_ACCEPT_LANGUAGE"] = chat.session.language = language
        if cookie:
            chat.session.environ["HTTP_COOKIE"] = f"{preferences.BROWSER_COOKIE}={cookie}"
        if user:
            chat.session.user = cl.User(identifier=user)
        await chat.start()
        self.open.append(chat)
        return chat

    async def streaming(self, chat: Chat, what: str, slow: str = SLOW) -> asyncio.Task:
        """Send a slow message (``slow``) in ``chat`` and wait for its answer's first words; its task."""
        n = len(chat.events)
        await guarded_send(chat, f"{slow} {what}")
        task = chat.session.current_task
        await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, f"{what} streaming")
        return task


@pytest_asyncio.fixture(loop_scope="module")
async def tabs(ui, fake) -> AsyncIterator[Tabs]:
    opened = Tabs(ui, fake)
    yield opened
    for chat in opened.open:
        await chat.stop()
        task = chat.session.current_task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await chat.end()


def words(chat: Chat, since: int) -> int:
    return sum(len(a.split()) for a in chat.screen(since).answers)


async def refused(chat: Chat, text: str) -> str:
    n = len(chat.events)
    await guarded_send(chat, text)
    await wait_for(lambda: chat.screen(n).errors, 10, "the refusal")
    [error] = chat.screen(n).errors  # one clear message
    return error


async def test_a_third_answer_of_a_browser_is_refused_with_its_text_while_the_two_and_others_stream(ui, tabs):
    cookie = browser()
    one, two, three = [await tabs.tab(cookie) for _ in range(3)]  # three tabs of one browser, login off
    m = marker()
    n1, n2 = len(one.events), len(two.events)
    first, second = await tabs.streaming(one, f"first {m}"), await tabs.streaming(two, f"second {m}")
    before = words(one, n1), words(two, n2)

    text = f"third ```fenced``` {m}"
    error = await refused(three, text)
    assert REFUSED in error and f"````text\n{text}\n````" in error, error  # the text comes back verbatim
    assert three.received(f"third ```fenced``` {m}") == [] and three.conversation.turns == []  # nothing stored/sent
    assert three.session.current_task is None or three.session.current_task.done()

    other = await tabs.tab(browser())  # another browser is not held back
    answered = await other.send(f"another user's question {marker()}")
    assert answered.answers and not answered.errors, answered.errors
    await wait_for(lambda: (words(one, n1), words(two, n2)) > before, 10, "both answers still streaming")
    assert not first.done() and not second.done()

    await one.stop()  # one ended: the browser may start one more
    await asyncio.wait_for(first, 20)
    n3 = len(three.events)
    await guarded_send(three, f"now {m}")
    await asyncio.wait_for(three.session.current_task, 60)
    assert three.screen(n3).errors == [] and len(three.received(f"now {m}")) == 1
    await two.stop()
    await asyncio.wait_for(second, 20)
    assert ui.fair.held(f"browser:{cookie}") == 0


async def test_a_signed_in_user_counts_over_browsers_and_the_refusal_is_in_chinese(ui, tabs, monkeypatch):
    handlers.browser_language(ui.service, monkeypatch)
    phone, laptop = await tabs.tab(browser(), user="alice"), await tabs.tab(browser(), user="alice")
    desk = await tabs.tab(browser(), user="alice", language="zh-CN")
    m = marker()
    tasks = [await tabs.streaming(phone, f"a {m}"), await tabs.streaming(laptop, f"b {m}")]
    error = await refused(desk, f"第三个问题 {m}")
    assert "你有 2 个回答仍在生成" in error and "每位用户同时最多 2 个" in error and f"第三个问题 {m}" in error
    assert desk.received(f"第三个问题 {m}") == []
    bob = await tabs.tab(browser(), user="bob")
    assert (await bob.send(f"bob {marker()}")).answers
    for chat, task in zip((phone, laptop), tasks, strict=True):
        await chat.stop()
        await asyncio.wait_for(task, 20)
    assert ui.fair.held("user:alice") == 0


async def test_a_compare_pair_counts_two_and_a_button_is_refused_too(ui, tabs):
    cookie = browser()
    pair_tab, other_tab = await tabs.tab(cookie), await tabs.tab(cookie)
    m, m2 = marker(), marker()
    failed = await other_tab.send(f"[[fault:http-500:fail=9]] {m2}")  # an error with a Retry button, held nothing
    [retry] = [a for msg in failed.messages for a in failed.actions.get(msg["id"], []) if a["name"] == "retry"]
    assert ui.fair.held(f"browser:{cookie}") == 0  # an error ended the answer: given back

    asked = len(other_tab.received(m2))
    await compare_on(pair_tab)
    pair = await tabs.streaming(pair_tab, f"both {m}")
    assert ui.fair.held(f"browser:{cookie}") == 2
    assert REFUSED in await refused(other_tab, f"meanwhile {m}")
    pressed = await other_tab.click(retry)
    [error] = pressed.errors
    assert "Not started: 2 of your answers are still streaming" in error and "press the button again" in error
    assert other_tab.received(f"meanwhile {m}") == [] and len(other_tab.received(m2)) == asked

    await pair_tab.stop()
    await asyncio.wait_for(pair, 20)
    assert ui.fair.held(f"browser:{cookie}") == 0
    await compare_off(pair_tab)


async def test_a_flood_of_sends_from_twenty_tabs_starts_two_answers_and_refuses_each_other_once(ui, fake, tabs):
    cookie = browser()
    many = [await tabs.tab(cookie) for _ in range(20)]
    m = marker()
    marks = [len(chat.events) for chat in many]
    await asyncio.gather(*(guarded_send(chat, f"{SLOW} flood {i} {m}") for i, chat in enumerate(many)))
    running = [c for c in many if c.session.current_task is not None and not c.session.current_task.done()]
    assert len(running) == 2
    assert ui.fair.held(f"browser:{cookie}") == 2
    for chat, n in zip(many, marks, strict=True):
        if chat not in running:
            [error] = chat.screen(n).errors
            assert REFUSED in error
    assert len([r for r in fake.records if f" {m}" in str(r.messages)]) <= 2
    tasks = [c.session.current_task for c in running]
    for chat in running:
        await chat.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert ui.fair.held(f"browser:{cookie}") == 0


async def test_a_tab_closed_while_its_answer_streams_gives_its_share_back(ui, tabs):
    cookie = browser()
    gone = await tabs.tab(cookie)
    # the answer goes on to its end with nobody to show it to (5 s here), then gives the share back
    task = await tabs.streaming(gone, f"closing {marker()}", slow="[[normal:tokens=100:rate=20]]")
    assert ui.fair.held(f"browser:{cookie}") == 1
    await gone.end()  # the browser went away (Chainlit's on_chat_end, the session deleted)
    tabs.open.remove(gone)
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 40)
    assert ui.fair.held(f"browser:{cookie}") == 0


async def test_with_priority_scheduling_a_users_second_answer_goes_with_priority_1_and_others_first_with_0(
    ui, tabs, monkeypatch
):
    """Issue #20: with [vllm] scheduling_policy = "priority" (an engine the launcher started; the fake server stands
    in for it here) each answer is sent with its user's answers already streaming as vLLM's priority, so the engine
    serves a user with none first when its batch is full."""
    monkeypatch.setattr(type(ui.service.settings), "priority_scheduling", property(lambda _: True))
    phone, laptop = await tabs.tab(browser(), user="alice"), await tabs.tab(browser(), user="alice")
    bob = await tabs.tab(browser(), user="bob")
    m = marker()
    tasks = [await tabs.streaming(phone, f"first {m}"), await tabs.streaming(laptop, f"second {m}")]
    assert (await answered(bob, f"bob {m}")).answers
    sent = {t: [r.priority for r in c.received(f"{t} {m}")] for c, t in ((phone, "first"), (laptop, "second"))}
    assert sent == {"first": [None], "second": [1]}  # 0 is vLLM's default: not sent
    assert [r.priority for r in bob.received(f"bob {m}")] == [None]
    for chat, task in zip((phone, laptop), tasks, strict=True):
        await chat.stop()
        await asyncio.wait_for(task, 20)
    assert (await answered(laptop, f"again {m}")).answers  # nothing of alice's streams now: first in line again
    assert [r.priority for r in laptop.received(f"again {m}")] == [None]


async def answered(chat: Chat, text: str):
    """Send ``text`` through the socket guard (which claims the user's share) and wait for its answer to end."""
    n = len(chat.events)
    await guarded_send(chat, text)
    task = chat.session.current_task
    if task is not None:
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 20)
    return chat.screen(n)

"""``[login] max_chats_per_account`` (issue #29): an account at the cap cannot start a new chat; the refusal names the
cap and the fix and quotes the typed text back. The chats are counted through the real data layer on a real SQLite
file (Chainlit's SQLAlchemyDataLayer behind ours, with the outbox), chats whose first write still waits counted too.

On the code before the cap, ``GuardedDataLayer`` had no ``chats_of`` and the guard let every new chat start."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from backend.ui import socket_guard
from tests.support.faults import Held
from tests.unit.chat.test_outbox_sqlite import History, new_thread, store, until

pytestmark = pytest.mark.asyncio
_ = store  # the fixture, used by name


async def test_an_accounts_chats_are_its_stored_ones_plus_those_waiting_less_those_being_deleted(store):
    first, alice = await new_thread(store, "alice")
    second, _ = await new_thread(store, "alice")
    await new_thread(store, "bob")
    assert await store.layer.chats_of("alice") == 2
    assert await store.layer.chats_of("bob") == 1
    assert await store.layer.chats_of("carol") == 0

    lock = Held(store.path)  # another process's exclusive lock: the next writes wait in the outbox
    try:
        waiting = str(uuid.uuid4())
        await store.layer.update_thread(waiting, name="a chat not stored yet", user_id=alice)
        await store.layer.delete_thread(first)
        await until(lambda: store.box.state().writes == 2, 30, "both writes waiting in the outbox")
        assert await store.layer.chats_of("alice") == 2  # one more waiting, one less being deleted
    finally:
        lock.release()
    assert await store.box.drained(60)
    assert await store.layer.chats_of("alice") == 2
    assert {r[0] for r in store.rows('SELECT "id" FROM threads WHERE "userIdentifier" = \'alice\'')} == {
        second,
        waiting,
    }


def guard(cap: int) -> socket_guard.Guard:
    return socket_guard.Guard(lambda: None, lambda: "en", lambda: None, chat_cap=cap)


def session_of(who: str | None) -> SimpleNamespace:
    return SimpleNamespace(user=SimpleNamespace(identifier=who) if who else None, thread_id="t")


@pytest.fixture
def layer_of(store, monkeypatch) -> History:
    monkeypatch.setattr(socket_guard, "get_data_layer", lambda: store.layer)
    return store


async def test_at_the_cap_a_new_chat_is_refused_naming_the_cap_and_the_fix_with_the_text_quoted(layer_of):
    await new_thread(layer_of, "alice")
    await new_thread(layer_of, "alice")
    text = "```text\nmy long question\n```"
    said = await guard(2).new_chat_refusal(session_of("alice"), text)
    assert said is not None
    assert "your account keeps 2 chats" in said and "at most 2 per account" in said, said
    assert "max_chats_per_account" in said and "Delete an old chat" in said and said.endswith(text), said
    assert await guard(3).new_chat_refusal(session_of("alice"), text) is None
    assert await guard(2).new_chat_refusal(session_of("bob"), text) is None
    assert await guard(0).new_chat_refusal(session_of("alice"), text) is None
    assert await guard(1).new_chat_refusal(session_of(None), text) is None


async def test_a_chat_whose_first_write_waits_counts_toward_the_cap(layer_of):
    _, alice = await new_thread(layer_of, "alice")
    lock = Held(layer_of.path)
    try:
        await layer_of.layer.update_thread(str(uuid.uuid4()), name="waiting", user_id=alice)
        await until(lambda: layer_of.box.state().writes == 1, 30, "the new chat's write waiting in the outbox")
        said = await guard(2).new_chat_refusal(session_of("alice"), "x")
        assert said is not None and "your account keeps 2 chats" in said, said
    finally:
        lock.release()
    assert await layer_of.box.drained(60), "the waiting write not stored after the lock"


async def test_a_history_that_cannot_be_read_lets_the_chat_start(layer_of, monkeypatch):
    async def broken(_identifier: str) -> int:
        raise OSError("disk I/O error")

    monkeypatch.setattr(layer_of.layer, "chats_of", broken)
    assert await guard(1).new_chat_refusal(session_of("alice"), "x") is None


async def test_a_history_that_does_not_answer_in_time_lets_the_chat_start_and_is_not_asked_again_meanwhile(
    layer_of, monkeypatch
):
    """The count is a database read: on a slow database the first message of a new chat waited for it, without
    bound. It now gets the id lookup's ``ID_LOOKUP_S``; the read left running is not started again while it is out."""
    never = asyncio.Event()
    asked: list[str] = []

    async def stuck(identifier: str) -> int:
        asked.append(identifier)
        await never.wait()
        return 99

    monkeypatch.setattr(layer_of.layer, "chats_of", stuck)
    t0 = time.monotonic()
    assert await asyncio.wait_for(guard(1).new_chat_refusal(session_of("alice"), "x"), 60) is None
    assert time.monotonic() - t0 < socket_guard.ID_LOOKUP_S + 10  # bounded (not the read's own time: never)
    assert await guard(1).new_chat_refusal(session_of("alice"), "y") is None
    assert asked == ["alice"]
    never.set()
    await until(lambda: not socket_guard._LATE, 10, "the late count settled")


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
async def test_the_refusal_is_in_the_users_language(layer_of, lang):
    await new_thread(layer_of, "alice")
    g = guard(1)
    g.lang = lambda: lang
    said = await g.new_chat_refusal(session_of("alice"), "typed")
    assert said is not None and "typed" in said and "max_chats_per_account" in said
    assert ("未新建此对话" in said) == (lang == "zh-CN"), said

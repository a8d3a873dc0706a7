"""Issue #18 through Chainlit's own handlers against the fake server: one answer streaming per chat (a button or a
message while it streams is refused, the message's text quoted back), and a vote only on a blind pair."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit import test_app_handlers as handlers
from tests.unit.test_app_compare import compare_off, compare_on, notes
from tests.unit.test_app_handlers import marker, wait_for

fake, ui, chat = handlers.fake, handlers.ui, handlers.chat

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def guarded_send(chat, text: str) -> None:
    """A client_message as the socket server dispatches it: through the handler registered for the event (the
    guard in front of Chainlit's), not Chainlit's function itself."""
    from chainlit.server import sio

    await sio.handlers["/"]["client_message"](chat.sid, {"message": chat.payload(text), "fileReferences": None})


async def test_a_button_or_a_message_while_an_answer_streams_is_refused_and_the_text_kept(chat):
    m = marker()
    screen = await chat.send(f"[[fault:http-500:fail=1:tokens=400:rate=20]] {m}")
    [retry] = [a for msg in screen.messages for a in screen.actions.get(msg["id"], []) if a["name"] == "retry"]
    n = len(chat.events)
    clicked = asyncio.create_task(chat.click(retry))
    await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, "the retried answer streaming")
    requests = len(chat.received(m))

    again = await chat.click(retry)  # the same button again (a second tab, a double click that got through)
    assert any("still being answered: wait for the answer" in e for e in again.errors), again.errors
    other = marker()
    n2 = len(chat.events)
    await guarded_send(chat, f"meanwhile {other}")
    await wait_for(lambda: chat.screen(n2).errors, 10, "the message refused")
    [refused] = chat.screen(n2).errors
    assert "still being answered: this one was not sent" in refused and f"```text\nmeanwhile {other}\n```" in refused
    assert len(chat.received(m)) == requests and chat.received(other) == []  # nothing more went to the model
    assert all(t.content != f"meanwhile {other}" for t in chat.conversation.turns)

    await chat.stop()
    await asyncio.wait_for(clicked, 20)
    n3 = len(chat.events)
    await guarded_send(chat, f"after {other}")  # the chat is free again
    await asyncio.wait_for(chat.session.current_task, 30)
    assert chat.screen(n3).errors == [] and len(chat.received(f"after {other}")) == 1


async def test_compare_vote_is_refused_on_a_pair_that_is_not_blind(chat, ui):
    await compare_on(chat)  # side by side, names shown: no vote buttons
    m = marker()
    screen = await chat.send(f"open question {m}")
    [note] = notes(screen)
    assert [a["name"] for a in screen.actions.get(note["id"], [])] == ["compare_pick"]
    turn = chat.conversation.last_user().id
    before = len(ui.service.votes.all())
    forged = {"name": "compare_vote", "payload": {"turn": turn, "winner": "a"}, "forId": note["id"], "id": "x"}
    refused = await chat.click(forged)
    assert any("Votes are for blind comparisons" in e for e in refused.errors), refused.errors
    assert len(ui.service.votes.all()) == before  # nothing stored
    await compare_off(chat)


async def test_a_vote_naming_no_side_is_refused_with_the_value(chat, ui):
    await compare_on(chat, "blind")
    await chat.send(f"blind question {marker()}")
    turn = chat.conversation.last_user().id
    before = len(ui.service.votes.all())
    forged = {"name": "compare_vote", "payload": {"turn": turn, "winner": "left"}, "forId": "n", "id": "y"}
    refused = await chat.click(forged)
    assert any("`left`" in e for e in refused.errors), refused.errors
    assert len(ui.service.votes.all()) == before
    await compare_off(chat)


async def test_a_compare_pair_streaming_is_one_answer_a_message_meanwhile_is_refused(chat):
    await compare_on(chat)
    m = marker()
    n = len(chat.events)
    await guarded_send(chat, f"[[normal:tokens=200:rate=20]] both {m}")
    task = chat.session.current_task
    await wait_for(lambda: len(chat.received(m)) == 2, 20, "both sides asked")  # the pair: two requests, one claim
    await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, "the pair streaming")
    n2 = len(chat.events)
    await guarded_send(chat, f"meanwhile {m}")
    await wait_for(lambda: chat.screen(n2).errors, 10, "the message refused")
    assert "still being answered: this one was not sent" in chat.screen(n2).errors[0]
    assert len(chat.received(m)) == 2  # no third request: nothing of the refused message went to a model
    await chat.stop()
    await asyncio.wait_for(task, 20)
    await compare_off(chat)


async def guarded_edit(chat, message_id: str, text: str) -> None:
    from chainlit.server import sio

    await sio.handlers["/"]["edit_message"](chat.sid, {"message": {"id": message_id, "output": text}})


async def test_only_the_chats_own_user_messages_can_be_edited_and_not_while_it_answers(chat):
    m = marker()
    screen = await chat.send(f"question {m}")
    [answer] = [x for x in screen.messages if x.get("type") == "assistant_message" and not x.get("isError")]
    asked = chat.conversation.last_user()
    n = len(chat.events)
    await guarded_edit(chat, answer["id"], "the model said this instead")  # an answer is no message of the user's
    [refused] = chat.screen(n).errors
    assert f"only your own messages in this chat can be edited (`{answer['id']}` is not one)" in refused
    assert chat.conversation.turns[-1].content.startswith(answer["output"][:20]) and not chat.received("instead")

    n = len(chat.events)
    await guarded_send(chat, f"[[normal:tokens=200:rate=20]] slow {m}")
    task = chat.session.current_task
    await wait_for(lambda: any("w3" in a for a in chat.screen(n).answers), 20, "the answer streaming")
    n2 = len(chat.events)
    await guarded_edit(chat, asked.id, f"edited meanwhile {m}")
    [busy] = chat.screen(n2).errors
    assert "still being answered: this one was not sent" in busy and f"edited meanwhile {m}" in busy
    assert chat.received(f"edited meanwhile {m}") == []
    await chat.stop()
    await asyncio.wait_for(task, 20)


async def test_a_browsers_message_loses_our_metadata_and_any_parent(chat):
    """What only the server writes (an answer's raw text, a command mark) and a parent step never come from the
    browser: a resumed chat would otherwise take the message for an answer or a command."""
    from chainlit.chat_context import chat_context
    from chainlit.context import init_ws_context
    from chainlit.server import sio

    m = marker()
    payload = chat.payload(f"plain {m}")
    payload["metadata"] = {"location": "http://x/", "qwenchat": {"raw": "fake answer", "command": "adapters"}}
    payload["parentId"] = "some-step"
    await sio.handlers["/"]["client_message"](chat.sid, {"message": payload, "fileReferences": None})
    await asyncio.wait_for(chat.session.current_task, 30)
    init_ws_context(chat.session)
    [stored] = [x for x in chat_context.get() if x.id == payload["id"]]
    assert stored.metadata == {"location": "http://x/"} and stored.parent_id is None
    assert len(chat.received(m)) == 1  # answered as an ordinary message


async def test_a_message_of_a_chat_still_being_resumed_waits_for_the_resume_then_goes_with_its_turns(chat):
    """Issue #20: a UI process that restarted gets the page's socket back with its thread id, and Chainlit resumes
    the chat from the history after it has told the page that nothing runs (the Stop button goes): a message sent
    then (or kept by the page while it was away) waits until on_chat_resume has restored the chat, instead of being
    answered at once without its earlier turns (the resume then replacing the session's state under it)."""
    from backend.chat.conversation import Conversation
    from tests.unit.test_app_handlers import user_session

    chat.session.thread_id_to_resume = chat.session.thread_id  # as Chainlit's connect makes it for a new process
    user_session(chat).resumed = False
    earlier = marker()
    try:
        m = marker()
        sending = asyncio.create_task(guarded_send(chat, f"after the restart {m}"))
        await asyncio.sleep(0.5)
        assert not sending.done() and chat.received(m) == []  # not sent while the chat is not resumed
        resumed = Conversation()  # what on_chat_resume restores from the thread: an earlier turn
        resumed.add_user("u1", f"the earlier question {earlier}")
        resumed.add_assistant("a1", "the earlier answer", "fake-qwen")
        user_session(chat).conversation, user_session(chat).resumed = resumed, True
        await asyncio.wait_for(sending, 10)
        task = chat.session.current_task
        if task is not None:
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 20)
        [request] = chat.received(m)
        assert any(earlier in str(msg.get("content")) for msg in request.messages)  # sent with its earlier turns
    finally:
        chat.session.thread_id_to_resume = None


async def test_a_history_that_does_not_answer_the_id_lookup_lets_the_message_through(monkeypatch):
    """The guard asks the history whether a message's id is another chat's. A database that takes seconds per
    statement held every message until the lookup's pool wait gave up (30 s per turn, measured); now the lookup is
    given ``ID_LOOKUP_S`` and the message goes on (the data layer checks again before its write)."""
    from backend.ui import socket_guard

    never = asyncio.Event()
    asked: list[str] = []

    class Stuck:
        async def step_owner(self, step_id: str) -> None:
            asked.append(step_id)
            await never.wait()

    monkeypatch.setattr(socket_guard, "get_data_layer", Stuck)
    guard = socket_guard.Guard(lambda: None, lambda: "en", None)  # type: ignore[arg-type]
    assert await asyncio.wait_for(guard.stored_owner("0214c0af-e99d-4ace-887d-41e8f9e8c4c1"), 60) is None
    assert len(socket_guard._LATE) == 1  # left to finish; the next message does not ask again while it is out
    assert await asyncio.wait_for(guard.stored_owner("1214c0af-e99d-4ace-887d-41e8f9e8c4c1"), 60) is None
    assert len(asked) == 1
    never.set()
    await wait_for(lambda: not socket_guard._LATE, 10, "the late lookup settled")


async def test_while_history_writes_wait_on_the_database_the_id_lookup_is_not_even_asked(monkeypatch):
    from backend.storage.outbox import Backlog
    from backend.ui import socket_guard

    asked: list[str] = []

    class Failing:
        class outbox:  # the shape GuardedDataLayer.outbox has
            @staticmethod
            def state() -> Backlog:
                return Backlog(3, 1, "slow")

        async def step_owner(self, step_id: str) -> None:
            asked.append(step_id)

    monkeypatch.setattr(socket_guard, "get_data_layer", Failing)
    guard = socket_guard.Guard(lambda: None, lambda: "en", None)  # type: ignore[arg-type]
    assert await guard.stored_owner("0214c0af-e99d-4ace-887d-41e8f9e8c4c1") is None
    assert asked == []

"""Issue #20, "Wi-Fi blips lose nothing", through Chainlit's own socket handlers against the fake server: a tab whose
socket is cut (what Chainlit emits meanwhile goes nowhere, and its ``disconnect`` handler runs) and that comes back
on a new socket of the same session (Chainlit's ``restore_existing_session``, then the ``connection_successful``
event, as its socket.io client does) shows what a tab never cut shows: an answer that ended while it was away, with
its footer; one still streaming, without the tokens of the gap missing; an error with its Retry; a compare pair; a
turn waiting for the engine. Then the next message works. The real socket, in Chromium: tests/e2e/test_blips.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from backend.chat.health import EngineLoad
from tests.unit import test_app_compare as compare
from tests.unit import test_app_handlers as handlers
from tests.unit.test_app_handlers import Screen, marker, wait_for
from tests.unit.test_app_queue import publish

fake, ui, chat = handlers.fake, handlers.ui, handlers.chat

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Link:
    """The tab's socket: ``cut`` (the server sees it close; what it emits goes nowhere) and ``back`` (the same
    session on a new socket). ``shown``: what the tab shows since the link was made; ``tab``: the whole tab;
    ``uncut``: what a tab never cut would show, built from what the app itself emitted (every event through
    Chainlit's emitter, tapped where the reconnect's journal records it), never from what the reconnect sent again:
    an event the replay doubles or leaves out shows up as a difference between ``tab`` and ``uncut``."""

    def __init__(self, chat) -> None:
        from backend.ui import reconnect

        self.chat = chat
        self.start = len(chat.events)
        self.mark = self.start  # where the cut began (in the tab's events)
        self.lost: list[tuple[str, Any]] = []
        self.live: list[tuple[str, Any]] = []  # every event the app emitted since, cut or not, in order
        journal = reconnect.journal_of(chat.session)
        record = journal.record

        def tap(event: str, data: Any) -> Any:
            self.live.append((event, data))
            return record(event, data)

        journal.record = tap  # type: ignore[method-assign]

    async def cut(self) -> None:
        from chainlit.server import sio

        self.mark = len(self.chat.events)

        async def nowhere(event: str, data: Any) -> None:
            self.lost.append((event, data))

        self.chat.session.emit = nowhere
        await sio.handlers["/"]["disconnect"](self.chat.sid)

    async def back(self) -> None:
        self.restore()
        await self.successful()

    def restore(self) -> None:
        """The session on its new socket (Chainlit's ``connect``); the browser's ``connection_successful`` comes a
        round trip later."""
        from chainlit.socket import restore_existing_session

        events = self.chat.events

        async def emit(event: str, data: Any) -> None:
            events.append((event, data))

        sid = f"sid-{uuid.uuid4()}"
        session = self.chat.session
        assert restore_existing_session(sid, session.id, emit, session.emit_call, session.environ)
        self.chat.sid = sid
        self.restored_at = len(events)

    async def successful(self) -> None:
        from chainlit.server import sio

        await sio.handlers["/"]["connection_successful"](self.chat.sid)

    def shown(self) -> Screen:
        return Screen(self.chat.events[self.start :])

    def tab(self) -> Screen:
        return Screen(list(self.chat.events))

    def uncut(self) -> Screen:
        return Screen(self.chat.events[: self.start] + self.live)


def view(screen: Screen) -> dict[str, Any]:
    """What the tab shows of each message and step, and each message's buttons."""
    return {
        "steps": {
            i: (s.get("type"), s.get("name"), s.get("output"), bool(s.get("isError"))) for i, s in screen.steps.items()
        },
        "buttons": {i: sorted(a["name"] for a in acts) for i, acts in screen.actions.items() if acts},
    }


def waiting(screen: Screen) -> list[dict[str, Any]]:
    """The turn's wait step ("queued: 3 answers ahead · engine busy")."""
    return [s for s in screen.steps.values() if str(s.get("name", "")).startswith("queued")]


def last_task_state(link: Link) -> str | None:
    """Whether the tab shows the chat answering (Chainlit's task_start / task_end, the Stop button)."""
    states = [e for e, _ in link.chat.events[link.start :] if e in ("task_start", "task_end")]
    return states[-1] if states else None


async def test_an_answer_that_ended_while_the_tab_was_away_is_shown_whole_with_its_footer(chat):
    link = Link(chat)
    sending = chat.start_sending(f"[[normal:tokens=40:rate=40]] {marker()}")
    await wait_for(lambda: link.shown().answers and link.shown().answers[-1].strip(), 20, "the first tokens")
    await link.cut()
    await asyncio.wait_for(sending, 30)  # the answer ends while the tab is away
    assert link.lost, "nothing was emitted during the cut: the test proves nothing"
    await link.back()
    answer = link.shown().answers[-1]
    assert "w39" in answer and "*`fake-qwen` ·" in answer, answer  # the whole text, then its footer
    assert view(link.tab()) == view(link.uncut())
    assert last_task_state(link) == "task_end"
    after = await chat.send(f"next {marker()}")  # and the next message works
    assert after.answers and not after.errors, after.errors


async def test_an_answer_still_streaming_at_the_reconnect_has_no_gap_and_keeps_streaming(chat):
    link = Link(chat)
    sending = chat.start_sending(f"[[normal:tokens=80:rate=20]] {marker()}")  # 4 s
    await wait_for(lambda: link.shown().answers and link.shown().answers[-1].strip(), 20, "the first tokens")
    await link.cut()
    await asyncio.sleep(1)
    assert not sending.done()
    await link.back()
    assert not sending.done(), "the answer ended before the reconnect: the test proves nothing"
    assert any(e == "stream_token" for e, _ in link.lost)
    assert view(link.tab()) == view(link.uncut())  # the gap filled at once, not only by the final text
    assert last_task_state(link) == "task_start", "the tab must show the chat still answering (Stop)"
    during = link.shown().answers[-1]
    await asyncio.wait_for(sending, 30)
    answer = link.shown().answers[-1]
    assert answer.startswith(during) and "w79" in answer and "*`fake-qwen` ·" in answer, answer
    assert view(link.tab()) == view(link.uncut())
    assert last_task_state(link) == "task_end"


async def test_tokens_streamed_between_the_new_socket_and_the_replay_wait_for_the_replay(chat):
    """The browser's client asks for the replay (``connection_successful``) a round trip after its socket connects.
    A token sent live in between would land after a gap the browser still has (the tokens of the cut): it waits
    for the replay, which carries it. (That what the journal does not keep still goes out live is the journal's own
    test: tests/unit/chat/test_replay.py.)"""
    link = Link(chat)
    sending = chat.start_sending(f"[[normal:tokens=80:rate=20]] {marker()}")  # 4 s
    await wait_for(lambda: link.shown().answers and link.shown().answers[-1].strip(), 20, "the first tokens")
    await link.cut()
    await asyncio.sleep(0.5)
    link.restore()
    emitted = len(link.live)
    await wait_for(
        lambda: sum(e == "stream_token" for e, _ in link.live[emitted:]) >= 3, 20, "tokens after the restore"
    )
    early = [e for e, _ in chat.events[link.restored_at :] if e in ("stream_token", "new_message", "update_message")]
    assert not early, f"sent to the new socket before the replay (the page would show a gap): {early}"
    await link.successful()
    assert not sending.done(), "the answer ended before the replay: the test proves nothing"
    assert view(link.tab()) == view(link.uncut())
    await wait_for(lambda: any(e == "stream_token" for e, _ in chat.events[link.restored_at :]), 20, "live tokens")
    await asyncio.wait_for(sending, 30)
    assert view(link.tab()) == view(link.uncut())
    assert "*`fake-qwen` ·" in link.shown().answers[-1]


async def test_a_cut_that_the_server_did_not_notice_loses_nothing_either(chat):
    """A laptop that left the Wi-Fi: no close reaches the server before the browser is back (the ping would find it
    later); what was emitted to the dead socket is lost all the same."""
    link = Link(chat)
    sending = chat.start_sending(f"[[normal:tokens=40:rate=40]] {marker()}")
    await wait_for(lambda: link.shown().answers and link.shown().answers[-1].strip(), 20, "the first tokens")
    link.mark = len(chat.events)

    async def nowhere(event: str, data: Any) -> None:
        link.lost.append((event, data))

    chat.session.emit = nowhere  # no disconnect handler
    await asyncio.wait_for(sending, 30)
    await link.back()
    assert "*`fake-qwen` ·" in link.shown().answers[-1]
    assert view(link.tab()) == view(link.uncut())


async def test_an_error_while_the_tab_was_away_is_shown_with_its_retry_and_retry_works(chat):
    link = Link(chat)
    await link.cut()  # the message reached the server just before the cut
    sending = chat.start_sending(f"[[fault:error-mid:at=3:fail=1]] {marker()}")
    await asyncio.wait_for(sending, 30)
    await link.back()
    shown = link.shown()
    assert shown.errors and shown.error_actions() == ["retry"], view(shown)
    assert view(link.tab()) == view(link.uncut())
    [retry] = [a for m in shown.messages if m.get("isError") for a in shown.actions.get(m["id"], [])]
    again = await chat.click(retry)
    assert again.answers and not again.errors, again.errors


async def test_a_compare_pair_that_ended_while_the_tab_was_away_is_shown_whole(chat):
    await compare.compare_on(chat)
    try:
        link = Link(chat)
        sending = chat.start_sending(f"[[normal:tokens=40:rate=40]] compare {marker()}")
        await wait_for(lambda: len(compare.sides(link.shown())) == 2, 20, "both sides streaming")
        await link.cut()
        await asyncio.wait_for(sending, 30)
        await link.back()
        shown = link.shown()
        sides = compare.sides(shown)
        for side in ("A", "B"):
            assert "w39" in sides[side]["output"] and "tokens" in sides[side]["output"], sides[side]["output"]
        assert compare.notes(shown), "the note with the vote buttons"
        assert view(link.tab()) == view(link.uncut())
    finally:
        await compare.compare_off(chat)


async def test_a_turn_waiting_in_the_queue_shows_its_wait_step_when_back_and_its_answer_after(chat, ui, monkeypatch):
    poller = ui.service.poller

    async def no_read() -> None:  # the load is what the test publishes (test_app_queue)
        return None

    monkeypatch.setattr(poller, "_note_load", no_read)
    await poller.refresh()
    publish(poller, EngineLoad(8, 3))
    try:
        link = Link(chat)
        await link.cut()
        sending = chat.start_sending(f"[[fault:stall-first:stall=3]] {marker()}")
        await wait_for(lambda: waiting(Screen(link.lost)), 10, "the wait step, sent while away")
        await link.back()
        assert not sending.done()
        assert waiting(link.shown()), "the tab back shows the turn waiting"
        assert last_task_state(link) == "task_start"
        await asyncio.wait_for(sending, 30)
        shown = link.shown()
        assert shown.answers and "*`fake-qwen` ·" in shown.answers[-1]
        assert view(link.tab()) == view(link.uncut())
    finally:
        publish(poller, None)


async def test_a_tab_back_before_its_first_message_is_not_sent_its_chat_again(chat):
    """Back before any message: Chainlit's own handler runs (the chat started once); the welcome's messages are
    not doubled."""
    link = Link(chat)
    await link.cut()
    await link.back()
    assert view(link.tab()) == view(link.uncut())
    after = await chat.send(f"first {marker()}")
    assert after.answers and not after.errors


async def test_a_chat_resumed_from_the_history_is_not_opened_again_from_the_database_on_reconnect(chat, monkeypatch):
    """Chainlit's own handler, for a session opened on a stored thread, resumes that thread again at every reconnect:
    the session's state replaced by the stored one (the answer under way lost) and the page's messages by the
    database's. Past the first message, the reconnect only sends what the page missed."""
    from chainlit.config import config

    resumed: list[object] = []

    async def on_chat_resume(thread: object) -> None:
        resumed.append(thread)

    monkeypatch.setattr(config.code, "on_chat_resume", on_chat_resume)
    chat.session.thread_id_to_resume = chat.session.thread_id  # as if the page had opened it from the sidebar
    await chat.send(f"first {marker()}")
    link = Link(chat)
    sending = chat.start_sending(f"[[normal:tokens=40:rate=20]] {marker()}")
    await wait_for(lambda: link.shown().answers and link.shown().answers[-1].strip(), 20, "the first tokens")
    await link.cut()
    await link.back()
    events = [e for e, _ in chat.events[link.mark :]]
    assert "resume_thread" not in events and "resume_thread_error" not in events, events
    assert resumed == []
    await asyncio.wait_for(sending, 30)
    assert "*`fake-qwen` ·" in link.shown().answers[-1]
    assert view(link.tab()) == view(link.uncut())


async def test_a_model_list_that_changed_while_the_tab_was_away_reaches_its_panel_when_back(chat, ui):
    """Chainlit runs on_chat_end at every disconnect, which stops the chat's model-list watcher: a change meanwhile
    reached nobody, and the panel stayed stale until the next message. Back on a new socket, the panel gets the
    new list at once and the watcher follows the next change."""
    import dataclasses

    await chat.send(f"first {marker()}")
    link = Link(chat)
    await link.cut()
    poller = ui.service.poller  # the engine's list changes while the tab is away (a new version, as a poll makes)
    poller._status = dataclasses.replace(poller._status, version=poller._status.version + 1000)
    await asyncio.sleep(0.3)  # away for a moment (the stopped watcher ends)
    await link.back()
    assert handlers.user_session(chat).models_version == poller.status.version, "the panel was sent the new list"
    await asyncio.sleep(0.3)  # the restarted watcher subscribes to the poller
    n = len(chat.events)
    await handlers.push_model_change(ui)  # and the watcher runs again
    await wait_for(lambda: handlers.settings_sent(chat, n), 10, "the next change sent by the watcher")

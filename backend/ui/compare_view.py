"""Compare mode as Chainlit shows it (backend/chat/compare.py decides): each side's bubble, its masked
progress lines, the note under a compared turn with its vote or "continue with" buttons, the panel's choice."""

from __future__ import annotations

from typing import Any

import chainlit as cl
from chainlit.input_widget import Select
from chainlit.utils import utc_now

from backend.chat import compare
from backend.chat.budget import FitResult
from backend.chat.coalesce import Coalescer
from backend.chat.turn import Reply
from backend.storage.history import META_KEY
from backend.text import t
from backend.ui import markdown, views
from backend.ui.views import ChatView, ViewHost

COMPARE_KEY = "compare"  # the chat's CompareState, beside its ChatSession


def column_mark(label: str, text: str) -> str:
    """``text`` as a link to ``#qc-side-a`` (or b): public/style.css finds a side's bubble and its error by it and
    puts A and B in two columns on a wide screen (#22); shown as plain text, not clickable. It lives in the
    message's own text, so resumed chats and shared views get the columns too."""
    return f"[{text}](#qc-side-{label.lower()})"


def compare_state() -> compare.CompareState:
    state = cl.user_session.get(COMPARE_KEY)
    if not isinstance(state, compare.CompareState):  # a resumed thread's copy holds None: compare is off
        state = compare.CompareState()
        cl.user_session.set(COMPARE_KEY, state)
    return state


def panel_choice() -> str:
    """The compare mode as the settings panel names it: off, on (side by side) or blind."""
    mode = compare_state().mode
    return "off" if mode is None else "blind" if mode.blind else "on"


def compare_widget(lang: str) -> Select:
    """The settings panel's way into compare mode: off, side by side (the base vs the model chosen above), blind."""
    items = {t(f"compare.panel_{v}", lang): v for v in ("off", "on", "blind")}
    return Select(
        id="compare",
        label=t("compare.panel", lang),
        items=items,
        initial_value=panel_choice(),
        description=t("compare.panel_desc", lang),
    )


async def update_pair(pair: compare.Pair, lang: str, *, new_note: bool = False) -> None:
    """Re-show both sides (names revealed or not, which one is picked) and the note with its buttons."""
    for view in compare_state().views.get(pair.turn_id, {}).values():
        await view.refresh()
    if not any(s.shown for s in pair.sides):
        return
    actions = compare_actions(pair, lang)
    buttons = compare_state().buttons
    if new_note or pair.note_id is None:
        msg = cl.Message(content=markdown.note(pair, lang), actions=actions, author="compare")
        await msg.send()
        pair.note_id = msg.id
    else:
        for old in buttons.get(pair.turn_id, []):  # the vote buttons after a vote, the other "continue with"
            await old.remove()
        msg = cl.Message(content=markdown.note(pair, lang), actions=actions, author="compare", id=pair.note_id)
        await msg.update()  # sends the new buttons too
    buttons[pair.turn_id] = actions
    for turn_id in list(buttons):
        if turn_id not in compare_state().pairs:
            del buttons[turn_id]


def compare_actions(pair: compare.Pair, lang: str) -> list[cl.Action]:
    payload = {"turn": pair.turn_id}
    if pair.blind and not pair.revealed:
        return [
            cl.Action(name="compare_vote", payload={**payload, "winner": w}, label=t(f"compare.vote_{w}", lang))
            for w in ("a", "b", "tie")
        ]
    return [
        cl.Action(
            name="compare_pick",
            payload={**payload, "side": side.label},
            label=t("compare.continue", lang, side=side.label),
        )
        for i, side in enumerate(pair.sides)
        if i != pair.picked and side.shown and side.text
    ]


async def pair_of(action: cl.Action, lang: str) -> compare.Pair | None:
    """The compared turn a vote or pick button belongs to (one press per button); None: gone, and said so."""
    await action.remove()
    pair = compare_state().pairs.get((action.payload or {}).get("turn", ""))
    if pair is None:
        await views.show_error(t("old_button", lang))
    return pair


class MaskedStep(cl.Step):
    """A compare side's progress line (an adapter load, its eviction note): the model names stay hidden in it
    until the vote, whatever the turn writes into its title and detail."""

    def __init__(self, view: CompareView, **kwargs: Any) -> None:
        self.view = view
        super().__init__(**kwargs)

    def _masked(self) -> None:
        pair, side, lang = self.view.pair, self.view.side, self.view.lang
        self.name = markdown.mask(self.name, pair, side, lang)
        self.output = markdown.mask(self.output or "", pair, side, lang)

    async def send(self) -> Any:
        self._masked()
        return await super().send()

    async def update(self) -> Any:
        self._masked()
        return await super().update()


class CompareView(ChatView):
    """One side of a compared turn: its bubble headed "A · model" (or just "A" while blind), its own footer,
    its own error bubble; the chat's model choice is left alone."""

    def __init__(self, lang: str, host: ViewHost, pair: compare.Pair, side: compare.Side) -> None:
        super().__init__(lang, host)
        self.pair, self.side = pair, side
        self.reply: Reply | None = None
        self.cut: tuple[str, str] | None = None  # (text, why) of an answer kept cut
        self.headed = False
        self.opened = False  # the bubble is on screen with its heading, no answer text yet

    async def open(self) -> None:
        """Show the side's bubble, headed, before its first token: A stays above B whichever answers first."""
        self.msg = cl.Message(content="", author=compare.author(self.pair, self.side))
        # Chainlit stamps a streamed message when it is sent, at its end: the side that finished first would come
        # first when the chat is read back from the history (B before A, out of its column). Stamped at opening.
        self.msg.created_at = utc_now()
        await self.msg.stream_token(self.heading())  # a streaming bubble, as any answer is (not a sent one)
        self.opened = self.headed = True

    def heading(self) -> str:
        return column_mark(self.side.label, compare.title(self.pair, self.side, self.lang)) + "\n\n"

    def step(self, title: str) -> cl.Step:
        return MaskedStep(self, name=title, type="tool")

    async def new_answer(self, model: str) -> None:
        if self.opened and self.msg is not None:  # the bubble opened for this side, still without text
            await self.flushed()
            self.reasoning = None
            self.out = Coalescer(self._emit, self.host.flush_seconds())
            self.msg.content, self.headed = self.heading(), True
            self._checkpoint_due = None
            return
        await super().new_answer(model)
        self.bubble.author = compare.author(self.pair, self.side)
        self.bubble.created_at = utc_now()  # as in open(): the history keeps the order the bubbles opened in
        self.headed = False

    async def _emit(self, kind: str, text: str) -> None:
        if kind == "answer" and not self.headed:  # the side's heading arrives with its first text
            self.headed = True
            text = self.heading() + text
        await super()._emit(kind, text)

    def cut_form(self, why: str) -> tuple[str, dict[str, Any]] | None:
        """The side's cut answer as ``keep_partial`` would show it (names masked in a blind compare)."""
        raw = self.bubble.content
        if self.headed:
            raw = raw.removeprefix(self.heading())
        if not raw:
            return None
        shown = compare.shown_model(self.pair, self.side, self.lang)
        marked = self.heading() + markdown.close_fence(raw) + markdown.interrupted_marker(why, shown)
        metadata = compare.side_metadata(self.pair, self.side)
        metadata[META_KEY] = {**metadata[META_KEY], "raw": raw, "interrupted": True}
        return marked, metadata

    def render(self) -> str:
        pair, side, lang = self.pair, self.side, self.lang
        head = self.heading()
        shown = compare.shown_model(pair, side, lang)
        if self.reply is not None:
            r = self.reply
            return (
                head
                + markdown.close_fence(r.text)
                + markdown.footer(shown, r.usage, r.fitted, r.seconds, lang, r.finish, r.waited)
            )
        text, why = self.cut or ("", "")
        return head + markdown.close_fence(text) + markdown.interrupted_marker(why, shown)

    async def drop_answer(self) -> None:
        self.opened = False  # a retry within the turn (the engine came back) opens a new bubble
        await super().drop_answer()

    async def show_answer(self, reply: Reply) -> str:
        await self.flushed()
        self.reply = reply
        self.side.text, self.side.model = reply.text, reply.model
        msg = self.bubble
        msg.author = compare.author(self.pair, self.side)
        msg.content = self.render()
        msg.metadata = compare.side_metadata(self.pair, self.side)
        await msg.send()
        return msg.id

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        await self.flushed()
        self.cut = (text, why)
        self.side.text, self.side.interrupted = text, True
        msg = self.bubble
        msg.content = self.render()
        msg.metadata = compare.side_metadata(self.pair, self.side)
        await msg.send()
        return msg.id

    async def refresh(self) -> None:
        """After a vote or a pick: names, footer and the picked mark in the stored metadata."""
        if self.msg is None or (self.reply is None and self.cut is None):
            return
        self.msg.author = compare.author(self.pair, self.side)
        self.msg.content = self.render()
        self.msg.metadata = compare.side_metadata(self.pair, self.side)
        await self.msg.update()

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        label = compare.author(self.pair, self.side)
        await super().show_error(
            f"{column_mark(self.side.label, f'**{label}**')}: {markdown.mask(text, self.pair, self.side, self.lang)}",
            retry=retry,
            trimmed=trimmed,
        )

    def retry_payload(self) -> dict[str, Any]:
        """A side's Retry runs that side again (compare_chat.retry_compared_side), not both."""
        return {**super().retry_payload(), "side": self.side.label}

    async def model_changed(self) -> None:
        """A compare side never changes the chat's model choice."""

    async def left_out(self, fitted: FitResult) -> None:
        if self.side is self.pair.sides[0]:  # both were sent the same history: list it once
            await views.show_left_out(fitted, self.lang)

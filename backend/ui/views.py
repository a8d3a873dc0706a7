"""ChatView: a turn as Chainlit shows it (the renderer backend/chat/turn.py drives), and the bubbles it needs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

import chainlit as cl
from chainlit.data import get_data_layer
from chainlit.utils import utc_now

from backend.chat.budget import FitResult
from backend.chat.coalesce import Coalescer
from backend.chat.turn import Reply
from backend.storage import history
from backend.text import t
from backend.ui import markdown

logger = logging.getLogger(__name__)

#: While an answer streams, the history gets what it has shown so far, marked as a cut answer ("⚠ answer
#: interrupted"), this long after its first text and then every CHECKPOINT_EVERY_S; the answer's end (its footer),
#: a Stop or an error replaces it. A UI process that dies mid-answer (kill -9, the OOM killer) thus leaves the resumed
#: chat its cut answer, as an engine that dies does, not a question without one (which the model, sent the chat
#: again, would answer in place of the next message). One upsert of the step each time, with login on only.
FIRST_CHECKPOINT_S = 2.0
CHECKPOINT_EVERY_S = 10.0


class ViewHost(Protocol):
    """What a view asks of the handlers (panel.Host, bound to one installation), at the moment it asks."""

    def flush_seconds(self) -> float:
        """[ui].stream_flush_ms in seconds: how long streamed tokens are held to go out in one batch."""
        ...

    def latest_turn_id(self) -> str | None:
        """The chat's latest user turn, named by Retry and "send trimmed" buttons."""
        ...

    async def send_settings(self) -> None:
        """Re-send the settings panel and the composer's model picker."""
        ...


async def show_error(text: str, actions: list[cl.Action] | None = None) -> None:
    """An error bubble, with buttons if any (Chainlit 2.12's cl.ErrorMessage takes no actions)."""
    msg = cl.Message(content=text, actions=actions or [])
    msg.is_error = True
    await msg.send()


async def show_left_out(fitted: FitResult | None, lang: str) -> None:
    """Which earlier turns were not sent (the context meter says how many)."""
    if fitted is None or not fitted.dropped:
        return
    lines = [f"- #{d.index + 1}: {d.preview}" for d in fitted.dropped]
    async with cl.Step(name=t("left_out_title", lang), type="tool", default_open=False) as step:
        step.output = "\n".join(lines)


class ChatView:
    """A turn as Chainlit shows it: the answer bubble, its reasoning step, tool steps, error bubbles."""

    def __init__(self, lang: str, host: ViewHost) -> None:
        self.lang, self.host = lang, host
        self.msg: cl.Message | None = None  # the answer bubble, from new_answer on
        self.reasoning: cl.Step | None = None
        # Tokens reach the browser in batches (one socket message and re-render each): [ui].stream_flush_ms.
        self.out = Coalescer(self._emit, host.flush_seconds())
        self._checkpoint_due: float | None = None  # monotonic; None until the answer's first text
        self._checkpoint: asyncio.Task[None] | None = None

    @property
    def bubble(self) -> cl.Message:
        """The answer bubble; turn.py opens it (new_answer) before it streams, finalises or cuts an answer."""
        if self.msg is None:
            raise RuntimeError("no answer bubble: new_answer was not called")
        return self.msg

    def step(self, title: str) -> cl.Step:
        return cl.Step(name=title, type="tool")

    async def new_answer(self, model: str) -> None:
        await self.flushed()
        self.msg, self.reasoning = cl.Message(content="", author=model), None
        self.out = Coalescer(self._emit, self.host.flush_seconds())  # its first token at once
        self._checkpoint_due = None

    async def stream_token(self, token: str) -> None:
        await self.out.add("answer", token)

    async def stream_reasoning(self, token: str) -> None:
        await self.out.add("reasoning", token)

    async def _emit(self, kind: str, text: str) -> None:
        """The coalescer's sink: one batch of answer or reasoning text to the browser."""
        if kind == "answer":
            await self.bubble.stream_token(text)
            self._maybe_checkpoint()
            return
        if self.reasoning is None:
            self.reasoning = cl.Step(name=t("reasoning", self.lang), type="llm", default_open=False)
            await self.reasoning.send()
        await self.reasoning.stream_token(text)

    async def flushed(self) -> None:
        """Send what the coalescer holds: before the answer is finalised, cut, removed or an error shown. A
        checkpoint still being written ends first, so that it never lands over the answer's final form."""
        try:
            await self.out.aclose()
        except Exception:  # the bubble may be gone (websocket); the final send sets the whole text anyway
            logger.debug("could not flush the streamed text", exc_info=True)
        if self._checkpoint is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint
            self._checkpoint = None

    def checkpoint_step(self) -> dict[str, Any] | None:
        """The answer bubble as the history keeps a cut answer (as ``keep_partial`` stores it), or None before
        its first text."""
        msg = self.msg
        form = self.cut_form(t("interrupted", self.lang)) if msg is not None else None
        if msg is None or form is None:
            return None
        if not msg.created_at:  # the final send keeps it: the answer stays where it opened in the chat
            msg.created_at = utc_now()
        step = dict(msg.to_dict())
        step["output"], step["metadata"] = form
        step["streaming"] = False
        return step

    def cut_form(self, why: str) -> tuple[str, dict[str, Any]] | None:
        """(text, metadata) of the answer shown so far as a cut answer, marked with ``why``; None before its text."""
        msg = self.bubble
        if not msg.content:
            return None
        marked = markdown.close_fence(msg.content) + markdown.interrupted_marker(why, msg.author)
        return marked, history.answer_metadata(msg.content, msg.author, interrupted=True)

    def _maybe_checkpoint(self) -> None:
        """Write the answer shown so far to the history when one is due and none is being written."""
        now = time.monotonic()
        if self._checkpoint_due is None:
            self._checkpoint_due = now + FIRST_CHECKPOINT_S
        if now < self._checkpoint_due or (self._checkpoint is not None and not self._checkpoint.done()):
            return
        self._checkpoint_due = now + CHECKPOINT_EVERY_S
        layer = get_data_layer()  # None with login off: no history
        step = self.checkpoint_step() if layer is not None else None
        if step is None:
            return
        self._checkpoint = asyncio.create_task(self._write_checkpoint(layer, step))

    @staticmethod
    async def _write_checkpoint(layer: Any, step: dict[str, Any]) -> None:
        try:
            await layer.update_step(step)
        except Exception:  # the answer goes on; the final write stores it whole
            logger.warning("could not write the streaming answer %s to the history", step.get("id"), exc_info=True)

    async def reasoning_done(self) -> None:
        await self.flushed()
        if self.reasoning is not None:
            await self.reasoning.update()

    async def show_answer(self, reply: Reply) -> str:
        await self.flushed()
        msg = self.bubble
        msg.author = reply.model
        msg.content = markdown.close_fence(reply.text) + markdown.footer(
            reply.model, reply.usage, reply.fitted, reply.seconds, self.lang, reply.finish, reply.waited
        )
        msg.metadata = history.answer_metadata(reply.text, reply.model)  # the history keeps no footer
        await msg.send()
        return msg.id

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        await self.flushed()
        msg = self.bubble
        msg.content = markdown.close_fence(text) + markdown.interrupted_marker(why, model)
        msg.metadata = history.answer_metadata(text, model, interrupted=True)
        await msg.send()
        return msg.id

    async def drop_answer(self) -> None:
        await self.flushed()
        await self.bubble.remove()

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        await self.flushed()
        actions = []
        if retry:
            actions.append(
                cl.Action(
                    name="retry",
                    payload=self.retry_payload(),
                    label=t("retry", self.lang),
                    icon="rotate-ccw",
                )
            )
        if trimmed is not None:
            actions.append(
                cl.Action(
                    name="send_trimmed",
                    payload={"turn": self.host.latest_turn_id(), "text": trimmed},
                    label=t("send_trimmed", self.lang),
                    icon="scissors",
                )
            )
        await show_error(text, actions)

    async def offer_cut(self, text: str, *, document: int, part: int, label: str) -> None:
        await self.flushed()
        payload = {"turn": self.host.latest_turn_id(), "document": document, "part": part}
        await show_error(text, [cl.Action(name="send_cut", payload=payload, label=label, icon="scissors")])

    def retry_payload(self) -> dict[str, Any]:
        """What this answer's Retry button carries: the user turn it answers (an older turn's button is refused)."""
        return {"turn": self.host.latest_turn_id()}

    async def model_changed(self) -> None:
        await self.host.send_settings()

    async def left_out(self, fitted: FitResult) -> None:
        await show_left_out(fitted, self.lang)

"""Answering the last user turn (backend/chat/turn.py holds the policy): as a message's task or a button's, one
answer at a time per chat, and the Retry and "send trimmed" buttons."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import chainlit as cl

from backend.chat import compare, turn
from backend.chat.conversation import Turn
from backend.chat.fairshare import Claim, TooMany
from backend.chat.turn import Outcome
from backend.text import t
from backend.ui.compare_chat import answer_compared, retry_compared_side
from backend.ui.compare_view import compare_state
from backend.ui.context import Ui, answerer, guarded
from backend.ui.panel import chat_view, remember
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


async def answer(ui: Ui) -> None:
    """Answer the last user turn; keep the settings it used."""
    if compare_state().mode is not None:  # compare mode: two models answer side by side
        await answer_compared(ui)
        return
    if await turn.answer(ui.chat(), ui.service, chat_view(ui)) is Outcome.ANSWERED:
        await remember(ui)


async def answer_as_task(ui: Ui, work: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
    """Answer (or do ``work``) as the session's current task, like a typed message, so the Stop button shows and
    works. Action callbacks run inside Chainlit's HTTP request, not the message task Stop cancels. Called inside
    ``one_answer``.
    """
    task = asyncio.create_task((work or functools.partial(answer, ui))())
    cl.context.session.current_task = task
    await cl.context.emitter.task_start()
    try:
        await asyncio.wait({task})
    finally:
        await cl.context.emitter.task_end()


async def turn_of(ui: Ui, action: cl.Action) -> Turn | None:
    """The user turn an action button belongs to, if it is still the latest; else say why not."""
    await action.remove()  # one press per button
    last = ui.chat().conversation.last_user()
    if last is None:
        await show_error(t("nothing_to_retry", ui.lang()))
    elif (action.payload or {}).get("turn") != last.id:
        await show_error(t("old_button", ui.lang()))
    else:
        return last
    return None


def claim_answers(ui: Ui, count: int | None = None) -> Claim | TooMany:
    """This user's fair share of ``count`` answers (None: what a message starts here, 2 in compare mode), counted
    until released; or why not (nothing counted, logged). Over all their chats: backend/chat/fairshare.py."""
    if count is None:
        count = 2 if compare_state().mode is not None else 1
    who = answerer()
    try:
        return ui.fair.claim(who, count)
    except TooMany as exc:
        logger.info(
            "fair share: %d more answer(s) refused for %s: %d streaming, limit %d ([ui] max_answers_per_user)",
            count,
            who if who.startswith("user:") else who.split(":")[0],  # a browser's cookie is not logged
            exc.held,
            exc.limit,
        )
        return exc


@contextlib.asynccontextmanager
async def one_answer(ui: Ui, count: int | None = None) -> AsyncIterator[bool]:
    """Around a button's work: False (and said, the button stays for later) while this chat is answering or the
    user has their fair share of answers streaming elsewhere; else True, and the chat counts as answering (and
    ``count`` answers as the user's) until the block ends (one answer streams per chat; a typed message or an edit
    claims the same in socket_guard.py). Claimed before any await, so two presses never both pass."""
    state = ui.chat()
    if state.answering:
        await show_error(t("busy_action", ui.lang()))
        yield False
        return
    claim = claim_answers(ui, count)
    if isinstance(claim, TooMany):
        await show_error(t("fair.busy_action", ui.lang(), running=claim.held, limit=claim.limit))
        yield False
        return
    state.answering = True
    state.ahead = claim.ahead  # the engine priority of its requests
    try:
        with claim:
            yield True
    finally:
        state.answering = False


@guarded
async def on_retry(ui: Ui, action: cl.Action) -> None:
    one_side = (action.payload or {}).get("side") in compare.LABELS  # a compare side's retry is one answer
    async with one_answer(ui, 1 if one_side else None) as free:
        if not free or await turn_of(ui, action) is None:
            return
        side = (action.payload or {}).get("side")  # a compare side's error: retry that side only, keep the other's
        pair = compare_state().pairs.get((action.payload or {}).get("turn", "")) if side else None
        if pair is not None and side in compare.LABELS:
            if pair.vote is not None:
                await show_error(t("compare.voted_no_retry", ui.lang()))
                return
            await answer_as_task(ui, functools.partial(retry_compared_side, ui, pair, side))
            return
        ui.chat().conversation.drop_answers_after_last_user()
        await answer_as_task(ui)


@guarded
async def on_send_trimmed(ui: Ui, action: cl.Action) -> None:
    async with one_answer(ui) as free:
        last = await turn_of(ui, action) if free else None
        if last is None:
            return
        ui.chat().conversation.add_user(last.id, action.payload["text"])
        await answer_as_task(ui)

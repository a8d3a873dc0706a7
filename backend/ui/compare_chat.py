"""Compare mode's handlers (backend/chat/compare.py decides, compare_view.py renders): /compare, /vote,
/leaderboard, the panel's compare choice, both sides answering, a side's retry, the vote and pick buttons."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict, replace
from datetime import UTC, datetime

import chainlit as cl

from backend.chat import budget, compare
from backend.chat.turn import Outcome
from backend.storage.votes import WINNERS, Winner
from backend.text import t
from backend.ui import markdown
from backend.ui.compare_view import CompareView, compare_state, pair_of, panel_choice, update_pair
from backend.ui.context import Ui, guarded, preference_key
from backend.ui.panel import Host, remember, send_settings
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


async def show_leaderboard(ui: Ui) -> None:
    """/leaderboard: wins, losses and ties per model from the stored blind votes."""
    standings = await asyncio.to_thread(ui.service.votes.leaderboard)
    await cl.Message(content=markdown.leaderboard_markdown(standings, ui.lang())).send()


async def run_vote(ui: Ui, text: str) -> None:
    """/vote A|B|tie [comment] on this chat's latest blind pair."""
    pair = compare_state().latest(blind=True)
    if pair is None:
        await show_error(t("compare.vote_none", ui.lang()))
        return
    try:
        winner, comment = compare.parse_vote(text)
    except compare.CompareRefused as exc:
        await show_error(exc.user_text(ui.lang()))
        return
    await cast_vote(ui, pair, winner, comment)


async def choose_compare(ui: Ui, choice: object) -> None:
    """The panel's compare choice, when it changed: the same as typing /compare, /compare blind, /compare off."""
    if choice not in ("off", "on", "blind") or choice == panel_choice():
        return
    await set_compare(ui, {"off": "off", "on": "", "blind": "blind"}[str(choice)])
    await send_settings(ui)  # the panel shows what is on (a refusal leaves it as it was)


async def set_compare(ui: Ui, text: str) -> None:
    """/compare [blind] [A] [B] turns compare mode on (or changes it), /compare off ends it."""
    app, chat = ui.service, ui.chat()
    state, status = compare_state(), app.poller.status
    served = [m.id for m in status.models if not m.is_adapter] + [m.id for m in status.adapters]
    loadable = [a.name for a in await app.local_adapters(status)]
    try:
        used = [turn.model for turn in chat.conversation.turns if turn.role == "assistant"]
        mode = compare.parse_command(text, served, loadable, chat.model, app.default_model(status), used)
    except compare.CompareRefused as exc:
        await show_error(exc.user_text(ui.lang()))
        return
    state.mode = mode
    if mode is None:
        model = chat.model or app.default_model(status)
        await cl.Message(content=t("compare.off", ui.lang(), model=model)).send()
    else:
        await cl.Message(content=mode.announcement(ui.lang())).send()


async def answer_compared(ui: Ui) -> None:
    """Both models answer the last user turn at once, each in its own bubble with its own footer and error."""
    state, chat, lang = compare_state(), ui.chat(), ui.lang()
    mode, last = state.mode, chat.conversation.last_user()
    if mode is None or last is None:
        return
    docs = last.documents
    try:  # each document's tokens, for the pair's references (cached: the meter counts the same frames)
        tokens = [await budget.frame_tokens(d, await ui.service.counter()) for d in docs]
    except Exception:  # the references say 0 tokens then; the answers matter more
        logger.warning("could not count the documents of %s for the compare pair", last.id, exc_info=True)
        tokens = [0] * len(docs)
    pair = compare.new_pair(
        mode, last.id, chat.conversation.messages(chat.system_prompt), documents=docs, tokens=tokens
    )
    views = {side.label: CompareView(lang, Host(ui), pair, side) for side in pair.sides}
    compare.remember(state.pairs, pair)
    state.views[pair.turn_id] = views
    for old in list(state.views):
        if old not in state.pairs:
            del state.views[old]
    for view in views.values():  # both bubbles at once, A above B, before either model sends a token
        await view.open()
    try:
        await compare.run(pair, chat, ui.service, views)
    finally:
        with contextlib.suppress(Exception):  # after Stop too: the picked side is marked in the stored messages
            await update_pair(pair, lang, new_note=True)
    if any(s.outcome is Outcome.ANSWERED for s in pair.sides):
        await remember(ui)


async def retry_compared_side(ui: Ui, pair: compare.Pair, label: str) -> None:
    """A compare side's Retry: that side answers the pair's turn again in a new bubble; the other side's answer,
    and which answer the chat continues from (if it is on screen), are kept."""
    state, lang = compare_state(), ui.lang()
    side = pair.side(label)
    side.text, side.message_id, side.interrupted, side.shown, side.outcome = "", None, False, False, None
    for old in state.buttons.pop(pair.turn_id, []):  # the pair's note is sent again below, with current buttons
        with contextlib.suppress(Exception):
            await old.remove()
    view = CompareView(lang, Host(ui), pair, side)
    state.views.setdefault(pair.turn_id, {})[label] = view
    await view.open()
    try:
        await compare.run(pair, ui.chat(), ui.service, {label: view}, only=label)
    finally:
        with contextlib.suppress(Exception):
            await update_pair(pair, lang, new_note=True)
    if pair.side(label).outcome is Outcome.ANSWERED:  # as the run left it
        await remember(ui)


@guarded
async def on_compare_vote(ui: Ui, action: cl.Action) -> None:
    pair = await pair_of(action, ui.lang())
    if pair is None:
        return
    winner = (action.payload or {}).get("winner")
    if not pair.blind:  # the buttons are only under blind pairs; a forged press on another is no blind vote
        logger.warning("compare_vote refused: the pair of turn %s is not blind", pair.turn_id)
        await show_error(t("compare.vote_not_blind", ui.lang()))
    elif winner not in WINNERS:
        await show_error(t("compare.vote_usage", ui.lang(), text=str(winner)[:80]))
    else:
        await cast_vote(ui, pair, winner, "")


@guarded
async def on_compare_pick(ui: Ui, action: cl.Action) -> None:
    pair = await pair_of(action, ui.lang())
    if pair is None:
        return
    if not compare.pick(pair, action.payload["side"], ui.chat().conversation):
        await show_error(t("compare.moved_on", ui.lang()))
        return
    await update_pair(pair, ui.lang())


def voter() -> str:
    session = cl.context.session
    if session.user:
        return str(session.user.identifier)
    return preference_key() or "anonymous"


async def cast_vote(ui: Ui, pair: compare.Pair, winner: Winner, comment: str) -> None:
    """Store the vote (the last vote on a turn wins, and the chat says so), then reveal the names."""
    vote = compare.to_vote(pair, winner, voter(), cl.context.session.thread_id, comment)
    if ui.outbox is not None:  # the history's one write path: after this turn's steps, kept until stored
        replaced = pair.vote is not None  # the last vote on a turn wins
        created = datetime.now(UTC).isoformat(timespec="milliseconds")  # set once: a replay writes the same row
        ui.outbox.submit(vote.thread_id, "vote", asdict(replace(vote, created_at=created)))
    else:
        try:
            replaced = await asyncio.to_thread(ui.service.votes.record, vote)
        except Exception as exc:  # a locked or broken file: say so, keep the names hidden
            logger.exception("could not store a vote")
            await show_error(t("compare.vote_failed", ui.lang(), detail=type(exc).__name__))
            return
    compare.apply_vote(pair, winner, ui.chat().conversation)
    await update_pair(pair, ui.lang())
    if replaced:
        await cl.Message(content=t("compare.vote_replaced", ui.lang()), author="compare").send()

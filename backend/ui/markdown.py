"""The Markdown the chat shows around answers: the footer under an answer, the fence closed and the marker under a
cut one, the hidden names and the note under a compared pair, the /leaderboard table. Pure text (no Chainlit
calls): the views (views.py, compare_view.py) and the handlers put it into bubbles."""

from __future__ import annotations

from collections.abc import Sequence

from backend.chat.budget import FitResult
from backend.chat.client import Finish, Usage
from backend.chat.compare import Pair, Side, shown_model, winner_text
from backend.chat.endings import ending_note
from backend.storage.votes import Standing
from backend.text import t


def close_fence(text: str) -> str:
    """``text`` with a code fence left open (an answer cut mid-block) closed, so what follows renders."""
    fence = None
    for line in text.splitlines():
        stripped = line.lstrip()
        for mark in ("```", "~~~"):
            if stripped.startswith(mark):
                if fence is None:
                    fence = mark
                elif fence == mark and not stripped.strip(mark[0]).strip():
                    fence = None
                break
    return text if fence is None else f"{text}\n{fence}"


def interrupted_marker(why: str, model: str) -> str:
    """The line under a cut answer (after ``close_fence``): why, and which model."""
    return f"\n\n*⚠ {why} · `{model}`*"


def footer(
    model: str,
    usage: Usage | None,
    fitted: FitResult | None,
    seconds: float,
    lang: str,
    finish: Finish | None = None,
    waited: float | None = None,
) -> str:
    """The line under each answer (after ``close_fence``): who answered, how much, how long, the context meter.

    ``seconds`` is the answer's own time; ``waited`` (None: the turn showed no wait) the time it spent waiting
    before that, for the model to load, an adapter load or in the engine's queue: apart, so that a cold start's
    first answer reads "8 tokens · 0.6 s · waited 157.7 s", not "8 tokens · 158.3 s"."""
    parts = [f"`{model}`"]  # ids like my_adapter or a*b would break the italics
    if usage and usage.completion_tokens is not None:
        parts.append(t("tokens", lang, n=usage.completion_tokens))
    parts.append(f"{seconds:.1f} s")
    if waited is not None:
        parts.append(t("waited", lang, seconds=waited))
    note = ending_note(finish, lang) if finish else None
    if note:
        parts.append(note)
    if fitted is not None:
        parts.append(fitted.meter_text(lang))
    return "\n\n*" + " · ".join(parts) + "*"


def mask(text: str, pair: Pair, side: Side, lang: str) -> str:
    """``text`` with the model names replaced by their hidden side labels while hidden (steps, errors)."""
    if pair.revealed:
        return text
    for other in sorted(pair.sides, key=lambda s: -len(s.model)):  # "pirate-v2" before "pirate"
        text = text.replace(other.model, shown_model(pair, other if other.model != side.model else side, lang))
    return text


def note(pair: Pair, lang: str) -> str:
    """The line under a compared pair: vote (blind, not voted yet) or which answer the chat continues from."""
    if pair.blind and not pair.revealed:
        return t("compare.vote_prompt", lang)
    side = pair.sides[pair.picked]
    text = t("compare.picked", lang, side=side.label, model=side.model)
    if pair.vote is not None:
        a, b = pair.sides
        text = t("compare.voted", lang, winner=winner_text(pair.vote, lang), model_a=a.model, model_b=b.model) + (
            "\n\n" + text
        )
    if pair.same:
        text += "\n\n" + t("compare.same", lang, model=pair.sides[0].model)
    return text


def leaderboard_markdown(standings: Sequence[Standing], lang: str) -> str:
    """``/leaderboard``: wins, losses and ties per model from the blind votes, as a markdown table."""
    if not standings:
        return t("leaderboard.empty", lang)
    lines = [f"**{t('leaderboard.title', lang)}**", "", t("leaderboard.head", lang), "|---|--:|--:|--:|"]
    lines += [f"| `{s.model}` | {s.wins} | {s.losses} | {s.ties} |" for s in standings]
    return "\n".join(lines)

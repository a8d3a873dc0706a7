"""``/export``: the conversation as Markdown, with the model of each answer.

md = conversation_markdown(conv, lang, system_prompt=..., pairs=..., title=...)
name = export_filename(now)   # chat-20260101-1200.md

``pairs`` is the compare mode's turn id -> compared pair (``compare.Pair``: ``sides`` with ``label``,
``model``, ``text``, ``interrupted``, ``message_id``; ``revealed``, ``picked``, ``vote``); read by
attribute, so this module does not depend on compare mode. A blind pair not voted on yet keeps its
model names hidden here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..text import t
from .conversation import Conversation
from .documents import describe, fenced
from .sanitize import sanitize_text
from .template import strip_reasoning


def export_filename(now: datetime) -> str:
    return f"chat-{now:%Y%m%d-%H%M}.md"


def _answer(text: str, interrupted: bool, lang: str) -> str:
    body = strip_reasoning(text).strip() or f"*{t('export.no_text', lang)}*"
    return body + (f"\n\n*⚠ {t('export.interrupted', lang)}*" if interrupted else "")


def _compared(pair: Any, lang: str) -> list[str]:
    revealed = bool(getattr(pair, "revealed", True))
    sides = list(getattr(pair, "sides", []) or [])
    picked = getattr(pair, "picked", 0)
    out: list[str] = []
    for i, side in enumerate(sides):
        label = str(getattr(side, "label", chr(ord("A") + i)))
        model = f"`{side.model}`" if revealed else t("export.hidden", lang)
        mark = f" · {t('export.picked', lang)}" if i == picked else ""
        out.append(f"### {t('export.side', lang, side=label)} · {model}{mark}")
        out.append(_answer(str(getattr(side, "text", "")), bool(getattr(side, "interrupted", False)), lang))
    vote = getattr(pair, "vote", None)
    if vote:
        winner = t("export.tie", lang) if vote == "tie" else t("export.side", lang, side=str(vote).upper())
        out.append(f"*{t('export.vote', lang, winner=winner)}*")
    return out


def conversation_markdown(
    conv: Conversation,
    lang: str,
    *,
    system_prompt: str = "",
    pairs: Mapping[str, Any] | None = None,
    title: str = "",
    now: datetime | None = None,
) -> str:
    """The chat as Markdown: each message under a heading, each answer's model in its heading."""
    pairs = pairs or {}
    when = (now or datetime.now()).strftime("%Y-%m-%d %H:%M")
    parts = [f"# {title or t('export.title', lang)}", f"*{t('export.exported', lang, when=when)}*"]
    if system_prompt.strip():
        parts += [f"**{t('system_prompt', lang)}:**", "\n".join(f"> {line}" for line in system_prompt.splitlines())]
    in_pair = False  # the answers after a compared user turn are its sides, shown with the pair
    for turn in conv.turns:
        if turn.role == "user":
            parts += [f"## {t('export.you', lang)}", turn.content]
            for doc in turn.documents:  # as the model read them (a cut one: the part sent)
                parts += [f"### 📎 {describe(doc, lang)}", *([fenced(doc.text)] if doc.kind != "image" else [])]
            in_pair = turn.id in pairs
            if in_pair:
                parts += _compared(pairs[turn.id], lang)
        elif not in_pair:
            heading = f"## {t('export.answer', lang)} · `{turn.model or '?'}`"
            parts += [heading, _answer(turn.content, turn.interrupted, lang)]
    return sanitize_text("\n\n".join(parts) + "\n")

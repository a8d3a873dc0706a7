"""How an answer ended, in words: the footer's line for every ending other than a plain stop, and what an answer
that carried no text shows instead (never a footer standing alone)."""

from __future__ import annotations

from ..engine_http import short
from ..text import t
from .client import Finish

#: finish reasons that need no word under the answer
PLAIN_ENDINGS = frozenset({"stop", "eos", "end_turn", "stop_sequence"})


def ending_note(finish: Finish, lang: str) -> str | None:
    """One line for every way an answer ends other than a plain stop (None for a plain stop)."""
    reason = finish.reason
    if reason in PLAIN_ENDINGS:
        return None
    if reason is None:
        return t("ending.none", lang)
    if reason == "length":
        return t("reply_limit", lang)
    if reason == "content_filter":
        return t("ending.content_filter", lang)
    if reason in ("tool_calls", "function_call") or finish.tools:
        return t("ending.tool_calls", lang, tools=f" ({', '.join(finish.tools)})" if finish.tools else "")
    return t("ending.unknown", lang, reason=short(reason, 60))


def no_text_message(finish: Finish | None, lang: str) -> str:
    """What to show instead of an answer that carried no text (never a footer standing alone)."""
    why = (ending_note(finish, lang) if finish else None) or t("ending.stop", lang)
    return t("no_text", lang, why=why)

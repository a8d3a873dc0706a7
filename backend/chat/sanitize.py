"""Text that can always be encoded: what is sent to the model and what is stored is passed through here.

    sanitize_text("a\ud800")            # "a\ufffd": a lone surrogate becomes U+FFFD
    sanitize_messages(messages)          # a copy of chat messages, every string in them sanitised

A lone surrogate (a browser can send one, e.g. half of an emoji cut by a paste) cannot be encoded as UTF-8: the
request to the engine and the database write would both fail on it. NUL and everything else is left unchanged.
"""

from __future__ import annotations

from typing import Any


def sanitize_text(text: str) -> str:
    """Replace lone surrogates (unencodable in UTF-8) with U+FFFD; join valid surrogate pairs."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _sanitize(value: Any) -> Any:
    if isinstance(value, str):
        return sanitize_text(value)
    if isinstance(value, list):
        return [_sanitize(v) for v in value]
    if isinstance(value, dict):
        return {k: _sanitize(v) for k, v in value.items()}
    return value


def sanitize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` that can always be sent (see sanitize_text); the input is not changed."""
    return [_sanitize(m) for m in messages]

"""What the product prints is safe to print: credentials in URLs masked, and a log record one line.

    mask_credentials("http://bob:s3cret@gpu:8000/v1")  -> "http://bob:***@gpu:8000/v1"
    install()                                            # once per process: every log record, whoever logs it

- **Credentials.** ``OPENAI_BASE_URL=http://user:password@host/v1`` is a working URL (httpx sends the pair as basic
  auth), and it reaches the chat's errors, the status line and ui.log. ``mask_credentials`` keeps the user name (it
  tells which account) and replaces the password; ``text.t`` applies it to every parameter of every text it makes
  (errors, the status line), and the log record factory to every record.
- **Log lines.** User text (a command's argument, an adapter name, a path) reaches the log as a %-style argument; a
  newline in it could forge a line (``/adapters x\\nFAKE LINE``). The record factory escapes control characters
  (``\\n`` -> ``\\\\n``, also ``\\r``, NUL, ESC, U+2028 …) in the message and its string arguments, for every logger of
  the process (ours, Chainlit's, uvicorn's), whichever handler writes it. A traceback (``exc_info``) is not a
  message: it stays multi-line.
"""

from __future__ import annotations

import logging
import re
from typing import Any

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^\s/?#@:]*):(?P<password>[^\s/?#@]+)@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def escape_controls(text: str) -> str:
    r"""Control characters as their escapes: one line whatever ``text`` holds (``\n`` -> ``\\n``)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def safe(text: str) -> str:
    return escape_controls(mask_credentials(text))


def _safe_arg(value: Any) -> Any:
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, BaseException):  # str(exc) is made at format time: made now, safe
        return safe(str(value))
    return value


def _safe_args(args: Any) -> Any:
    if isinstance(args, tuple):
        return tuple(_safe_arg(a) for a in args)
    if isinstance(args, dict):
        return {k: _safe_arg(v) for k, v in args.items()}
    return args


def install() -> None:
    """Every log record of this process made safe where it is made (idempotent)."""
    base = logging.getLogRecordFactory()
    if getattr(base, "_qwenchat_safe", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        if isinstance(record.msg, str):
            record.msg = safe(record.msg)
        if record.args:
            record.args = _safe_args(record.args)
        return record

    factory._qwenchat_safe = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)

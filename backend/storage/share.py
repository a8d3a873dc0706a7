"""Shareable read-only chats (``[login] enable``): who may open a shared link, who may share.

Chainlit 2.12 does the sharing: the owner's sidebar menu calls ``PUT /project/thread/share`` (it sets
``metadata.is_shared``) and copies ``/share/<thread id>``; that page reads ``GET /project/share/<id>`` and shows
the thread with no composer. backend/ui/routes.py puts two routes of ours in front of those, which decide here:

- opening a link needs a login (Chainlit would show a shared thread to anyone who has the link);
- a deleted (or never existing, or malformed) id, and a thread its owner has not shared (or stopped
  sharing), are refused with a message saying which (Chainlit answers a bare "Not Found" for both);
- only the owner shares or unshares: anyone else gets 403 and a message (Chainlit's 401 would log the
  browser out);
- only the owner rates the answers (thumbs, ``PUT /feedback``): Chainlit checks nothing there, and a shared
  chat shows its viewers the thumbs buttons; their ratings would become the owner's training data
  (``python -m backend export-feedback``).

The thread ids are UUIDs (``datalayer.GuardedDataLayer`` refuses others before SQL), so telling "deleted"
from "not shared" does not let anyone discover chats.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.storage.datalayer import valid_thread_id


@dataclass(frozen=True)
class Refusal:
    status: int  # HTTP status of the answer
    key: str  # backend/text.py key of the message


LOGIN = Refusal(401, "share.login")
GONE = Refusal(404, "share.gone")
NOT_SHARED = Refusal(403, "share.not_shared")
NOT_OWNER = Refusal(403, "share.not_owner")
NOT_OWNER_FEEDBACK = Refusal(403, "share.not_owner_feedback")


def thread_metadata(thread: Mapping[str, Any]) -> dict[str, Any]:
    """A thread's metadata as a dict (Chainlit hands it back as a JSON string on SQLite)."""
    meta = thread.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return {}
    return dict(meta) if isinstance(meta, dict) else {}


def is_shared(thread: Mapping[str, Any] | None) -> bool:
    return thread is not None and thread_metadata(thread).get("is_shared") is True


def view_refusal(thread: Mapping[str, Any] | None, viewer: str | None) -> Refusal | None:
    """Why ``viewer`` may not open this shared link (None: they may). ``thread`` None: no such thread."""
    if not viewer:
        return LOGIN
    if thread is None:
        return GONE
    if not is_shared(thread):
        return NOT_SHARED
    return None


def share_refusal(thread_id: object, author: str, user: str | None) -> Refusal | None:
    """Why ``user`` may not share or unshare the thread whose author is ``author`` ("" = no such thread)."""
    if not user:
        return LOGIN
    if not valid_thread_id(thread_id) or not author:
        return GONE
    if author != user:
        return NOT_OWNER
    return None


def feedback_refusal(thread_id: object, author: str, user: str | None) -> Refusal | None:
    """Why ``user`` may not rate an answer in the thread whose author is ``author``."""
    refusal = share_refusal(thread_id, author, user)
    return NOT_OWNER_FEEDBACK if refusal is NOT_OWNER else refusal

"""One open chat's state: its turns, its settings, and the tasks that serve it, in one typed object.

backend/ui/context.py keeps it under a single key of Chainlit's ``user_session`` and rebuilds it when that key
holds anything else: on resume Chainlit hands back a JSON copy of the old ``user_session``, in
which this object (like the lock and the task inside it) has become None. What must survive a
resume is stored apart from it, as plain JSON (``history.META_KEY``, see backend/ui/panel.py's ``remember``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .conversation import Conversation


@dataclass(eq=False)
class ChatSession:
    """What one browser chat holds between two messages."""

    system_prompt: str
    sampling: dict[str, float]  # temperature, top_p, top_k, min_p as the settings panel shows them
    conversation: Conversation = field(default_factory=Conversation)
    model: str | None = None  # the chosen model or adapter; None until the panel was first sent (the default)
    models_version: int | None = None  # the poller's model-list version the panel was last sent with
    mode_shown: str | None = None  # the model the composer's picker last showed as chosen
    # One settings send at a time: between setting ``model`` and sending the picker, a second send
    # (the watcher, a choice) would otherwise show the other model as the picker's default.
    settings_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watcher: asyncio.Task[None] | None = None  # re-sends the panel when the engine's model list changes
    # False from Chainlit's on_chat_end (the browser went away) until the browser acts again (a message, a
    # settings change): no watcher starts meanwhile, even from a chat start that was still running.
    connected: bool = True
    # A message, an edit or a button is being answered (a compare pair is one answer). Another one meanwhile is
    # refused (backend/ui/socket_guard.py, answering.py one_answer): one answer streaming per chat (issue #18).
    answering: bool = False
    # The user's answers already streaming (over all their chats) when this chat's answer was claimed: the engine
    # priority its requests go with under [vllm] scheduling_policy = "priority" (0 goes first; issue #20).
    ahead: int = 0
    # Chainlit's on_chat_resume restored this chat from the history (its turns and settings): a message of a chat
    # being resumed waits for it (backend/ui/socket_guard.py), or it would be answered without its earlier turns.
    resumed: bool = False

"""One conversation's turns, independent of the UI.

Why a class and not a list of dicts: Chainlit re-runs ``on_message`` with the *same* message id
when the user edits a message; the edited turn and everything after it must be replaced, not
appended (else stale turns are resent). A partial answer cut by an error or by Stop is kept and
marked, so what the user saw is what the history holds.

A user turn may carry documents (files attached to it, converted: ``documents.py``): the model gets them framed
before the question (``documents.framed_message``); the turn keeps the question as typed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .documents import Document, framed_message, neutralize_frames
from .sanitize import sanitize_text
from .template import strip_reasoning


@dataclass
class Turn:
    id: str
    role: str  # "user" | "assistant"
    content: str
    model: str = ""  # for assistant turns: the model/adapter that produced it
    interrupted: bool = False  # the answer was cut (error, stall, Stop)
    documents: tuple[Document, ...] = ()  # user turns: the files attached to it, as text


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)

    def add_user(self, turn_id: str, content: str, documents: tuple[Document, ...] | None = None) -> Turn:
        """Append a user turn; an existing id (an edit) replaces that turn and drops what followed. An edit keeps
        the turn's documents unless ``documents`` is given (the browser sends an edit's text only)."""
        kept: tuple[Document, ...] = ()
        for i, turn in enumerate(self.turns):
            if turn.id == turn_id:
                kept = turn.documents
                del self.turns[i:]
                break
        turn = Turn(turn_id, "user", content, documents=kept if documents is None else documents)
        self.turns.append(turn)
        return turn

    def add_assistant(self, turn_id: str, content: str, model: str, *, interrupted: bool = False) -> Turn:
        turn = Turn(turn_id, "assistant", content, model, interrupted)
        self.turns.append(turn)
        return turn

    def last_user(self) -> Turn | None:
        return next((t for t in reversed(self.turns) if t.role == "user"), None)

    def drop_answers_after_last_user(self) -> None:
        """Before a Retry: the last user turn is resent, the (partial) answer to it is replaced."""
        last = self.last_user()
        if last is not None:
            del self.turns[self.turns.index(last) + 1 :]

    def messages(self, system_prompt: str = "") -> list[dict[str, str]]:
        """OpenAI-format messages: system prompt (if any), then the turns; reasoning stripped; a user turn's
        documents framed before its text, and frame markers typed by the user broken (``neutralize_frames``).

        Lone surrogates become U+FFFD here, before the budget's tokenizer sees them (the Rust
        tokenizer raises TypeError on them); the turns keep the text as typed.
        """
        return [message for message, _ in self._entries(system_prompt)]

    def documents(self, system_prompt: str = "") -> list[tuple[Document, ...]]:
        """Each message of ``messages(system_prompt)``'s documents, in the same order (mostly empty)."""
        return [docs for _, docs in self._entries(system_prompt)]

    def _entries(self, system_prompt: str) -> list[tuple[dict[str, str], tuple[Document, ...]]]:
        out: list[tuple[dict[str, str], tuple[Document, ...]]] = []
        if system_prompt.strip():
            out.append(({"role": "system", "content": sanitize_text(system_prompt)}, ()))
        for turn in self.turns:
            if turn.role == "assistant":
                content = strip_reasoning(turn.content)
                if not content.strip():
                    continue  # an answer cut before any text carries nothing for the model
            else:
                content = framed_message(turn.content, turn.documents) if turn.documents else turn.content
                content = content if turn.documents else neutralize_frames(content)
            out.append(({"role": turn.role, "content": sanitize_text(content)}, turn.documents))
        return out

    def to_list(self) -> list[dict[str, Any]]:
        return [{**asdict(t), "documents": [d.to_dict() for d in t.documents]} for t in self.turns]

    @classmethod
    def from_list(cls, items: Iterable[dict[str, Any]]) -> Conversation:
        turns = []
        for item in items:
            fields = {k: v for k, v in item.items() if k in Turn.__dataclass_fields__}
            fields["documents"] = tuple(Document.from_dict(d) for d in fields.get("documents") or ())
            turns.append(Turn(**fields))
        return cls(turns)

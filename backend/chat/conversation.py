"""One conversation's turns, independent of the UI.

Why a class and not a list of dicts: Chainlit re-runs ``on_message`` with the *same* message id
when the user edits a message; the edited turn and everything after it must be replaced, not
appended (else stale turns are resent). A partial answer cut by an error or by Stop is kept and
marked, so what the user saw is what the history holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .sanitize import sanitize_text
from .template import strip_reasoning


@dataclass
class Turn:
    id: str
    role: str  # "user" | "assistant"
    content: str
    model: str = ""  # for assistant turns: the model/adapter that produced it
    interrupted: bool = False  # the answer was cut (error, stall, Stop)


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)

    def add_user(self, turn_id: str, content: str) -> Turn:
        """Append a user turn; an existing id (an edit) replaces that turn and drops what followed."""
        for i, turn in enumerate(self.turns):
            if turn.id == turn_id:
                del self.turns[i:]
                break
        turn = Turn(turn_id, "user", content)
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
        """OpenAI-format messages: system prompt (if any), then the turns; reasoning stripped.

        Lone surrogates become U+FFFD here, before the budget's tokenizer sees them (the Rust
        tokenizer raises TypeError on them); the turns keep the text as typed.
        """
        out: list[dict[str, str]] = []
        if system_prompt.strip():
            out.append({"role": "system", "content": sanitize_text(system_prompt)})
        for turn in self.turns:
            content = strip_reasoning(turn.content) if turn.role == "assistant" else turn.content
            if turn.role == "assistant" and not content.strip():
                continue  # an answer cut before any text carries nothing for the model
            out.append({"role": turn.role, "content": sanitize_text(content)})
        return out

    def to_list(self) -> list[dict[str, Any]]:
        return [asdict(t) for t in self.turns]

    @classmethod
    def from_list(cls, items: Iterable[dict[str, Any]]) -> Conversation:
        return cls([Turn(**{k: v for k, v in item.items() if k in Turn.__dataclass_fields__}) for item in items])

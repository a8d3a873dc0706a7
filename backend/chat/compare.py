"""Compare mode: two models answer the same message side by side; blind mode hides who is who until a vote.

    mode = parse_command("blind", served, loadable, chosen, base, used)    # CompareMode, None (off) or CompareRefused
    pair = new_pair(mode, turn_id, prompt)                                   # sides A, B (random order when blind)
    await run(pair, session, service, views)                                 # both stream at once; Stop stops both
    settle(pair, session.conversation)                                      # the picked answer joins the history
    vote = to_vote(pair, "b", user, thread_id)                               # for VoteStore.record

Each side is one ordinary turn (``turn.answer`` with a fixed model and its own ``Renderer``): the same wait,
adapter load, budget fit, stream and error handling as a normal answer, and its own footer and error. One
side failing never hides the other: each side's turn catches its own errors. The conversation continues from
the picked side (the first side, A, until the user picks another or votes for it); both answers stay in the
chat (their message metadata says side, model, picked).

No Chainlit here (backend/ui/compare_view.py renders).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.storage.history import META_KEY
from backend.storage.votes import Vote, Winner

from ..text import t
from .conversation import Conversation
from .documents import Document, frame, reference_frame
from .service import Service
from .session import ChatSession
from .turn import Outcome, Renderer
from .turn import answer as answer_turn

LABELS = ("A", "B")
#: A vote's prompt keeps a document's text up to this many characters (about 4K tokens); a longer one is a reference
#: (name, SHA-256 of its text, tokens: ``documents.reference_frame``), for issue #18's reason (a chat's 50 kept pairs
#: and every stored vote would each hold a copy). The chat's history keeps the text.
PAIR_DOCUMENT_CHARS = 16_000
MAX_PAIRS = 50  # compared turns a chat keeps in memory for votes and picks (older buttons are refused)


class CompareRefused(ValueError):
    """A /compare or /vote the app cannot do; ``user_text`` says why and what to type instead."""

    def __init__(self, key: str, **params: Any) -> None:
        self.key, self.params = key, params
        super().__init__(t(key, "en", **params))

    def user_text(self, lang: str) -> str:
        return t(self.key, lang, **self.params)


@dataclass(frozen=True)
class CompareMode:
    model_a: str
    model_b: str
    blind: bool = False

    @property
    def same(self) -> bool:
        return self.model_a == self.model_b

    def announcement(self, lang: str) -> str:
        key = "compare.on_blind" if self.blind else "compare.on"
        text = t(key, lang, a=self.model_a, b=self.model_b)
        if self.same:
            text += "\n\n" + t("compare.same", lang, model=self.model_a)
        return text


def parse_command(
    text: str,
    served: Sequence[str],
    loadable: Sequence[str],
    chosen: str | None,
    base: str,
    used: Sequence[str] = (),
) -> CompareMode | None:
    """``/compare [blind] [A] [B]`` or ``/compare off``. No names, or the base alone: the base against an adapter
    (``partner``); another name: the base against it. The base faces itself only when both names say so (#22).
    Every name must be served or loadable. ``used``: the models of this chat's answers, oldest first."""
    words = text.replace("`", " ").split()
    if [w.lower() for w in words] == ["off"]:
        return None
    blind = any(w.lower() == "blind" for w in words)
    names = [w for w in words if w.lower() != "blind"]
    known = list(dict.fromkeys([*served, *loadable]))
    if len(names) > 2:
        raise CompareRefused("compare.usage", text=text.strip())
    for name in names:
        if name not in known:
            raise CompareRefused("compare.unknown", name=name, models=", ".join(f"`{m}`" for m in known) or "-")
    if len(names) == 2:
        return CompareMode(names[0], names[1], blind)
    if len(names) == 1 and names[0] != base:
        return CompareMode(base, names[0], blind)
    other = partner(base, known, chosen, used)
    if other is None:
        raise CompareRefused("compare.one_model", model=base)
    return CompareMode(base, other, blind)


def partner(base: str, known: Sequence[str], chosen: str | None, used: Sequence[str]) -> str | None:
    """Who faces the base by default: the chosen adapter, else the one this chat used last, else the first served
    (``known`` lists the served before the loadable); None when the base is all there is."""
    for model in [chosen, *reversed(used), *known]:
        if model and model != base and model in known:
            return model
    return None


@dataclass
class Side:
    """One side of a compared turn: what its model said, and the bubble that shows it."""

    label: str  # "A" or "B": the order shown
    model: str
    text: str = ""
    message_id: str | None = None
    interrupted: bool = False
    shown: bool = False  # an answer (whole or cut) reached the screen
    outcome: Outcome | None = None

    def keep(self, turn_id: str, text: str, model: str, interrupted: bool) -> None:
        """The side's ``turn.Recorder``: its answer is kept here, the conversation takes the picked one later."""
        self.message_id, self.text, self.interrupted, self.shown = turn_id, text, interrupted, True
        if model:
            self.model = model  # the model the server says answered


@dataclass
class Pair:
    """One compared turn."""

    turn_id: str  # the user message both answered
    prompt: list[dict[str, str]]  # the turn's own prompt (``turn_prompt``): what a vote stores
    sides: list[Side]
    blind: bool
    revealed: bool = True
    picked: int = 0  # index into sides: the answer the conversation continues from
    vote: Winner | None = None
    settled: bool = False  # the picked answer is in the conversation
    note_id: str | None = None  # the message under the pair (vote or continue-with buttons)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return self.sides[0].model == self.sides[1].model

    def side(self, label: str) -> Side:
        return next(s for s in self.sides if s.label == label.upper())


def new_pair(
    mode: CompareMode,
    turn_id: str,
    prompt: list[dict[str, str]],
    rng: random.Random | None = None,
    *,
    documents: Sequence[Document] = (),
    tokens: Sequence[int] = (),
) -> Pair:
    """Sides A and B: in the order given, or in random order when blind. ``prompt``: the messages of the turn; the
    pair keeps only its own part (``turn_prompt``), its long ``documents`` as references (``tokens``: each one's)."""
    models = [mode.model_a, mode.model_b]
    if mode.blind:
        (rng or random.SystemRandom()).shuffle(models)
    sides = [Side(label, model) for label, model in zip(LABELS, models, strict=True)]
    return Pair(turn_id, turn_prompt(prompt, documents, tokens), sides, mode.blind, revealed=not mode.blind)


def turn_prompt(
    messages: Sequence[Mapping[str, str]], documents: Sequence[Document] = (), tokens: Sequence[int] = ()
) -> list[dict[str, str]]:
    """What a vote on the turn stores as its prompt: the system prompt (if any) and the last user message, whose
    ``documents`` (its files) over ``PAIR_DOCUMENT_CHARS`` characters, and its images, are references.

    Not the whole conversation (issue #18): a chat's 50 kept pairs and every stored vote would each hold all the
    turns before it, so one long chat could fill the memory and the votes table with copies of itself."""
    system = [dict(m) for m in messages[:1] if m.get("role") == "system"]
    user = next((dict(m) for m in reversed(messages) if m.get("role") == "user"), None)
    if user is not None and documents:
        user["content"] = _referenced(user["content"], documents, tokens or [0] * len(documents))
    return system + ([user] if user else [])


def _referenced(content: str, documents: Sequence[Document], tokens: Sequence[int]) -> str:
    """The framed message with each long document's frame replaced by its reference, and its images' references
    first (an image is no text: it was an image part beside it)."""
    images = []
    for doc, count in zip(documents, tokens, strict=True):
        if doc.kind == "image":
            images.append(reference_frame(doc, count))
        elif len(doc.text) > PAIR_DOCUMENT_CHARS:
            content = content.replace(frame(doc), reference_frame(doc, count), 1)
    return "\n\n".join([*images, content])


async def run(
    pair: Pair, session: ChatSession, service: Service, views: Mapping[str, Renderer], *, only: str | None = None
) -> None:
    """Both sides answer at once, each through its own renderer. Stop (cancelling this) stops both; each keeps
    what it showed. The picked answer joins the conversation however it ends (``settle``).

    ``only``: that side answers again (its Retry); the other keeps its answer, and stays picked if it was picked
    and is on screen."""
    kept = pair.sides[pair.picked]
    last = session.conversation.last_user()
    if only is not None and last is not None and last.id == pair.turn_id:
        session.conversation.drop_answers_after_last_user()  # the side is asked what it was asked the first time
    try:
        async with asyncio.TaskGroup() as group:
            for side in pair.sides:
                if only is None or side.label == only:
                    task = _side(side, session, service, views[side.label])
                    group.create_task(task, name=f"compare-{side.label}")
    finally:
        keep = only is not None and kept.label != only and kept.shown and bool(kept.text)
        pair.picked = pair.sides.index(kept) if keep else default_pick(pair)
        settle(pair, session.conversation)


async def _side(side: Side, session: ChatSession, service: Service, view: Renderer) -> None:
    side.outcome = await answer_turn(session, service, view, model=side.model, record=side.keep)


def default_pick(pair: Pair) -> int:
    """The first side with an answer on screen (A, unless A has none)."""
    return next((i for i, s in enumerate(pair.sides) if s.shown and s.text), 0)


def settle(pair: Pair, conv: Conversation) -> None:
    """Put the picked answer after the pair's user turn (replacing an earlier pick) if that turn is the latest."""
    last = conv.last_user()
    if last is None or last.id != pair.turn_id:
        return  # the chat moved on (or the turn was edited): history after it is not rewritten
    conv.drop_answers_after_last_user()
    side = pair.sides[pair.picked]
    if side.shown and side.text:
        conv.add_assistant(side.message_id or "", side.text, side.model, interrupted=side.interrupted)
    pair.settled = True


def pick(pair: Pair, label: str, conv: Conversation) -> bool:
    """Continue from side ``label``; False when that is no longer possible (a later message was sent)."""
    last = conv.last_user()
    if last is None or last.id != pair.turn_id:
        return False
    pair.picked = LABELS.index(label.upper())
    settle(pair, conv)
    return True


# ---------------------------------------------------------------- what the screen says


def title(pair: Pair, side: Side, lang: str) -> str:
    """The line that heads a side's bubble: "A · `base`", or just "A" while the names are hidden."""
    if not pair.revealed:
        return f"**{side.label}**"
    same = f" · {t('compare.same_short', lang)}" if pair.same else ""
    return f"**{side.label}** · `{side.model}`{same}"


def author(pair: Pair, side: Side) -> str:
    return f"{side.label} · {side.model}" if pair.revealed else side.label


def shown_model(pair: Pair, side: Side, lang: str) -> str:
    """What the footer names as the model: the model, or "A (hidden)" in blind mode before the vote."""
    return side.model if pair.revealed else f"{side.label} ({t('compare.hidden', lang)})"


def side_metadata(pair: Pair, side: Side) -> dict[str, Any]:
    """A side's message metadata: the raw answer (the history's), its model once revealed, side, picked."""
    index = pair.sides.index(side)
    return {
        META_KEY: {
            "raw": side.text,
            "model": side.model if pair.revealed else "",
            "interrupted": side.interrupted,
            "compare": {"side": side.label, "picked": index == pair.picked, "blind": pair.blind},
        }
    }


def winner_text(winner: Winner, lang: str) -> str:
    return t("compare.tie", lang) if winner == "tie" else t("compare.winner", lang, side=winner.upper())


def parse_vote(text: str) -> tuple[Winner, str]:
    """``/vote A|B|tie [comment]`` → (winner, comment)."""
    word, _, comment = text.strip().partition(" ")
    winner = word.strip().lower()
    if winner not in ("a", "b", "tie"):
        raise CompareRefused("compare.vote_usage", text=text.strip()[:80])
    return winner, comment.strip()  # type: ignore[return-value]


def apply_vote(pair: Pair, winner: Winner, conv: Conversation) -> None:
    """The names are revealed; the winner (A on a tie) becomes the answer the chat continues from."""
    pair.vote, pair.revealed = winner, True
    pick(pair, "A" if winner == "tie" else winner, conv)


def to_vote(pair: Pair, winner: Winner, user: str, thread_id: str, comment: str = "") -> Vote:
    a, b = pair.sides
    return Vote(
        user=user,
        thread_id=thread_id,
        turn_id=pair.turn_id,
        prompt=pair.prompt,
        answer_a=a.text,
        answer_b=b.text,
        model_a=a.model,
        model_b=b.model,
        winner=winner,
        comment=comment,
    )


def remember(pairs: dict[str, Pair], pair: Pair) -> None:
    """Keep the pair for its buttons; the oldest go past ``MAX_PAIRS``."""
    pairs[pair.turn_id] = pair
    while len(pairs) > MAX_PAIRS:
        pairs.pop(next(iter(pairs)))


@dataclass
class CompareState:
    """One chat's compare mode (None: off) and its recent pairs."""

    mode: CompareMode | None = None
    pairs: dict[str, Pair] = field(default_factory=dict)
    views: dict[str, Any] = field(default_factory=dict)  # turn id -> its views (backend/ui/compare_view.py)
    buttons: dict[str, list[Any]] = field(default_factory=dict)  # turn id -> the buttons shown under its note

    def latest(self, *, blind: bool | None = None) -> Pair | None:
        for pair in reversed(self.pairs.values()):
            if blind is None or pair.blind == blind:
                return pair
        return None

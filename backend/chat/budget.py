"""Fitting a conversation into the model's token budget, with a per-message count cache.

    budget = max_model_len − reply_reserve          (reply_reserve is also sent as max_tokens)
    fit = await fit_history(messages, counter, max_model_len=262_144, reply_reserve=1024)
    fit.messages        what to send: system prompt (if not empty) + the newest turns that fit
    fit.prompt_tokens   the prompt's exact size (== vLLM usage.prompt_tokens when fit.exact)
    fit.dropped         the oldest whole turns left out, with previews for the UI
    fit.meter_text(lang)  "12,345 / 261,120 tokens · 3 earlier turns left out" ("≈" if estimated)
    fit = await with_documents(fit, conversation.documents(system), counter)   # each document's share in the meter:
                          "121,400 / 262,144 tokens · report.pdf 98,210 · notes.docx left out"

Rules: the system prompt and the newest user turn are always kept; the oldest whole turns
(a user message and the answers after it) go first; nothing is cut inside a message. If the
newest user message alone does not fit, ``PromptTooLong`` carries the numbers (``tokens``,
``system``, ``budget`` and ``limit``, the most the message may have) and the UI may offer
:func:`trim_middle` — never a silent cut. The input list is never changed.

What is sent differs from what is shown in two ways: reasoning (``<think>…</think>``) is
removed from assistant messages, and special-token strings are neutralised (see
``template.neutralize_special_tokens``: the role-forgery guard).

Speed: per-message costs are cached by (role, hash of content, length) per counter, so a new
turn tokenises only its new text. The cache holds costs only, never text: what is sent is always
prepared again from the caller's own message (cheap: ~0.4 ms for 1.5 MB), so even a hash
collision can only skew a count, never put one conversation's text into another's prompt or
let a special token through unneutralised. On a cold cache the newest messages are counted first, in
batches sized from the chars-per-token seen so far, until the budget is full: older messages
are never tokenised. Totals are ``overhead(system) + Σ segment costs``, which equals a full
render for additive templates (checked on probe conversations when the counter loads, and
once per counter against a full render of a real prompt); other templates are fitted with
full renders.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import text as catalog
from ..errors import ConfigError, MessageTooLong, PromptTooLong, SystemPromptTooLong
from ..text import quoted
from .counters import TokenCounter
from .documents import Document, frame, framed_message
from .template import (
    Message,
    TemplateNotAdditive,
    neutralize_special_tokens,
    strip_reasoning,
)

logger = logging.getLogger(__name__)

#: Trimmed messages get this in place of their middle (``{omitted}`` is a token count).
TRIM_MARKER = "[… {omitted:,} tokens omitted …]"
#: The once-per-counter check re-renders the whole prompt; do it on a first fit no bigger than this
#: (a new chat), so a resumed 256K-token chat does not pay for it.
_CHECK_MAX_TOKENS = 32_768
_FIRST_CHARS_PER_TOKEN = 1.2  # below any language's real ratio: the first batch never overshoots much


def token_budget(max_model_len: int, reply_reserve: int) -> int:
    """Prompt tokens available: ``max_model_len − reply_reserve``; ConfigError naming both if none."""
    if reply_reserve <= 0:
        raise ConfigError("budget.reply_reserve", reply_reserve, "a positive number of tokens")
    if max_model_len <= reply_reserve:
        raise ConfigError(
            "budget.reply_reserve",
            reply_reserve,
            f"fewer tokens than max_model_len ({max_model_len}, from the server's /v1/models or "
            "[model].max_model_len) so the prompt has room; lower [budget].reply_reserve or raise --max-model-len",
        )
    return max_model_len - reply_reserve


@dataclass(frozen=True)
class DroppedTurn:
    """One earlier turn left out of the prompt."""

    index: int  # position of the turn's first message in the input list
    indices: tuple[int, ...]  # every message of the turn
    preview: str  # the start of its user message, on one line
    tokens: int | None  # what it would have cost, when it was counted


@dataclass(frozen=True)
class FitResult:
    """What to send, and the numbers for the context meter."""

    messages: list[dict[str, str]]
    prompt_tokens: int
    budget: int
    max_model_len: int
    reply_reserve: int
    dropped: tuple[DroppedTurn, ...] = ()
    kept_turns: int = 0
    exact: bool = True
    source: str = ""
    system_tokens: int = 0  # template overhead incl. the system prompt and the generation prompt
    documents: tuple[tuple[str, int], ...] = ()  # (name, tokens of its frame) of each document sent
    documents_left_out: tuple[str, ...] = ()  # the names of documents in the earlier turns left out

    @property
    def left_out(self) -> int:
        return len(self.dropped)

    def meter_text(self, lang: str | None = "en") -> str:
        meter = catalog.t(
            "meter.context", lang, approx="" if self.exact else "≈", used=self.prompt_tokens, budget=self.budget
        )
        for name, tokens in self.documents:
            meter += " · " + catalog.t("meter.document", lang, name=name, tokens=tokens)
        n = self.left_out
        if n:
            meter += " · " + catalog.t("meter.left_out.one" if n == 1 else "meter.left_out.many", lang, n=n)
        for name in self.documents_left_out:
            meter += " · " + catalog.t("meter.document_left_out", lang, name=name)
        return meter


async def with_documents(fit: FitResult, per_message: Sequence[Sequence[Document]], counter: TokenCounter) -> FitResult:
    """``fit`` with each document's share: the tokens of its frame as sent (special tokens neutralised, like every
    message), counted by the same counter and cached like a message. ``per_message``: the documents of each
    message given to ``fit_history``, in its order (``Conversation.documents``). The frames and the question are
    joined by blank lines: the message's own cost may differ from the sum of its parts by a token per joint."""
    if not any(per_message):
        return fit
    dropped = {i for d in fit.dropped for i in d.indices}
    shares, left_out = [], []
    for index, docs in enumerate(per_message):
        for doc in (d for d in docs if d.kind != "image"):  # an image is an image part, not framed text
            if index in dropped:
                left_out.append(doc.name)
                continue
            shares.append((doc.name, await frame_tokens(doc, counter)))
    return replace(fit, documents=tuple(shares), documents_left_out=tuple(left_out))


async def frame_tokens(doc: Document, counter: TokenCounter) -> int:
    """The tokens of ``doc``'s frame as sent (special tokens neutralised), cached like a message; 0 for an image
    (an image part: the meter counts text)."""
    if doc.kind == "image":
        return 0
    cache = _cache_for(counter)
    text = neutralize_special_tokens(frame(doc), counter.specials)
    key = ("document", hash(text), len(text))
    tokens = cache.get(key)
    if tokens is None:
        tokens = await counter.count_text(text)
        cache.put(key, tokens)
    return tokens


# ---------------------------------------------------------------- preparing messages


def _text(content: Any) -> str:
    """Message content as text; OpenAI content parts are joined (text parts only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def prepare_content(role: str, content: str, specials: Sequence[str]) -> str:
    """The text actually sent for one message: reasoning removed (assistant), specials neutralised."""
    if role == "assistant":
        content = strip_reasoning(content)
    return neutralize_special_tokens(content, specials)


@dataclass(eq=False)
class _Item:
    index: int
    role: str
    raw: str
    key: Hashable
    content: str | None = None  # prepared text (from raw, never from the cache), once known
    cost: int | None = None

    def prepare(self, specials: Sequence[str]) -> str:
        """Set and return the text to send, always made from this message's own text."""
        if self.content is None:
            self.content = prepare_content(self.role, self.raw, specials)
        return self.content


class _CostCache:
    """(role, hash(content), len) → token cost of the prepared message; two generations.

    Python's str hash is computed once per string object and kept, so history strings that
    come back turn after turn are looked up in O(1). No text is retained, and none is ever
    taken from here: a hit gives a cost, and the text to send is prepared from the message itself.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self.new: dict[Hashable, int] = {}
        self.old: dict[Hashable, int] = {}

    def get(self, key: Hashable) -> int | None:
        hit = self.new.get(key)
        if hit is None:
            hit = self.old.get(key)
            if hit is not None:
                self.put(key, hit)
        return hit

    def put(self, key: Hashable, value: int) -> None:
        self.new[key] = value
        if len(self.new) > self.max_entries:
            self.old, self.new = self.new, {}


_CACHES: weakref.WeakKeyDictionary[Any, _CostCache] = weakref.WeakKeyDictionary()
_VERIFIED: weakref.WeakSet[Any] = weakref.WeakSet()


def _cache_for(counter: TokenCounter) -> _CostCache:
    cache = _CACHES.get(counter)
    if cache is None:
        cache = _CACHES[counter] = _CostCache()
    return cache


def clear_cache(counter: TokenCounter) -> None:
    """Forget the cached per-message costs (and the first-fit check) for ``counter``."""
    _CACHES.pop(counter, None)
    _VERIFIED.discard(counter)


def _preview(text: str, limit: int = 80) -> str:
    one_line = " ".join(text[: limit * 4].split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


# ---------------------------------------------------------------- fitting


async def fit_history(
    messages: Sequence[Message],
    counter: TokenCounter,
    *,
    max_model_len: int,
    reply_reserve: int,
    verify: bool | None = None,
) -> FitResult:
    """Choose what to send so the prompt fits ``max_model_len − reply_reserve`` tokens.

    ``messages``: OpenAI format, oldest first, an optional system message first, ending with
    the newest user turn. ``verify``: compare the total with one full render (None: once per
    counter, on its first fit of at most 32K tokens). Raises PromptTooLong, SystemPromptTooLong, ConfigError,
    ValueError (no user message).
    """
    budget = token_budget(max_model_len, reply_reserve)
    system, turns = _split_turns(messages, counter.specials)
    items = [it for turn in turns for it in turn]
    # Segment sums are only proven for user/assistant messages ending with a user message (Qwen3's
    # template, e.g., renders an assistant message after the last user turn with a <think> block).
    use_segments = (
        counter.additive and items[-1].role == "user" and all(it.role in ("user", "assistant") for it in items)
    )
    if use_segments:
        try:
            fit = await _fit_by_segments(system, turns, counter, budget)
        except TemplateNotAdditive:
            use_segments = False
    if use_segments and (verify or (verify is None and counter not in _VERIFIED and fit[1] <= _CHECK_MAX_TOKENS)):
        full = await counter.count_messages(_window(system, turns, len(turns) - fit[0]))
        if _sums_agree(fit[1], full, counter, pieces=1 + sum(len(turn) for turn in turns[len(turns) - fit[0] :])):
            _VERIFIED.add(counter)
        else:
            logger.warning(
                "segment total %d != full render %d (%s); fitting with full renders from now on",
                fit[1],
                full,
                counter.source,
            )
            try:
                counter.additive = False
            except AttributeError:  # a read-only wrapper: it is checked again next time instead
                pass
            use_segments = False
    if not use_segments:
        fit = await _fit_by_renders(system, turns, counter, budget)
    kept, total, overhead = fit
    first_kept = len(turns) - kept
    dropped = []
    for turn in turns[:first_kept]:
        user = next((it for it in turn if it.role == "user"), turn[0])
        costs = [it.cost for it in turn]
        dropped.append(
            DroppedTurn(
                index=turn[0].index,
                indices=tuple(it.index for it in turn),
                preview=_preview(user.raw),
                tokens=sum(c for c in costs if c is not None) if all(c is not None for c in costs) else None,
            )
        )
    return FitResult(
        messages=_window(system, turns, first_kept),
        prompt_tokens=total,
        budget=budget,
        max_model_len=max_model_len,
        reply_reserve=reply_reserve,
        dropped=tuple(dropped),
        kept_turns=kept,
        exact=counter.exact,
        source=counter.source,
        system_tokens=overhead,
    )


def _sums_agree(segments: int, full: int, counter: TokenCounter, *, pieces: int) -> bool:
    """Whether a segment total proves the counter additive, against one full render of the same prompt.

    An exact counter must agree to the token. An estimate rounds each piece up (its margin is a
    ceiling per piece), so its sum may exceed the full render by up to one token per piece, never
    fall below it: an under-count is the only error that could overflow the context.
    """
    if counter.exact:
        return segments == full
    return full <= segments <= full + pieces


def _split_turns(messages: Sequence[Message], specials: Sequence[str]) -> tuple[str | None, list[list[_Item]]]:
    """(system prompt as sent or None if empty, turns): a turn starts at each user message."""
    msgs = list(messages)
    system: str | None = None
    start = 0
    if msgs and msgs[0].get("role") == "system":
        raw_system = _text(msgs[0].get("content"))
        system = neutralize_special_tokens(raw_system, specials) if raw_system.strip() else None
        start = 1
    turns: list[list[_Item]] = []
    for i in range(start, len(msgs)):
        role, raw = str(msgs[i].get("role")), _text(msgs[i].get("content"))
        if role == "user" or not turns:
            turns.append([])
        turns[-1].append(_Item(i, role, raw, (role, hash(raw), len(raw))))
    if not turns or not any(it.role == "user" for it in turns[-1]):
        raise ValueError("fit_history needs at least one user message (the newest turn)")
    return system, turns


def _window(system: str | None, turns: list[list[_Item]], first: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": system}] if system is not None else []
    for turn in turns[first:]:
        # every kept message was prepared while it was counted; raw text is never sent
        out.extend({"role": it.role, "content": it.content or ""} for it in turn)
    return out


#: Below this many tokens of room for the newest message, the system prompt is the problem.
MIN_MESSAGE_ROOM = 64


def _too_long(tokens: int, other: int, budget: int) -> PromptTooLong | SystemPromptTooLong:
    if budget - other < MIN_MESSAGE_ROOM:
        return SystemPromptTooLong(system=other, budget=budget)
    # limit: the most tokens the newest message may have; what trim_middle should aim for.
    return PromptTooLong(tokens=tokens, system=other, budget=budget, limit=max(0, budget - other))


async def _fit_by_segments(
    system: str | None, turns: list[list[_Item]], counter: TokenCounter, budget: int
) -> tuple[int, int, int]:
    """(turns kept, prompt tokens, overhead) from cached per-message costs, newest first."""
    cache = _cache_for(counter)
    specials = counter.specials
    overhead = await counter.overhead(system)
    order = [it for turn in reversed(turns) for it in reversed(turn)]
    seen = {"chars": 0, "tokens": 0}

    async def fill(p: int, remaining: int) -> None:
        """Count a batch of uncached messages from order[p], sized to cover ``remaining`` tokens."""
        ratio = seen["chars"] / seen["tokens"] if seen["tokens"] else _FIRST_CHARS_PER_TOKEN
        batch: list[_Item] = []
        chars, cached = 0, 0
        while p < len(order) and (not batch or chars / ratio + cached < remaining * 1.05):
            it = order[p]
            p += 1
            if it.cost is not None:
                cached += it.cost
                continue
            hit = cache.get(it.key)
            if hit is not None:
                it.cost = hit
                it.prepare(specials)
                cached += it.cost
                continue
            batch.append(it)
            chars += len(it.prepare(specials))
        if not batch:
            return
        costs = await counter.count_segments([{"role": it.role, "content": it.content} for it in batch])
        for it, cost in zip(batch, costs, strict=False):
            it.cost = cost
            cache.put(it.key, cost)
        seen["chars"] += chars
        seen["tokens"] += sum(costs)

    total, kept, p = overhead, 0, 0
    for t in range(len(turns) - 1, -1, -1):
        turn_cost = 0
        for it in reversed(turns[t]):
            if it.cost is None:
                hit = cache.get(it.key)
                if hit is not None:
                    it.cost = hit
                    it.prepare(specials)
                else:
                    await fill(p, budget - total - turn_cost)
            turn_cost += it.cost  # type: ignore[operator]
            p += 1
        if total + turn_cost > budget:
            if kept == 0:
                raise await _newest_too_long(turns[-1], counter, overhead, turn_cost, budget)
            break
        total += turn_cost
        kept += 1
    return kept, total, overhead


async def _newest_too_long(
    turn: list[_Item], counter: TokenCounter, overhead: int, turn_cost: int, budget: int
) -> PromptTooLong | SystemPromptTooLong:
    user = next(it for it in reversed(turn) if it.role == "user")
    wrapper = (await counter.count_segments([{"role": "user", "content": ""}]))[0]
    tokens = max(0, user.cost - wrapper)  # type: ignore[operator]
    return _too_long(tokens, overhead + turn_cost - tokens, budget)


async def _fit_by_renders(
    system: str | None, turns: list[list[_Item]], counter: TokenCounter, budget: int
) -> tuple[int, int, int]:
    """Fallback for templates that do not decompose: full renders, searched from an estimate."""
    specials = counter.specials
    for turn in turns:
        for it in turn:
            it.prepare(specials)
    n = len(turns)
    counts: dict[int, int] = {}

    async def count(first: int) -> int:
        if first not in counts:
            counts[first] = await counter.count_messages(_window(system, turns, first))
        return counts[first]

    newest = await count(n - 1)
    if newest > budget:
        user = next(it for it in reversed(turns[-1]) if it.role == "user")
        tokens = await counter.count_text(user.content or "")
        raise _too_long(tokens, max(0, newest - tokens), budget)
    overhead = (await counter.count_messages([{"role": "system", "content": system}])) if system is not None else 0
    # Estimate from the newest turn's chars per token, then search with exact counts.
    chars = sum(len(it.content or "") for it in turns[-1]) + 1
    per_char = newest / chars
    est: float = newest
    guess = n - 1
    while guess > 0:
        c = sum(len(it.content or "") for it in turns[guess - 1]) * per_char
        if est + c > budget:
            break
        est += c
        guess -= 1

    async def fits(first: int) -> bool:
        return await count(first) <= budget

    if await fits(guess):
        hi, step, lo = guess, 1, guess - 1
        while lo >= 0 and await fits(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, -1)
    else:
        lo, step, hi = guess, 1, min(guess + 1, n - 1)
        while hi < n - 1 and not await fits(hi):
            lo, step = hi, step * 2
            hi = min(lo + step, n - 1)
    while hi - lo > 1:
        mid = (hi + lo) // 2
        if await fits(mid):
            hi = mid
        else:
            lo = mid
    return n - hi, await count(hi), overhead


# ---------------------------------------------------------------- trimming


async def trim_middle(text: str, max_tokens: int, counter: TokenCounter, *, marker: str = TRIM_MARKER) -> str:
    """``text`` cut to at most ``max_tokens`` (as sent): head and tail kept, the middle replaced by ``marker``.

    Only for the UI to *offer* (PromptTooLong.limit is the number to pass); text that already
    fits comes back unchanged. Cuts prefer line ends near the cut points.
    """
    specials = counter.specials

    async def size(s: str) -> int:
        return await counter.count_text(neutralize_special_tokens(s, specials))

    total = await size(text)
    if total <= max_tokens:
        return text
    joint = "\n\n" + marker.format(omitted=total) + "\n\n"
    reserve = await size(joint) + 4  # the junctions may merge a token or two
    if max_tokens <= reserve + 2:
        raise ValueError(f"max_tokens={max_tokens} leaves no room for text around the marker ({reserve} tokens)")
    keep = max_tokens - reserve
    per_token = len(text) / total
    for _ in range(6):
        head_n, tail_n = (keep + 1) // 2, keep // 2
        head, h = await _fit_piece(text, head_n, per_token, size, from_start=True)
        tail, t = await _fit_piece(text, tail_n, per_token, size, from_start=False)
        result = head + "\n\n" + marker.format(omitted=max(0, total - h - t)) + "\n\n" + tail
        over = await size(result) - max_tokens
        if over <= 0:
            return result
        keep -= over + 2
        if keep <= 0:
            break
    raise ValueError(f"could not trim to {max_tokens} tokens")


async def _fit_piece(
    text: str, target: int, per_token: float, size: Callable[[str], Awaitable[int]], *, from_start: bool
) -> tuple[str, int]:
    """The longest head (or tail) of ``text`` with at most ``target`` tokens, found in a few counts."""
    if target <= 0:
        return "", 0
    best, best_n = "", 0
    n_chars = min(len(text), max(1, int(target * per_token)))
    for _ in range(8):
        piece = text[:n_chars] if from_start else text[len(text) - n_chars :]
        n = await size(piece)
        if n <= target:
            if len(piece) > len(best):
                best, best_n = piece, n
            if n >= target * 0.98 or n_chars >= len(text):
                break
            n_chars = min(len(text), int(n_chars * target / max(n, 1)) + 1)
        else:
            n_chars = max(1, int(n_chars * target / n * 0.98))
    # Prefer a line end close to the cut (within 2 % of the piece).
    unsnapped, window = len(best), max(1, len(best) // 50)
    if from_start:
        cut = best.rfind("\n", len(best) - window)
        if cut > 0:
            best = best[: cut + 1]
    else:
        cut = best.find("\n", 0, window)
        if 0 <= cut < len(best) - 1:
            best = best[cut + 1 :]
    if len(best) != unsnapped:
        best_n = await size(best)
    return best, best_n


# ---------------------------------------------------------------- a document that does not fit


async def fitting_part(
    question: str, documents: Sequence[Document], limit: int, counter: TokenCounter
) -> tuple[int, int]:
    """(which document, how many of its pages or lines) to keep so the message fits ``limit`` tokens as sent: the
    largest document is cut, at a page (or line) end, the others and the question whole. Never applied here:
    the UI offers it, naming the cut (``Document.first``). (i, 0): not even its first page fits."""
    specials = counter.specials

    async def size(docs: Sequence[Document]) -> int:
        return await counter.count_text(neutralize_special_tokens(framed_message(question, list(docs)), specials))

    biggest = max(range(len(documents)), key=lambda i: len(documents[i].text))
    doc = documents[biggest]

    async def fits(n: int) -> bool:
        trial = list(documents)
        trial[biggest] = doc.first(n)
        return await size(trial) <= limit

    lo, hi = 0, doc.units  # fits(lo) is assumed, fits(hi) is known false (the message did not fit)
    if not await fits(1):
        return biggest, 0
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await fits(mid):
            lo = mid
        else:
            hi = mid
    return biggest, lo


async def check_message_length(text: str, limit: int, counter: Callable[[], Awaitable[TokenCounter]]) -> None:
    """MessageTooLong (with the count and the text quoted back) for a message above ``limit`` tokens ([ui]
    max_message_tokens; 0: none). A text of no more UTF-8 bytes than the limit is not counted: a byte-level
    tokenizer makes at most one token per byte."""
    if not limit or len(text) <= limit // 4 or len(text.encode("utf-8", "surrogatepass")) <= limit:
        return
    tokens = await (await counter()).count_text(text)
    if tokens > limit:
        logger.info("a message of %d tokens refused: [ui] max_message_tokens is %d", tokens, limit)
        raise MessageTooLong(tokens, limit, quoted(text))

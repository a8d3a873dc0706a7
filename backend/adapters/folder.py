"""The adapters folder: the allow-list of what may be loaded at runtime, and what is in it.

    path = resolve_adapter(settings.lora.resolved_dir, "pirate")   # or AdapterPathRefused
    infos = discover_adapters(settings.lora.resolved_dir)
    prepare_runtime_load(folder, name, base_dir, max_rank)          # allow-list + doctor

Only folders directly inside the adapters folder can be named: no separators, no hidden names,
no symlinked folders. A runtime load also takes only regular files in that folder: no symlinks,
no pickled weights (``.bin``/``.pt``…, which can run code when loaded): ``.safetensors`` only.
Errors name the folder as ``[lora].dir``, never by its server path (they reach the browser);
``hide_paths`` removes any that come from elsewhere (the doctor, the engine's own messages).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    AdapterError,
    AdapterFileRefused,
    AdapterPathRefused,
    AdapterRejected,
    QwenChatError,
)
from ..text import Text
from .doctor import CONFIG_FILE, Diagnosis, diagnose_adapter, read_json

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterInfo:
    """An adapter folder found in the adapters folder; ``problem`` is set when it could not be read."""

    name: str
    path: Path
    rank: int | None = None
    base_model_name_or_path: str | None = None
    problem: str = ""

    @property
    def label(self) -> str:
        """Dropdown label: ``pirate (r=8)``."""
        return f"{self.name} (r={self.rank})" if self.rank is not None else self.name


# ---------------------------------------------------------------- adapters folder (allow-list)


LORA_DIR_LABEL = "[lora].dir"  # how messages name the adapters folder: never its server path
#: Suffixes of pickled PyTorch files (vLLM would torch.load adapter_model.bin / .pt).
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})


def _shown_name(name: str) -> str:
    """The name as typed, except an absolute path, shown by its last part: messages carry no server paths."""
    if os.path.isabs(name) or name.startswith("~"):
        return "…/" + (Path(name).name or "")
    return name


def resolve_adapter(folder: str | Path, name: str, *, shown: str = LORA_DIR_LABEL) -> Path:
    """The folder of adapter ``name`` directly inside ``folder``; nothing else can be named.

    AdapterPathRefused for "", ".", "..", hidden names, separators, absolute paths, NUL, and symlinks
    resolving outside ``folder``; AdapterFileRefused for a symlinked folder inside it; AdapterRejected
    when there is no such adapter folder. ``shown`` names the folder in the messages.
    """
    folder = Path(folder)
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or name.startswith(".")
        or any(c in name for c in ("/", "\\", "\x00", ":"))
        or name != name.strip()
        or os.path.isabs(name)
    ):
        raise AdapterPathRefused(name=_shown_name(name) if isinstance(name, str) else repr(name), folder=shown)
    root = folder.resolve()
    candidate = root / name
    try:
        target = candidate.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        target = None
    if target is not None and (target == root or not target.is_relative_to(root)):
        raise AdapterPathRefused(name=name, folder=shown)
    if target is not None and candidate.is_symlink():
        raise AdapterFileRefused(name, ".", "symlink_folder")
    if target is None or not target.is_dir():
        try:  # plain listing: discover_adapters() calls us, so no recursion through it
            known = (
                ", ".join(
                    sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and (p / CONFIG_FILE).is_file())
                )
                or "none"
            )
        except OSError:
            known = "none (the folder does not exist)"
        raise AdapterRejected(name, f"there is no adapter folder named {name!r} in {shown} (found: {known})")
    return target


def discover_adapters(folder: str | Path) -> list[AdapterInfo]:
    """Adapter folders (with adapter_config.json) directly inside ``folder``, sorted by name.

    Unreadable ones are returned with ``problem`` set, never raised; symlinks leading outside are skipped.
    """
    root = Path(folder)
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    out: list[AdapterInfo] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            path = resolve_adapter(root, entry.name)
        except AdapterError:
            continue
        cfg_path = path / CONFIG_FILE
        if not cfg_path.is_file():
            continue
        try:
            cfg = read_json(cfg_path)
            if not isinstance(cfg, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            out.append(AdapterInfo(entry.name, path, problem=f"{CONFIG_FILE} is unreadable ({exc})"))
            continue
        r = cfg.get("r")
        base_name = cfg.get("base_model_name_or_path")
        out.append(
            AdapterInfo(
                entry.name,
                path,
                rank=r if isinstance(r, int) and not isinstance(r, bool) else None,
                base_model_name_or_path=base_name if isinstance(base_name, str) else None,
                problem="" if isinstance(r, int) else f"{CONFIG_FILE} has no valid rank r ({r!r})",
            )
        )
    return out


def read_rank(adapter_dir: str | Path) -> int | None:
    """The adapter's rank ``r`` from adapter_config.json, or None (for dropdown labels)."""
    try:
        r = read_json(Path(adapter_dir) / CONFIG_FILE).get("r")
    except (OSError, ValueError, AttributeError):
        return None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def check_runtime_files(path: str | Path, name: str) -> None:
    """Every entry of an adapter folder (and its subfolders) is a real folder or a regular, non-pickle file.

    AdapterFileRefused naming the first offender by its path inside the folder. The check is lexical
    (``lstat``): a symlink is refused wherever it points.
    """
    root = Path(path)
    if root.is_symlink():
        raise AdapterFileRefused(name, ".", "symlink_folder")
    pending = [root]
    while pending:
        current = pending.pop()
        with os.scandir(current) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    raise AdapterFileRefused(name, rel, "symlink")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    raise AdapterFileRefused(name, rel, "not_regular")
                elif Path(entry.name).suffix.lower() in PICKLE_SUFFIXES:
                    raise AdapterFileRefused(name, rel, "pickle")


def prepare_runtime_load(
    folder: str | Path, name: str, base_dir: str | Path | None, max_rank: int, *, base_aliases: Iterable[str] = ()
) -> Diagnosis:
    """Allow-list + file rules + doctor before a runtime load.

    AdapterPathRefused / AdapterFileRefused / AdapterRejected (the doctor's errors).
    """
    path = resolve_adapter(folder, name)
    check_runtime_files(path, name)
    diagnosis = diagnose_adapter(path, base_dir, max_rank, name=name, base_aliases=base_aliases)
    if not diagnosis.ok:
        raise AdapterRejected(name, diagnosis.errors_text())
    return diagnosis


# ---------------------------------------------------------------- no server paths in messages


def hide_paths(text: str, places: Mapping[str, str]) -> str:
    """``text`` with each server path in ``places`` (path -> label, e.g. "[lora].dir") replaced by its label.

    The longest path first, and only whole path parts: "/a/lora" does not touch "/a/lora-2".
    """
    for path in sorted(places, key=len, reverse=True):
        if path and path != "/":
            label = places[path].replace("\\", "\\\\")  # a replacement string: backslashes escaped
            text = re.sub(re.escape(path) + r"(?![^/\s'\"`),;:.\]])", label, text)
    return text


def hide_error_paths(exc: QwenChatError, places: Mapping[str, str]) -> QwenChatError:
    """The same error, its text parameters passed through ``hide_paths`` (it is shown in the browser)."""
    for key, value in list(vars(exc).items()):
        if not key.startswith("_") and isinstance(value, str):
            setattr(exc, key, hide_paths(value, places))
        elif not key.startswith("_") and isinstance(value, Text):  # a text within the text (AdapterFleetPartial)
            setattr(exc, key, value.map_strings(lambda s: hide_paths(s, places)))
    exc.args = (exc.user_text("en"),)
    return exc

"""The adapters folder: the allow-list of what may be loaded at runtime, and what is in it.

    path = resolve_adapter(settings.lora.resolved_dir, "pirate")   # or AdapterPathRefused
    infos = discover_adapters(settings.lora.resolved_dir)
    prepare_runtime_load(folder, name, base_dir, max_rank)          # allow-list + doctor

Only folders directly inside the adapters folder can be named: no separators, no hidden names,
no symlinks that resolve outside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    AdapterError,
    AdapterPathRefused,
    AdapterRejected,
)
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


def resolve_adapter(folder: str | Path, name: str) -> Path:
    """The folder of adapter ``name`` directly inside ``folder``; nothing else can be named.

    AdapterPathRefused for "", ".", "..", hidden names, separators, absolute paths, NUL, and symlinks
    resolving outside ``folder``; AdapterRejected when there is no such adapter folder.
    """
    folder = Path(folder)
    shown = str(folder)
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or name.startswith(".")
        or any(c in name for c in ("/", "\\", "\x00", ":"))
        or name != name.strip()
        or os.path.isabs(name)
    ):
        raise AdapterPathRefused(name=name if isinstance(name, str) else repr(name), folder=shown)
    root = folder.resolve()
    candidate = root / name
    try:
        target = candidate.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        target = None
    if target is not None and (target == root or not target.is_relative_to(root)):
        raise AdapterPathRefused(name=name, folder=shown)
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


def prepare_runtime_load(
    folder: str | Path, name: str, base_dir: str | Path | None, max_rank: int, *, base_aliases: Iterable[str] = ()
) -> Diagnosis:
    """Allow-list + doctor before a runtime load; AdapterPathRefused / AdapterRejected (doctor's errors)."""
    path = resolve_adapter(folder, name)
    diagnosis = diagnose_adapter(path, base_dir, max_rank, name=name, base_aliases=base_aliases)
    if not diagnosis.ok:
        raise AdapterRejected(name, diagnosis.error_text())
    return diagnosis

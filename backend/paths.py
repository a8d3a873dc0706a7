"""Where things are: the repository folder, the cache folder outside git, and a path from config.toml."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository folder (config.toml, profiles/, backend/).
ROOT = Path(__file__).resolve().parent.parent


def home_dir() -> Path:
    """Cache folder for environments, models and adapters (outside git)."""
    return Path(os.environ.get("QWENCHAT_HOME") or Path.home() / ".cache" / "qwenchat")


def resolve_path(value: str) -> Path:
    """A path from config.toml: ``~`` expanded, relative to the repository folder."""
    p = Path(value).expanduser()
    return (p if p.is_absolute() else ROOT / p).resolve()

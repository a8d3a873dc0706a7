"""The UI process's own folder for Chainlit's per-session files (uploads, an ``/export``).

    FILES_DIRECTORY = files.own_directory()   # <tmp>/qwenchat-files-<pid>-<random>, owner-only (0700)

Chainlit deletes its files folder when its process stops; one folder per process means a second UI process on
the same checkout stopping cannot take this one's files with it. A process killed with ``kill -9`` cannot delete
its folder: the next start removes the folders of this user whose process is gone (the pid in the name, checked
with signal 0; a pid in use, by any process, keeps its folder).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "qwenchat-files-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or no such pid number: leave it
        return True
    return True


def remove_stale(parent: Path) -> list[Path]:
    """Delete the files folders in ``parent`` left by processes of this user that are gone; return them."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _NAME.match(path.name)
        if not match or _alive(int(match.group(1))):
            continue
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    if removed:
        logger.info("removed %d files folder(s) left by UI processes that were killed", len(removed))
    return removed


def own_directory(parent: Path | None = None) -> Path:
    """This process's files folder (new, 0700), after removing those of processes that are gone."""
    where = Path(parent or tempfile.gettempdir())
    remove_stale(where)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=where))

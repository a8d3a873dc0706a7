"""Faults the history tests inject: another process holding SQLite's write lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# Another process holding SQLite's write lock (a backup tool, a sqlite3 shell in a transaction) until told to stop.
LOCKER = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN EXCLUSIVE'); "
    "print('locked', flush=True); sys.stdin.read()"
)


class Held:
    """``BEGIN EXCLUSIVE`` on ``path`` in a process of its own, until ``release()``."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        return time.monotonic()

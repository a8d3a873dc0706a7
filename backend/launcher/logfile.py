"""Size-capped logs of the child processes (engine.log, ui.log): the launcher reads each child's output
pipe and writes it here, rotating at ``[logging] max_bytes`` with ``[logging] backups`` older files
(``engine.log.1`` … ``engine.log.N``, like ``logging.handlers.RotatingFileHandler``).

    log = RotatingLog(path, max_bytes, backups); log.write(b"...")
    pump = LogPump(proc.stdout, log)          # a thread: the pipe into the log until EOF
    pump.settle()                             # wait until what the child wrote is in the file
    read_tail(path, n)                        # the last n bytes, across a rotation
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_BACKUPS = 3
CHUNK = 64 * 1024


def rotated(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


class RotatingLog:
    """Append-only bytes to ``path``; a write that would pass ``max_bytes`` first rotates the files.

    Rotation happens at chunk boundaries (what one read of the pipe returned), so the current file can
    pass ``max_bytes`` by at most one chunk; a single huge chunk is written whole.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, max(1, backups)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: IO[bytes] = path.open("ab")

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file.closed:
                return
            if self._file.tell() and self._file.tell() + len(data) > self.max_bytes:
                self._rotate()
            self._file.write(data)
            self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        rotated(self.path, self.backups).unlink(missing_ok=True)
        for n in range(self.backups - 1, 0, -1):
            if rotated(self.path, n).exists():
                rotated(self.path, n).replace(rotated(self.path, n + 1))
        self.path.replace(rotated(self.path, 1))
        self._file = self.path.open("ab")

    def close(self) -> None:
        with self._lock:
            self._file.close()


class LogPump:
    """A daemon thread copying a child's output pipe into a ``RotatingLog`` until EOF, then closing both."""

    def __init__(self, stream: IO[bytes], log: RotatingLog) -> None:
        self.stream, self.log = stream, log
        self.last_data = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"log-pump {log.path.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        fd = self.stream.fileno()
        try:
            while chunk := os.read(fd, CHUNK):
                self.log.write(chunk)
                self.last_data = time.monotonic()
        except OSError:
            pass
        finally:
            self.stream.close()
            self.log.close()

    def settle(self, timeout: float = 3.0, quiet: float = 0.3) -> None:
        """Wait until the pipe is drained: EOF, or nothing new for ``quiet`` seconds (a child of the
        process may keep the pipe open), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.thread.is_alive() and time.monotonic() < deadline:
            if time.monotonic() - self.last_data >= quiet:
                return
            self.thread.join(0.05)


def read_tail(path: Path, max_bytes: int = 200_000) -> str:
    """The last ``max_bytes`` of the log, reaching into ``path.1`` … when the current file is shorter
    (just rotated), so the diagnosis still sees the lines before the rotation."""
    parts: list[bytes] = []
    need = max_bytes
    for n in range(0, 100):
        p = path if n == 0 else rotated(path, n)
        try:
            with p.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - need))
                data = f.read()
        except OSError:
            break
        parts.append(data)
        need -= len(data)
        if need <= 0:
            break
    return b"".join(reversed(parts)).decode("utf-8", "replace")

"""Reading the files attached to a message, never on the UI's event loop: limits first, then each file converted in a
conversion process of its own, with progress and Stop.

    reader = Reader(settings.uploads)
    reader.check(uploads)                                   # TooManyDocuments / DocumentTooLarge before any work
    docs = await reader.read_all(uploads, model="qwen3", progress=show)   # show(name, page, pages): a live step

Why a child process per file and not ``concurrent.futures.ProcessPoolExecutor``: Stop ends the conversion at once
(the process group is terminated), where an executor's running task would go on to its end; the child reports
progress as it goes (``page n of N``) without shared queues; and its imports (pypdfium2, mammoth) stay out of the
UI process. At most ``[uploads] workers`` convert at once (a semaphore: the pool), each at a lower CPU priority
(nice 10) so that the chats streaming meanwhile keep their share of the cores. A process costs ≈0.1 s to start
(docs/DOCUMENTS.md).

The child is ``python -m backend.chat.convert_child PATH NAME MAX_BYTES MAX_UNZIPPED`` (convert_child.py: it imports
the converters and nothing of the UI, to start fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..settings import ROOT, UploadsSettings
from . import document_errors
from .document_errors import DocumentError, DocumentTooLarge, DocumentUnreadable, ImageNotSupported, TooManyDocuments
from .documents import IMAGE_SUFFIXES, Document, Limits

logger = logging.getLogger(__name__)

#: (file name, pages read, pages) while a PDF is read; awaited between progress lines.
Progress = Callable[[str, int, int], Awaitable[None]]
_MB = 1024 * 1024
STOP_GRACE = 2.0  # s between SIGTERM and SIGKILL when a conversion is stopped


@dataclass(frozen=True)
class Upload:
    """A file the browser sent with a message: the name the user gave it and where Chainlit stored it."""

    name: str
    path: Path


class Reader:
    """Converts uploads with at most ``[uploads] workers`` conversion processes at once (one per UI process)."""

    def __init__(self, settings: UploadsSettings, python: str = "") -> None:
        self.settings = settings
        self.python = python or sys.executable
        self.limits = Limits(int(settings.max_mb * _MB), int(settings.max_unzipped_mb * _MB))
        self._slots = asyncio.Semaphore(settings.workers)

    def check(self, uploads: Sequence[Upload]) -> None:
        """The message's files within [uploads] max_files and each within max_mb; raises before any is read."""
        if len(uploads) > self.settings.max_files:
            raise TooManyDocuments(len(uploads), self.settings.max_files)
        for up in uploads:
            size = up.path.stat().st_size
            if size > self.limits.max_bytes:
                raise DocumentTooLarge(up.name, size / _MB, self.settings.max_mb)

    async def read_all(
        self, uploads: Sequence[Upload], *, model: str, progress: Progress, images: bool = False
    ) -> list[Document]:
        """Every upload as a Document, in order; the first failure raises (nothing is half sent). ``model``: the
        model the message goes to, named when an image is refused; ``images``: whether it reads images
        (``Service.takes_images``), else an image is refused before any file is read."""
        self.check(uploads)
        if not images:  # refused before any conversion: nothing to wait for
            for up in uploads:
                if Path(up.name).suffix.lower() in IMAGE_SUFFIXES:
                    raise ImageNotSupported(up.name, model)
        docs = []
        for up in uploads:
            doc = await self.read(up, progress)
            if doc.kind == "image" and not images:
                raise ImageNotSupported(up.name, model)
            docs.append(doc)
        return docs

    async def read(self, upload: Upload, progress: Progress) -> Document:
        """One upload converted in a child process (waiting for a free slot first)."""
        async with self._slots:
            t0 = time.monotonic()
            doc = await self._convert(upload, progress)
            logger.info(
                "document %s: %s, %d pages, %d characters in %.2f s",
                upload.name,
                doc.kind,
                doc.pages,
                len(doc.text),
                time.monotonic() - t0,
            )
            return doc

    async def _convert(self, upload: Upload, progress: Progress) -> Document:
        argv = [self.python, "-m", "backend.chat.convert_child", str(upload.path), upload.name]
        argv += [str(self.limits.max_bytes), str(self.limits.max_unzipped_bytes)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(ROOT),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own group: Stop ends it whole
            limit=1 << 30,  # the document comes as one line
        )
        try:
            assert proc.stdout is not None and proc.stderr is not None
            result: dict[str, Any] | None = None
            async for raw in proc.stdout:
                line = json.loads(raw)
                if "progress" in line:
                    await progress(upload.name, *line["progress"])
                else:
                    result = line
            err = (await proc.stderr.read()).decode("utf-8", "replace")
            rc = await proc.wait()
        except BaseException:  # Stop (cancelled) or our own failure: the conversion ends now
            await _stop(proc)
            raise
        return _result(upload.name, result, rc, err)


def _result(name: str, result: dict[str, Any] | None, rc: int, err: str) -> Document:
    """The child's last line as a Document, or the error it named, raised here."""
    if result is not None and "document" in result:
        return Document.from_dict(result["document"])
    if result is not None and "error" in result:
        cls = getattr(document_errors, str(result["error"].get("class")), None)
        if isinstance(cls, type) and issubclass(cls, DocumentError):
            raise document_errors.rebuilt_error(cls, dict(result["error"].get("params") or {}))
    last = next((line for line in reversed(err.splitlines()) if line.strip()), f"exit code {rc}")
    logger.warning("conversion of %s failed (exit code %s): %s", name, rc, err[-2000:])
    raise DocumentUnreadable(name, "?", last[-200:])


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """terminate → grace → kill, the child's whole group."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(proc.wait(), wait)
            return

"""The conversion process (started by ``reading.Reader``): one file, converted; JSON lines on stdout.

    python -m backend.chat.convert_child PATH NAME MAX_BYTES MAX_UNZIPPED

Lines: ``{"progress": [page, pages]}`` while a PDF is read (at most every PROGRESS_EVERY s), then the result:
``{"document": {...}}`` (``Document.to_dict``) or ``{"error": {"class": "DocumentEncrypted", "params": {...}}}``
for a DocumentError. Anything else (a crash) is the exit code and stderr. It runs at nice 10: the UI's chats first.
Imports the converters only (no settings, no asyncio): it starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .document_errors import DocumentError
from .documents import Document, Limits, convert_file, pdf_document, pdf_page_count, pdf_pages, sniff

PROGRESS_EVERY = 0.25  # s between progress lines
PAGES_AT_ONCE = 10  # pages read between two looks at the clock


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def convert_with_progress(path: Path, name: str, limits: Limits) -> Document:
    """``convert_file``, but a PDF page by page with a progress line at most every PROGRESS_EVERY s."""
    if sniff(path, name, limits) != "pdf":
        return convert_file(path, name, limits)
    count = pdf_page_count(path, name)
    pages: list[str] = []
    said = time.monotonic()
    for start in range(0, count, PAGES_AT_ONCE):
        pages += pdf_pages(path, name, start, min(count, start + PAGES_AT_ONCE))
        if time.monotonic() - said >= PROGRESS_EVERY:
            _emit({"progress": [len(pages), count]})
            said = time.monotonic()
    return pdf_document(name, pages, count)


def child_main(argv: list[str]) -> int:
    """The conversion process: one file, its result as the last JSON line."""
    with contextlib.suppress(OSError):
        os.nice(10)  # the UI's chats first
    path, name, max_bytes, max_unzipped = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    try:
        doc = convert_with_progress(path, name, Limits(max_bytes, max_unzipped))
    except DocumentError as exc:
        _emit({"error": {"class": type(exc).__name__, "params": exc.params}})
        return 0
    _emit({"document": doc.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

"""The original files attached in a chat, kept only when a store is configured ([uploads] keep_originals).

    store = file_store(settings)                      # None: originals are not kept (the default)
    await store.put(thread_id, file_id, path)         # after the file was read; ids are UUIDs
    data = await store.get(thread_id, file_id)        # None when it is not there
    await store.delete_chat(thread_id)                # with the chat (GuardedDataLayer.delete_thread)

Only the converted text goes to the model and into the history (docs/DOCUMENTS.md); the original is for its owner to
download again: ``GET /qwenchat/files/<thread id>/<file id>`` (backend/ui/routes.py) serves it to the chat's owner
and, once the chat is shared, to those logged in with its link, never without a login, always as an attachment.

``FileStore`` is the seam: ``LocalFileStore`` keeps ``<folder>/<thread id>/<file id>`` (``[uploads] originals_dir``,
default ``<QWENCHAT_HOME>/uploads``). An S3-compatible store (AWS S3, MinIO, Ceph, R2) would implement the same three
methods on keys ``<thread id>/<file id>`` (``put_object``, ``get_object``, ``delete_objects`` over a prefix listing),
its bucket and credentials from the environment, never in the browser.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from pathlib import Path
from typing import Protocol

from ..paths import home_dir, resolve_path
from ..settings import Settings

logger = logging.getLogger(__name__)

FILES_ROUTE = "/qwenchat/files"  # + /<thread id>/<file id>: backend/ui/routes.py serves the originals there


class FileStore(Protocol):
    """Where the originals of a chat's files are kept, by (chat, file) id."""

    async def put(self, thread_id: str, file_id: str, source: Path) -> None:
        """Keep a copy of ``source``."""

    async def get(self, thread_id: str, file_id: str) -> bytes | None:
        """The file's bytes, or None when it is not kept."""

    async def delete_chat(self, thread_id: str) -> None:
        """Every file of the chat gone (nothing kept: nothing to do)."""


def _uuid(value: str, what: str) -> str:
    """``value`` as a canonical UUID; ValueError naming ``what`` otherwise (no path is ever made from other text)."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"{what} {str(value)[:80]!r} is not a UUID") from None


class LocalFileStore:
    """``<folder>/<thread id>/<file id>``: the ids are UUIDs (checked), so no name a user chose becomes a path."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _chat(self, thread_id: str) -> Path:
        return self.folder / _uuid(thread_id, "chat id")

    def _path(self, thread_id: str, file_id: str) -> Path:
        return self._chat(thread_id) / _uuid(file_id, "file id")

    async def put(self, thread_id: str, file_id: str, source: Path) -> None:
        target = self._path(thread_id, file_id)

        def copy() -> None:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(source, partial)
            partial.replace(target)  # a reader never sees half a file

        await asyncio.to_thread(copy)

    async def get(self, thread_id: str, file_id: str) -> bytes | None:
        path = self._path(thread_id, file_id)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    async def delete_chat(self, thread_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._chat(thread_id), True)


def file_store(settings: Settings) -> FileStore | None:
    """The store [uploads] configures: None unless keep_originals (with a history: a chat without one is not kept);
    a local folder, originals_dir or ``<QWENCHAT_HOME>/uploads``."""
    uploads = settings.uploads
    if not uploads.keep_originals or not settings.login.enable:
        return None
    return LocalFileStore(resolve_path(uploads.originals_dir) if uploads.originals_dir else home_dir() / "uploads")

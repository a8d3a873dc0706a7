"""An adapter added while the product runs by hub id (``/adapters owner/name[@revision]``, issue #19): downloaded
by the same code as a ``[lora] modules`` hub id, checked by the adapter doctor, then loaded like one from
``[lora].dir``.

    folder = await fetch_adapter(HubModel("acme/pirate-lora", adapter=True), on_progress)
    diagnosis = check_snapshot(folder, "pirate-lora", base_dir, max_rank, base_aliases=("qwen3-4b",))

The download is ``python -m backend download-model --adapter ID`` in a child process (its own process group): the
launcher's downloader (engine/download.py: only the adapter's files, huggingface_hub's cache, ``HF_TOKEN``,
``HF_HOME``, ``HF_ENDPOINT``, resumed after a stop, errors translated in one place), which the UI's code may not
import. Its ``[download]`` lines become ``on_progress(done, total, rate)``; its ``[download-error]`` line one
``AdapterDownloadFailed`` with the downloader's text, re-worded where that text names ``[lora] modules``: here the
id was typed after /adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from .. import hub
from ..errors import AdapterDownloadFailed, AdapterFileRefused, AdapterNameTaken, AdapterRejected
from ..hub import HubModel
from ..settings import ROOT
from ..text import Text
from .doctor import Diagnosis, diagnose_adapter

logger = logging.getLogger(__name__)

#: The downloader's words that name the config ([lora] modules, [model] path) → ours, which name /adapters.
RUNTIME_KEYS = {
    "download.no_adapter_repo": "adapter_hub.no_repo",
    "download.no_repo": "adapter_hub.no_repo",
    "download.no_adapter_revision": "adapter_hub.no_revision",
    "download.no_revision": "adapter_hub.no_revision",
    "download.no_adapter_repo_or_private": "adapter_hub.no_repo_or_private",
    "download.no_repo_or_private": "adapter_hub.no_repo_or_private",
    "download.not_an_adapter": "adapter_hub.not_an_adapter",
    "download.offline": "adapter_hub.offline",
    "download.adapter_offline": "adapter_hub.offline",
}

Progress = Callable[[int, int, int], Awaitable[None]]


def refuse_taken_name(model: HubModel, added: tuple[HubModel, Path] | None, served: set[str] | frozenset[str]) -> None:
    """A hub adapter is served as ``owner/name`` (a folder of [lora].dir cannot have a "/" in its name, so the two
    never meet): AdapterNameTaken when that name is served already from another source (another revision added
    before, a ``[lora] modules`` entry or an engine's adapter of that name). Checked before the download."""
    name = model.repo_id
    if added is not None and added[0] != model:
        raise AdapterNameTaken(name, str(added[0]))
    if added is None and name in served:
        raise AdapterNameTaken(name, "[lora] modules")


def parse_adapter_id(text: str) -> HubModel:
    """``owner/name[@revision]`` typed after /adapters → the adapter repo; anything else: AdapterDownloadFailed."""
    value = text.strip().strip("`").strip()
    model = hub.parse_hub_id(value)
    if model is None:
        raise AdapterDownloadFailed(value, Text("adapter_hub.not_an_id", {"value": value}))
    return model.as_adapter()


async def fetch_adapter(
    model: HubModel, on_progress: Progress | None = None, *, python: str = "", max_bytes: int = 0
) -> Path:
    """The adapter's snapshot folder in huggingface_hub's cache, downloaded first unless it is complete there;
    ``max_bytes``: refused before the first byte past it ([hub] max_download_gb), or when the hub gives no size."""
    done = hub.complete_snapshot(model)
    if done is not None:
        return done
    argv = [python or sys.executable, "-m", "backend", "download-model", "--adapter", str(model)]
    argv += ["--max-bytes", str(max_bytes)] if max_bytes else []
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(ROOT),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own group: a Stop ends it and its download threads together
    )
    tail: list[str] = []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        async for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            got = hub.parse_progress(line)
            if got is None:
                tail = [*tail[-19:], line]
            elif on_progress is not None:
                await on_progress(*got)
        out = (await proc.stdout.read()).decode("utf-8", "replace").strip()
        rc = await proc.wait()
    except BaseException:  # a Stop (cancelled) or our own failure: the download stops; what it fetched stays
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    folder = hub.complete_snapshot(model)
    if rc == 0 and folder is not None:
        logger.info("adapter %s downloaded into %s", model, out or folder)
        return folder
    raise download_failed(model, rc, tail)


def download_failed(model: HubModel, rc: int, tail: list[str]) -> AdapterDownloadFailed:
    """The downloader's own error (its ``[download-error]`` line), in /adapters' words where they differ."""
    told = hub.parse_error(tail)
    if told is not None:
        key, params = told
        return AdapterDownloadFailed(str(model), Text(RUNTIME_KEYS.get(key, key), params))
    logger.warning("download of adapter %s ended with exit code %s: %s", model, rc, " | ".join(tail[-5:]))
    last = next((line for line in reversed(tail) if line.strip()), "")
    return AdapterDownloadFailed(str(model), Text("adapter_hub.failed", {"rc": rc, "detail": last[-200:]}))


def check_snapshot(
    folder: Path, name: str, base_dir: str | Path | None, max_rank: int, *, base_aliases: Iterable[str] = ()
) -> Diagnosis:
    """The adapter doctor on the snapshot folder, as for a folder of [lora].dir; pickled weights refused (a runtime
    load takes .safetensors only). Its files are links into the cache's blobs: huggingface_hub's layout, which
    the allow-list's no-symlink rule for [lora].dir is not about."""
    if not (folder / "adapter_model.safetensors").is_file():
        raise AdapterFileRefused(name, "adapter_model.bin", "pickle")
    diagnosis = diagnose_adapter(folder, base_dir, max_rank, name=name, base_aliases=tuple(base_aliases))
    if not diagnosis.ok:
        raise AdapterRejected(name, diagnosis.errors_text())
    return diagnosis

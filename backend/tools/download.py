"""Download a hub model into huggingface_hub's cache: only the files vLLM needs, resumable, with progress.

    python -m backend download-model            # [model] path's hub id; prints the snapshot folder on stdout

Run by the launcher in the background (engine/prepare_bg.py, its own process group, the app environment) or by
``python -m backend prepare`` in the foreground. Steps:

1. the repo at the revision (``model_info`` with file sizes): its commit and the files vLLM needs
   (``hub.select_files``: config, tokenizer, chat template, ``*.safetensors`` + index; no ``original/``, no
   ``.bin`` beside safetensors);
2. free disk space in the cache against the bytes still missing (``QWENCHAT_HUB_FREE_BYTES`` pretends a free
   space, for tests);
3. each missing file into ``blobs/<etag>`` through ``<etag>.incomplete``, resumed with a Range request from where
   an earlier run stopped: huggingface_hub 2.x downloads into a temporary file unique to each process and deletes
   it on failure (huggingface/huggingface_hub#4228), so a stopped ``snapshot_download`` starts every unfinished
   file over; a file goes into ``blobs/`` only when whole (size checked), under huggingface_hub's own lock;
4. ``snapshot_download`` with exactly those files: it finds the blobs, links the snapshot, writes
   ``refs/<revision>`` and the tree listing that ``hub.complete_snapshot`` checks.

Stderr carries ``[download] {"done", "total", "rate"}`` lines (bytes; bytes/s over the last seconds) twice a
second, and on failure one ``[download-error] {"key", "params"}`` line (a ``download.*`` catalog key in
backend/text.py) plus the English text; the exit code is then 2. Translating huggingface_hub's and httpx's errors
happens in ``translate`` only, most specific first.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend import hub
from backend.hub import ERROR_PREFIX, PROGRESS_PREFIX, HubModel
from backend.hub import parse_error as parse_error  # the launcher's preparation reads both from here
from backend.hub import parse_progress as parse_progress
from backend.text import t

#: Tests: the free space (bytes) the disk check sees instead of the real one.
ENV_FREE_BYTES = "QWENCHAT_HUB_FREE_BYTES"
WORKERS = 4  # files fetched at once (the weights' shards)
#: huggingface_hub's http_get writes in chunks of constants.DOWNLOAD_CHUNK_SIZE (10 MB): nothing reaches the disk
#: before 10 MB of a file have come, so a stop loses up to 10 MB per file and the progress moves in 10 MB steps.
CHUNK = 1 << 20


class DownloadError(Exception):
    """The download cannot go on; ``key`` is a ``download.*`` text with ``params``."""

    def __init__(self, key: str, **params: Any) -> None:
        self.key, self.params = key, params
        super().__init__(t(key, "en", **params))


@dataclass
class Plan:
    """What one run fetches: the repo's commit and the needed files' sizes."""

    model: HubModel
    commit: str
    sizes: dict[str, int]
    storage: Path
    # per file: the blob name the repo info gives (an LFS file's sha256, else its git blob id), which is the ETag
    # huggingface_hub names the blob by; the HEAD in fetch_file has the last word (where)
    etags: dict[str, str] = field(default_factory=dict)
    # per file: where its bytes are on disk now (the partial file, then the blob); read by the progress thread
    where: dict[str, Path] = field(default_factory=dict)
    # the needed files whose size the hub's answer did not give (counted as 0 in ``sizes``)
    unsized: tuple[str, ...] = ()

    def on_disk(self) -> int:
        """Bytes of the needed files on disk: linked, whole blobs, and partial ``.incomplete`` files."""
        done = 0
        snapshot = self.storage / "snapshots" / self.commit
        for name, size in self.sizes.items():
            if (snapshot / name).is_file():
                done += size
                continue
            etag = self.etags.get(name)
            guesses = [self.storage / "blobs" / etag, self.storage / "blobs" / f"{etag}.incomplete"] if etag else []
            for path in [self.where[name]] if name in self.where else guesses:
                try:
                    done += min(size, path.stat().st_size)
                    break
                except OSError:
                    pass
        return done


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


# ---------------------------------------------------------------- errors, in one place


#: An adapter's (``[lora] modules``) own words for what names ``[model] path`` for a model.
_ADAPTER_KEYS = {
    "download.no_repo": "download.no_adapter_repo",
    "download.no_revision": "download.no_adapter_revision",
    "download.no_repo_or_private": "download.no_adapter_repo_or_private",
    "download.offline": "download.adapter_offline",
}
#: No network and no complete copy in the cache, for a model and for an adapter: a copy that is there is served.
OFFLINE_KEYS = ("download.offline", "download.adapter_offline")


def translate(exc: BaseException, model: HubModel, file: str = "") -> DownloadError:
    """huggingface_hub's and httpx's exceptions → a DownloadError naming the id, the revision, the setting."""
    err = _translate(exc, model, file)
    if model.adapter and err.key in _ADAPTER_KEYS:
        return DownloadError(_ADAPTER_KEYS[err.key], **err.params)
    return err


def _translate(exc: BaseException, model: HubModel, file: str) -> DownloadError:
    import httpx2
    from huggingface_hub import errors as hf_errors

    ep = endpoint()
    if isinstance(exc, DownloadError):
        return exc
    if isinstance(exc, hf_errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        html = "html" in exc.response.headers.get("content-type", "")
        if isinstance(exc, hf_errors.RevisionNotFoundError):
            return DownloadError("download.no_revision", id=model.repo_id, revision=model.revision, endpoint=ep)
        token = bool(os.environ.get("HF_TOKEN"))
        gated = isinstance(exc, hf_errors.GatedRepoError)  # a RepositoryNotFoundError too
        if status == 401 and isinstance(exc, hf_errors.RepositoryNotFoundError) and not gated and not token:
            # the hub answers a missing repo and a private one alike (401 RepoNotFound) to a caller without a token
            return DownloadError("download.no_repo_or_private", id=model.repo_id, endpoint=ep)
        if status in (401, 403) or gated:
            key = "download.token_refused" if token else "download.needs_token"
            return DownloadError(key, id=model.repo_id, status=status, endpoint=ep)
        if html:
            return DownloadError("download.not_a_hub", endpoint=ep, detail=f"HTTP {status} with a web page")
        if status == 404:
            return DownloadError("download.no_repo", id=str(model), endpoint=ep)
        return DownloadError("download.http", id=model.repo_id, status=status, detail=_short(exc))
    if isinstance(exc, hf_errors.OfflineModeIsEnabled | httpx2.ConnectError | httpx2.ConnectTimeout):
        return offline_error(model, _short(exc))
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DownloadError("download.disk_full", id=model.repo_id, file=file or "?", cache=str(hub.hub_cache_dir()))
    if isinstance(exc, httpx2.TransportError | OSError) and file:
        return DownloadError("download.dropped", id=model.repo_id, file=file, detail=_short(exc))
    if isinstance(exc, httpx2.TransportError):
        return offline_error(model, _short(exc))
    if isinstance(exc, ValueError | KeyError | TypeError):  # a JSON body that is no repo: not a hub at all
        return DownloadError("download.not_a_hub", endpoint=ep, detail=_short(exc))
    return DownloadError("download.http", id=model.repo_id, status="-", detail=_short(exc))


def offline_error(model: HubModel, detail: str) -> DownloadError:
    return DownloadError(
        "download.offline",
        id=model.repo_id,
        endpoint=endpoint(),
        detail=detail,
        cache=str(hub.hub_cache_dir()),
        folder=hub.storage_dir(model).name,
    )


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- the steps


def plan(model: HubModel) -> Plan:
    """The commit and the needed files (with their sizes) from the hub's repo info."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(model.repo_id, revision=model.revision, files_metadata=True)
    if not isinstance(info.sha, str) or not info.siblings:
        raise DownloadError("download.not_a_hub", endpoint=endpoint(), detail="no commit or file list in its answer")
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings}
    unsized = tuple(sorted(s.rfilename for s in info.siblings if s.size is None))
    etags = {s.rfilename: (s.lfs.sha256 if s.lfs else s.blob_id) or "" for s in info.siblings}
    wanted = hub.select_files(sizes, adapter=model.adapter)
    if ("adapter_config.json" if model.adapter else "config.json") not in wanted:
        key = "download.not_an_adapter" if model.adapter else "download.not_a_model"
        raise DownloadError(key, id=str(model), files=", ".join(sorted(sizes)[:8]))
    if model.adapter and not any(n.startswith("adapter_model.") for n in wanted):
        raise DownloadError("download.not_an_adapter", id=str(model), files=", ".join(sorted(sizes)[:8]))
    storage = hub.storage_dir(model)
    etag_of = {n: etags[n] for n in wanted if etags[n]}
    return Plan(
        model,
        info.sha,
        {n: sizes[n] for n in wanted},
        storage,
        etag_of,
        unsized=tuple(n for n in unsized if n in wanted),
    )


def free_bytes(folder: Path) -> int:
    override = os.environ.get(ENV_FREE_BYTES)
    if override:
        return int(override)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_size(p: Plan, max_bytes: int) -> None:
    """Before the first byte: the needed files' total against ``max_bytes`` ([hub] max_download_gb; 0: no cap). A
    file the hub gives no size for is refused under a cap: its size could be anything, and a cap checked only while
    the bytes arrive would still write up to the cap, per try, before saying no."""
    if not max_bytes:
        return
    if p.unsized:
        raise DownloadError("download.size_unknown", id=str(p.model), files=", ".join(sorted(p.unsized)[:8]))
    total = sum(p.sizes.values())
    if total > max_bytes:
        size, limit = hub.human_bytes(total), hub.human_bytes(max_bytes)
        raise DownloadError("download.too_big", id=str(p.model), size=size, limit=limit, size_bytes=total)


def check_disk(p: Plan) -> None:
    """Too little free space for what is still missing: a DownloadError with both numbers."""
    need = sum(p.sizes.values()) - p.on_disk()
    free = free_bytes(hub.hub_cache_dir())
    if need > free:
        raise DownloadError(
            "download.disk",
            id=p.model.repo_id,
            need=hub.human_bytes(need),
            free=hub.human_bytes(free),
            need_bytes=need,
            free_bytes=free,
            cache=str(hub.hub_cache_dir()),
        )


def fetch_file(p: Plan, name: str) -> None:
    """One file into ``blobs/<etag>``, resuming ``<etag>.incomplete`` from where it stopped."""
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get, repo_folder_name
    from huggingface_hub.utils._fixes import WeakFileLock
    from huggingface_hub.utils._headers import build_hf_headers

    if (p.storage / "snapshots" / p.commit / name).is_file():
        return
    meta = get_hf_file_metadata(hf_hub_url(p.model.repo_id, name, revision=p.commit))
    if not meta.etag or not meta.location:
        raise DownloadError("download.not_a_hub", endpoint=endpoint(), detail=f"no ETag for {name}")
    blob = p.storage / "blobs" / meta.etag
    part = blob.with_name(meta.etag + ".incomplete")
    p.where[name] = part
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = hub.hub_cache_dir() / ".locks" / repo_folder_name(repo_id=p.model.repo_id, repo_type="model")
    lock.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(str(lock / f"{meta.etag}.lock")):  # huggingface_hub's own lock for this blob
        if blob.is_file():
            p.where[name] = blob
            return
        with part.open("r+b" if part.exists() else "wb") as f:
            f.seek(0, os.SEEK_END)
            resume = f.tell()
            if meta.size is not None and resume > meta.size:  # not ours to continue: start this file over
                f.seek(0)
                f.truncate()
                resume = 0
            # http_get: Range from `resume`, 5 retries on a dropped connection, the size checked at the end
            http_get(meta.location, f, resume_size=resume, headers=build_hf_headers(), expected_size=meta.size)
        os.replace(part, blob)
        p.where[name] = blob


def link_snapshot(p: Plan) -> Path:
    """huggingface_hub's snapshot: it links the blobs fetched above, writes refs/ and the tree listing."""
    from huggingface_hub import snapshot_download

    patterns = [n.replace("[", "[[]").replace("*", "[*]").replace("?", "[?]") for n in p.sizes]
    snapshot_download(
        p.model.repo_id,
        revision=p.model.revision,
        cache_dir=hub.hub_cache_dir(),
        allow_patterns=patterns,
        max_workers=WORKERS,
    )
    folder = hub.complete_snapshot(p.model)
    if folder is None:
        raise DownloadError("download.incomplete", id=str(p.model))
    return folder


class Reporter:
    """Prints ``[download] {done, total, rate}`` twice a second from a thread until stopped."""

    def __init__(self, p: Plan, write: Callable[[str], None], every: float = 0.5) -> None:
        self.plan, self.write, self.every = p, write, every
        self._stop = threading.Event()
        self._samples: deque[tuple[float, int]] = deque(maxlen=10)  # the rate is over the last ~5 s
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)

    def line(self) -> str:
        now, done = time.monotonic(), self.plan.on_disk()
        self._samples.append((now, done))
        t0, d0 = self._samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        total = sum(self.plan.sizes.values())
        return PROGRESS_PREFIX + json.dumps({"done": done, "total": total, "rate": round(rate)})

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.write(self.line())

    def __enter__(self) -> Reporter:
        self.write(self.line())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.write(self.line())


def download(model: HubModel, write: Callable[[str], None], *, max_bytes: int = 0) -> Path:
    """The whole download (see the module docstring); the snapshot folder. Raises DownloadError."""
    done = hub.complete_snapshot(model)
    if done is not None:
        return done
    try:
        p = plan(model)
    except Exception as exc:
        err = translate(exc, model)
        cached = hub.complete_snapshot(model)
        if err.key in OFFLINE_KEYS and cached is not None:
            return cached
        raise err from exc
    check_size(p, max_bytes)
    check_disk(p)
    with Reporter(p, write):
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="download") as pool:
            order = sorted(p.sizes, key=lambda n: -p.sizes[n])  # the big shards first: they set the pace
            futures = {name: pool.submit(fetch_file, p, name) for name in order}
            for name, future in futures.items():
                try:
                    future.result()
                except Exception as exc:
                    for other in futures.values():
                        other.cancel()
                    raise translate(exc, model, file=name) from exc
        try:
            return link_snapshot(p)
        except DownloadError:
            raise
        except Exception as exc:
            raise translate(exc, model) from exc


def _lines(stream: Any) -> Callable[[str], None]:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            stream.write(line + "\n")
            stream.flush()

    return write


def _for_people(write: Callable[[str], None]) -> Callable[[str], None]:
    """``[download]`` lines → "[qwenchat] downloading the model 34 % · 2.7 of 8.0 GB · 45 MB/s" every 5 %; the
    ``[download-error]`` line left out (the same error follows as a sentence)."""
    said = [-5]

    def people(line: str) -> None:
        got = parse_progress(line)
        if got is None:
            if not line.startswith(ERROR_PREFIX):
                write(line)
            return
        done, total, rate = got
        percent = done * 100 // total if total else 0
        if percent >= said[0] + 5 or (done == total and said[0] < 100):
            said[0] = percent
            size_done, size_total = hub.bytes_of(done, total)
            text = t(
                "health.downloading_pct",
                "en",
                percent=percent,
                done=size_done,
                total=size_total,
                rate=hub.human_bytes(rate),
            )
            write(f"[qwenchat] {text}")

    return people


def main(argv: list[str] | None = None) -> int:
    """``python -m backend download-model [ID]``: the hub id from the argument or [model] path."""
    ap = argparse.ArgumentParser(prog="python -m backend download-model")
    ap.add_argument("id", nargs="?", help="owner/name[@revision]; default: [model] path")
    ap.add_argument("--text", action="store_true", help="progress for people (every 5 %%), not [download] lines")
    ap.add_argument("--adapter", action="store_true", help="a LoRA adapter repo: only adapter_config.json + weights")
    ap.add_argument("--max-bytes", type=int, default=0, help="refuse before the first byte past this size (0: no cap)")
    args = ap.parse_args(argv)
    if args.id:
        model = hub.parse_hub_id(args.id)
        model = model.as_adapter() if model and args.adapter else model
    else:
        from backend.settings import load_settings

        model = load_settings().model.hub
    if model is None:
        print(f"[qwenchat] not a hub id: {args.id or '[model] path'} ({hub.PATH_FORMS})", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress lines instead of tqdm's
    from huggingface_hub import constants

    constants.DOWNLOAD_CHUNK_SIZE = CHUNK
    write = _for_people(_lines(sys.stderr)) if args.text else _lines(sys.stderr)
    # Ctrl-C (python -m backend prepare): stop at once; the worker threads would otherwise finish their files
    # first. What is on disk stays for the next run. (The launcher stops this process with SIGTERM: the same.)
    signal.signal(signal.SIGINT, lambda *_: (write("[qwenchat] stopped; start again to resume"), os._exit(130)))
    try:
        folder = download(model, write, max_bytes=args.max_bytes)
    except DownloadError as exc:
        write(ERROR_PREFIX + json.dumps({"key": exc.key, "params": exc.params}, ensure_ascii=False))
        write(f"[qwenchat] {exc}")
        return 2
    print(folder, flush=True)
    return 0

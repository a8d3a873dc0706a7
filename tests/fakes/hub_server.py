"""A fake Hugging Face hub (aiohttp, 127.0.0.1) for huggingface_hub clients pointed at it with ``HF_ENDPOINT``.

It serves model folders as repos, each at one commit (a sha1 of its files), with the parts of the hub's HTTP API
that ``snapshot_download`` and ``model_info`` use:

    GET  /api/models/{owner}/{name}[/revision/{rev}]     repo info: sha, siblings (size, blobId, lfs)
    GET  /api/models/{owner}/{name}/tree/{rev}           the file list (``?recursive``), one page
    HEAD /{owner}/{name}/resolve/{rev}/{file}            X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size
    GET  /{owner}/{name}/resolve/{rev}/{file}            the bytes; ``Range: bytes=N-`` answers 206

``*.safetensors`` files are LFS files (ETag: their sha256), the others regular git blobs (ETag: the git blob
sha1), as on the hub. Faults, set on the object (also while it runs):

    gated      repo ids that answer 401 (X-Error-Code GatedRepo) unless ``Authorization: Bearer <token>``
    rate       bytes per second per file response (0: as fast as it goes): a download a test can stop midway
    drops      the next N file responses close the connection after ``drop_at`` bytes of body
    web_page   every request gets 200 text/html (``HF_ENDPOINT`` pointing at a web site)
    unsized    repo ids whose repo info gives no file sizes (the hub did not say)

An unknown repo answers 404 ``RepoNotFound``, an unknown revision 404 ``RevisionNotFound``. ``served`` counts the
file bytes sent; ``requests`` records (method, path, status, Range).

    with FakeHub({"qwen/tiny": folder}) as hub:       # runs on its own thread
        env["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

HOST = "127.0.0.1"
CHUNK = 64 * 1024


@dataclass(frozen=True)
class RepoFile:
    path: Path
    size: int
    blob_id: str  # git blob sha1
    sha256: str | None  # LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id

    def info(self, name: str) -> dict[str, object]:
        lfs = {"oid": self.sha256, "size": self.size, "pointerSize": 134} if self.sha256 else None
        return {"type": "file", "oid": self.blob_id, "size": self.size, "path": name, **({"lfs": lfs} if lfs else {})}


@dataclass
class Repo:
    files: dict[str, RepoFile]
    commit: str
    revisions: set[str] = field(default_factory=lambda: {"main"})

    @classmethod
    def from_folder(cls, folder: Path) -> Repo:
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
            data = path.read_bytes()
            blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            sha256 = hashlib.sha256(data).hexdigest() if path.suffix in (".safetensors", ".bin", ".pth") else None
            files[path.relative_to(folder).as_posix()] = RepoFile(path, len(data), blob_id, sha256)
        commit = hashlib.sha1("".join(f"{n}{f.blob_id}" for n, f in files.items()).encode()).hexdigest()
        return cls(files, commit)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


class FakeHub:
    def __init__(self, repos: dict[str, Path], *, token: str = "hf_test_token") -> None:
        self.repos = {rid: Repo.from_folder(folder) for rid, folder in repos.items()}
        self.token = token
        self.gated: set[str] = set()
        self.rate = 0.0
        self.drops = 0
        self.drop_at = 0
        self.web_page = False
        self.unsized: set[str] = set()
        self._served = 0
        self._epoch = 0  # bumped by each reset of ``served``: responses begun before it count no more
        self.requests: list[tuple[str, str, int, str]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # ------------------------------------------------------------ running on a thread

    def __enter__(self) -> FakeHub:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-hub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake hub did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/models/{owner}/{name}", self._info)
        app.router.add_get("/api/models/{owner}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{owner}/{name}/tree/{rev}", self._tree)
        app.router.add_route("HEAD", "/{owner}/{name}/resolve/{rev}/{file:.+}", self._resolve)
        app.router.add_get("/{owner}/{name}/resolve/{rev}/{file:.+}", self._resolve, allow_head=False)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    # ------------------------------------------------------------ routes

    @web.middleware
    async def _record(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if self.web_page:
            response: web.StreamResponse = web.Response(
                text="<!doctype html><html><body><h1>Welcome to our site</h1></body></html>", content_type="text/html"
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                response = exc
        self.requests.append((request.method, request.path, response.status, request.headers.get("Range", "")))
        return response

    def _repo(self, request: web.Request) -> tuple[str, Repo]:
        rid = f"{request.match_info['owner']}/{request.match_info['name']}"
        repo = self.repos.get(rid)
        if repo is None:
            raise self._error(404, "RepoNotFound", "Repository not found")
        if rid in self.gated and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise self._error(401, "GatedRepo", f"Access to model {rid} is restricted. You must have access to it")
        rev = request.match_info.get("rev", "main")
        if rev not in repo.revisions and rev != repo.commit:
            raise self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return rid, repo

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.HTTPException:
        cls = {401: web.HTTPUnauthorized, 404: web.HTTPNotFound}[status]
        return cls(
            text=json.dumps({"error": message}),
            content_type="application/json",
            headers={"X-Error-Code": code, "X-Error-Message": message},
        )

    async def _info(self, request: web.Request) -> web.Response:
        rid, repo = self._repo(request)
        siblings = []
        for name, f in repo.files.items():
            sib: dict[str, object] = {"rfilename": name, "size": f.size, "blobId": f.blob_id}
            if rid in self.unsized:
                del sib["size"]
            elif f.sha256:
                sib["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            siblings.append(sib)
        body = {"_id": rid, "id": rid, "modelId": rid, "sha": repo.commit, "private": False, "gated": False}
        body |= {"siblings": siblings, "tags": [], "library_name": "transformers", "usedStorage": repo.size}
        return web.json_response(body)

    async def _tree(self, request: web.Request) -> web.Response:
        _, repo = self._repo(request)
        return web.json_response([f.info(name) for name, f in repo.files.items()])

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        _, repo = self._repo(request)
        f = repo.files.get(request.match_info["file"])
        if f is None:
            raise self._error(404, "EntryNotFound", "Entry not found")
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{f.blob_id}"',
            "X-Linked-Size": str(f.size),
            "Accept-Ranges": "bytes",
        }
        if f.sha256:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
        if request.method == "HEAD":
            return web.Response(headers=headers)
        start = 0
        rng = request.headers.get("Range", "")
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{f.size - 1}/{f.size}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = f.size - start
        await response.prepare(request)
        with self._lock:
            drop = self.drops > 0
            self.drops -= 1 if drop else 0
        sent = 0
        epoch = self._epoch
        with f.path.open("rb") as src:
            src.seek(start)
            while chunk := src.read(CHUNK):
                if drop and sent + len(chunk) > self.drop_at:
                    chunk = chunk[: max(0, self.drop_at - sent)]
                    if chunk:
                        await response.write(chunk)
                        self._count(len(chunk), epoch)
                    assert request.transport is not None
                    request.transport.close()  # mid-body: the client sees the connection drop
                    return response
                await response.write(chunk)
                self._count(len(chunk), epoch)
                sent += len(chunk)
                if self.rate:
                    await asyncio.sleep(len(chunk) / self.rate)
        await response.write_eof()
        return response

    @property
    def served(self) -> int:
        """Bytes of file bodies written since the last reset (``served = 0``), by responses begun after it: a
        response of a stopped client, asleep between two chunks, can still write a few before it notices the client
        is gone, and those are not the next run's."""
        return self._served

    @served.setter
    def served(self, value: int) -> None:
        with self._lock:
            self._served = value
            self._epoch += 1

    def _count(self, n: int, epoch: int) -> None:
        with self._lock:
            if epoch == self._epoch:
                self._served += n

    async def _other(self, request: web.Request) -> web.Response:
        return web.json_response({"error": f"not faked: {request.method} {request.path}"}, status=404)

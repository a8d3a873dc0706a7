"""A fleet's replicas as the health poller sees them: each one's own ``/health`` and ``/v1/models`` (asked directly,
besides the router in front of them), its supervisor's status file for the launcher's own, and the log lines of a
replica or an adapter that comes and goes (once per change). See health.py's docstring."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from ..contract import EngineStatus, replica_status_file_name
from ..engine_http import public_url, replica_address
from .health_classify import replica_text
from .health_http import Http, root_of
from .health_status import ModelEntry, ReplicaHealth, parse_models

logger = logging.getLogger("backend.chat.health")  # the poller's log: one name for every health line

Get = Callable[[str, float], Awaitable[Http]]
Partial = tuple[tuple[str, tuple[int, ...]], ...]  # (model, the numbers of the ready replicas lacking it)


class Fleet:
    """The replicas (``urls``: each one's OpenAI base URL); the first ``local`` are the launcher's own, with a
    supervisor status file next to ``status_file``."""

    def __init__(self, urls: Sequence[str], status_file: Path | None, local: int) -> None:
        # (number, host:port, root URL) of each replica; a user:password in a replica's URL is left out (every
        # replica takes the engine key as a bearer token)
        self.roots = tuple((i + 1, replica_address(u), root_of(public_url(u))) for i, u in enumerate(urls))
        folder = status_file.parent if status_file else None
        self.status_files: dict[int, Path] = (
            {i + 1: folder / replica_status_file_name(i) for i in range(min(local, len(urls)))} if folder else {}
        )
        self.view = tuple(ReplicaHealth(n, addr) for n, addr, _ in self.roots)  # as last seen

    def __bool__(self) -> bool:
        return bool(self.roots)

    @property
    def any_ready(self) -> bool:
        return any(r.ready for r in self.view)

    async def poll(
        self, get: Get, timeout: float, parents: Mapping[str, str], base_name: str
    ) -> tuple[tuple[ReplicaHealth, ...], dict[int, tuple[ModelEntry, ...]]]:
        """Each replica's ``/health`` and ``/v1/models``, all at once: (each replica's view, the model list of each
        ready replica whose list could be read, by number)."""
        n = len(self.roots)
        answers, sups = await asyncio.gather(
            asyncio.gather(
                *(get(root + "/health", timeout) for _, _, root in self.roots),
                *(get(root + "/v1/models", timeout) for _, _, root in self.roots),
            ),
            asyncio.to_thread(self.read_status_files),
        )
        out = []
        lists: dict[int, tuple[ModelEntry, ...]] = {}
        for (number, address, _), resp, listed in zip(self.roots, answers[:n], answers[n:], strict=True):
            sup = sups.get(number)
            text = replica_text(resp, sup, timeout)
            ready = text is None
            if ready and listed.ok and listed.status == 200:
                models = parse_models(listed.body, parents, base_name)
                if models is not None:
                    lists[number] = models
            attempt, cause = (sup.attempt, sup.cause) if sup is not None else (None, "")
            out.append(ReplicaHealth(number, address, ready, text, attempt=attempt, cause=cause))
        return tuple(out), lists

    def read_status_files(self) -> dict[int, EngineStatus]:
        """The supervisor status files of this launcher's replicas (by number; missing files left out)."""
        found = {n: EngineStatus.read(path) for n, path in self.status_files.items()}
        return {n: sup for n, sup in found.items() if sup is not None}

    def note(self, replicas: tuple[ReplicaHealth, ...]) -> None:
        """Keep the replicas' view; log each replica that went down or came back (once per change)."""
        old = {r.number: r for r in self.view}
        roots = {n: root for n, _, root in self.roots}
        for r in replicas:
            before = old.get(r.number)
            if before is not None and (before.ready, before.detail) == (r.ready, r.detail):
                continue
            url = public_url(roots[r.number])
            if r.ready:
                logger.info("fleet replica %d (%s) is ready", r.number, url)
            elif before is not None and (before.ready or before.detail):
                logger.warning("fleet replica %d (%s) is not ready: %s", r.number, url, r.detail)
            else:
                logger.info("fleet replica %d (%s) is not ready yet: %s", r.number, url, r.detail)
        self.view = replicas

    def note_partial(self, before: Partial, now: Partial, offered: set[str]) -> None:
        """Log each model that became (or stopped being) served by some ready replicas only, once per change."""
        addresses = {n: addr for n, addr, _ in self.roots}
        old = dict(before)
        for name, numbers in now:
            if old.get(name) != numbers:
                where = ", ".join(f"replica {n} ({addresses.get(n, '?')})" for n in numbers)
                logger.warning(
                    "fleet: adapter %r is not served by %s; it is not offered until every ready replica serves it",
                    name,
                    where,
                )
        for name in old.keys() - dict(now).keys():
            if name in offered:
                logger.info("fleet: adapter %r is served by every ready replica again; it is offered", name)
            else:
                logger.info("fleet: adapter %r is no longer served by any ready replica", name)

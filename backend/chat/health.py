"""One shared engine-health poller per app process: is the model able to answer, and if not, why.

    poller = get_poller(settings.engine_base_url, settings.api_key, HealthSettings(), status_file=path)
    await poller.start()                          # idempotent; every session may call it
    poller.status                                 # HealthStatus snapshot: state, reason (a Text), models, ...
    poller.status.text("zh-CN")                   # the reason in the viewer's language
    status = await poller.wait_until_ready(300, on_progress=show)   # show(elapsed, status), sync or async
    async for status in poller.subscribe(): ...   # current status first, then every change
    await poller.refresh()                        # poll now (after loading an adapter)
    await poller.stop()

Each poll: the supervisor's status file (if any), ``GET {root}/health``, ``GET {root}/v1/models``
and a real one-token generation on the base model, because vLLM's /health can say 200 while the
engine is hung (vllm#39863). The probe runs every ``probe_every`` seconds after one that answered
(even slowly: a 4B model on CPU is slow, and probing it every second only adds load), and on every
poll while probes fail or right after /health or /v1/models failed.

States (``EngineState``):

    STARTING  refused / 503 / no models yet, never ready in this engine's life; or supervisor starting/restarting
              (even with /health answering: ready only once the launcher's status says running);
              or the launcher still preparing (installing the engine, converting the model: ``phase``, no HTTP);
              or a fleet's router that answers /health while a probe through it fails with a 5xx (not routable)
    READY     health 200 (or no /health route), models listed, probe answered within probe_slow
    DEGRADED  after health 200 and models: probe timed out, failed or was slow; or /health or /v1/models stopped answering
    DOWN      refused (or unhealthy) after having been ready (any probe that answered, even slowly, counts as
              "ready" here); never up within startup_limit; supervisor down/stopped; the engine refused our API key

A transition (state or reason) is logged once and pushed to subscribers once; a steady state is
not re-logged. Reasons are catalog Texts (key + parameters, no ticking numbers) so they can be compared; the
words are made where they are shown (the status line, in the viewer's language; logs, in English).

A fleet (``replicas``: each replica's OpenAI base URL; the base URL is then the router in front of them):
every poll also asks each replica's ``GET /health`` and ``GET /v1/models`` directly, in parallel with the
router's /health (no per-message calls); the probe still goes through the router. ``HealthStatus.replicas``
holds each replica's view (number, ``host:port``, ready, why not), a replica going down or coming back is
logged once. The launcher's own replicas (``local_replicas``, the first ones) also have supervisor status files
next to the main one: read with each poll, they give a down replica its supervisor's words ("restarting —
attempt 1 of 5", and why) and each local replica its restart ``attempt`` and ``cause`` (metrics count them); a local
replica whose supervisor still says starting/restarting is not ready, whatever its /health says (as the router).

The model list in a fleet is what EVERY ready replica whose list was read serves (by id; lineage from the
replicas' own ``parent`` fields and [lora] parents; the smallest ``max_model_len`` any states), not the
router's ``/v1/models``, which vllm-router forwards to one worker: that list would flap with the worker asked
when one lacks an adapter (a remote replica started without it, a local one restarted without the adapters
loaded at runtime), and fails for a moment right after a replica dies. A model only some ready replicas serve
is not offered (not in ``models``); ``HealthStatus.partial_models`` names it with the replicas lacking it
(logged once per change, published to subscribers). A replica that is not ready does not count. When no
replica's list could be read (replicas out of this process's reach, a key they refuse), the router's list is
used, as without a fleet.

On top of the router's state:

    all replicas ready        the router's state (READY: the line adds "3 of 3 replicas ready")
    some, not all, ready      DEGRADED (the fleet answers, with less capacity): "2 of 3 replicas ready;
                              replica 3 (gpu-c:8000): connection refused"
    none ready                DOWN, unless a probe through the router answered in this very poll
                              (replicas this process cannot reach directly, e.g. a remote fleet behind
                              its router): then DEGRADED, saying so; probes then run on every poll

vllm-router answers its own ``/health`` with 503 as soon as one replica is unhealthy: with a replica ready here,
that 503 is not the engine being down (the probe through the router decides).

Ready means routable: a fleet is READY only once the one-token probe THROUGH the router answers, not on the router's
``/health`` or its replicas' alone. A router that answers ``/health`` while a request through it fails with a 5xx
(restarted, its workers not checked yet) is STARTING, "the router answers, but a test generation through it
failed (…)", with a replica ready here (with none, DOWN as above): a message sent meanwhile waits with the loading
step instead of failing; the probe runs on every poll until one through the router answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import inspect
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .. import hub
from ..contract import (
    PHASE_CONVERT_MODEL,
    PHASE_DOWNLOAD_MODEL,
    PHASE_INSTALL_ENGINE,
    EngineStatus,
    SupervisorState,
    replica_status_file_name,
)
from ..engine_http import Route, auth_headers, error_message, public_url, replica_address, status_error
from ..errors import NoWorkerAvailable
from ..probe import probe_body
from ..settings import HealthSettings  # re-exported: the [health] section
from ..text import Text, t

logger = logging.getLogger(__name__)


class EngineState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    DOWN = "down"


@dataclass(frozen=True)
class ModelEntry:
    """One entry of /v1/models: the base model (``parent`` None) or a LoRA adapter.

    ``lineage_unknown``: the server hides lineage (no ``parent`` field at all: LiteLLM, a router), [lora] parents
    does not name this model, and it is not the one base model we can tell: base or adapter, nobody says.
    """

    id: str
    parent: str | None = None
    root: str | None = None
    max_model_len: int | None = None
    lineage_unknown: bool = False

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None

    @property
    def is_base(self) -> bool:
        return self.parent is None and not self.lineage_unknown


@dataclass(frozen=True)
class ReplicaHealth:
    """One fleet replica as this process sees it (``GET /health`` on the replica itself)."""

    number: int  # 1-based, in [fleet] order (local replicas first)
    address: str  # host:port: no scheme, credentials or path (it is shown in the browser)
    ready: bool = False
    detail: Text | None = (
        None  # why not ready ("connection refused", "HTTP 503", "no answer within 5 s"); None when ready
    )
    # a replica this launcher supervises (its status file): restarts in the supervisor's window, and the last cause
    attempt: int | None = None
    cause: str = ""

    def detail_in(self, lang: str | None) -> str:
        return self.detail.in_(lang) if self.detail else ""

    def to_json(self, lang: str | None = "en") -> dict[str, Any]:
        return {
            "replica": self.number,
            "address": self.address,
            "ready": self.ready,
            "detail": self.detail_in(lang),
            "attempt": self.attempt,
            "cause": self.cause or None,
        }


@dataclass(frozen=True)
class EngineLoad:
    """vLLM's own gauges (``GET /metrics``): requests generating and requests queued, over every replica."""

    running: int
    waiting: int

    @property
    def busy(self) -> bool:
        return self.waiting > 0


#: seconds before a server whose /metrics answered 404 is asked again (a server may become a vLLM behind one URL)
METRICS_RETRY_S = 60.0
_GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$", re.MULTILINE)


def parse_load(text: str) -> EngineLoad | None:
    """``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` from vLLM's Prometheus text, summed over
    their label sets (one per served model name); None when neither gauge is there (not a vLLM, an old one)."""
    found = {"running": 0.0, "waiting": 0.0}
    seen = False
    for name, value in _GAUGE.findall(text):
        with contextlib.suppress(ValueError):
            number = float(value)
            if number == number:  # NaN: skipped
                found[name] += number
                seen = True
    return EngineLoad(round(found["running"]), round(found["waiting"])) if seen else None


@dataclass(frozen=True)
class HealthStatus:
    """An immutable snapshot of what the poller knows. ``models`` is the last known list (kept, with
    ``models_stale``, while the engine is down); ``version`` changes only when that list changes."""

    state: EngineState = EngineState.STARTING
    reason: Text | None = None  # why (made in the viewer's language by ``text``)
    since: float = 0.0  # epoch: entered this state (or reason)
    starting_elapsed: float = 0.0  # seconds this engine life has been starting; 0 unless STARTING
    models: tuple[ModelEntry, ...] = ()
    models_stale: bool = False
    base_model: str | None = None
    max_model_len: int | None = None
    version: int = 0
    last_probe_latency: float | None = None
    checked_at: float = 0.0  # epoch of the last poll
    # from the supervisor's status file, when there is one
    cause: str | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    log_path: str | None = None
    phase: str | None = None  # the launcher's preparation step while STARTING (contract.PHASE_*), else None
    replicas: tuple[ReplicaHealth, ...] = ()  # a fleet's replicas as last polled; () without a fleet
    # a fleet: models some ready replicas serve but not all, each with the numbers of the ready replicas lacking
    # it (not in ``models``: not offered until every ready replica serves it); () without a fleet
    partial_models: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # vLLM's own load (its /metrics, every replica's summed), read at each poll while it answers; None: unknown
    load: EngineLoad | None = None

    def load_text(self, lang: str | None = "en") -> str:
        """The status line's "busy · 8 running, 3 waiting" while requests queue in the engine; else ""."""
        if self.load is None or not self.load.busy or not self.answering:
            return ""
        return t("status.load", lang, running=self.load.running, waiting=self.load.waiting)

    @property
    def replicas_total(self) -> int:
        return len(self.replicas)

    @property
    def replicas_ready(self) -> int:
        return sum(1 for r in self.replicas if r.ready)

    def replicas_text(self, lang: str | None = "en") -> str:
        """ "2 of 3 replicas ready" (``""`` without a fleet)."""
        if not self.replicas:
            return ""
        return t("health.replicas_count", lang, ready=self.replicas_ready, total=self.replicas_total)

    def lacking(self, model: str) -> tuple[int, ...]:
        """The numbers of the ready replicas that do not serve ``model`` while others do; () if none (or no fleet)."""
        return next((numbers for name, numbers in self.partial_models if name == model), ())

    def replicas_named(self, numbers: Sequence[int], lang: str | None = "en") -> str:
        """ "replica 2 (gpu-b:8000), replica 3 (gpu-c:8000)": no scheme, path or credentials."""
        addresses = {r.number: r.address for r in self.replicas}
        return t("health.list_sep", lang).join(
            t("health.replica_named", lang, number=n, address=addresses.get(n, "?")) for n in numbers
        )

    def partial_text(self, lang: str | None = "en") -> str:
        """The status line's note on models not served by every ready replica (``""`` when there are none)."""
        return t("health.item_sep", lang).join(
            t("health.partial_model", lang, model=name, replicas=self.replicas_named(numbers, lang))
            for name, numbers in self.partial_models
        )

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    @property
    def answering(self) -> bool:
        """The engine takes requests (possibly slowly): worth sending a message."""
        return self.state in (EngineState.READY, EngineState.DEGRADED)

    @property
    def adapters(self) -> tuple[ModelEntry, ...]:
        return tuple(m for m in self.models if m.is_adapter)

    def text(self, lang: str | None = "en") -> str:
        """The reason in the best language for ``lang`` ("" when there is none)."""
        return self.reason.in_(lang) if self.reason else ""


# ---------------------------------------------------------------- one poll's observations


@dataclass
class _Http:
    ok: bool = False  # a response arrived
    status: int = 0
    body: Any = None
    error: str = ""  # "refused", "timeout", or an exception text
    latency: float = 0.0


def _parse_models(
    body: Any, parents: Mapping[str, str] | None = None, base_name: str = ""
) -> tuple[ModelEntry, ...] | None:
    """The model list, with lineage from [lora] parents (``parents``) where the server gives none."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    shown = any(isinstance(item, dict) and "parent" in item for item in data)  # vLLM: "parent": null on the base
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        mml = item.get("max_model_len")
        out.append(
            ModelEntry(
                id=item["id"],
                parent=item.get("parent") if isinstance(item.get("parent"), str) else None,
                root=item.get("root") if isinstance(item.get("root"), str) else None,
                max_model_len=mml if isinstance(mml, int) and not isinstance(mml, bool) else None,
            )
        )
    return _with_lineage(tuple(out), shown, parents or {}, base_name)


def _with_lineage(
    models: tuple[ModelEntry, ...], shown: bool, parents: Mapping[str, str], base_name: str
) -> tuple[ModelEntry, ...]:
    """[lora] parents where the list gives no parent; then, if the server shows no lineage at all and several
    models are left without a parent, only those known to be bases (a declared parent, or [model]'s name) stay
    bases: the others are ``lineage_unknown`` (the picker labels them neutrally, never "base model")."""
    models = tuple(
        dataclasses.replace(m, parent=parents[m.id])
        if m.parent is None and parents.get(m.id) not in (None, m.id)
        else m
        for m in models
    )
    rest = [m for m in models if m.parent is None]
    if shown or len(rest) <= 1:
        return models
    named = set(parents.values()) | ({base_name} if base_name else set())
    return tuple(
        dataclasses.replace(m, lineage_unknown=True) if m.parent is None and m.id not in named else m for m in models
    )


def _base_of(models: tuple[ModelEntry, ...]) -> ModelEntry | None:
    """The base model: the first known one, else (lineage hidden and undeclared) the first that is no adapter,
    for the probe and as the chat's default model."""
    return next((m for m in models if m.is_base), None) or next((m for m in models if m.parent is None), None)


def _fleet_models(
    lists: Mapping[int, tuple[ModelEntry, ...]],
) -> tuple[tuple[ModelEntry, ...], tuple[tuple[str, tuple[int, ...]], ...]]:
    """(the models every listed replica serves, in the first replica's order, each with the smallest
    ``max_model_len`` any of them states; each model only some serve, with the numbers of those lacking it)."""
    numbers = sorted(lists)
    ids = {n: {m.id for m in lists[n]} for n in numbers}
    common = set.intersection(*ids.values())

    def smallest_len(model: ModelEntry) -> ModelEntry:
        lens = [e.max_model_len for n in numbers for e in lists[n] if e.id == model.id and e.max_model_len is not None]
        return dataclasses.replace(model, max_model_len=min(lens)) if lens else model

    models = tuple(smallest_len(m) for m in lists[numbers[0]] if m.id in common)
    seen: dict[str, None] = {}  # every listed id, in replica order
    for n in numbers:
        seen.update((m.id, None) for m in lists[n])
    partial = tuple((name, tuple(n for n in numbers if name not in ids[n])) for name in seen if name not in common)
    return models, partial


def _root(base_url: str) -> str:
    """An engine's root URL from its OpenAI base URL (``…/v1`` or not)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_detail(resp: _Http) -> str:
    msg = " ".join(error_message(resp.body).split())[:160]
    return f"HTTP {resp.status}" + (f": {msg}" if msg else "")


# ---------------------------------------------------------------- the poller


class HealthPoller:
    """Polls one engine; see the module docstring. Create with ``get_poller`` (one per process)."""

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        settings: HealthSettings | None = None,
        status_file: str | Path | None = None,
        replicas: Sequence[str] = (),
        *,
        parents: Mapping[str, str] | None = None,
        base_name: str = "",
        local_replicas: int = 0,
    ) -> None:
        self.root_url = _root(base_url)
        # lineage where the server hides it: [lora] parents, and [model]'s name as the base (see _with_lineage)
        self.parents = dict(parents or {})
        self.base_name = base_name
        self.api_url = self.root_url + "/v1"
        self.api_key = api_key
        self.settings = settings or HealthSettings()
        self.status_file = Path(status_file) if status_file else None
        # a fleet: (number, host:port, root URL) of each replica, polled directly besides the router; a
        # user:password in a replica's URL is left out (every replica takes the engine key as a bearer token)
        self.replica_roots = tuple((i + 1, replica_address(u), _root(public_url(u))) for i, u in enumerate(replicas))
        # the first ``local_replicas`` are this launcher's: each has a supervisor status file next to the main one
        folder = self.status_file.parent if self.status_file else None
        self.replica_status_files: dict[int, Path] = (
            {i + 1: folder / replica_status_file_name(i) for i in range(min(local_replicas, len(replicas)))}
            if folder
            else {}
        )
        self._fresh_answer = False  # a probe through the router answered in the poll under way
        self._replica_view = tuple(ReplicaHealth(n, addr) for n, addr, _ in self.replica_roots)  # published by _set

        now = time.time()
        self._status = HealthStatus(
            state=EngineState.STARTING,
            reason=Text("health.waiting"),
            since=now,
            checked_at=0.0,
            replicas=self._replica_view,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[HealthStatus]]] = []  # (resolve after poll number, future)
        self._subscribers: set[asyncio.Queue[HealthStatus | None]] = set()
        self._force_probe = False
        self._stopped = False
        # this engine life
        self._ever_ready = False
        self._life_started = time.monotonic()  # monotonic start of the current engine life
        self._last_probe_at: float | None = None  # monotonic
        # the outcome of the last probe that answered (READY or slow DEGRADED), replayed between
        # probes; None while probes fail or after /health or /v1/models failed: probe on every poll
        self._answered: tuple[EngineState, Text] | None = None
        self._health_404_logged = False
        # roots whose /metrics answered 404 (a server that is no vLLM): not asked again before this (monotonic)
        self._no_metrics_until: dict[str, float] = {}
        self._published: tuple[Any, ...] = ()
        self._poll_seq = 0  # polls started
        self._sup_key: tuple[Any, ...] | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start polling on the running loop (idempotent)."""
        if self.running:
            return
        if self._stopped:
            raise RuntimeError("this HealthPoller was stopped; create a new one with get_poller()")
        self._loop = asyncio.get_running_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # no keep-alive: a pooled connection to an engine that restarted would read as "refused"
                connector=aiohttp.TCPConnector(limit=4 + len(self.replica_roots), force_close=True),
                headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else None,
            )
        self._task = asyncio.create_task(self._run(), name="qwenchat-health-poller")
        logger.info("health poller started for %s", self.root_url)

    async def stop(self) -> None:
        """Stop polling, close HTTP, end every subscription and pending wait (idempotent)."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None
        for q in list(self._subscribers):
            _put_latest(q, None)
        self._subscribers.clear()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_result(self.status)
        self._waiters.clear()

    # ------------------------------------------------------------ public reads

    @property
    def status(self) -> HealthStatus:
        s = self._status
        if s.state is EngineState.STARTING:
            return dataclasses.replace(s, starting_elapsed=max(0.0, time.monotonic() - self._life_started))
        return s

    async def refresh(self, probe: bool = False) -> HealthStatus:
        """Poll now and return the result (``probe=True`` also forces a probe generation)."""
        self._force_probe = self._force_probe or probe
        if not self.running:
            await self._poll_once()
            return self.status
        assert self._loop is not None
        fut: asyncio.Future[HealthStatus] = self._loop.create_future()
        # a poll already under way may have started before the caller's change (e.g. an adapter load):
        # only a poll that starts after this point counts
        entry = (self._poll_seq + 1, fut)
        self._waiters.append(entry)
        self._wake.set()
        s = self.settings
        limit = 2 * s.request_timeout + s.probe_timeout + 2.0
        try:
            return await asyncio.wait_for(asyncio.shield(fut), limit)
        except TimeoutError:
            return self.status
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    async def wait_until_ready(
        self,
        timeout: float,
        on_progress: Callable[[float, HealthStatus], Awaitable[None] | None] | None = None,
        *,
        accept_degraded: bool = True,
        progress_every: float = 1.0,
    ) -> HealthStatus:
        """Wait until the engine answers (READY, or DEGRADED when ``accept_degraded``) or is DOWN, or
        ``timeout`` seconds pass; return the status at that moment. ``on_progress(elapsed, status)`` is
        called at once, on every change and every ``progress_every`` seconds (for "loading… 23 s").

        Time while the launcher is still preparing (installing the engine, converting the model: ``phase``)
        does not count against ``timeout``, which is about the model loading: a first start's install takes
        minutes and ends in READY or, on failure, DOWN."""
        started = time.monotonic()
        preparing = 0.0  # seconds spent in a preparation phase, not counted
        done_states = {EngineState.READY, EngineState.DOWN} | ({EngineState.DEGRADED} if accept_degraded else set())
        sub = self.subscribe()
        try:
            status = await sub.__anext__()  # the current status, queued by subscribe()
            mark = time.monotonic()
            while True:
                now = time.monotonic()
                if status.phase:
                    preparing += now - mark
                mark = now
                elapsed = now - started
                if on_progress is not None:
                    result = on_progress(elapsed, status)
                    if inspect.isawaitable(result):
                        await result
                counted = elapsed - preparing
                if status.state in done_states or counted >= timeout or self._stopped:
                    return status
                wait = min(progress_every, max(0.0, timeout - counted))
                try:
                    nxt = await asyncio.wait_for(sub.__anext__(), wait)
                    status = nxt
                except TimeoutError:
                    status = self.status
                except StopAsyncIteration:
                    return self.status
        finally:
            await sub.aclose()

    def subscribe(self) -> Subscription:
        """An async iterator of statuses: the current one first, then each change. Ends at stop().
        Slow readers only miss intermediate statuses, never the latest."""
        q: asyncio.Queue[HealthStatus | None] = asyncio.Queue(maxsize=8)
        q.put_nowait(self.status)
        if self._stopped:
            q.put_nowait(None)
        else:
            self._subscribers.add(q)
        return Subscription(self, q)

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            self._poll_seq += 1
            seq = self._poll_seq
            try:
                await self._poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not kill health polling for the whole app
                logger.exception("health poll failed")
            for after, fut in self._waiters:
                if after <= seq and not fut.done():
                    fut.set_result(self.status)
            # poll fast only while failing; a slow but answering engine is polled like a ready one
            answering = self._status.state is EngineState.READY or self._answered is not None
            interval = self.settings.poll_ready if answering else self.settings.poll_starting
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()

    async def _get(self, url: str, timeout: float) -> _Http:
        return await self._request("GET", url, timeout)

    async def _request(self, method: str, url: str, timeout: float, payload: Any = None) -> _Http:
        if self._session is None:  # refresh() before start(): a private one-shot session
            async with aiohttp.ClientSession(headers=auth_headers(self.api_key)) as session:
                return await self._send(session, method, url, timeout, payload)
        return await self._send(self._session, method, url, timeout, payload)

    @staticmethod
    async def _send(session: aiohttp.ClientSession, method: str, url: str, timeout: float, payload: Any) -> _Http:
        started = time.monotonic()
        try:
            async with session.request(method, url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                return _Http(ok=True, status=resp.status, body=body, latency=time.monotonic() - started)
        except TimeoutError:
            return _Http(error="timeout", latency=time.monotonic() - started)
        except aiohttp.ClientConnectorError:
            return _Http(error="refused", latency=time.monotonic() - started)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # a pooled keep-alive connection to a server that has gone away
            return _Http(error="refused", latency=time.monotonic() - started)
        except aiohttp.ClientError as exc:
            return _Http(error=f"{type(exc).__name__}: {exc}", latency=time.monotonic() - started)

    async def _poll_once(self) -> None:
        """One poll: the supervisor's file, then /health, /v1/models and the probe; a stage that cannot go on
        sets the state it found (``_set``) and ends the poll."""
        # Any early return below (health or models failing) leaves this None, so the next poll
        # that gets through probes again before it may report READY.
        answered, self._answered = self._answered, None
        sup = await self._read_supervisor()
        if sup is not None and sup.state in _SUP_DOWN:
            self._set(EngineState.DOWN, _supervisor_down_text(sup), sup=sup, models_ok=False)
            return
        if sup is not None and sup.state is SupervisorState.PREPARING:
            # no engine process yet: nothing to ask over HTTP, and no start-up limit while the launcher prepares
            self._set(EngineState.STARTING, _supervisor_starting_text(sup), sup=sup, models_ok=False)
            return
        replica_lists = await self._check_health(sup)
        if replica_lists is None:
            return
        base = await self._check_models(sup, replica_lists)
        if base is not None:
            await self._check_probe(base, answered, sup)
            await self._note_load()

    async def _note_load(self) -> None:
        """vLLM's ``/metrics`` (each replica's in a fleet, summed; the engine key as for every request): how many
        requests run and wait. Published when it changes; unknown (None) when no answer has the gauges. A server
        whose /metrics is 404 (an external server that is no vLLM) is asked again only ``METRICS_RETRY_S`` later, or
        after an engine (re)start, not at every poll."""
        now = time.monotonic()
        roots = [root for _, _, root in self.replica_roots] or [self.root_url]
        roots = [root for root in roots if self._no_metrics_until.get(root, 0.0) <= now]
        answers = await asyncio.gather(*(self._get(root + "/metrics", self.settings.request_timeout) for root in roots))
        for root, answer in zip(roots, answers, strict=True):
            if answer.ok and answer.status == 404:
                self._no_metrics_until[root] = now + METRICS_RETRY_S
        loads = [parse_load(a.body) for a in answers if a.ok and a.status == 200 and isinstance(a.body, str)]
        known = [load for load in loads if load is not None]
        load = EngineLoad(sum(x.running for x in known), sum(x.waiting for x in known)) if known else None
        if load == self._status.load:
            return
        self._status = dataclasses.replace(self._status, load=load)
        snapshot = self.status
        for q in list(self._subscribers):
            _put_latest(q, snapshot)

    async def _read_supervisor(self) -> EngineStatus | None:
        """The supervisor's status file (None without one); a (re)start or a new engine process begins a new life."""
        sup = await asyncio.to_thread(EngineStatus.read, self.status_file) if self.status_file else None
        if sup is not None:
            key = (sup.state, sup.pid, sup.attempt)
            if key != self._sup_key:
                # a (re)start or a new engine process begins a new life: "ever ready" and the
                # starting clock (from the supervisor's "since") start over
                new_process = self._sup_key is not None and sup.pid != self._sup_key[1]
                if sup.state in _SUP_STARTING or new_process or self._sup_key is None:
                    self._new_life(sup.since)
                self._sup_key = key
        return sup

    async def _check_health(self, sup: EngineStatus | None) -> dict[int, tuple[ModelEntry, ...]] | None:
        """``GET /health`` (and a fleet's replicas, at the same time): the replicas' model lists when it may go on
        (``{}`` without a fleet), None when the state is set."""
        s = self.settings
        self._fresh_answer = False
        replica_lists: dict[int, tuple[ModelEntry, ...]] = {}
        if self.replica_roots:  # the replicas' /health and /v1/models at the same time as the router's: one poll's time
            health, (replicas, replica_lists) = await asyncio.gather(
                self._get(self.root_url + "/health", s.request_timeout), self._poll_replicas()
            )
            self._note_replicas(replicas)
        else:
            health = await self._get(self.root_url + "/health", s.request_timeout)
        health_ok = health.ok and (health.status == 200 or health.status == 404)
        if self.replica_roots and health.ok and health.status == 503 and any(r.ready for r in self._replica_view):
            # vllm-router's /health is 503 as soon as one replica is unhealthy; it still routes to the others
            health_ok = True
        if health.ok and health.status == 404 and not self._health_404_logged:
            self._health_404_logged = True
            logger.info("%s/health is not served (404); readiness from /v1/models and the probe only", self.root_url)

        if sup is not None and sup.state in _SUP_STARTING:
            # Until its supervisor says running, whatever /health says: the UI never calls an engine ready (and answers
            # through it) while the launcher's status still says it (re)starts (issue #28: a restarted engine answered
            # /health and the probe up to a second before its supervisor's next check wrote "running").
            self._set(EngineState.STARTING, _supervisor_starting_text(sup), sup=sup, models_ok=False)
        elif not health.ok:
            self._health_unanswered(health, sup)
        elif health.status in (401, 403):
            self._set(EngineState.DOWN, _refused(health, Route.HEALTH), sup=sup, models_ok=False)
        elif not health_ok and self._ever_ready:
            self._set(EngineState.DOWN, Text("health.unhealthy", {"status": health.status}), sup=sup, models_ok=False)
        elif not health_ok:
            self._starting_or_timed_out(Text("health.loading"), sup)
        else:
            return replica_lists
        return None

    def _health_unanswered(self, health: _Http, sup: EngineStatus | None) -> None:
        """/health got no answer: slow or gone after having been ready, else still starting."""
        if self._ever_ready and health.error == "timeout":
            reason = Text("health.health_slow", {"seconds": self.settings.request_timeout})
            self._set(EngineState.DEGRADED, reason, sup=sup, models_ok=False)
        elif self._ever_ready:
            how = Text("health.replica_refused") if health.error == "refused" else Text.verbatim(health.error)
            reason = Text("health.stopped_answering", {"how": how, "url": self.root_url})
            self._set(EngineState.DOWN, reason, sup=sup, models_ok=False)
        else:
            self._starting_or_timed_out(Text("health.not_listening"), sup)

    async def _check_models(
        self, sup: EngineStatus | None, replica_lists: dict[int, tuple[ModelEntry, ...]]
    ) -> ModelEntry | None:
        """The model list (a fleet's: what every ready replica serves), kept; its base model, or None when the
        state is set."""
        partial: tuple[tuple[str, tuple[int, ...]], ...] = ()
        if replica_lists:  # a fleet: what every ready replica serves (the router's list is one replica's)
            models: tuple[ModelEntry, ...] | None
            models, partial = _fleet_models(replica_lists)
            models_resp = _Http(ok=True, status=200)
        else:  # no fleet, or no replica's list could be read from here: the router's
            models_resp = await self._get(self.api_url + "/models", self.settings.request_timeout)
            models = (
                _parse_models(models_resp.body, self.parents, self.base_name)
                if models_resp.ok and models_resp.status == 200
                else None
            )
        if models_resp.ok and models_resp.status in (401, 403):
            self._set(EngineState.DOWN, _refused(models_resp, Route.MODELS), sup=sup, models_ok=False)
            return None
        base = _base_of(models or ())
        if base is None and self._ever_ready:
            detail = Text.verbatim(models_resp.error or _error_detail(models_resp))
            if not models_resp.error and models_resp.status == 200:
                detail = Text("health.no_base_model")
            reason = Text("health.no_model_list", {"detail": detail})
            self._set(EngineState.DEGRADED, reason, sup=sup, models_ok=False)
        elif base is None:
            self._starting_or_timed_out(Text("health.waiting_models"), sup)
        else:
            self._update_models(models or (), partial)
        return base

    async def _check_probe(
        self, base: ModelEntry, answered: tuple[EngineState, Text] | None, sup: EngineStatus | None
    ) -> None:
        """A one-token generation on the base model when one is due; else the last answer's state again."""
        s = self.settings
        now = time.monotonic()
        due = (
            self._force_probe
            or answered is None
            or self._last_probe_at is None
            or now - self._last_probe_at >= s.probe_every
        )
        if not due:
            assert answered is not None
            self._answered = answered
            self._set(*answered, sup=sup, models_ok=True)
            return
        self._force_probe = False
        probe = await self._request(
            "POST",
            self.api_url + "/chat/completions",
            s.probe_timeout,
            probe_body(base.id),  # the same request as the supervisor's hang watchdog
        )
        self._last_probe_at = time.monotonic()
        if probe.ok and probe.status == 200 and isinstance(probe.body, dict) and probe.body.get("choices"):
            self._ever_ready = True  # it answered: a later refusal is a crash (DOWN), not "starting"
            self._fresh_answer = True
            if probe.latency > s.probe_slow:
                self._answered = (EngineState.DEGRADED, Text("health.slow", {"seconds": s.probe_slow}))
            else:
                self._answered = (EngineState.READY, Text("health.ready"))
            self._set(*self._answered, sup=sup, models_ok=True, latency=probe.latency)
        elif probe.error == "refused":
            state = EngineState.DOWN if self._ever_ready else EngineState.STARTING
            self._set(state, Text("health.probe_dropped"), sup=sup, models_ok=True)
        elif probe.error == "timeout":
            reason = Text("health.probe_timeout", {"seconds": s.probe_timeout})
            self._set(EngineState.DEGRADED, reason, sup=sup, models_ok=True)
        elif (self.replica_roots and probe.status >= 500 and any(r.ready for r in self._replica_view)) or isinstance(
            status_error(probe.status, probe.body, Route.CHAT), NoWorkerAvailable
        ):
            # Ready means routable: a router that answers /health (e.g. just restarted, its workers not checked yet)
            # but fails a request through it would fail the user's message too; wait for it like a start. A router
            # that says it has no worker (also one in front of replicas this app does not know) is one.
            reason = Text("health.router_not_routing", {"detail": _error_detail(probe)})
            if self._status.state is not EngineState.STARTING:  # "starting 12 s" counts from here, not the UI's start
                self._life_started = time.monotonic()
            self._set(EngineState.STARTING, reason, sup=sup, models_ok=True)
        else:
            reason = Text("health.probe_failed", {"detail": probe.error or _error_detail(probe)})
            self._set(EngineState.DEGRADED, reason, sup=sup, models_ok=True)

    # ------------------------------------------------------------ fleet replicas

    async def _poll_replicas(self) -> tuple[tuple[ReplicaHealth, ...], dict[int, tuple[ModelEntry, ...]]]:
        """Each replica's ``/health`` and ``/v1/models``, all at once: (each replica's view, the model list of each
        ready replica whose list could be read, by number)."""
        timeout = self.settings.request_timeout
        n = len(self.replica_roots)
        answers, sups = await asyncio.gather(
            asyncio.gather(
                *(self._get(root + "/health", timeout) for _, _, root in self.replica_roots),
                *(self._get(root + "/v1/models", timeout) for _, _, root in self.replica_roots),
            ),
            asyncio.to_thread(self._read_replica_status),
        )
        out = []
        lists: dict[int, tuple[ModelEntry, ...]] = {}
        for (number, address, _), resp, listed in zip(self.replica_roots, answers[:n], answers[n:], strict=True):
            sup = sups.get(number)
            # a local replica is ready once its supervisor says so too (as the router's: see _check_health)
            ready = resp.ok and resp.status == 200 and not (sup is not None and sup.state in _SUP_STARTING)
            text: Text | None
            if sup is not None and not ready and sup.state in (*_SUP_STARTING, *_SUP_DOWN):
                # the launcher's own replica: what its supervisor says (restarting, attempt 1 of 5, and why)
                text = _supervisor_down_text(sup) if sup.state in _SUP_DOWN else _supervisor_starting_text(sup)
            elif ready:
                text = None
                models = (
                    _parse_models(listed.body, self.parents, self.base_name)
                    if listed.ok and listed.status == 200
                    else None
                )
                if models is not None:
                    lists[number] = models
            elif resp.ok:
                text = Text.verbatim(_error_detail(resp))
            elif resp.error == "refused":
                text = Text("health.replica_refused")
            elif resp.error == "timeout":
                text = Text("health.replica_timeout", {"seconds": timeout})
            else:  # an aiohttp error: its class only (its text may quote the URL)
                text = Text.verbatim(resp.error.split(":", 1)[0])
            attempt, cause = (sup.attempt, sup.cause) if sup is not None else (None, "")
            out.append(ReplicaHealth(number, address, ready, text, attempt=attempt, cause=cause))
        return tuple(out), lists

    def _read_replica_status(self) -> dict[int, EngineStatus]:
        """The supervisor status files of this launcher's replicas (by number; missing files left out)."""
        found = {n: EngineStatus.read(path) for n, path in self.replica_status_files.items()}
        return {n: sup for n, sup in found.items() if sup is not None}

    def _note_replicas(self, replicas: tuple[ReplicaHealth, ...]) -> None:
        """Keep the replicas' view (published with the state it leads to); log each replica that went down or came
        back (once per change)."""
        old = {r.number: r for r in self._replica_view}
        roots = {n: root for n, _, root in self.replica_roots}
        for r in replicas:
            before = old.get(r.number)
            if before is not None and (before.ready, before.detail) == (r.ready, r.detail):
                continue
            if r.ready:
                logger.info("fleet replica %d (%s) is ready", r.number, public_url(roots[r.number]))
            elif before is not None and (before.ready or before.detail):
                logger.warning(
                    "fleet replica %d (%s) is not ready: %s", r.number, public_url(roots[r.number]), r.detail
                )
            else:
                logger.info(
                    "fleet replica %d (%s) is not ready yet: %s", r.number, public_url(roots[r.number]), r.detail
                )
        self._replica_view = replicas

    def _fleet_view(self, state: EngineState, reason: Text) -> tuple[EngineState, Text]:
        """The router's answering state (READY/DEGRADED) seen through its replicas (module docstring)."""
        reps = self._replica_view
        ready = sum(1 for r in reps if r.ready)
        if ready == len(reps):
            return state, reason
        which = Text.join(
            "; ",
            (
                Text("health.replica_down", {"number": r.number, "address": r.address, "detail": r.detail or "?"})
                for r in reps
                if not r.ready
            ),
        )

        if ready == 0:
            self._force_probe = True  # each poll asks the router again: is anything still answering?
            if self._fresh_answer:
                key, new_state = "health.replicas_unreachable", EngineState.DEGRADED
            else:
                key, new_state = "health.replicas_none", EngineState.DOWN
        else:
            key, new_state = "health.replicas_some", EngineState.DEGRADED
        said = Text(key, {"ready": ready, "total": len(reps), "which": which})
        if state is EngineState.DEGRADED and new_state is EngineState.DEGRADED:  # e.g. slow as well: say both
            said = Text.join(" · ", [said, reason])
        return new_state, said

    # ------------------------------------------------------------ state bookkeeping

    def _new_life(self, since: float | None) -> None:
        self._ever_ready = False
        self._no_metrics_until.clear()
        self._last_probe_at = None
        self._answered = None
        if since is not None:
            self._life_started = time.monotonic() - max(0.0, time.time() - since)
        else:
            self._life_started = time.monotonic()

    def _starting_or_timed_out(self, reason: Text, sup: EngineStatus | None) -> None:
        limit = self.settings.startup_limit
        if time.monotonic() - self._life_started >= limit:
            self._set(EngineState.DOWN, Text("health.never_ready", {"seconds": limit}), sup=sup, models_ok=False)
        else:
            self._set(EngineState.STARTING, reason, sup=sup, models_ok=False)

    def _update_models(
        self, models: tuple[ModelEntry, ...], partial: tuple[tuple[str, tuple[int, ...]], ...] = ()
    ) -> None:
        old = self._status
        if partial != old.partial_models:
            self._note_partial(old.partial_models, partial, {m.id for m in models})
            self._status = old = dataclasses.replace(old, partial_models=partial)
        if models != old.models:
            base = _base_of(models)
            self._status = dataclasses.replace(
                old,
                models=models,
                version=old.version + 1,
                base_model=base.id if base else None,
                max_model_len=base.max_model_len if base else None,
            )
            logger.info("engine models changed (version %d): %s", self._status.version, ", ".join(m.id for m in models))

    def _note_partial(
        self,
        before: tuple[tuple[str, tuple[int, ...]], ...],
        now: tuple[tuple[str, tuple[int, ...]], ...],
        offered: set[str],
    ) -> None:
        """Log each model that became (or stopped being) served by some ready replicas only, once per change."""
        addresses = {n: addr for n, addr, _ in self.replica_roots}
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

    def _set(
        self,
        state: EngineState,
        reason: Text,
        *,
        sup: EngineStatus | None,
        models_ok: bool,
        latency: float | None = None,
    ) -> None:
        if self.replica_roots and state in (EngineState.READY, EngineState.DEGRADED):
            state, reason = self._fleet_view(state, reason)
        old = self._status
        now = time.time()
        changed = state is not old.state or reason != old.reason
        new = dataclasses.replace(
            old,
            state=state,
            reason=reason,
            since=now if state is not old.state else old.since,
            models_stale=bool(old.models) and not models_ok,
            last_probe_latency=latency if latency is not None else old.last_probe_latency,
            checked_at=now,
            cause=(sup.cause or None) if sup else None,
            attempt=sup.attempt if sup else None,
            max_attempts=sup.max_attempts if sup else None,
            log_path=(sup.log_path or None) if sup else None,
            phase=(sup.phase or None) if sup and sup.state is SupervisorState.PREPARING else None,
            replicas=self._replica_view,
        )
        self._status = new
        key = (state, reason, new.version, new.models_stale, new.attempt, new.replicas, new.partial_models)
        notify = key != self._published
        self._published = key
        if changed:
            level = logging.INFO if state in (EngineState.STARTING, EngineState.READY) else logging.WARNING
            if state is old.state:
                logger.log(level, "engine %s: %s", state.value, reason)  # English
            else:
                logger.log(level, "engine %s → %s: %s", old.state.value, state.value, reason)
        if notify:
            snapshot = self.status
            for q in list(self._subscribers):
                _put_latest(q, snapshot)


def _put_latest(q: asyncio.Queue[HealthStatus | None], item: HealthStatus | None) -> None:
    """Queue ``item``; when full, drop the oldest so the latest always gets through."""
    while True:
        try:
            q.put_nowait(item)
            return
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()


class Subscription:
    """Async iterator of HealthStatus changes; ``aclose()`` (or leaving ``async with``) unsubscribes."""

    def __init__(self, poller: HealthPoller, queue: asyncio.Queue[HealthStatus | None]) -> None:
        self._poller = poller
        self._queue = queue
        self._closed = False

    def __aiter__(self) -> AsyncIterator[HealthStatus]:
        return self

    async def __anext__(self) -> HealthStatus:
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._closed = True
        self._poller._subscribers.discard(self._queue)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# ---------------------------------------------------------------- texts from the supervisor's file

_SUP_STARTING = (SupervisorState.PREPARING, SupervisorState.STARTING, SupervisorState.RESTARTING)
_SUP_DOWN = (SupervisorState.DOWN, SupervisorState.STOPPED)


def _supervisor_starting_text(sup: EngineStatus) -> Text:
    if sup.state is SupervisorState.PREPARING:
        if sup.phase == PHASE_INSTALL_ENGINE and sup.progress is not None:
            return Text("health.installing_pct", {"percent": max(0, min(100, sup.progress))})
        if sup.phase == PHASE_INSTALL_ENGINE:
            return Text("health.installing")
        if sup.phase == PHASE_CONVERT_MODEL:
            return Text("health.converting")
        if sup.phase == PHASE_DOWNLOAD_MODEL:
            return _downloading_text(sup)
        return Text("health.preparing")
    if sup.state is SupervisorState.RESTARTING:
        if sup.attempt and sup.max_attempts:
            params = {"reason": _reason(sup), "attempt": sup.attempt, "attempts": sup.max_attempts}
            return Text("health.restarting_attempt", params)
        return Text("health.restarting", {"reason": _reason(sup)})
    return Text("health.starting")


def _downloading_text(sup: EngineStatus) -> Text:
    """``downloading the model 34 % · 2.7 of 8.0 GB · 45 MB/s`` ([model] path's hub id, engine/download.py)."""
    if sup.progress is None or not sup.bytes_total or sup.bytes_done is None:
        return Text("health.downloading")
    done, total = hub.bytes_of(sup.bytes_done, sup.bytes_total)
    rate = hub.human_bytes(sup.bytes_rate or 0)
    percent = max(0, min(100, sup.progress))
    return Text("health.downloading_pct", {"percent": percent, "done": done, "total": total, "rate": rate})


def _supervisor_down_text(sup: EngineStatus) -> Text:
    if sup.state is SupervisorState.STOPPED:
        return Text("health.stopped")
    if sup.attempt:
        return Text("health.down_after", {"reason": _reason(sup), "attempt": sup.attempt})
    return Text("health.down", {"reason": _reason(sup)})


def _reason(sup: EngineStatus) -> Text:
    """The supervisor's cause (the file may hold none)."""
    return sup.reason or Text("health.engine_stopped")


def _refused(resp: _Http, route: Route) -> Text:
    """The status line for an answer the poller cannot get past (the key refused), from the one error table."""
    return status_error(resp.status, resp.body, route).as_text()


# ---------------------------------------------------------------- the shared instance

_shared: HealthPoller | None = None


def get_poller(
    base_url: str,
    api_key: str = "",
    settings: HealthSettings | None = None,
    status_file: str | Path | None = None,
    replicas: Sequence[str] = (),
    *,
    parents: Mapping[str, str] | None = None,
    base_name: str = "",
    local_replicas: int = 0,
) -> HealthPoller:
    """The process's one poller, created on first call (needs a running loop). Later calls return the
    same object; a call naming a different engine URL raises ValueError. A poller left over from a
    closed loop or stopped is replaced."""
    global _shared
    loop = asyncio.get_running_loop()
    p = _shared
    if p is not None and (p._stopped or (p._loop is not None and (p._loop is not loop or p._loop.is_closed()))):
        p = None
    if p is None:
        p = HealthPoller(
            base_url,
            api_key,
            settings,
            status_file,
            replicas,
            parents=parents,
            base_name=base_name,
            local_replicas=local_replicas,
        )
        p._loop = loop
        _shared = p
        return p
    wanted = HealthPoller(base_url).root_url
    if wanted != p.root_url:
        raise ValueError(f"the shared health poller watches {p.root_url}, not {wanted}; one engine per app process")
    return p


async def reset_shared() -> None:
    """Stop and forget the shared poller (tests; app shutdown)."""
    global _shared
    p, _shared = _shared, None
    if p is not None:
        await p.stop()


HealthPoller.shared = staticmethod(get_poller)  # type: ignore[attr-defined]

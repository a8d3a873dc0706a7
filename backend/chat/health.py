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
              (even with /health answering: ready only once the launcher's status says running); or refused /
              unhealthy after ready while its launcher's status still says running, for SUPERVISED_GRACE_S (the
              restart is coming: vLLM answers 503 for seconds after its EngineCore died, then exits);
              or the launcher still preparing (installing the engine, converting the model: ``phase``, no HTTP);
              or a fleet's router that answers /health while a probe through it fails with a 5xx (not routable)
    READY     health 200 (or no /health route), models listed, probe answered within probe_slow
    DEGRADED  after health 200 and models: probe timed out, failed or was slow; or /health or /v1/models stopped answering
    DOWN      refused (or unhealthy) after having been ready (any probe that answered, even slowly, counts as
              "ready" here), without a launcher or past its grace; never up within startup_limit; supervisor
              down/stopped; the engine refused our API key

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
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ..contract import EngineStatus
from ..probe import probe_body
from ..settings import HealthSettings  # re-exported: the [health] section
from ..text import Text
from .health_classify import Life, Poll, Verdict, classify, fleet_view, health_ok, probe_answered
from .health_fleet import Fleet, Partial
from .health_http import Http, new_session, root_of, send
from .health_life import EngineLife, LoadGauges
from .health_status import (
    METRICS_RETRY_S,
    EngineLoad,
    EngineState,
    HealthStatus,
    ModelEntry,
    ReplicaHealth,
    base_of,
    fleet_models,
    next_status,
    parse_load,
    parse_models,
    with_models,
)
from .health_subscriptions import Subscribers, Subscription, wait_for_state

__all__ = [
    "METRICS_RETRY_S",
    "EngineLoad",
    "EngineState",
    "HealthPoller",
    "HealthSettings",
    "HealthStatus",
    "ModelEntry",
    "ReplicaHealth",
    "Subscription",
    "get_poller",
    "parse_load",
    "reset_shared",
]

logger = logging.getLogger(__name__)

Lists = dict[int, tuple[ModelEntry, ...]]  # a fleet's replicas' model lists, by replica number


class HealthPoller:
    """Polls one engine; see the module docstring. Create with ``get_poller`` (one per process). It schedules the
    reads and keeps this engine life's bookkeeping; what the reads mean is ``health_classify.classify``'s."""

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
        self.root_url = root_of(base_url)
        # lineage where the server hides it: [lora] parents, and [model]'s name as the base (see with_lineage)
        self.parents = dict(parents or {})
        self.base_name = base_name
        self.api_url = self.root_url + "/v1"
        self.api_key = api_key
        self.settings = settings or HealthSettings()
        self.status_file = Path(status_file) if status_file else None
        self.fleet = Fleet(replicas, self.status_file, local_replicas)
        self._fresh_answer = False  # a probe through the router answered in the poll under way
        self._status = HealthStatus(
            state=EngineState.STARTING,
            reason=Text("health.waiting"),
            since=time.time(),
            checked_at=0.0,
            replicas=self.fleet.view,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[HealthStatus]]] = []  # (resolve after poll number, future)
        self.subscribers = Subscribers()
        self._force_probe = False
        self._stopped = False
        self.life = EngineLife()
        self.load_gauges = LoadGauges()
        self._health_404_logged = False
        self._published: tuple[Any, ...] = ()
        self._poll_seq = 0  # polls started

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
        self._session = self._session or new_session(self.api_key, 4 + len(self.fleet.roots))
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
        self.subscribers.close()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_result(self.status)
        self._waiters.clear()

    # ------------------------------------------------------------ public reads

    @property
    def status(self) -> HealthStatus:
        s = self._status
        if s.state is EngineState.STARTING:
            return dataclasses.replace(s, starting_elapsed=self.life.starting_for())
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
        done = {EngineState.READY, EngineState.DOWN} | ({EngineState.DEGRADED} if accept_degraded else set())
        async with self.subscribe() as sub:
            return await wait_for_state(
                sub, lambda: self.status, lambda: self._stopped, done, timeout, on_progress, progress_every
            )

    def subscribe(self) -> Subscription:
        """An async iterator of statuses: the current one first, then each change. Ends at stop().
        Slow readers only miss intermediate statuses, never the latest."""
        return self.subscribers.subscribe(self.status)

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
            answering = self._status.state is EngineState.READY or self.life.answered is not None
            interval = self.settings.poll_ready if answering else self.settings.poll_starting
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()

    async def _get(self, url: str, timeout: float) -> Http:
        return await self._request("GET", url, timeout)

    async def _request(self, method: str, url: str, timeout: float, payload: Any = None) -> Http:
        if self._session is None:  # refresh() before start(): a private one-shot session
            async with new_session(self.api_key, 4 + len(self.fleet.roots)) as session:
                return await send(session, method, url, timeout, payload)
        return await send(self._session, method, url, timeout, payload)

    async def _poll_once(self) -> None:
        """One poll: the supervisor's file, then /health, /v1/models and the probe, each read only while the ones
        before it decide nothing (``classify``)."""
        # Any early return below leaves this None, so the next poll that gets through probes again before it may
        # report READY.
        answered, self.life.answered = self.life.answered, None
        self._fresh_answer = False
        poll = Poll(sup=await self._read_supervisor())
        if self._decided(poll):
            return
        health, replica_lists = await self._read_health()
        self.life.note_health(health_ok(health, self._life()))
        poll = dataclasses.replace(poll, health=health)
        if self._decided(poll):
            return
        models_resp, models, partial = await self._read_models(replica_lists)
        poll = dataclasses.replace(poll, models=models_resp, base=base_of(models or ()))
        if self._decided(poll):
            return
        old, self._status = self._status, with_models(self._status, models or (), partial)
        _log_models(old, self._status, self.fleet)
        assert poll.base is not None
        await self._probe(poll, answered)
        await self._note_load()

    def _life(self) -> Life:
        over = self.life.starting_for() >= self.settings.startup_limit
        fleet, ready = bool(self.fleet), self.fleet.any_ready
        return Life(self.life.ever_ready, over, fleet, ready, self.root_url, self.life.lost_for())

    def _decided(self, poll: Poll) -> bool:
        """Set the state the poll so far decides, if it decides one."""
        verdict = classify(poll, self._life(), self.settings)
        if verdict is not None:
            self._set(verdict, poll.sup)
        return verdict is not None

    async def _read_health(self) -> tuple[Http, Lists]:
        """``GET /health``, and a fleet's replicas at the same time (one poll's time): the answer, and the model
        list of each ready replica whose list could be read."""
        timeout = self.settings.request_timeout
        lists: Lists = {}
        if self.fleet:
            health, (replicas, lists) = await asyncio.gather(
                self._get(self.root_url + "/health", timeout),
                self.fleet.poll(self._get, timeout, self.parents, self.base_name),
            )
            self.fleet.note(replicas)
        else:
            health = await self._get(self.root_url + "/health", timeout)
        if health.ok and health.status == 404 and not self._health_404_logged:
            self._health_404_logged = True
            logger.info("%s/health is not served (404); readiness from /v1/models and the probe only", self.root_url)
        return health, lists

    async def _read_models(self, replica_lists: Lists) -> tuple[Http, tuple[ModelEntry, ...] | None, Partial]:
        """The model list: a fleet's is what every ready replica serves (the router's is one replica's); with no
        fleet, or no replica's list read from here, the router's ``/v1/models``."""
        if replica_lists:
            models, partial = fleet_models(replica_lists)
            return Http(ok=True, status=200), models, partial
        resp = await self._get(self.api_url + "/models", self.settings.request_timeout)
        ok = resp.ok and resp.status == 200
        return resp, parse_models(resp.body, self.parents, self.base_name) if ok else None, ()

    async def _probe(self, poll: Poll, answered: Verdict | None) -> None:
        """A one-token generation on the base model when one is due; else the last answer's state again."""
        s, life = self.settings, self.life
        if not life.probe_due(self._force_probe, answered, s.probe_every):
            assert answered is not None
            life.answered = answered
            self._set(answered, poll.sup)
            return
        self._force_probe = False
        assert poll.base is not None
        # the same request as the supervisor's hang watchdog
        url = self.api_url + "/chat/completions"
        probe = await self._request("POST", url, s.probe_timeout, probe_body(poll.base.id))
        life.last_probe_at = time.monotonic()
        verdict = classify(dataclasses.replace(poll, probe=probe), self._life(), s)
        assert verdict is not None
        if probe_answered(probe):
            life.ever_ready = True  # it answered: a later refusal is a crash (DOWN), not "starting"
            self._fresh_answer = True
            life.answered = verdict
            self._set(verdict, poll.sup, latency=probe.latency)
            return
        if verdict.state is EngineState.STARTING and probe.ok and self._status.state is not EngineState.STARTING:
            life.started = time.monotonic()  # a router not routing: "starting 12 s" counts from here
        self._set(verdict, poll.sup)

    async def _note_load(self) -> None:
        """vLLM's ``/metrics`` (each replica's in a fleet, summed; the engine key as for every request): how many
        requests run and wait (``LoadGauges``). Published when it changes."""
        roots = [root for _, _, root in self.fleet.roots] or [self.root_url]
        load = await self.load_gauges.read(self._get, roots, self.settings.request_timeout)
        if load != self._status.load:
            self._status = dataclasses.replace(self._status, load=load)
            self.subscribers.publish(self.status)

    async def _read_supervisor(self) -> EngineStatus | None:
        """The supervisor's status file (None without one); a (re)start or a new engine process begins a new life."""
        sup = await asyncio.to_thread(EngineStatus.read, self.status_file) if self.status_file else None
        if sup is not None and self.life.note_supervisor(sup):
            self.load_gauges.forget()
        return sup

    # ------------------------------------------------------------ the status

    def _set(self, verdict: Verdict, sup: EngineStatus | None, latency: float | None = None) -> None:
        """The new status (a fleet's through its replicas); logged when state or reason change, published when
        anything a reader shows changes."""
        state, reason = verdict.state, verdict.reason
        if self.fleet and state in (EngineState.READY, EngineState.DEGRADED):
            if not self.fleet.any_ready:
                self._force_probe = True  # each poll asks the router again: is anything still answering?
            state, reason = fleet_view(state, reason, self.fleet.view, self._fresh_answer)
        old = self._status
        new = self._status = next_status(old, state, reason, verdict.models_ok, sup, latency, self.fleet.view)
        _log_transition(old, new)
        key = (state, reason, new.version, new.models_stale, new.attempt, new.replicas, new.partial_models)
        if key != self._published:
            self._published = key
            self.subscribers.publish(self.status)


def _log_transition(old: HealthStatus, new: HealthStatus) -> None:
    """Once per change of state or reason (in English)."""
    if new.state is old.state and new.reason == old.reason:
        return
    level = logging.INFO if new.state in (EngineState.STARTING, EngineState.READY) else logging.WARNING
    if new.state is old.state:
        logger.log(level, "engine %s: %s", new.state.value, new.reason)
    else:
        logger.log(level, "engine %s → %s: %s", old.state.value, new.state.value, new.reason)


def _log_models(old: HealthStatus, new: HealthStatus, fleet: Fleet) -> None:
    """A new model list, and in a fleet each model served by some ready replicas only, once per change."""
    if new.partial_models != old.partial_models:
        fleet.note_partial(old.partial_models, new.partial_models, {m.id for m in new.models})
    if new.version != old.version:
        logger.info("engine models changed (version %d): %s", new.version, ", ".join(m.id for m in new.models))


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

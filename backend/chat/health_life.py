"""What the health poller remembers between polls: this engine life's bookkeeping (``EngineLife``), and which
servers have vLLM's load gauges (``LoadGauges``). A (re)start or a new engine process begins a new life."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..contract import EngineStatus
from .health_classify import SUP_STARTING, Verdict
from .health_http import Http
from .health_status import METRICS_RETRY_S, EngineLoad, parse_load


class EngineLife:
    """Since the engine (re)started: whether a probe answered, when it started (monotonic), the last probe."""

    def __init__(self) -> None:
        self.ever_ready = False
        self.started = time.monotonic()
        self.last_probe_at: float | None = None  # monotonic
        # the outcome of the last probe that answered (READY or slow DEGRADED), replayed between
        # probes; None while probes fail or after /health or /v1/models failed: probe on every poll
        self.answered: Verdict | None = None
        self.lost_since: float | None = None  # monotonic: /health stopped saying go on after it had (None: it does)
        self._sup_key: tuple[Any, ...] | None = None

    def begin(self, since: float | None = None) -> None:
        """A new life, started at ``since`` (epoch; now without one)."""
        self.ever_ready = False
        self.last_probe_at = None
        self.answered = None
        self.lost_since = None
        self.started = time.monotonic() - (max(0.0, time.time() - since) if since is not None else 0.0)

    def note_supervisor(self, sup: EngineStatus) -> bool:
        """Read the supervisor's status: True when it begins a new life (a (re)start, a new engine process, or
        the first status seen; "ever ready" and the starting clock, from the supervisor's "since", start over)."""
        key = (sup.state, sup.pid, sup.attempt)
        if key == self._sup_key:
            return False
        new_process = self._sup_key is not None and sup.pid != self._sup_key[1]
        new = sup.state in SUP_STARTING or new_process or self._sup_key is None
        self._sup_key = key
        if new:
            self.begin(sup.since)
        return new

    def note_health(self, ok: bool) -> None:
        """Whether this poll's /health said go on. Once a ready engine's stops, its (re)start clock counts from
        then: the status line's "starting 3 s" while the launcher is about to restart it."""
        if ok:
            self.lost_since = None
        elif self.ever_ready and self.lost_since is None:
            self.lost_since = self.started = time.monotonic()

    def lost_for(self) -> float:
        return 0.0 if self.lost_since is None else time.monotonic() - self.lost_since

    def probe_due(self, force: bool, answered: Verdict | None, every: float) -> bool:
        """A probe is due when forced, after one that did not answer (``answered`` None), or ``every`` seconds
        after the last."""
        last = self.last_probe_at
        return force or answered is None or last is None or time.monotonic() - last >= every

    def starting_for(self) -> float:
        return max(0.0, time.monotonic() - self.started)


class LoadGauges:
    """vLLM's ``/metrics`` gauges summed over the servers asked. A server whose /metrics is 404 (an external
    server that is no vLLM) is asked again only ``METRICS_RETRY_S`` later, or after an engine (re)start."""

    def __init__(self) -> None:
        self.no_metrics_until: dict[str, float] = {}  # root -> monotonic

    def forget(self) -> None:
        self.no_metrics_until.clear()

    async def read(
        self, get: Callable[[str, float], Awaitable[Http]], roots: Sequence[str], timeout: float
    ) -> EngineLoad | None:
        """The load (``EngineLoad``), or None when no answer has the gauges."""
        now = time.monotonic()
        roots = [root for root in roots if self.no_metrics_until.get(root, 0.0) <= now]
        answers = await asyncio.gather(*(get(root + "/metrics", timeout) for root in roots))
        for root, answer in zip(roots, answers, strict=True):
            if answer.ok and answer.status == 404:
                self.no_metrics_until[root] = now + METRICS_RETRY_S
        loads = [parse_load(a.body) for a in answers if a.ok and a.status == 200 and isinstance(a.body, str)]
        known = [load for load in loads if load is not None]
        return EngineLoad(sum(x.running for x in known), sum(x.waiting for x in known)) if known else None

"""The engine's state from what one poll read, as pure functions (no I/O, no clock): the table health.py's
docstring describes, tested row by row in tests/unit/chat/test_health_classify.py.

    verdict = classify(Poll(sup=sup, health=answer), Life(ever_ready=True), settings)
    verdict                        # None: the stages read so far decide nothing; ask the next one
    verdict.state, verdict.reason  # else the state and why, and whether the model list read holds

A poll reads in stages (the supervisor's file, ``/health``, ``/v1/models``, the probe) and stops at the first that
decides; a stage not read is None in ``Poll``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import hub
from ..contract import PHASE_CONVERT_MODEL, PHASE_DOWNLOAD_MODEL, PHASE_INSTALL_ENGINE, EngineStatus, SupervisorState
from ..engine_http import Route, status_error
from ..errors import NoWorkerAvailable
from ..settings import HealthSettings
from ..text import Text
from .health_http import Http, error_detail
from .health_status import EngineState, ModelEntry, ReplicaHealth

SUP_STARTING = (SupervisorState.PREPARING, SupervisorState.STARTING, SupervisorState.RESTARTING)
SUP_DOWN = (SupervisorState.DOWN, SupervisorState.STOPPED)
# How long an engine the launcher supervises may stop answering while its status still says "running" before that
# counts as down. Its supervisor sees the process exit within a second; vLLM's API server answers /health with 503
# for a few seconds after its EngineCore died (the OOM killer's pick), then exits. Meanwhile a message waits for
# the restart instead of failing (issue #28).
SUPERVISED_GRACE_S = 30.0


@dataclass(frozen=True)
class Poll:
    """What one poll has read so far (a stage not read yet is None)."""

    sup: EngineStatus | None = None  # the supervisor's status file (None also without one)
    health: Http | None = None  # GET /health
    models: Http | None = None  # GET /v1/models (a fleet's: an ``ok`` 200 standing for the replicas' lists)
    base: ModelEntry | None = None  # the base model of that list
    probe: Http | None = None  # the one-token generation


@dataclass(frozen=True)
class Life:
    """What the poller knows of this engine's life."""

    ever_ready: bool = False  # a probe answered since the engine (re)started
    startup_over: bool = False  # [health].startup_limit passed since it started
    fleet: bool = False  # the base URL is a router in front of replicas
    replica_ready: bool = False  # a fleet replica answers its own /health
    root_url: str = ""
    lost_for: float = 0.0  # seconds /health has not said go on since it last did, in this life (0: it does)


@dataclass(frozen=True)
class Verdict:
    state: EngineState
    reason: Text
    models_ok: bool = False  # the model list this poll read holds (else it is kept, marked stale)


def classify(poll: Poll, life: Life, settings: HealthSettings) -> Verdict | None:
    """The state the stages read so far decide, or None when the next stage must be read."""
    sup = poll.sup
    if sup is not None and sup.state in SUP_DOWN:
        return Verdict(EngineState.DOWN, supervisor_down_text(sup))
    if sup is not None and sup.state is SupervisorState.PREPARING:
        # no engine process yet: nothing to ask over HTTP, and no start-up limit while the launcher prepares
        return Verdict(EngineState.STARTING, supervisor_starting_text(sup))
    if poll.health is None:
        return None
    verdict = _health(poll.health, sup, life, settings)
    if verdict is not None or poll.models is None:
        return verdict
    verdict = _models(poll.models, poll.base, life, settings)
    if verdict is not None or poll.probe is None:
        return verdict
    return _probe(poll.probe, life, settings)


def health_ok(health: Http, life: Life) -> bool:
    """/health says go on: 200, or not served (404); a fleet's router also with 503 while a replica is ready
    (vllm-router's /health is 503 as soon as one replica is unhealthy; it still routes to the others)."""
    if life.fleet and health.ok and health.status == 503 and life.replica_ready:
        return True
    return health.ok and health.status in (200, 404)


def _starting(reason: Text, life: Life, settings: HealthSettings) -> Verdict:
    if life.startup_over:
        return Verdict(EngineState.DOWN, Text("health.never_ready", {"seconds": settings.startup_limit}))
    return Verdict(EngineState.STARTING, reason)


def _health(health: Http, sup: EngineStatus | None, life: Life, settings: HealthSettings) -> Verdict | None:
    ok = health_ok(health, life)
    if sup is not None and sup.state in SUP_STARTING:
        # Until its supervisor says running, whatever /health says: the UI never calls an engine ready (and answers
        # through it) while the launcher's status still says it (re)starts (issue #28: a restarted engine answered
        # /health and the probe up to a second before its supervisor's next check wrote "running").
        return Verdict(EngineState.STARTING, supervisor_starting_text(sup))
    if not health.ok:  # no answer: slow or gone after having been ready, else still starting
        if life.ever_ready and health.error == "timeout":
            return Verdict(EngineState.DEGRADED, Text("health.health_slow", {"seconds": settings.request_timeout}))
        if life.ever_ready:
            how = Text("health.replica_refused") if health.error == "refused" else Text.verbatim(health.error)
            return _lost(Text("health.stopped_answering", {"how": how, "url": life.root_url}), sup, life)
        return _starting(Text("health.not_listening"), life, settings)
    if health.status in (401, 403):
        return Verdict(EngineState.DOWN, refused(health, Route.HEALTH))
    if not ok and life.ever_ready:
        return _lost(Text("health.unhealthy", {"status": health.status}), sup, life)
    if not ok:
        return _starting(Text("health.loading"), life, settings)
    return None


def _lost(why: Text, sup: EngineStatus | None, life: Life) -> Verdict:
    """A ready engine that stopped answering: DOWN, unless the launcher supervises it and has not seen it yet
    (still "running", for ``SUPERVISED_GRACE_S``): then STARTING, for the restart that is coming."""
    if sup is not None and sup.state is SupervisorState.RUNNING and life.lost_for < SUPERVISED_GRACE_S:
        return Verdict(EngineState.STARTING, Text("health.supervised_lost", {"why": why}))
    return Verdict(EngineState.DOWN, why)


def _models(models: Http, base: ModelEntry | None, life: Life, settings: HealthSettings) -> Verdict | None:
    if models.ok and models.status in (401, 403):
        return Verdict(EngineState.DOWN, refused(models, Route.MODELS))
    if base is None and life.ever_ready:
        detail = Text.verbatim(models.error or error_detail(models))
        if not models.error and models.status == 200:
            detail = Text("health.no_base_model")
        return Verdict(EngineState.DEGRADED, Text("health.no_model_list", {"detail": detail}))
    if base is None:
        return _starting(Text("health.waiting_models"), life, settings)
    return None


def probe_answered(probe: Http) -> bool:
    return probe.ok and probe.status == 200 and isinstance(probe.body, dict) and bool(probe.body.get("choices"))


def _probe(probe: Http, life: Life, settings: HealthSettings) -> Verdict:
    if probe_answered(probe):
        if probe.latency > settings.probe_slow:
            return Verdict(EngineState.DEGRADED, Text("health.slow", {"seconds": settings.probe_slow}), True)
        return Verdict(EngineState.READY, Text("health.ready"), True)
    if probe.error == "refused":
        return Verdict(
            EngineState.DOWN if life.ever_ready else EngineState.STARTING, Text("health.probe_dropped"), True
        )
    if probe.error == "timeout":
        return Verdict(EngineState.DEGRADED, Text("health.probe_timeout", {"seconds": settings.probe_timeout}), True)
    if (life.fleet and probe.status >= 500 and life.replica_ready) or isinstance(
        status_error(probe.status, probe.body, Route.CHAT), NoWorkerAvailable
    ):
        # Ready means routable: a router that answers /health (e.g. just restarted, its workers not checked yet)
        # but fails a request through it would fail the user's message too; wait for it like a start. A router
        # that says it has no worker (also one in front of replicas this app does not know) is one.
        return Verdict(EngineState.STARTING, Text("health.router_not_routing", {"detail": error_detail(probe)}), True)
    reason = Text("health.probe_failed", {"detail": probe.error or error_detail(probe)})
    return Verdict(EngineState.DEGRADED, reason, True)


def fleet_view(
    state: EngineState, reason: Text, replicas: Sequence[ReplicaHealth], fresh_answer: bool
) -> tuple[EngineState, Text]:
    """The router's answering state (READY/DEGRADED) seen through its replicas (health.py's docstring);
    ``fresh_answer``: a probe through the router answered in this very poll."""
    ready = sum(1 for r in replicas if r.ready)
    if ready == len(replicas):
        return state, reason
    which = Text.join(
        "; ",
        (
            Text("health.replica_down", {"number": r.number, "address": r.address, "detail": r.detail or "?"})
            for r in replicas
            if not r.ready
        ),
    )
    if ready == 0 and fresh_answer:
        key, new_state = "health.replicas_unreachable", EngineState.DEGRADED
    elif ready == 0:
        key, new_state = "health.replicas_none", EngineState.DOWN
    else:
        key, new_state = "health.replicas_some", EngineState.DEGRADED
    said = Text(key, {"ready": ready, "total": len(replicas), "which": which})
    if state is EngineState.DEGRADED and new_state is EngineState.DEGRADED:  # e.g. slow as well: say both
        said = Text.join(" · ", [said, reason])
    return new_state, said


def replica_text(resp: Http, sup: EngineStatus | None, timeout: float) -> Text | None:
    """Why a fleet replica is not ready (None when it is): its supervisor's words for the launcher's own replica,
    else what its /health answered."""
    # a local replica is ready once its supervisor says so too (as the router's: see _health)
    ready = resp.ok and resp.status == 200 and not (sup is not None and sup.state in SUP_STARTING)
    if sup is not None and not ready and sup.state in (*SUP_STARTING, *SUP_DOWN):
        # the launcher's own replica: what its supervisor says (restarting, attempt 1 of 5, and why)
        return supervisor_down_text(sup) if sup.state in SUP_DOWN else supervisor_starting_text(sup)
    if ready:
        return None
    if resp.ok:
        return Text.verbatim(error_detail(resp))
    if resp.error == "refused":
        return Text("health.replica_refused")
    if resp.error == "timeout":
        return Text("health.replica_timeout", {"seconds": timeout})
    return Text.verbatim(resp.error.split(":", 1)[0])  # an aiohttp error: its class only (its text may quote the URL)


# ---------------------------------------------------------------- texts from the supervisor's file


def supervisor_starting_text(sup: EngineStatus) -> Text:
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


def supervisor_down_text(sup: EngineStatus) -> Text:
    if sup.state is SupervisorState.STOPPED:
        return Text("health.stopped")
    if sup.attempt:
        return Text("health.down_after", {"reason": _reason(sup), "attempt": sup.attempt})
    return Text("health.down", {"reason": _reason(sup)})


def _reason(sup: EngineStatus) -> Text:
    """The supervisor's cause (the file may hold none)."""
    return sup.reason or Text("health.engine_stopped")


def refused(resp: Http, route: Route) -> Text:
    """The status line for an answer the poller cannot get past (the key refused), from the one error table."""
    return status_error(resp.status, resp.body, route).as_text()

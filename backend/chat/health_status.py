"""What the health poller knows, as values: the engine's state, its models, its replicas and load (``HealthStatus``);
and the model list read from ``/v1/models`` (one engine's, or what every ready replica of a fleet serves).

The poller (health.py) makes them; everything else reads them. See health.py's docstring for the states.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract import EngineStatus, SupervisorState
from ..text import Text, t


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


def next_status(
    old: HealthStatus,
    state: EngineState,
    reason: Text,
    models_ok: bool,
    sup: EngineStatus | None,
    latency: float | None,
    replicas: tuple[ReplicaHealth, ...],
) -> HealthStatus:
    """The status after a poll: ``old``'s model list kept (stale unless this poll read it), the supervisor's
    restart attempt, cause and log path, the probe's latency when it answered."""
    now = time.time()
    return dataclasses.replace(
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
        replicas=replicas,
    )


# ---------------------------------------------------------------- the model list


def parse_models(
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
    return with_lineage(tuple(out), shown, parents or {}, base_name)


def with_lineage(
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


def base_of(models: tuple[ModelEntry, ...]) -> ModelEntry | None:
    """The base model: the first known one, else (lineage hidden and undeclared) the first that is no adapter,
    for the probe and as the chat's default model."""
    return next((m for m in models if m.is_base), None) or next((m for m in models if m.parent is None), None)


def fleet_models(
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

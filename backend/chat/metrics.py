"""The UI's own metrics, in the Prometheus text exposition format (version 0.0.4), for ``GET /metrics``.

    metrics.METRICS.first_token(model, seconds)      # turn.py: the first streamed token of an answer
    metrics.METRICS.answered(model, seconds)         # turn.py: an answer shown whole
    metrics.METRICS.outcome("ok" | error code, model)   # turn.py: how each answer ended, by the model asked
    with metrics.METRICS.streaming(): ...            # turn.py: an answer streaming now
    metrics.METRICS.observe_engine(status)           # ui/server.py: every poller snapshot (restarts by cause, per replica)
    text = metrics.METRICS.render(engine=status, active_sessions=n, anomalies=client.anomaly_counts())

Per process, since it started (several UI processes each have their own; Prometheus sums them). The counts are
kept here (the restart counts are derived from the poller's snapshots, which prometheus_client's own metric objects
cannot express); the families are built for each scrape and written by ``prometheus_client``, so the text is
Prometheus's own. vLLM's own metrics are at the engine's ``/metrics`` (its port, with the engine key), not here.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .health import EngineState, HealthStatus

#: Content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

#: Seconds. On CPU a first token can take tens of seconds (a cold engine, a long prompt); on a GPU, well under one.
FIRST_TOKEN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ANSWER_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)

#: ``qwenchat_answers_total`` outcome of an answer shown whole; the others are error codes (errors.py) or these.
OK = "ok"
STOPPED = "stopped"  # the user pressed Stop
NO_TEXT = "no_text"  # the stream ended without answer text (a tool call, a content filter, reasoning only)
APP_ERROR = "app_error"  # a bug in the app
ENGINE_DOWN = "engine_down"  # the engine was down when the message came
ADAPTER = "adapter"  # a compare side whose adapter could not be loaded

UNKNOWN_CAUSE = "unknown"


def _new_restarts(last: int, attempt: int) -> int:
    """Restarts a supervisor's ``attempt`` (restarts within its window) reveals after ``last``: a rise counts the
    difference; a fall to a number above 0 is a restart in a new window (the old ones aged out); a fall to 0 is a
    new launch; the same number, nothing."""
    return attempt - last if attempt > last else (1 if 0 < attempt < last else 0)


@dataclass
class _Histogram:
    """One label set's observations: per-bucket counts (not cumulative; the last is +Inf), their sum and count."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound as Prometheus spells it, cumulative count) for HistogramMetricFamily."""
        bounds = [floatToGoString(b) for b in self.buckets] + ["+Inf"]  # type: ignore[no-untyped-call]
        return list(zip(bounds, itertools.accumulate(self.counts), strict=True))


class Metrics:
    """Counters, gauges and histograms of one UI process; thread-safe (the Chainlit loop and to_thread callers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first_token: dict[str, _Histogram] = {}
        self._answer: dict[str, _Histogram] = {}
        self._outcomes: Counter[tuple[str, str]] = Counter()  # (model, outcome)
        self._streaming = 0
        self._restarts: Counter[str] = Counter()
        self._last_attempt = 0
        self._replica_restarts: Counter[tuple[int, str]] = Counter()  # (replica number, cause)
        self._replica_attempts: dict[int, int] = {}
        self._history_failures: Counter[str] = Counter()  # by cause (database.CAUSES)
        self._history_pending = 0

    # ------------------------------------------------------------ updates

    def first_token(self, model: str, seconds: float) -> None:
        with self._lock:
            self._first_token.setdefault(model, _Histogram(FIRST_TOKEN_BUCKETS)).observe(seconds)

    def answered(self, model: str, seconds: float) -> None:
        with self._lock:
            self._answer.setdefault(model, _Histogram(ANSWER_BUCKETS)).observe(seconds)

    def outcome(self, outcome: str, model: str) -> None:
        with self._lock:
            self._outcomes[(model, outcome)] += 1

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """An answer streams for the duration of the block (also left on error or Stop)."""
        with self._lock:
            self._streaming += 1
        try:
            yield
        finally:
            with self._lock:
                self._streaming -= 1

    def history_failed(self, cause: str) -> None:
        with self._lock:
            self._history_failures[cause] += 1

    def history_pending(self, writes: int) -> None:
        with self._lock:
            self._history_pending = writes

    def observe_engine(self, status: HealthStatus) -> None:
        """Count the restarts this snapshot reveals, from the supervisor's ``attempt`` (``_new_restarts``), and in
        a fleet from each local replica's. Snapshots repeat: the same attempt counts nothing."""
        with self._lock:
            if status.attempt is not None:  # else no supervisor (external engine), or no status file yet
                new = _new_restarts(self._last_attempt, status.attempt)
                self._last_attempt = status.attempt
                if new:
                    self._restarts[status.cause or UNKNOWN_CAUSE] += new
            for r in status.replicas:  # a fleet: the launcher's own replicas have supervisors too
                if r.attempt is None:
                    continue
                new = _new_restarts(self._replica_attempts.get(r.number, 0), r.attempt)
                self._replica_attempts[r.number] = r.attempt
                if new:
                    self._replica_restarts[(r.number, r.cause or UNKNOWN_CAUSE)] += new

    def reset(self) -> None:
        """Tests only: back to a fresh process."""
        self.__init__()  # type: ignore[misc]

    # ------------------------------------------------------------ the exposition text

    def render(self, *, engine: HealthStatus, active_sessions: int, anomalies: Mapping[str, int]) -> str:
        """The text exposition of this process's metrics and the given snapshot (prometheus_client's writer)."""
        self.observe_engine(engine)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(self._families(engine, active_sessions, anomalies)))
        return generate_latest(registry).decode()

    def _families(self, engine: HealthStatus, active_sessions: int, anomalies: Mapping[str, int]) -> list[Metric]:
        """Every family, in the order /metrics has always listed them; those of a fleet only with a fleet."""
        with self._lock:
            out: list[Metric] = [
                _histograms("qwenchat_first_token_seconds", self._first_token, _HELP["first_token"]),
                _histograms("qwenchat_answer_seconds", self._answer, _HELP["answer"]),
                _counter("qwenchat_answers", _HELP["answers"], ("model", "outcome"), self._outcomes),
                _gauge("qwenchat_streaming_answers", _HELP["streaming"], self._streaming),
                _counter("qwenchat_engine_restarts", _HELP["restarts"], ("cause",), self._restarts),
                _gauge("qwenchat_history_pending_writes", _HELP["history_pending"], self._history_pending),
                _counter(
                    "qwenchat_history_write_failures", _HELP["history_failures"], ("cause",), self._history_failures
                ),
            ]
            if self._replica_restarts:
                replica_restarts = {(str(n), cause): v for (n, cause), v in self._replica_restarts.items()}
                out.append(
                    _counter(
                        "qwenchat_replica_restarts", _HELP["replica_restarts"], ("replica", "cause"), replica_restarts
                    )
                )
        out.append(_counter("qwenchat_stream_anomalies", _HELP["anomalies"], ("kind",), anomalies))
        out.append(_gauge("qwenchat_active_sessions", _HELP["sessions"], active_sessions))
        state = GaugeMetricFamily("qwenchat_engine_state", _HELP["state"], labels=("state",))
        for s in EngineState:
            state.add_metric((s.value,), 1 if engine.state is s else 0)
        out.append(state)
        if engine.replicas:  # a [fleet]: each replica as the poller last saw it (its own /health)
            ready = GaugeMetricFamily("qwenchat_replica_ready", _HELP["replica_ready"], labels=("replica", "address"))
            for r in engine.replicas:
                ready.add_metric((str(r.number), r.address), 1 if r.ready else 0)
            out.append(ready)
        attempt = GaugeMetricFamily("qwenchat_engine_restart_attempt", _HELP["attempt"])
        if engine.attempt is not None:  # absent with an external engine
            attempt.add_metric((), engine.attempt)
        out.append(attempt)
        return out


class _Scrape(Collector):
    """One scrape's families, ready-made (the registry asks a collector for them)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _histograms(name: str, per_model: Mapping[str, _Histogram], text: str) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text, labels=("model",))
    for model in sorted(per_model):
        h = per_model[model]
        family.add_metric((model,), h.cumulative(), h.total)
    return family


def _counter(name: str, text: str, labels: tuple[str, ...], values: Mapping[Any, float]) -> CounterMetricFamily:
    """``name`` without ``_total``: prometheus_client adds it to the sample (and the parser strips it again)."""
    family = CounterMetricFamily(name, text, labels=labels)
    for key in sorted(values):
        family.add_metric(key if isinstance(key, tuple) else (key,), values[key])
    return family


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


_HELP = {
    "first_token": "Seconds from the user's message to the first streamed token, per model "
    "(includes any wait for the engine and an adapter load).",
    "answer": "Seconds from the user's message to the last token of an answer shown whole, per model.",
    "answers": "Answers by the model asked and outcome: ok, or the error code (errors.py), stopped, no_text, "
    "app_error, engine_down.",
    "streaming": "Answers streaming now.",
    "restarts": "Engine restarts seen by this UI process, by cause: rises of the supervisor status file's attempt "
    "(restarts within its window) as the health poller read it.",
    "replica_restarts": "A fleet's local replicas: restarts seen by this UI process, by replica and cause (each "
    "replica's own supervisor status file, read as for qwenchat_engine_restarts_total).",
    "anomalies": "Chat requests whose stream had each anomaly kind (one count per request and kind).",
    "sessions": "Browser chat sessions connected now.",
    "state": "The engine's state as the UI sees it: 1 for the current state.",
    "replica_ready": "A fleet's replicas as the UI sees them: 1 if the replica answers its own /health, else 0.",
    "attempt": "The supervisor's attempt now (restarts within its window; absent with an external engine).",
    "history_pending": "History writes kept (journalled) and not stored yet: the database is locked, full, slow or down.",
    "history_failures": "Failed history write attempts (each retried), by cause: locked, full, down, slow, error.",
}


METRICS = Metrics()

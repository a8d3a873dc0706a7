"""The UI's own metrics, in the Prometheus text exposition format (version 0.0.4), for ``GET /metrics``.

    metrics.METRICS.first_token(model, seconds)      # turn.py: the first streamed token of an answer
    metrics.METRICS.answered(model, seconds)         # turn.py: an answer shown whole
    metrics.METRICS.outcome("ok" | error code, model)   # turn.py: how each answer ended, by the model asked
    with metrics.METRICS.streaming(): ...            # turn.py: an answer streaming now
    metrics.METRICS.observe_engine(status)           # ui/server.py: every poller snapshot (restarts by cause, per replica)
    text = metrics.METRICS.render(engine=status, active_sessions=n, anomalies=client.anomaly_counts())

Per process, since it started (several UI processes each have their own; Prometheus sums them). Each family is a
prometheus_client ``Histogram``, ``Counter`` or ``Gauge`` in this process's own ``CollectorRegistry`` (not the
library's global one), written by ``generate_latest``. Two kinds of values are set at each scrape rather than
counted: the engine snapshot's (state, replicas, attempt) and the client's stream anomaly counts, which client.py
keeps (a small collector reads them). vLLM's own metrics are at the engine's ``/metrics`` (its port, with the engine
key), not here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.chat.health import EngineState, HealthStatus

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

#: Families written only when they have a sample: those of a fleet.
_FLEET_ONLY = frozenset({"qwenchat_replica_restarts", "qwenchat_replica_ready"})


def _new_restarts(last: int, attempt: int) -> int:
    """Restarts a supervisor's ``attempt`` (restarts within its window) reveals after ``last``: a rise counts the
    difference; a fall to a number above 0 is a restart in a new window (the old ones aged out); a fall to 0 is a
    new launch; the same number, nothing."""
    return attempt - last if attempt > last else (1 if 0 < attempt < last else 0)


class _Registry(CollectorRegistry):
    """This process's registry, written as /metrics has always been: no ``_created`` series (a library-wide switch
    otherwise), no fleet family without a fleet, and a family in ``without_samples`` as HELP and TYPE only."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.without_samples: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            family.samples = [
                s for s in family.samples if not s.name.endswith("_created") and family.name not in self.without_samples
            ]
            if family.samples or family.name not in _FLEET_ONLY:
                yield family


class _Anomalies(Collector):
    """``qwenchat_stream_anomalies_total`` from the counts client.py keeps, as given to the scrape."""

    def __init__(self) -> None:
        self.counts: Mapping[str, int] = {}

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily("qwenchat_stream_anomalies", _HELP["anomalies"], labels=("kind",))
        for kind in sorted(self.counts):
            family.add_metric((kind,), self.counts[kind])
        return [family]


class Metrics:
    """Counters, gauges and histograms of one UI process; thread-safe (the Chainlit loop and to_thread callers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the restart bookkeeping, and one scrape's snapshot at a time
        self._last_attempt = 0
        self._replica_attempts: dict[int, int] = {}
        r = self._registry = _Registry()
        # Registered in the order /metrics has always listed them.
        self._first_token = Histogram(
            "qwenchat_first_token_seconds", _HELP["first_token"], ("model",), buckets=FIRST_TOKEN_BUCKETS, registry=r
        )
        self._answer = Histogram(
            "qwenchat_answer_seconds", _HELP["answer"], ("model",), buckets=ANSWER_BUCKETS, registry=r
        )
        self._outcomes = Counter("qwenchat_answers", _HELP["answers"], ("model", "outcome"), registry=r)
        self._streaming = Gauge("qwenchat_streaming_answers", _HELP["streaming"], registry=r)
        self._restarts = Counter("qwenchat_engine_restarts", _HELP["restarts"], ("cause",), registry=r)
        self._history_pending = Gauge("qwenchat_history_pending_writes", _HELP["history_pending"], registry=r)
        self._history_failures = Counter(
            "qwenchat_history_write_failures", _HELP["history_failures"], ("cause",), registry=r
        )
        self._replica_restarts = Counter(
            "qwenchat_replica_restarts", _HELP["replica_restarts"], ("replica", "cause"), registry=r
        )
        self._anomalies = _Anomalies()
        r.register(self._anomalies)
        self._sessions = Gauge("qwenchat_active_sessions", _HELP["sessions"], registry=r)
        self._state = Gauge("qwenchat_engine_state", _HELP["state"], ("state",), registry=r)
        self._replica_ready = Gauge(
            "qwenchat_replica_ready", _HELP["replica_ready"], ("replica", "address"), registry=r
        )
        self._attempt = Gauge("qwenchat_engine_restart_attempt", _HELP["attempt"], registry=r)

    # ------------------------------------------------------------ updates

    def first_token(self, model: str, seconds: float) -> None:
        self._first_token.labels(model).observe(seconds)

    def answered(self, model: str, seconds: float) -> None:
        self._answer.labels(model).observe(seconds)

    def outcome(self, outcome: str, model: str) -> None:
        self._outcomes.labels(model, outcome).inc()

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """An answer streams for the duration of the block (also left on error or Stop)."""
        with self._streaming.track_inprogress():
            yield

    def history_failed(self, cause: str) -> None:
        self._history_failures.labels(cause).inc()

    def history_pending(self, writes: int) -> None:
        self._history_pending.set(writes)

    def observe_engine(self, status: HealthStatus) -> None:
        """Count the restarts this snapshot reveals, from the supervisor's ``attempt`` (``_new_restarts``), and in
        a fleet from each local replica's. Snapshots repeat: the same attempt counts nothing."""
        with self._lock:
            if status.attempt is not None:  # else no supervisor (external engine), or no status file yet
                new = _new_restarts(self._last_attempt, status.attempt)
                self._last_attempt = status.attempt
                if new:
                    self._restarts.labels(status.cause or UNKNOWN_CAUSE).inc(new)
            for r in status.replicas:  # a fleet: the launcher's own replicas have supervisors too
                if r.attempt is None:
                    continue
                new = _new_restarts(self._replica_attempts.get(r.number, 0), r.attempt)
                self._replica_attempts[r.number] = r.attempt
                if new:
                    self._replica_restarts.labels(str(r.number), r.cause or UNKNOWN_CAUSE).inc(new)

    def reset(self) -> None:
        """Tests only: back to a fresh process."""
        self.__init__()  # type: ignore[misc]

    # ------------------------------------------------------------ the exposition text

    def render(self, *, engine: HealthStatus, active_sessions: int, anomalies: Mapping[str, int]) -> str:
        """The text exposition of this process's metrics and the given snapshot (prometheus_client's writer)."""
        self.observe_engine(engine)
        with self._lock:
            self._anomalies.counts = dict(anomalies)
            self._sessions.set(active_sessions)
            for s in EngineState:
                self._state.labels(s.value).set(1 if engine.state is s else 0)
            self._replica_ready.clear()  # a fleet: each replica as the poller last saw it (its own /health)
            for replica in engine.replicas:
                self._replica_ready.labels(str(replica.number), replica.address).set(1 if replica.ready else 0)
            self._registry.without_samples.discard("qwenchat_engine_restart_attempt")
            if engine.attempt is None:  # an external engine: no supervisor, no attempt
                self._registry.without_samples.add("qwenchat_engine_restart_attempt")
            else:
                self._attempt.set(engine.attempt)
            return generate_latest(self._registry).decode()


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

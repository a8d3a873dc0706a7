"""The UI's own metrics, in the Prometheus text exposition format (version 0.0.4), for ``GET /metrics``.

    metrics.METRICS.first_token(model, seconds)      # turn.py: the first streamed token of an answer
    metrics.METRICS.answered(model, seconds)         # turn.py: an answer shown whole
    metrics.METRICS.outcome("ok" | error code, model)   # turn.py: how each answer ended, by the model asked
    with metrics.METRICS.streaming(): ...            # turn.py: an answer streaming now
    metrics.METRICS.observe_engine(status)           # app.py: every poller snapshot (restarts by cause, per replica)
    text = metrics.METRICS.render(engine=status, active_sessions=n, anomalies=client.anomaly_counts())

Per process, since it started (several UI processes each have their own; Prometheus sums them). Written
by hand: ``prometheus_client`` is not in the app environment, and the format is a few lines of text.
vLLM's own metrics are at the engine's ``/metrics`` (its port, no key), not here.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from .health import EngineState, HealthStatus

#: Content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        i = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
        self.counts[i] += 1
        self.total += value
        self.count += 1


def _new_restarts(last: int, attempt: int) -> int:
    """Restarts a supervisor's ``attempt`` (restarts within its window) reveals after ``last``: a rise counts the
    difference; a fall to a number above 0 is a restart in a new window (the old ones aged out); a fall to 0 is a
    new launch; the same number, nothing."""
    return attempt - last if attempt > last else (1 if 0 < attempt < last else 0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


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
        self.observe_engine(engine)
        out: list[str] = []

        def head(name: str, kind: str, text: str) -> None:
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")

        def sample(name: str, value: float, **labels: str) -> None:
            out.append(f"{name}{_labels(**labels)} {_number(value)}")

        with self._lock:
            for name, hists, text in (
                (
                    "qwenchat_first_token_seconds",
                    self._first_token,
                    "Seconds from the user's message to the first streamed token, per model "
                    "(includes any wait for the engine and an adapter load).",
                ),
                (
                    "qwenchat_answer_seconds",
                    self._answer,
                    "Seconds from the user's message to the last token of an answer shown whole, per model.",
                ),
            ):
                head(name, "histogram", text)
                for model in sorted(hists):
                    h = hists[model]
                    cumulative = 0
                    for bound, n in zip((*h.buckets, math.inf), h.counts, strict=True):
                        cumulative += n
                        sample(f"{name}_bucket", cumulative, model=model, le=_number(bound))
                    sample(f"{name}_sum", h.total, model=model)
                    sample(f"{name}_count", h.count, model=model)

            head(
                "qwenchat_answers_total",
                "counter",
                "Answers by the model asked and outcome: ok, or the error code (errors.py), stopped, no_text, "
                "app_error, engine_down.",
            )
            for model, outcome in sorted(self._outcomes):
                sample("qwenchat_answers_total", self._outcomes[(model, outcome)], model=model, outcome=outcome)

            head("qwenchat_streaming_answers", "gauge", "Answers streaming now.")
            sample("qwenchat_streaming_answers", self._streaming)

            head(
                "qwenchat_engine_restarts_total",
                "counter",
                "Engine restarts seen by this UI process, by cause: rises of the supervisor status file's attempt "
                "(restarts within its window) as the health poller read it.",
            )
            for cause in sorted(self._restarts):
                sample("qwenchat_engine_restarts_total", self._restarts[cause], cause=cause)

            if self._replica_restarts:
                head(
                    "qwenchat_replica_restarts_total",
                    "counter",
                    "A fleet's local replicas: restarts seen by this UI process, by replica and cause (each "
                    "replica's own supervisor status file, read as for qwenchat_engine_restarts_total).",
                )
                for number, cause in sorted(self._replica_restarts):
                    count = self._replica_restarts[(number, cause)]
                    sample("qwenchat_replica_restarts_total", count, replica=str(number), cause=cause)

        head(
            "qwenchat_stream_anomalies_total",
            "counter",
            "Chat requests whose stream had each anomaly kind (one count per request and kind).",
        )
        for kind in sorted(anomalies):
            sample("qwenchat_stream_anomalies_total", anomalies[kind], kind=kind)

        head("qwenchat_active_sessions", "gauge", "Browser chat sessions connected now.")
        sample("qwenchat_active_sessions", active_sessions)

        head("qwenchat_engine_state", "gauge", "The engine's state as the UI sees it: 1 for the current state.")
        for state in EngineState:
            sample("qwenchat_engine_state", 1 if engine.state is state else 0, state=state.value)

        if engine.replicas:  # a [fleet]: each replica as the poller last saw it (its own /health)
            head(
                "qwenchat_replica_ready",
                "gauge",
                "A fleet's replicas as the UI sees them: 1 if the replica answers its own /health, else 0.",
            )
            for r in engine.replicas:
                sample("qwenchat_replica_ready", 1 if r.ready else 0, replica=str(r.number), address=r.address)

        head(
            "qwenchat_engine_restart_attempt",
            "gauge",
            "The supervisor's attempt now (restarts within its window; absent with an external engine).",
        )
        if engine.attempt is not None:
            sample("qwenchat_engine_restart_attempt", engine.attempt)
        return "\n".join(out) + "\n"


METRICS = Metrics()

"""GET /metrics: the Prometheus text format (written by prometheus_client), read back with Prometheus's own text parser
and a stricter one of the exposition format here; the same families as the hand-written exposition it replaced; and
what the handlers count into it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.chat.client import reset_anomaly_counts
from backend.chat.health import EngineState, HealthStatus
from backend.web import metrics
from tests.unit.test_app_handlers import Chat, chat, fake, marker, ui, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# ---------------------------------------------------------------- a strict parser of the text format (0.0.4)

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? (\S+)$")
VALUE = re.compile(r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Families (name -> type) and samples; raises AssertionError on anything the format does not allow."""
    assert text.endswith("\n"), "the exposition ends with a line feed"
    types: dict[str, str] = {}
    helped: set[str] = set()
    samples: Samples = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert re.fullmatch(NAME, name) and doc and name not in helped, line
            helped.add(name)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert re.fullmatch(NAME, name) and kind in TYPES and name not in types, line
            assert not any(n == name or n.startswith(name + "_") for n, _ in samples), f"TYPE after samples: {line}"
            types[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, value = m.group(1), m.group(m.lastindex or 0)
            assert VALUE.match(value), line
            labels = frozenset(re.findall(LABEL, m.group(2) or ""))
            family = next((f for f in types if name == f or name in (f + "_bucket", f + "_sum", f + "_count")), None)
            assert family is not None, f"sample of no declared family: {line}"
            if name.endswith("_bucket") and types[family] == "histogram":
                assert "le" in dict(labels), line
            key = (name, labels)
            assert key not in samples, f"duplicate sample: {line}"
            samples[key] = float(value.replace("Inf", "inf"))
    for family, kind in types.items():
        if kind == "histogram":
            check_histogram(family, samples)
    # Prometheus's own parser reads the same families, types and samples (it is laxer, so both run).
    theirs: Samples = {}
    for fam in text_string_to_metric_families(text):
        ours = fam.name if fam.name in types else fam.name + "_total"  # it names a counter's family without _total
        assert types.get(ours) == fam.type, f"{fam.name}: {fam.type} vs {types.get(ours)}"
        for s in fam.samples:
            theirs[(s.name, _plain(s.labels.items()))] = s.value
    mine = {(name, _plain((k, _unescape(v)) for k, v in labels)): v for (name, labels), v in samples.items()}
    assert theirs.keys() == mine.keys()
    assert all(theirs[k] == v or (math.isnan(v) and math.isnan(theirs[k])) for k, v in mine.items())
    return types, samples


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _plain(labels: object) -> frozenset[tuple[str, str]]:
    """Labels as values, with ``le`` as a number (their parser and ours spell 10 and 10.0 alike)."""
    return frozenset((k, repr(float(v)) if k == "le" else v) for k, v in labels)  # type: ignore[attr-defined]


def check_histogram(family: str, samples: Samples) -> None:
    series: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
    for (name, labels), value in samples.items():
        if name == family + "_bucket":
            le = dict(labels)["le"]
            series.setdefault(labels - {("le", le)}, []).append((float(le.replace("Inf", "inf")), value))
    for labels, buckets in series.items():
        buckets.sort()
        counts = [n for _, n in buckets]
        assert counts == sorted(counts), f"{family} buckets are not cumulative: {buckets}"
        assert buckets[-1][0] == math.inf, f"{family} has no +Inf bucket"
        assert samples[(family + "_count", labels)] == buckets[-1][1]
        assert (family + "_sum", labels) in samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample's value; ``le`` compares as a number (``10`` and ``10.0`` are the same bucket)."""
    want = _plain(labels.items())
    return next((v for (n, ls), v in samples.items() if n == name and _plain(ls) == want), None)


def scrape(ui) -> Samples:  # noqa: F811
    return parse(metrics.METRICS.render(engine=ui.service.poller.status, active_sessions=0, anomalies={}))[1]


# ---------------------------------------------------------------- the module alone


async def test_the_text_parses_and_holds_every_family_with_its_type():
    m = metrics.Metrics()
    m.first_token("pirate", 0.3)
    m.first_token("pirate", 400.0)  # above the last bucket: only +Inf
    m.answered('we"ird\\model\n', 2.0)  # label values are escaped
    m.outcome("ok", "pirate")
    m.history_failed("locked")
    m.history_failed("locked")
    m.history_pending(3)
    status = HealthStatus(state=EngineState.DEGRADED, attempt=2, cause="oom_cpu")
    types, samples = parse(m.render(engine=status, active_sessions=3, anomalies={"json_body": 2}))
    assert types == {
        "qwenchat_first_token_seconds": "histogram",
        "qwenchat_answer_seconds": "histogram",
        "qwenchat_answers_total": "counter",
        "qwenchat_streaming_answers": "gauge",
        "qwenchat_engine_restarts_total": "counter",
        "qwenchat_history_pending_writes": "gauge",
        "qwenchat_history_write_failures_total": "counter",
        "qwenchat_stream_anomalies_total": "counter",
        "qwenchat_active_sessions": "gauge",
        "qwenchat_engine_state": "gauge",
        "qwenchat_engine_restart_attempt": "gauge",
    }
    assert value(samples, "qwenchat_first_token_seconds_bucket", model="pirate", le="0.5") == 1
    assert value(samples, "qwenchat_first_token_seconds_bucket", model="pirate", le="300") == 1
    assert value(samples, "qwenchat_first_token_seconds_bucket", model="pirate", le="+Inf") == 2
    assert value(samples, "qwenchat_first_token_seconds_sum", model="pirate") == pytest.approx(400.3)
    assert value(samples, "qwenchat_answer_seconds_count", model='we\\"ird\\\\model\\n') == 1
    assert value(samples, "qwenchat_answers_total", model="pirate", outcome="ok") == 1
    assert value(samples, "qwenchat_stream_anomalies_total", kind="json_body") == 2
    assert value(samples, "qwenchat_active_sessions") == 3
    assert {s.value: value(samples, "qwenchat_engine_state", state=s.value) for s in EngineState} == {
        "starting": 0,
        "ready": 0,
        "degraded": 1,
        "down": 0,
    }
    assert value(samples, "qwenchat_engine_restarts_total", cause="oom_cpu") == 2  # first seen at attempt 2
    assert value(samples, "qwenchat_engine_restart_attempt") == 2
    assert value(samples, "qwenchat_history_write_failures_total", cause="locked") == 2
    assert value(samples, "qwenchat_history_pending_writes") == 3


def _rich_metrics() -> str:
    """Every family with samples (histograms of two models, a fleet with restarts), as in
    data/metrics_hand_written.txt, which the hand-written exposition before prometheus_client wrote for this state."""
    from backend.chat.health import ReplicaHealth

    m = metrics.Metrics()
    m.first_token("pirate", 0.3)
    m.first_token("base", 400.0)
    m.answered("pirate", 2.0)
    m.outcome("ok", "pirate")
    m.outcome("engine_error", "base")

    def fleet(a1: int, c1: str, a2: int, c2: str, attempt: int, cause: str | None) -> HealthStatus:
        return HealthStatus(
            state=EngineState.DEGRADED,
            attempt=attempt,
            cause=cause,
            replicas=(
                ReplicaHealth(1, "127.0.0.1:8001", True, attempt=a1, cause=c1),
                ReplicaHealth(2, "gpu-b:8000", False, "connection refused", attempt=a2, cause=c2),
            ),
        )

    m.observe_engine(fleet(0, "", 0, "", 0, None))
    m.observe_engine(fleet(1, "killed", 0, "", 2, "oom_cpu"))
    return m.render(engine=fleet(1, "", 2, "oom_cpu", 2, None), active_sessions=3, anomalies={"json_body": 2})


async def test_the_families_names_labels_and_values_are_those_of_the_hand_written_exposition():
    """The move to prometheus_client changed no family, type, sample name, label or value (only spelling: 1.0 for
    a bucket bound of 1, the order of labels)."""
    from pathlib import Path

    def read(text: str) -> dict[str, tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]]:
        return {
            fam.name: (fam.type, {(s.name, _plain(s.labels.items())): s.value for s in fam.samples})
            for fam in text_string_to_metric_families(text)
        }

    before = (Path(__file__).parent / "data" / "metrics_hand_written.txt").read_text()
    now = _rich_metrics()
    parse(now)  # and the strict reading holds
    ours = {k: v for k, v in read(now).items() if not k.startswith("qwenchat_history_")}  # added since (issue 32)
    assert ours == read(before)
    assert len(ours) == 11


async def test_restarts_are_counted_by_cause_from_the_attempts_the_poller_sees():
    m = metrics.Metrics()
    seen = [
        (None, ""),  # external engine: nothing
        (0, ""),  # first start
        (1, "oom_cpu"),  # restarting
        (1, ""),  # running again: the same attempt is not another restart
        (3, "hung"),  # two restarts between two snapshots
        (3, ""),  # down after giving up: the supervisor writes the last attempt again, no restart
        (1, "crash"),  # later, the old restarts aged out of the window: one restart
        (2, "crash"),  # one more
        (0, ""),  # a new launch
    ]
    for attempt, cause in seen:
        m.observe_engine(HealthStatus(attempt=attempt, cause=cause or None))
    _, samples = parse(m.render(engine=HealthStatus(), active_sessions=0, anomalies={}))
    restarts = {dict(k[1])["cause"]: v for k, v in samples.items() if k[0] == "qwenchat_engine_restarts_total"}
    assert restarts == {"oom_cpu": 1, "hung": 2, "crash": 2}
    assert value(samples, "qwenchat_engine_restart_attempt") is None  # external: no attempt


async def test_a_fleets_replicas_are_one_gauge_each_and_none_without_a_fleet():
    from backend.chat.health import ReplicaHealth

    m = metrics.Metrics()
    fleet = HealthStatus(
        state=EngineState.DEGRADED,
        replicas=(
            ReplicaHealth(1, "127.0.0.1:8001", True),
            ReplicaHealth(2, "gpu-b:8000", False, "connection refused"),
        ),
    )
    types, samples = parse(m.render(engine=fleet, active_sessions=0, anomalies={}))
    assert types["qwenchat_replica_ready"] == "gauge"
    ready = {dict(k[1])["address"]: v for k, v in samples.items() if k[0] == "qwenchat_replica_ready"}
    assert ready == {"127.0.0.1:8001": 1, "gpu-b:8000": 0}
    types, _ = parse(m.render(engine=HealthStatus(), active_sessions=0, anomalies={}))
    assert "qwenchat_replica_ready" not in types


async def test_a_fleets_local_replica_restarts_are_counted_per_replica_and_cause():
    """Each local replica's supervisor attempt (read from its status file by the poller) counts like the engine's;
    a remote replica (no attempt) counts nothing; replica 1 restarting does not count for replica 2."""
    from backend.chat.health import ReplicaHealth

    m = metrics.Metrics()

    def fleet(a1: int | None, c1: str, a2: int | None, c2: str) -> HealthStatus:
        return HealthStatus(
            replicas=(
                ReplicaHealth(1, "127.0.0.1:8001", a1 == 0 or not c1, attempt=a1, cause=c1),
                ReplicaHealth(2, "127.0.0.1:8002", True, attempt=a2, cause=c2),
                ReplicaHealth(3, "gpu-b:8000", True),  # remote: no supervisor of ours
            )
        )

    for snapshot in (fleet(0, "", 0, ""), fleet(1, "killed", 0, ""), fleet(1, "", 0, ""), fleet(1, "", 2, "oom_cpu")):
        m.observe_engine(snapshot)
    types, samples = parse(m.render(engine=fleet(1, "", 2, ""), active_sessions=0, anomalies={}))
    assert types["qwenchat_replica_restarts_total"] == "counter"
    restarts = {
        (dict(k[1])["replica"], dict(k[1])["cause"]): v
        for k, v in samples.items()
        if k[0] == "qwenchat_replica_restarts_total"
    }
    assert restarts == {("1", "killed"): 1, ("2", "oom_cpu"): 2}
    assert not any(k[0] == "qwenchat_engine_restarts_total" for k in samples)  # the router's own: none
    types, _ = parse(metrics.Metrics().render(engine=HealthStatus(), active_sessions=0, anomalies={}))
    assert "qwenchat_replica_restarts_total" not in types  # no fleet, or no restart: no family


# ---------------------------------------------------------------- through the handlers


async def test_one_ok_and_one_faulted_answer_are_counted(ui, chat):  # noqa: F811
    metrics.METRICS.reset()
    reset_anomaly_counts()
    ok = await chat.send(f"hello {marker()}")
    assert ok.answers and not ok.errors
    faulted = await chat.send(f"[[fault:http-500]] {marker()}")
    assert faulted.errors and not faulted.answers

    samples = scrape(ui)
    model = ui.service.default_model(ui.service.poller.status)  # what the fake server serves: "fake-qwen"
    answers = {tuple(sorted(k[1])): v for k, v in samples.items() if k[0] == "qwenchat_answers_total"}
    assert answers == {(("model", model), ("outcome", "ok")): 1, (("model", model), ("outcome", "engine_error")): 1}
    assert value(samples, "qwenchat_first_token_seconds_count", model=model) == 1  # the faulted one had no token
    assert value(samples, "qwenchat_answer_seconds_count", model=model) == 1
    assert value(samples, "qwenchat_streaming_answers") == 0
    assert value(samples, "qwenchat_engine_state", state="ready") == 1


async def test_a_streaming_answer_shows_in_the_gauge_and_stop_is_its_outcome(ui, chat):  # noqa: F811
    metrics.METRICS.reset()
    task = chat.start_sending(f"[[fault:think-inline:tokens=400:rate=20]] {marker()}")
    await wait_for(lambda: value(scrape(ui), "qwenchat_streaming_answers") == 1, 20, "the answer streaming")
    await chat.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 20)
    samples = scrape(ui)
    assert value(samples, "qwenchat_streaming_answers") == 0
    model = ui.service.default_model(ui.service.poller.status)
    assert value(samples, "qwenchat_answers_total", model=model, outcome="stopped") == 1


async def test_stream_anomalies_come_from_the_client_counters(ui, chat):  # noqa: F811
    reset_anomaly_counts()
    assert (await chat.send(f"[[fault:json-body]] {marker()}")).answers
    response = await get_metrics(ui)
    assert value(parse(response.text)[1], "qwenchat_stream_anomalies_total", kind="json_body") == 1


async def get_metrics(ui, headers: dict[str, str] | None = None):  # noqa: F811
    import httpx
    from chainlit.server import app as http_app

    transport = httpx.ASGITransport(app=http_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        return await client.get("/metrics", headers=headers or {})


async def test_active_sessions_count_connected_browsers_only(ui, fake):  # noqa: F811
    from chainlit.server import sio

    before = value(parse((await get_metrics(ui)).text)[1], "qwenchat_active_sessions")
    tab = Chat(ui, fake)
    sid = await sio.manager.connect(f"eio-{marker()}", "/")
    tab.session.socket_id = sid
    try:
        assert value(parse((await get_metrics(ui)).text)[1], "qwenchat_active_sessions") == (before or 0) + 1
        await sio.manager.disconnect(sid, "/")  # the tab closed; Chainlit keeps its session a while
        assert value(parse((await get_metrics(ui)).text)[1], "qwenchat_active_sessions") == before
    finally:
        await tab.session.delete()


async def test_metrics_need_a_login_when_login_is_on(ui, monkeypatch):  # noqa: F811
    import chainlit as cl
    from chainlit.auth import create_jwt
    from chainlit.config import config

    open_metrics = await get_metrics(ui)
    assert open_metrics.status_code == 200 and open_metrics.headers["content-type"].startswith("text/plain")
    assert "qwenchat_engine_state" in open_metrics.text

    monkeypatch.setattr(config.code, "password_auth_callback", lambda u, p: None)
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "x" * 64)
    refused = await get_metrics(ui)
    assert refused.status_code == 401 and "qwenchat_" not in refused.text

    token = create_jwt(cl.User(identifier="admin"))
    allowed = await get_metrics(ui, {"Authorization": f"Bearer {token}"})
    assert allowed.status_code == 200
    parse(allowed.text)

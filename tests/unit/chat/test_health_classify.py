"""health_classify.classify: the state one poll's reads decide, row by row (no server, no clock)."""

from __future__ import annotations

import pytest

from backend.chat.health_classify import SUPERVISED_GRACE_S, Life, Poll, classify, fleet_view
from backend.chat.health_http import Http
from backend.chat.health_status import EngineState, ModelEntry, ReplicaHealth
from backend.contract import EngineStatus, SupervisorState
from backend.settings import HealthSettings
from backend.text import Text

S = HealthSettings()
BASE = ModelEntry(id="smol", parent=None)
OK = Http(ok=True, status=200, body={"data": []})
ANSWER = Http(ok=True, status=200, body={"choices": [{"message": {"content": "x"}}]}, latency=0.1)
SLOW = Http(ok=True, status=200, body={"choices": [{}]}, latency=S.probe_slow + 1)
REFUSED = Http(error="refused")
TIMEOUT = Http(error="timeout")
READY, DEGRADED, STARTING, DOWN = EngineState.READY, EngineState.DEGRADED, EngineState.STARTING, EngineState.DOWN
FRESH, UP, LATE = Life(), Life(ever_ready=True), Life(startup_over=True)
FLEET = Life(ever_ready=True, fleet=True, replica_ready=True)
RUNNING = EngineStatus(state=SupervisorState.RUNNING)  # the launcher's supervisor: it has seen nothing wrong yet
LONG_LOST = Life(ever_ready=True, lost_for=SUPERVISED_GRACE_S + 1)

ROWS = [
    # (why, poll, life, state, reason key) — state None: the next stage must be read
    ("supervisor down", Poll(sup=EngineStatus(state=SupervisorState.DOWN)), UP, DOWN, "health.down"),
    ("supervisor stopped", Poll(sup=EngineStatus(state=SupervisorState.STOPPED)), UP, DOWN, "health.stopped"),
    ("launcher preparing", Poll(sup=EngineStatus(state=SupervisorState.PREPARING)), LATE, STARTING, "health.preparing"),
    ("nothing read yet", Poll(), FRESH, None, None),
    ("restarting, no /health", Poll(EngineStatus(state=SupervisorState.RESTARTING), REFUSED), UP, STARTING, None),
    ("not listening yet", Poll(health=REFUSED), FRESH, STARTING, "health.not_listening"),
    ("never up within the limit", Poll(health=REFUSED), LATE, DOWN, "health.never_ready"),
    ("gone after ready", Poll(health=REFUSED), UP, DOWN, "health.stopped_answering"),
    ("gone, its launcher not there yet", Poll(RUNNING, REFUSED), UP, STARTING, "health.supervised_lost"),
    ("gone, its launcher silent too long", Poll(RUNNING, REFUSED), LONG_LOST, DOWN, "health.stopped_answering"),
    ("/health slow after ready", Poll(health=TIMEOUT), UP, DEGRADED, "health.health_slow"),
    ("/health slow, supervised", Poll(RUNNING, TIMEOUT), UP, DEGRADED, "health.health_slow"),
    ("key refused", Poll(health=Http(ok=True, status=401)), UP, DOWN, None),
    ("unhealthy after ready", Poll(health=Http(ok=True, status=500)), UP, DOWN, "health.unhealthy"),
    # vLLM whose EngineCore died answers 503 for seconds before it exits and its launcher restarts it
    ("unhealthy, its launcher not there yet", Poll(RUNNING, Http(ok=True, status=503)), UP, STARTING, None),
    ("unhealthy, its launcher silent too long", Poll(RUNNING, Http(ok=True, status=503)), LONG_LOST, DOWN, None),
    ("loading", Poll(health=Http(ok=True, status=503)), FRESH, STARTING, "health.loading"),
    ("router 503 with a replica ready", Poll(health=Http(ok=True, status=503)), FLEET, None, None),
    ("/health 404 goes on", Poll(health=Http(ok=True, status=404)), FRESH, None, None),
    ("no models yet", Poll(health=OK, models=OK), FRESH, STARTING, "health.waiting_models"),
    ("models lost after ready", Poll(health=OK, models=OK), UP, DEGRADED, "health.no_model_list"),
    ("models refused", Poll(health=OK, models=Http(ok=True, status=403)), UP, DOWN, None),
    ("models read, probe next", Poll(health=OK, models=OK, base=BASE), UP, None, None),
    ("probe answered", Poll(health=OK, models=OK, base=BASE, probe=ANSWER), FRESH, READY, "health.ready"),
    ("probe slow", Poll(health=OK, models=OK, base=BASE, probe=SLOW), FRESH, DEGRADED, "health.slow"),
    ("probe dropped, starting", Poll(health=OK, models=OK, base=BASE, probe=REFUSED), FRESH, STARTING, None),
    ("probe dropped after ready", Poll(health=OK, models=OK, base=BASE, probe=REFUSED), UP, DOWN, None),
    ("probe timed out", Poll(health=OK, models=OK, base=BASE, probe=TIMEOUT), UP, DEGRADED, "health.probe_timeout"),
    ("probe failed", Poll(health=OK, models=OK, base=BASE, probe=Http(ok=True, status=500)), UP, DEGRADED, None),
    (
        "router not routing",
        Poll(health=OK, models=OK, base=BASE, probe=Http(ok=True, status=502)),
        FLEET,
        STARTING,
        "health.router_not_routing",
    ),
]


@pytest.mark.parametrize(("why", "poll", "life", "state", "key"), ROWS, ids=[r[0] for r in ROWS])
def test_classify(why, poll, life, state, key):
    verdict = classify(poll, life, S)
    if state is None:
        assert verdict is None, f"{why}: decided {verdict}"
        return
    assert verdict is not None and verdict.state is state, f"{why}: {verdict}"
    if key is not None:
        assert verdict.reason.key == key
    assert verdict.models_ok is (poll.probe is not None)  # only a poll that got to the probe read a list that holds


def test_a_fleet_with_some_replicas_down_is_degraded_and_with_none_down_unless_the_router_just_answered():
    up, down = ReplicaHealth(1, "a:1", True), ReplicaHealth(2, "b:2", False, Text.verbatim("refused"))
    ready = Text("health.ready")
    assert fleet_view(READY, ready, (up, up), False) == (READY, ready)
    assert fleet_view(READY, ready, (up, down), False)[0] is DEGRADED
    assert fleet_view(READY, ready, (down, down), False)[0] is DOWN
    state, said = fleet_view(READY, ready, (down, down), True)
    assert state is DEGRADED and said.key == "health.replicas_unreachable"

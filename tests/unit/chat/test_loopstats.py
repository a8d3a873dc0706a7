"""The opt-in event-loop sampler (backend/web/loopstats.py): off by default, measures a blocked loop."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import pytest

from backend.web import loopstats


def test_percentiles_and_window_of_histograms():
    hist = {0: 90, 10: 9, 500: 1}  # 0 ms x90, 1 ms x9, 50 ms x1
    p = loopstats.percentiles(hist)
    assert p == {"n": 100.0, "p50": 0.0, "p99": 1.0, "max": 50.0}
    assert loopstats.percentiles({}) == {"n": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    before = {"hist": {"0": 40, "10": 9}}
    after = {"hist": {"0": 90, "10": 9, "500": 1}}
    assert loopstats.window(before, after) == {0: 50, 500: 1}
    assert loopstats.window(None, after) == hist


def test_nothing_starts_without_the_variable(monkeypatch):
    monkeypatch.delenv(loopstats.ENV, raising=False)
    monkeypatch.setattr(loopstats, "_active", None)

    async def main():
        return loopstats.start_from_environment(), {t.get_name() for t in asyncio.all_tasks()}

    stats, tasks = asyncio.run(main())
    assert stats is None and "loopstats" not in tasks


@pytest.mark.asyncio
async def test_a_blocked_loop_shows_as_lag_and_sigusr1_writes_a_profile(tmp_path, monkeypatch):
    target = tmp_path / "loop.json"
    monkeypatch.setenv(loopstats.ENV, str(target))
    monkeypatch.setattr(loopstats, "_active", None)
    monkeypatch.setattr(loopstats.atexit, "register", lambda fn: None)
    stats = loopstats.start_from_environment()
    assert stats is not None and stats.task is not None
    try:
        await asyncio.sleep(0.3)
        before = loopstats.read(target)
        os.kill(os.getpid(), signal.SIGUSR1)  # profile on
        await asyncio.sleep(0.05)
        time.sleep(0.08)  # block the loop for 80 ms
        gc.collect()  # a full collection: its pause is recorded
        await asyncio.sleep(0.4)
        os.kill(os.getpid(), signal.SIGUSR1)  # profile off: written
        await asyncio.sleep(0.05)
        after = loopstats.read(target)
    finally:
        stats.task.cancel()
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        gc.callbacks.remove(stats.on_gc)
    assert after["pid"] == os.getpid() and after["rss_kb"] > 0 and after["peak_rss_kb"] >= after["rss_kb"]
    lag = loopstats.percentiles(loopstats.window(before, after))
    assert lag["max"] >= 60, lag  # the 80 ms block, seen by the sampler
    assert lag["p50"] < 60, lag  # and most wake-ups were not blocked
    assert (tmp_path / "loop.json.prof").stat().st_size > 0
    full = after["gc"]["2"]
    assert full["n"] >= 1 and 0 < full["max_ms"] <= full["total_ms"], after["gc"]

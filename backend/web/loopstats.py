"""Opt-in measurements of the Chainlit process for benchmarks and soak tests; off unless asked for.

``QWENCHAT_LOOPSTATS=<file>`` starts, at app startup, one sampler task: it sleeps ``INTERVAL`` s and records how
late it woke up (the event loop's lag: how long a ready callback waited behind others) in a cumulative histogram
of 0.1 ms buckets. Every ``WRITE_EVERY`` s, and at exit, it writes a JSON snapshot to the file (atomically): pid,
RSS, peak RSS, the histogram. A reader takes two snapshots and diffs them (``window``) to get the lag of exactly
that stretch of time; ``percentiles`` turns a histogram into p50/p99. The snapshot also holds the garbage collector's
pauses per generation (``gc``: count, total and longest, in ms). The exit snapshot is also logged in one line.

With the variable set, ``SIGUSR1`` toggles a cProfile of the event-loop thread: the first signal starts it, the
second stops it and writes ``<file>.prof`` (read it with ``pstats``). Unset: no task, no handler, nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import cProfile
import gc
import json
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV = "QWENCHAT_LOOPSTATS"
INTERVAL = 0.005  # seconds between two wake-ups of the sampler
WRITE_EVERY = 0.25  # seconds between two snapshots
RESOLUTION_MS = 0.1  # histogram bucket width
MAX_BUCKET = 100_000  # 10 s: anything later lands here


def bucket(lag_s: float) -> int:
    return min(MAX_BUCKET, max(0, round(lag_s * 1000 / RESOLUTION_MS)))


def percentiles(hist: Mapping[int, int], qs: Sequence[float] = (50, 99)) -> dict[str, float]:
    """``{"p50": ms, "p99": ms, "max": ms, "n": count}`` of a histogram (bucket -> count); zeros when empty."""
    total = sum(hist.values())
    out: dict[str, float] = {"n": float(total)}
    items = sorted((b, c) for b, c in hist.items() if c > 0)
    for q in qs:
        value = 0.0
        if total:
            rank, seen = q / 100 * total, 0
            for b, c in items:
                seen += c
                if seen >= rank:
                    value = b * RESOLUTION_MS
                    break
        out[f"p{q:g}"] = value
    out["max"] = items[-1][0] * RESOLUTION_MS if items else 0.0
    return out


def window(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[int, int]:
    """The histogram of the samples taken between two snapshots (``before`` None: since start)."""
    old = {int(k): int(v) for k, v in (before or {}).get("hist", {}).items()}
    new = {int(k): int(v) for k, v in after.get("hist", {}).items()}
    return {b: c - old.get(b, 0) for b, c in new.items() if c - old.get(b, 0) > 0}


def read(path: Path) -> dict[str, Any]:
    """The newest snapshot in ``path`` (written atomically: never half a file)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a loop-stats snapshot")
    return data


def _rss_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB, from /proc; zeros where /proc is missing."""
    rss = hwm = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


class LoopStats:
    def __init__(self, path: Path, interval: float = INTERVAL) -> None:
        self.path = path
        self.interval = interval
        self.hist: dict[int, int] = {}
        self.started = time.time()
        self.profile: cProfile.Profile | None = None
        self.task: asyncio.Task[None] | None = None
        # The garbage collector's pauses (they stop the loop like any blocking call): per generation, their count,
        # total and longest, in ms
        self.gc: dict[str, dict[str, float]] = {}  # filled by on_gc, once start_from_environment hooks it
        self._gc_start = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` entry: the time from each collection's start to its stop."""
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        ms = (time.perf_counter() - self._gc_start) * 1000
        gen = self.gc.setdefault(str(info.get("generation")), {"n": 0, "total_ms": 0.0, "max_ms": 0.0})
        gen["n"] += 1
        gen["total_ms"] += ms
        gen["max_ms"] = max(gen["max_ms"], ms)

    def snapshot(self, hist: Mapping[int, int] | None = None) -> dict[str, Any]:
        rss, hwm = _rss_kb()
        return {
            "pid": os.getpid(),
            "time": time.time(),
            "started": self.started,
            "interval_ms": self.interval * 1000,
            "resolution_ms": RESOLUTION_MS,
            "rss_kb": rss,
            "peak_rss_kb": hwm,
            "cpu_s": time.process_time(),  # the process's CPU time: its work, whatever the machine's load
            "profiling": self.profile is not None,
            "gc": {g: dict(v) for g, v in self.gc.items()},
            "hist": {str(b): c for b, c in sorted((self.hist if hist is None else hist).items())},
        }

    def write(self, hist: Mapping[int, int] | None = None) -> dict[str, Any]:
        snap = self.snapshot(hist)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(snap))
        os.replace(tmp, self.path)
        return snap

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_write = loop.time()
        writing: asyncio.Future[dict[str, Any]] | None = None
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval)
            now = loop.time()
            b = bucket(now - t0 - self.interval)
            self.hist[b] = self.hist.get(b, 0) + 1
            if writing is not None and writing.done():
                if isinstance(writing.exception(), OSError):
                    logger.error("loop stats: could not write %s: %s", self.path, writing.exception())
                    return
                writing = None
            if now >= next_write and writing is None:
                next_write = now + WRITE_EVERY
                # Off the loop (a file write can block for milliseconds on a busy disk), and not awaited: the
                # sampling goes on meanwhile (awaiting it, a loaded machine's slow thread hand-off left whole
                # seconds unsampled, and the percentiles of a window were those of a few dozen samples).
                writing = asyncio.ensure_future(asyncio.to_thread(self.write, dict(self.hist)))

    def toggle_profile(self) -> None:
        if self.profile is None:
            self.profile = cProfile.Profile()
            self.profile.enable()
            logger.info("loop stats: profiling the event loop")
            return
        self.profile.disable()
        out = self.path.with_name(self.path.name + ".prof")
        self.profile.dump_stats(str(out))
        self.profile = None
        logger.info("loop stats: profile written to %s", out)

    def at_exit(self) -> None:
        with contextlib.suppress(OSError):
            snap = self.write()
            p = percentiles(window(None, snap))
            logger.info(
                "loop stats at exit: lag p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d samples; RSS %d KiB, peak %d KiB",
                p["p50"],
                p["p99"],
                p["max"],
                p["n"],
                snap["rss_kb"],
                snap["peak_rss_kb"],
            )


_active: LoopStats | None = None


def start_from_environment() -> LoopStats | None:
    """Start the sampler on the running loop if ``QWENCHAT_LOOPSTATS`` names a file; once per process."""
    global _active
    target = os.environ.get(ENV)
    if not target or _active is not None:
        return _active
    stats = LoopStats(Path(target))
    loop = asyncio.get_running_loop()
    stats.task = loop.create_task(stats.run(), name="loopstats")
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGUSR1, stats.toggle_profile)
    atexit.register(stats.at_exit)
    gc.callbacks.append(stats.on_gc)
    _active = stats
    logger.info("loop stats: sampling the event loop every %.0f ms into %s", stats.interval * 1000, target)
    return stats

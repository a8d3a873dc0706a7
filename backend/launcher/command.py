"""Build the vLLM and Chainlit commands: pure functions of the settings.

cmd = build_engine_command(settings, engine="cpu", python="/…/engine/bin/python",
                           api_key="k", adapters={"pirate": Path(…)})
cmd.argv, cmd.env        # what would run; `./start.sh --dry-run` prints exactly this
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from backend.contract import ENV_ENGINE_API_KEY
from backend.engine_plugins import gate
from backend.errors import ConfigError, EngineUnavailable
from backend.settings import ROOT, Settings

logger = logging.getLogger(__name__)

#: Never printed by --dry-run or written to logs.
SECRET_ENV = {"VLLM_API_KEY", ENV_ENGINE_API_KEY}
#: [vllm] stream_interval = 0 on a GPU: tokens per chunk after the first. A GPU streams 50-100+ tokens per second to
#: each of many users (the meeting room of issue #20); 4 tokens a chunk is still 12 or more updates a second.
GPU_STREAM_INTERVAL = 4
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
    """True when `nvidia-smi -L` lists at least one GPU that CUDA_VISIBLE_DEVICES leaves visible."""
    return bool(gpu_count())


def gpu_memory_bytes() -> int | None:
    """Total memory of the first GPU (nvidia-smi), or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(out.stdout.split()[0]) * 1024**2 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def gpu_count() -> int | None:
    """GPUs vLLM would see: `nvidia-smi -L` lines, narrowed by CUDA_VISIBLE_DEVICES when it is set; None when
    nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    listed = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return min(listed, len([d for d in visible.split(",") if d.strip()]))
    return listed


def check_parallel(settings: Settings, *, engine: str, gpus: int | None) -> None:
    """tensor_parallel_size × data_parallel_size against the engine and the visible GPUs (``gpus``; None: unknown,
    e.g. a dry run). ConfigError naming both settings."""
    s = settings.vllm
    tp, dp = s.tensor_parallel_size, s.data_parallel_size
    if tp == 1 and dp == 1:
        return
    if engine != "gpu":
        key, value = ("vllm.tensor_parallel_size", tp) if tp > 1 else ("vllm.data_parallel_size", dp)
        raise ConfigError(
            key,
            value,
            f"1 on the {engine} engine (vLLM-CPU here runs one process on one machine: tensor_parallel_size = {tp}, "
            f'data_parallel_size = {dp}); set both to 1, or use device = "gpu" on a machine with {tp * dp} GPUs',
        )
    if gpus is not None and tp * dp > gpus:
        raise ConfigError(
            "vllm.tensor_parallel_size",
            tp,
            f"tensor_parallel_size × data_parallel_size ({tp} × {dp} = {tp * dp} GPUs) within the {gpus} GPU(s) "
            "visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES); lower [vllm] tensor_parallel_size or "
            "[vllm] data_parallel_size",
        )


def resolve_engine(requested: str, has_gpu: bool) -> str:
    """ "auto" → gpu when a GPU is visible, else cpu; a forced "gpu" without one is refused."""
    if requested == "auto":
        return "gpu" if has_gpu else "cpu"
    if requested == "gpu" and not has_gpu:
        raise EngineUnavailable(
            "gpu",
            "no NVIDIA GPU found (nvidia-smi -L lists none). "
            'Use [vllm].device = "cpu" (or "auto"), or run on a machine with a GPU.',
        )
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
    m, s, net, lora = settings.model, settings.vllm, settings.network, settings.lora
    # vllm-cpu's `vllm` console script is broken (PackageNotFoundError: vllm); the module works.
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(m.resolved_path),
        "--served-model-name",
        m.name,
        "--host",
        net.engine_host,
        "--port",
        str(net.engine_port),
        "--max-model-len",
        str(m.max_model_len),
        "--max-num-seqs",
        str(s.max_num_seqs),
        "--dtype",
        m.dtype,
        "--generation-config",
        "vllm",  # our sampling settings, not the model folder's defaults
        # vLLM's key guards /v1 and a few other prefixes only; the gate guards every route (issue #18)
        "--middleware",
        gate.MIDDLEWARE,
    ]
    # The key goes through the environment (vLLM reads VLLM_API_KEY): an --api-key argument
    # would be visible to every user of the machine in `ps`.
    env = {**OFFLINE_ENV, "VLLM_API_KEY": api_key, **gate_env(net.engine_host, net.engine_port)}
    if engine == "gpu":
        argv += ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
        # only when > 1: vLLM's defaults are 1, and a single-GPU command stays as short as before
        if s.tensor_parallel_size > 1:
            argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
        if s.data_parallel_size > 1:
            argv += ["--data-parallel-size", str(s.data_parallel_size)]
    else:
        # By default vllm-cpu reserves most of RAM for the KV cache and refuses to start.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_gib)
    if lora.enable:
        argv += [
            "--enable-lora",
            "--max-loras",
            str(lora.max_loras),
            "--max-lora-rank",
            str(lora.max_lora_rank),
            "--max-cpu-loras",
            str(lora.max_cpu_loras),
        ]
        if adapters:
            argv += ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
        if lora.runtime_loading:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if chat_template is not None:
        # vLLM refuses chat requests for a model folder without a chat template.
        argv += ["--chat-template", str(chat_template)]
    if s.scheduling_policy != "fcfs":  # vLLM's default: a fcfs command stays as it was
        argv += ["--scheduling-policy", s.scheduling_policy]
    interval = s.stream_interval or (GPU_STREAM_INTERVAL if engine == "gpu" else 1)
    if interval > 1:  # vLLM's default is 1: such a command stays as it was
        argv += ["--stream-interval", str(interval)]
    argv += list(s.extra_args)
    # PYTHONDONTWRITEBYTECODE off for vLLM: a fresh engine environment's .pyc are written later (prepare_bg.
    # compile_later), so the first start writes those of what it imports; with it on, the API server, the EngineCore
    # and the Worker (spawned with -B then) would each compile the same ~4,500 modules in memory, at every start.
    return Command(tuple(argv), env, unset=("OPENAI_BASE_URL", "OPENAI_API_KEY", "PYTHONDONTWRITEBYTECODE"))


def gate_env(host: str, port: int) -> dict[str, str]:
    """What the engine needs to load ``gate.EngineGate``: our code on its path, the Host names and the port it is
    reached by (loopback, and ``[network] engine_host``; the gate adds the machine's name when that is 0.0.0.0 or ::)."""
    names = dict.fromkeys((*gate.LOOPBACK_NAMES, host.strip("[]").lower()))
    return {"PYTHONPATH": str(ROOT), gate.ENV_HOSTS: ",".join(names), gate.ENV_PORT: str(port)}


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
    from backend.chatml import CHATML_TEMPLATE

    path = log_dir / "chatml-fallback.jinja"
    path.write_text(CHATML_TEMPLATE)
    return path


def build_ui_command(settings: Settings, *, python: str) -> Command:
    """The Chainlit command (``chainlit run`` without nest_asyncio: backend/ui/launch.py; run from the checkout,
    the supervisor's working directory); pure."""
    argv = (
        python,
        "-m",
        "backend.ui.launch",
        "run",
        str(ROOT / "app.py"),
        "--headless",
        "--host",
        settings.network.ui_host,
        "--port",
        str(settings.network.ui_port),
    )
    # uvicorn believes X-Forwarded-For/-Proto (the client's address, the scheme) only from these peers; its default
    # is loopback, which would let any local process pick its own address for the login throttle.
    env = {"CHAINLIT_APP_ROOT": str(ROOT), "FORWARDED_ALLOW_IPS": ",".join(settings.network.trusted_proxies)}
    # CI=true puts `chainlit run` in CI mode, which overwrites OPENAI_API_KEY with a fake key.
    return Command(argv, env, unset=("CI",))

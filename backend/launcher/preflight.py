"""Checks before vLLM is launched: the model folder, free ports, memory for the KV cache."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.errors import ConfigError, ExposureRefused, ModelPathError, PortInUse
from backend.hosts import host_name_of, is_loopback, is_wildcard, served_host_names
from backend.settings import Settings
from backend.text import Text, t

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- preflight


def check_model_dir(path: Path) -> None:
    """The most common start-up failure: a wrong model path. Checked before vLLM is launched."""
    if not path.exists():
        raise ModelPathError(str(path), Text("model_path.missing"))
    if not path.is_dir():
        raise ModelPathError(str(path), Text("model_path.is_file"))
    if (path / "adapter_config.json").exists():
        raise ModelPathError(str(path), Text("model_path.adapter", {"path": str(path)}))
    if not (path / "config.json").exists():
        raise ModelPathError(str(path), Text("model_path.no_config"))
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelPathError(str(path), Text("model_path.no_weights"))


def check_port_free(host: str, port: int, setting: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            raise PortInUse(host, port, setting) from None


def check_login(settings: Settings) -> None:
    """With login on, ``[login] password`` of at least MIN_PASSWORD_LENGTH characters (as hash-password asks of
    the other accounts): a ConfigError naming the length, never the password."""
    from backend.passwords import MIN_PASSWORD_LENGTH

    login = settings.login
    if login.enable and len(login.password) < MIN_PASSWORD_LENGTH:
        raise ConfigError(
            "login.password",
            f"<{len(login.password)} characters>",
            f"a password of at least {MIN_PASSWORD_LENGTH} characters (in config.toml or QWENCHAT_LOGIN_PASSWORD)",
        )


def check_exposure(settings: Settings) -> list[str]:
    """Who can reach what: refuses a UI open to other machines without login (unless ``[network] public``) or, on
    every address (0.0.0.0), without the names it answers to (``[network] host_names``); returns the lines to print: the
    names a UI off loopback answers to, and loud warnings (an engine port open to other machines, a public UI)."""
    network, login = settings.network, settings.login
    warnings: list[str] = []
    if not is_loopback(network.ui_host):
        if not login.enable:
            if not network.public:
                raise ExposureRefused(network.ui_host, network.ui_port)
            warnings.append(t("security.ui_public", "en", host=network.ui_host, port=network.ui_port))
        names = served_host_names(settings)
        if not names:
            example = this_machine() or ["chat.example.com", "10.0.0.5"]
            raise ConfigError(
                "network.host_names",
                list(network.host_names),
                f"the host names and addresses people open the chat at, because [network] ui_host = "
                f"{network.ui_host!r} answers on every address and a page under any other name is refused (DNS "
                f'rebinding): e.g. [network] host_names = {json.dumps(example)} (or QWENCHAT_NETWORK_HOST_NAMES="{" ".join(example)}"), '
                f"or set [network] ui_host to the one address it should listen on",
            )
        warnings.append(t("security.ui_hosts", "en", port=network.ui_port, names=", ".join(names)))
    if not settings.external and not is_loopback(network.engine_host):
        warnings.append(t("security.engine_exposed", "en", host=network.engine_host, port=network.engine_port))
    return warnings


def this_machine() -> list[str]:
    """This machine's name and the address it reaches others from (no packet is sent), for the example of
    ``[network] host_names``; loopback ones left out."""
    found = [socket.gethostname()]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: a UDP "connect" only picks the route
        found.append(probe.getsockname()[0])
    names = (host_name_of(n) for n in found)
    return list(dict.fromkeys(n for n in names if n and not is_loopback(n) and not is_wildcard(n)))


def model_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
        return config if isinstance(config, dict) else {}
    except (OSError, ValueError):
        return {}


def kv_cache_bytes_per_token(config: Mapping[str, Any]) -> int:
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


def check_limits(
    settings: Settings, config: Mapping[str, Any], *, engine: str, available_bytes: int | None
) -> list[Advice]:
    """max_model_len within the model's limit; a KV-cache estimate against what is available."""
    out: list[Advice] = []
    m = settings.model
    limit = int(
        config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings") or 0
    )
    if limit and m.max_model_len > limit:
        out.append(
            Advice(
                "error",
                f"[model].max_model_len = {m.max_model_len} is above the model's limit "
                f"max_position_embeddings = {limit}; lower [model].max_model_len to {limit} or less.",
            )
        )
    per_token = kv_cache_bytes_per_token(config)
    if per_token:
        one_seq = per_token * m.max_model_len
        gib = 1024**3
        out.append(
            Advice(
                "info",
                f"KV cache: {per_token / 1024:.0f} KiB per token; one full "
                f"{m.max_model_len}-token sequence needs {one_seq / gib:.1f} GiB; "
                f"{settings.vllm.max_num_seqs} such sequences need {one_seq * settings.vllm.max_num_seqs / gib:.1f} GiB.",
            )
        )
        budget = settings.vllm.cpu_kvcache_gib * gib if engine == "cpu" else available_bytes
        if budget and one_seq > budget:
            setting = "[vllm].cpu_kvcache_gib" if engine == "cpu" else "GPU memory"
            out.append(
                Advice(
                    "warning",
                    f"one full-length sequence ({one_seq / gib:.1f} GiB of KV cache) does not fit "
                    f"in {setting} ({budget / gib:.1f} GiB): vLLM may refuse to start. Lower "
                    f"[model].max_model_len, or give the cache more memory.",
                )
            )
    return out


# ---------------------------------------------------------------- memory per GPU (tensor / data parallel)

#: config.json fields of the models a profile ships for, so a dry run without the folder can still estimate.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-4b-instruct-2507": {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 262144,
    },
}

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def known_config(settings: Settings) -> dict[str, Any]:
    """The built-in shape for the served name or the folder name (case-insensitive), or {}."""
    for name in (settings.model.name, settings.model.resolved_path.name):
        if name.lower() in KNOWN_CONFIGS:
            return dict(KNOWN_CONFIGS[name.lower()])
    return {}


def param_count(config: Mapping[str, Any]) -> int:
    """Parameters of a dense decoder from its shape: embeddings (+ an untied LM head) + per layer the q/k/v/o
    projections and a gated MLP (gate, up, down). Norms and biases are left out (well under 0.1 %)."""
    cfg = config.get("text_config", config)
    hidden = int(cfg.get("hidden_size", 0))
    layers = int(cfg.get("num_hidden_layers", 0))
    heads = int(cfg.get("num_attention_heads", 1))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or hidden // max(heads, 1))
    inter = int(cfg.get("intermediate_size", 4 * hidden))
    vocab = int(cfg.get("vocab_size", 0))
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
    return embed + layers * per_layer


def weights_bytes(settings: Settings, config: Mapping[str, Any], model_dir: Path) -> tuple[int, str]:
    """The model's weights in bytes and where the figure comes from: the *.safetensors files when the folder has
    them, else parameters (from config.json's shape) × bytes per parameter of the dtype."""
    files = list(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
    if files:
        return sum(f.stat().st_size for f in files), "the *.safetensors files"
    dtype = settings.model.dtype if settings.model.dtype != "auto" else str(config.get("torch_dtype", "bfloat16"))
    return param_count(config) * _DTYPE_BYTES.get(dtype, 2), f"config.json's shape in {dtype}"


def gpu_memory_estimate(
    settings: Settings, config: Mapping[str, Any], model_dir: Path, *, gpu_bytes: int | None
) -> list[Advice]:
    """Memory per GPU for [vllm] tensor_parallel_size (tp) and data_parallel_size (dp); the formula:

    weights per GPU  = weights / tp                       (each replica holds the whole model, split over tp GPUs)
    KV per token     = 2 (K,V) × layers × ceil(kv_heads / tp) × head_dim × 2 bytes   (a GPU keeps its heads only)
    KV per GPU       = KV per token × max_model_len × max_num_seqs   (max_num_seqs full-length chats per replica)
    GPU needed       = (weights per GPU + KV per GPU) / gpu_memory_utilization   (vLLM takes that fraction of each)
    Activations and CUDA graphs (typically 1-3 GiB) come on top. With ``gpu_bytes`` (one GPU's memory) also the
    full-length sequences that fit per replica.
    """
    cfg = config.get("text_config", config)
    layers = int(cfg.get("num_hidden_layers", 0))
    if not layers:
        return []
    s = settings.vllm
    tp, dp, util = s.tensor_parallel_size, s.data_parallel_size, s.gpu_memory_utilization
    heads = int(cfg.get("num_attention_heads", 1))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size", 0)) // max(heads, 1))
    total, source = weights_bytes(settings, config, model_dir)
    per_gpu_weights = total / tp
    kv_token = 2 * layers * -(-kv_heads // tp) * head_dim * 2
    seq = kv_token * settings.model.max_model_len
    kv = seq * s.max_num_seqs
    need = per_gpu_weights + kv
    gib = 1024**3
    out = [
        Advice(
            "info",
            f"memory per GPU (tensor_parallel_size {tp} × data_parallel_size {dp} = {tp * dp} GPU(s); weights "
            f"{total / 1e9:.1f} GB from {source}): weights {per_gpu_weights / gib:.1f} GiB + KV cache "
            f"{s.max_num_seqs} × {settings.model.max_model_len} tokens × {kv_token / 1024:.0f} KiB = "
            f"{kv / gib:.1f} GiB → {need / gib:.1f} GiB per GPU; at gpu_memory_utilization {util:g} that is a "
            f"{need / util / gib:.1f} GiB GPU (smaller ones hold fewer full-length sequences at once).",
        )
    ]
    if gpu_bytes:
        room = gpu_bytes * util - per_gpu_weights
        fits = room / seq if room > 0 else 0.0
        level = "info" if fits >= 1 else "warning"
        out.append(
            Advice(
                level,
                f"this machine's GPU: {gpu_bytes / gib:.1f} GiB × {util:g} = {gpu_bytes * util / gib:.1f} GiB; after "
                f"the weights {max(room, 0) / gib:.1f} GiB of KV cache = {fits:.1f} full-length sequence(s) per "
                f"replica (of max_num_seqs {s.max_num_seqs})"
                + ("." if fits >= 1 else "; raise tensor_parallel_size or lower [model].max_model_len."),
            )
        )
    return out

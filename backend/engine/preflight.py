"""Checks before vLLM is launched: the model folder, free ports, memory for the KV cache."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExposureRefused, ModelPathError, PortInUse
from ..settings import Settings, is_loopback
from ..text import t

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- preflight


def check_model_dir(path: Path) -> None:
    """The most common start-up failure: a wrong model path. Checked before vLLM is launched."""
    if not path.exists():
        raise ModelPathError(str(path), "does not exist")
    if not path.is_dir():
        raise ModelPathError(str(path), "is a file, not a model folder")
    if (path / "adapter_config.json").exists():
        raise ModelPathError(
            str(path),
            "is an un-merged LoRA adapter, not a model; serve the base with "
            "[lora].modules, or merge it: python -m backend merge --base BASE --adapter "
            f"{path} --out DIR",
        )
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


def check_exposure(settings: Settings) -> list[str]:
    """Who can reach what: refuses a UI open to other machines without login (unless ``[ui] public``);
    returns the loud warnings to print (an engine port open to other machines, a public UI)."""
    server, ui = settings.server, settings.ui
    warnings: list[str] = []
    if not is_loopback(server.ui_host) and not ui.auth:
        if not ui.public:
            raise ExposureRefused(server.ui_host, server.ui_port)
        warnings.append(t("security.ui_public", "en", host=server.ui_host, port=server.ui_port))
    if not settings.external and not is_loopback(server.host):
        warnings.append(t("security.engine_exposed", "en", host=server.host, port=server.port))
    return warnings


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
                f"{settings.server.max_num_seqs} such sequences need {one_seq * settings.server.max_num_seqs / gib:.1f} GiB.",
            )
        )
        budget = settings.server.cpu_kvcache_gib * gib if engine == "cpu" else available_bytes
        if budget and one_seq > budget:
            setting = "[server].cpu_kvcache_gib" if engine == "cpu" else "GPU memory"
            out.append(
                Advice(
                    "warning",
                    f"one full-length sequence ({one_seq / gib:.1f} GiB of KV cache) does not fit "
                    f"in {setting} ({budget / gib:.1f} GiB): vLLM may refuse to start. Lower "
                    f"[model].max_model_len, or give the cache more memory.",
                )
            )
    return out

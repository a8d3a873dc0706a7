"""What the adapter doctor finds and knows (backend/adapters/doctor.py): its findings, the diagnosis, the base
model's modules and shapes, and the names of the files and tensors of a PEFT folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..text import Text
from .safetensors import read_safetensors_header

Severity = Literal["error", "warning"]
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
#: vLLM fuses these HF modules into one packed layer (packed_modules_mapping of Llama/Qwen2/Qwen3).
PACKED_GROUPS: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
#: Architectures whose vLLM 0.32 model class declares ``embedding_modules`` (LoRA on embed_tokens/lm_head).
EMBEDDING_LORA_ARCHS = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GraniteForCausalLM",
        "CohereForCausalLM",
        "MiniCPMForCausalLM",
        "ExaoneForCausalLM",
        "NemotronForCausalLM",
        "PhiMoEForCausalLM",
    }
)
EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings", "embed_in")


# ---------------------------------------------------------------- value objects


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found: ``severity`` error (vLLM would refuse, crash or mis-serve) or warning."""

    severity: Severity
    code: str  # stable, e.g. "rank_too_large"; tests and the UI key on it
    text: Text  # names the bad value and the fix: a catalog doctor.* text, made in the reader's language

    @property
    def message(self) -> str:
        """The text in English (the command line, logs, the JSON report)."""
        return str(self.text)

    def to_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "code": self.code, "message": self.message}


@dataclass(frozen=True)
class Diagnosis:
    """The doctor's verdict on one adapter folder (or one model folder)."""

    name: str
    path: Path
    findings: tuple[Finding, ...] = ()
    rank: int | None = None
    base_model_name_or_path: str | None = None
    target_modules: tuple[str, ...] | str = ()
    base: str = ""  # the base model folder checked against, "" when none
    kind: Literal["adapter", "model"] = "adapter"

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warning")

    @property
    def ok(self) -> bool:
        """True when vLLM can serve it as intended (warnings allowed)."""
        return not self.errors

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.findings)

    def summary(self) -> str:
        e, w = len(self.errors), len(self.warnings)
        verdict = "ready to serve" if not e else "vLLM would refuse it, crash, or serve it wrongly"
        return f"{self.name}: {e} error{'s' * (e != 1)}, {w} warning{'s' * (w != 1)} — {verdict}"

    def error_text(self) -> str:
        """All error messages on one line, in English (logs, the command line)."""
        return str(self.errors_text())

    def errors_text(self) -> Text:
        """All error messages on one line, to make in the reader's language (AdapterRejected, the excluded list)."""
        return Text.join("; ", [f.text for f in self.errors])

    def format_text(self) -> str:
        if self.kind == "model":
            head = f"model folder {self.path}"
        else:
            rank = f"rank {self.rank}" if self.rank is not None else "rank ?"
            head = f"adapter {self.name!r} ({self.path}, {rank})" + (f" against base {self.base}" if self.base else "")
        lines = [head]
        lines += [f"  {f.severity:<7} {f.code}: {f.message}" for f in self.findings]
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": str(self.path),
            "base": self.base or None,
            "rank": self.rank,
            "base_model_name_or_path": self.base_model_name_or_path,
            "target_modules": list(self.target_modules)
            if isinstance(self.target_modules, tuple)
            else self.target_modules,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class BaseModelInfo:
    """What the doctor knows about the served base: module path -> weight shape (None if unknown)."""

    path: Path
    modules: Mapping[str, tuple[int, ...] | None]
    architectures: tuple[str, ...] = ()
    name_or_path: str = ""

    @property
    def linear_modules(self) -> list[str]:
        """2-D weights that are not embeddings: what PEFT's "all-linear" could target (minus lm_head)."""
        return [
            m
            for m, s in self.modules.items()
            if (s is None or len(s) == 2) and not is_embedding(m) and m.rsplit(".", 1)[-1] != "lm_head"
        ]


class Findings:
    """Collects findings; the same problem repeated per layer collapses into one line."""

    def __init__(self) -> None:
        self._items: dict[tuple[Severity, str, str], list[Any]] = {}

    def add(self, severity: Severity, code: str, text: Text, group: str | None = None, where: str = "") -> None:
        key = (severity, code, group or repr(text))
        if key in self._items:
            self._items[key][1].append(where)
        else:
            self._items[key] = [text, [where]]

    def result(self) -> tuple[Finding, ...]:
        out = []
        for (severity, code, _), (text, wheres) in self._items.items():
            if len(wheres) > 1:
                more = [w for w in wheres[1:] if w]
                where = f"{', '.join(more[:6])}{', …' if len(more) > 6 else ''}"
                n = len(wheres) - 1
                text = (
                    Text("doctor.same_in_more", {"text": text, "n": n, "where": where})
                    if more
                    else (Text("doctor.and_more", {"text": text, "n": n}))
                )
            out.append(Finding(severity, code, text))
        # errors first, stable order otherwise
        return tuple(sorted(out, key=lambda f: f.severity != "error"))


@dataclass(frozen=True)
class AdapterConfig:
    """What the checks after adapter_config.json use from it (bad values already reported and left out)."""

    base_name: str | None = None
    lora: bool = True  # False: another PEFT type; nothing after the config is checked
    r: int | None = None
    rank_pattern: Mapping[str, Any] = field(default_factory=dict)
    targets: tuple[str, ...] | str = ()
    modules_to_save: tuple[str, ...] = ()


# ---------------------------------------------------------------- names and the base model


def is_embedding(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in EMBEDDING_NAMES


def read_json(path: Path) -> Any:
    with path.open("r", encoding="utf-8") as f:
        return json.load(f)


def read_base_model(base_dir: str | Path) -> BaseModelInfo:
    """Module names and weight shapes of a HF model folder, from safetensors headers or a weights index.

    ValueError (with the reason) when the folder is not a readable model.
    """
    base = Path(base_dir)
    if not base.is_dir():
        raise ValueError(f"base model folder {base} does not exist")
    config: dict[str, Any] = {}
    if (base / "config.json").is_file():
        try:
            config = read_json(base / "config.json")
        except (OSError, ValueError) as exc:
            raise ValueError(f"{base / 'config.json'} is not valid JSON ({exc})") from None
    tensors: dict[str, tuple[int, ...] | None] = {}
    single = base / "model.safetensors"
    index = base / "model.safetensors.index.json"
    bin_index = base / "pytorch_model.bin.index.json"
    if single.is_file():
        tensors.update(read_safetensors_header(single))
    elif index.is_file() or bin_index.is_file():
        idx = index if index.is_file() else bin_index
        try:
            weight_map = read_json(idx)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{idx} has no readable weight_map ({exc})") from None
        tensors.update({name: None for name in weight_map})
        if idx is index:  # shapes from the shard headers that are present
            for shard in sorted(set(weight_map.values())):
                if (base / shard).is_file():
                    tensors.update(read_safetensors_header(base / shard))
    else:
        shards = sorted(base.glob("*.safetensors"))
        if not shards:
            raise ValueError(
                f"{base} has no model.safetensors, model.safetensors.index.json or "
                "pytorch_model.bin.index.json to read module names from"
            )
        for shard in shards:
            tensors.update(read_safetensors_header(shard))
    modules: dict[str, tuple[int, ...] | None] = {}
    for name, shape in tensors.items():
        if name.endswith(".weight"):
            modules[name[: -len(".weight")]] = shape
    if any(".lora_A" in m or ".lora_B" in m for m in modules):
        raise ValueError(f"{base} holds un-merged LoRA weights, not a base model")
    # Tied embeddings: lm_head has no weight of its own but is still a module of the model.
    if config.get("tie_word_embeddings", True) and not any(m.rsplit(".", 1)[-1] == "lm_head" for m in modules):
        embed = next((m for m in modules if is_embedding(m)), None)
        if embed is not None:
            modules["lm_head"] = modules[embed]
    archs = config.get("architectures") or ()
    return BaseModelInfo(
        path=base,
        modules=modules,
        architectures=tuple(a for a in archs if isinstance(a, str)),
        name_or_path=str(config.get("_name_or_path") or config.get("_model_name_or_path") or ""),
    )


def parse_key(key: str) -> tuple[str | None, str]:
    """(module path without the PEFT prefix, kind) of one adapter tensor, as vLLM's parse_fine_tuned_lora_name.

    kind: "A", "B", "emb_A", "emb_B", "base_copy" (skipped by vLLM), "dora", "bias", "named" (adapter name
    left in the key), "other" (not a LoRA key).
    """
    name = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else key
    if name.endswith((".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight")) or name in (
        "lm_head.base_layer.weight",
    ):
        return name.rsplit(".", 2)[0], "base_copy"
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[:-2]), "A" if parts[-2] == "lora_A" else "B"
    if parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[:-1]), "emb_A" if parts[-1].endswith("A") else "emb_B"
    if "lora_magnitude_vector" in parts:
        return ".".join(parts[: parts.index("lora_magnitude_vector")]), "dora"
    if len(parts) >= 2 and parts[-1] == "bias" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[:-2]), "bias"
    if len(parts) >= 3 and parts[-3] in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[:-3]), "named"
    return None, "other"


def short_name(module: str) -> str:
    return module.rsplit(".", 1)[-1]

"""The adapter doctor: does this LoRA folder fit the base model, and if not, exactly why.

    diagnosis = diagnose_adapter("adapters/pirate", base_dir=model_dir, max_rank=16)
    diagnosis.ok, diagnosis.errors, diagnosis.rank, diagnosis.format_text()
    diagnose_model_dir(model_dir)                   # a PEFT folder passed as the *model*
    doctor_main(["adapters/pirate", "--base", model_dir, "--json"])   # python -m backend doctor
    path = resolve_adapter(settings.lora.resolved_dir, "pirate")     # allow-list, or AdapterPathRefused
    infos = discover_adapters(settings.lora.resolved_dir)
    await load_adapter(client, api_key, "pirate", path)              # POST /v1/load_lora_adapter

Why a doctor: vLLM exits rc=1 at start on one bad static adapter, crashes deep inside on others
(``IndexError`` at ``lora_a[i]``, ``KeyError …lora_A.weight``), and silently ignores modules the base
lacks (200, no effect). The doctor reads only ``adapter_config.json`` and safetensors *headers* (no torch,
no weights) and mirrors vLLM 0.32's own rules (vllm/lora/peft_helper.py, lora_model.py, utils.py).
Pure functions; file reads are small but callers in async code should use ``asyncio.to_thread``.

"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import (
    ConfigError,
)
from ..settings import VLLM_LORA_RANKS
from ..text import Text
from .safetensors import read_safetensors_header, scan_values

logger = logging.getLogger(__name__)

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
_EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings", "embed_in")


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
            if (s is None or len(s) == 2) and not _is_embedding(m) and m.rsplit(".", 1)[-1] != "lm_head"
        ]


class _Findings:
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


# ---------------------------------------------------------------- base model


def _is_embedding(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in _EMBEDDING_NAMES


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
        embed = next((m for m in modules if _is_embedding(m)), None)
        if embed is not None:
            modules["lm_head"] = modules[embed]
    archs = config.get("architectures") or ()
    return BaseModelInfo(
        path=base,
        modules=modules,
        architectures=tuple(a for a in archs if isinstance(a, str)),
        name_or_path=str(config.get("_name_or_path") or config.get("_model_name_or_path") or ""),
    )


# ---------------------------------------------------------------- the doctor


@dataclass
class _ModuleTensors:
    a: tuple[int, ...] | None = None
    b: tuple[int, ...] | None = None
    a_key: str = ""
    b_key: str = ""
    embedding: bool = False


def _rank_for(module: str, r: int, rank_pattern: Mapping[str, Any]) -> int:
    # Same rule as PEFT's get_pattern_key / vLLM's PEFTHelper._match_pattern: suffix at a "." boundary.
    for key, value in rank_pattern.items():
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return int(value)
        except (re.error, TypeError, ValueError):
            continue
    return r


def _matches_target(module: str, target: str) -> bool:
    """PEFT's list semantics: exact name or a suffix at a '.' boundary."""
    return module == target or module.endswith("." + target)


def _short(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _layer_of(module: str) -> str:
    m = re.search(r"\.(\d+)\.", "." + module + ".")
    return m.group(1) if m else ""


def _fmt_shape(shape: Iterable[int] | None) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]" if shape is not None else "[?]"


def _norm_base_name(name: str) -> str:
    return name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()


@dataclass(frozen=True)
class _AdapterConfig:
    """What the checks after adapter_config.json use from it (bad values already reported and left out)."""

    base_name: str | None = None
    lora: bool = True  # False: another PEFT type; nothing after the config is checked
    r: int | None = None
    rank_pattern: Mapping[str, Any] = field(default_factory=dict)
    targets: tuple[str, ...] | str = ()
    modules_to_save: tuple[str, ...] = ()


def diagnose_adapter(
    adapter_dir: str | Path,
    base_dir: str | Path | None = None,
    max_rank: int = 16,
    *,
    name: str | None = None,
    base_aliases: Iterable[str] = (),
) -> Diagnosis:
    """Check one PEFT LoRA folder against the served base model, the way vLLM would load it.

    ``base_aliases``: other names of the served base (e.g. its hub id) that count as a match for
    ``base_model_name_or_path``. Reads only JSON and safetensors headers. The stages follow vLLM 0.32's
    load: ``--max-lora-rank``, the folder and its config (``PEFTHelper.from_local_dir``: rank and
    features), the weights file, the base model's modules (``check_unexpected_modules``), then the tensors
    (``LoRAModel.from_lora_tensors``). A folder or config that cannot be read stops the check there.
    """
    path = Path(adapter_dir)
    name = name or path.name
    found = _Findings()
    q = repr(name)
    _check_max_rank(found, max_rank)
    raw = _check_config_file(found, q, path)
    config = _check_config(found, q, raw) if raw is not None else _AdapterConfig()
    if raw is not None and config.lora:
        _check_rank(found, q, config, max_rank)
        _check_features(found, q, raw, config, path)
        tensors = _check_weights_file(found, q, path)
        base = _check_base(found, q, base_dir)
        if base is not None:
            _check_base_match(found, q, config.base_name, base, base_aliases)
            _check_targets(found, q, config.targets, base, tensors)
        if tensors is not None:
            _check_tensors(found, q, tensors, config, base, path)
            _check_values(found, q, path / WEIGHTS_FILE)
    base_label = str(base_dir) if base_dir is not None else ""
    return Diagnosis(name, path, found.result(), config.r, config.base_name, config.targets, base_label)


def _check_max_rank(found: _Findings, max_rank: int) -> None:
    if max_rank not in VLLM_LORA_RANKS:
        ranks = ", ".join(map(str, VLLM_LORA_RANKS))
        found.add("error", "bad_max_rank", Text("doctor.bad_max_rank", {"max_rank": max_rank, "ranks": ranks}))


def _check_config_file(found: _Findings, q: str, path: Path) -> dict[str, Any] | None:
    """The folder and its adapter_config.json as a JSON object; None (reported) when either is missing or bad."""
    if not path.is_dir():
        found.add("error", "missing_folder", Text("doctor.missing_folder", {"q": q, "path": str(path)}))
        return None
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        key = "doctor.missing_config.model" if (path / "config.json").is_file() else "doctor.missing_config"
        found.add("error", "missing_config", Text(key, {"q": q, "file": CONFIG_FILE, "path": str(path)}))
        return None
    try:
        cfg = read_json(cfg_path)
    except (OSError, ValueError) as exc:
        found.add(
            "error", "bad_config", Text("doctor.config_not_json", {"q": q, "file": CONFIG_FILE, "detail": str(exc)})
        )
        return None
    if not isinstance(cfg, dict):
        found.add("error", "bad_config", Text("doctor.config_not_object", {"q": q, "file": CONFIG_FILE}))
        return None
    return cfg


def _check_config(found: _Findings, q: str, cfg: Mapping[str, Any]) -> _AdapterConfig:
    """peft_type, the keys vLLM requires and their types (PEFTHelper.from_dict)."""
    base_name = cfg.get("base_model_name_or_path") if isinstance(cfg.get("base_model_name_or_path"), str) else None
    peft_type = cfg.get("peft_type")
    if peft_type is None:
        found.add("warning", "missing_peft_type", Text("doctor.missing_peft_type", {"q": q, "file": CONFIG_FILE}))
    elif str(peft_type).upper() != "LORA":
        found.add("error", "not_lora", Text("doctor.not_lora", {"q": q, "peft_type": repr(peft_type)}))
        return _AdapterConfig(base_name, lora=False)
    missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in cfg]
    if missing:
        lacks = {"q": q, "file": CONFIG_FILE, "keys": ", ".join(missing)}
        found.add("error", "bad_config", Text("doctor.config_lacks", lacks))
    r = cfg.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        if "r" in cfg:
            found.add("error", "bad_config", Text("doctor.config_bad_r", {"q": q, "r": repr(r), "file": CONFIG_FILE}))
        r = None
    rank_pattern = cfg.get("rank_pattern") or {}
    if not isinstance(rank_pattern, dict):
        found.add("error", "bad_config", Text("doctor.config_bad_rank_pattern", {"q": q, "value": repr(rank_pattern)}))
        rank_pattern = {}
    targets: tuple[str, ...] | str = ()
    raw_targets = cfg.get("target_modules")
    if isinstance(raw_targets, list) and all(isinstance(t, str) for t in raw_targets):
        targets = tuple(raw_targets)
    elif isinstance(raw_targets, str):
        targets = raw_targets
    elif raw_targets is not None:
        found.add("error", "bad_config", Text("doctor.config_bad_targets", {"q": q, "value": repr(raw_targets)}))
    mts = cfg.get("modules_to_save") or []
    mts = [m for m in mts if isinstance(m, str)] if isinstance(mts, list) else []
    return _AdapterConfig(base_name, True, r, rank_pattern, targets, tuple(mts))


def _check_rank(found: _Findings, q: str, config: _AdapterConfig, max_rank: int) -> None:
    """The largest rank (r or a rank_pattern entry) against --max-lora-rank (PEFTHelper.validate_legal)."""
    r = config.r
    ranks = [x for x in [r, *config.rank_pattern.values()] if isinstance(x, int) and not isinstance(x, bool)]
    if ranks and max(ranks) > max_rank:
        top = max(ranks)
        fix = (
            Text("doctor.rank_fix.raise", {"to": next(v for v in VLLM_LORA_RANKS if v >= top), "max_rank": max_rank})
            if top <= VLLM_LORA_RANKS[-1]
            else Text("doctor.rank_fix.retrain", {"max_rank": max_rank, "largest": VLLM_LORA_RANKS[-1]})
        )
        key = "doctor.rank_too_large" if top == r else "doctor.rank_too_large.pattern"
        found.add("error", "rank_too_large", Text(key, {"q": q, "rank": top, "max_rank": max_rank, "fix": fix}))


def _check_features(found: _Findings, q: str, cfg: Mapping[str, Any], config: _AdapterConfig, path: Path) -> None:
    """Features vLLM 0.32 refuses (PEFTHelper._validate_features)."""
    bad_mts = [m for m in config.modules_to_save if m not in ("classifier", "score")]
    if bad_mts:
        params = {"q": q, "modules": ", ".join(bad_mts), "path": str(path)}
        found.add("error", "modules_to_save", Text("doctor.modules_to_save", params))
    if cfg.get("use_dora"):
        found.add("error", "dora", Text("doctor.dora", {"q": q, "path": str(path)}))
    unsupported = _unsupported_features(cfg)
    if unsupported:
        features = Text.join(Text("doctor.list_sep"), unsupported)
        found.add("error", "unsupported_feature", Text("doctor.unsupported_feature", {"q": q, "features": features}))


def _unsupported_features(cfg: Mapping[str, Any]) -> list[Text]:
    """The config's settings that vLLM cannot serve, each as the phrase its finding names it by."""
    unsupported = []
    if cfg.get("bias", "none") != "none":
        unsupported.append(Text("doctor.feature.bias", {"value": repr(cfg.get("bias"))}))
    if cfg.get("lora_bias"):
        unsupported.append(Text.verbatim("lora_bias = true"))
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        unsupported.append(Text("doctor.feature.init", {"value": repr(init)}))
    for key, label in (
        ("alora_invocation_tokens", "aLoRA"),
        ("layer_replication", "layer_replication"),
        ("use_bdlora", "BD-LoRA"),
        ("use_qalora", "QALoRA"),
    ):
        if cfg.get(key):
            unsupported.append(Text.verbatim(label))
    return unsupported


def _check_weights_file(found: _Findings, q: str, path: Path) -> dict[str, tuple[int, ...]] | None:
    """The safetensors header of the weights; None when there is none to read (reported)."""
    weights_path = path / WEIGHTS_FILE
    if weights_path.is_file():
        try:
            return read_safetensors_header(weights_path)
        except (OSError, ValueError) as exc:
            found.add("error", "bad_weights", Text("doctor.bad_weights", {"q": q, "detail": str(exc)}))
    elif (path / "adapter_model.bin").is_file() or (path / "adapter_model.pt").is_file():
        found.add("warning", "weights_not_inspected", Text("doctor.weights_not_inspected", {"q": q}))
    else:
        found.add("error", "no_weights", Text("doctor.no_weights", {"q": q, "file": WEIGHTS_FILE, "path": str(path)}))
    return None


def _check_values(found: _Findings, q: str, weights: Path) -> None:
    """What a loader would load, values included (bounded: safetensors.scan_values): a NaN or Inf anywhere is an
    error naming the tensor (every answer through it would be garbage); every lora_B all zeros (as PEFT creates
    them, before training) is a warning: the adapter changes nothing, the base model answers."""
    try:
        values = scan_values(weights)
    except (OSError, ValueError) as exc:
        found.add("error", "bad_weights", Text("doctor.bad_weights", {"q": q, "detail": str(exc)}))
        return
    for v in values:
        if v.non_finite:
            text = Text("doctor.non_finite", {"q": q, "tensor": v.name, "count": v.non_finite, "checked": v.checked})
            found.add("error", "non_finite", text, group="non_finite", where=v.name)
    lora_b = [v for v in values if ".lora_B." in v.name]
    if values and all(v.all_zero for v in (lora_b or values)):
        part = "lora_B" if lora_b else "weight"
        found.add("warning", "all_zero", Text("doctor.all_zero", {"q": q, "part": part, "n": len(lora_b or values)}))


def _check_base(found: _Findings, q: str, base_dir: str | Path | None) -> BaseModelInfo | None:
    """The served base model's modules and shapes; None when none was given or it cannot be read (reported)."""
    if base_dir is None:
        found.add("warning", "no_base", Text("doctor.no_base", {"q": q}))
        return None
    try:
        return read_base_model(base_dir)
    except (OSError, ValueError) as exc:
        found.add("error", "base_unreadable", Text("doctor.base_unreadable", {"q": q, "detail": str(exc)}))
        return None


def _check_base_match(
    found: _Findings, q: str, base_name: str | None, base: BaseModelInfo, aliases: Iterable[str]
) -> None:
    if not base_name:
        return
    served = {_norm_base_name(n) for n in (str(base.path), base.name_or_path, *aliases) if n}
    if _norm_base_name(base_name) not in served:
        params = {"q": q, "trained": repr(base_name), "served": repr(base.path.name)}
        found.add("warning", "base_mismatch", Text("doctor.base_mismatch", params))


def _check_targets(
    found: _Findings,
    q: str,
    targets: tuple[str, ...] | str,
    base: BaseModelInfo,
    tensors: Mapping[str, tuple[int, ...]] | None,
) -> None:
    names = list(base.modules)
    some = ", ".join(sorted({_short(m) for m in base.linear_modules})[:12])
    if isinstance(targets, str):
        if targets == "all-linear":
            return
        try:
            hit = any(re.fullmatch(targets, m) for m in names)
        except re.error as exc:
            found.add(
                "error", "bad_config", Text("doctor.bad_regex", {"q": q, "regex": repr(targets), "detail": str(exc)})
            )
            return
        if not hit:
            params = {"q": q, "regex": repr(targets), "some": some}
            found.add("error", "unknown_target_module", Text("doctor.regex_matches_nothing", params))
        return
    lora_modules = {m for m, _ in (_parse_key(k) for k in (tensors or {})) if m}
    for t in targets:
        if t in PACKED_GROUPS and any(_short(m) == t for m in lora_modules):
            continue  # tensors for vLLM's fused name: reported as fused_packed_key
        if not any(_matches_target(m, t) for m in names):
            params = {"q": q, "module": repr(t), "some": some}
            found.add("error", "unknown_target_module", Text("doctor.unknown_target_module", params))
        elif tensors is not None and not any(_matches_target(m, t) for m in lora_modules):
            found.add(
                "warning", "target_without_tensors", Text("doctor.target_without_tensors", {"q": q, "module": repr(t)})
            )


def _parse_key(key: str) -> tuple[str | None, str]:
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


def _modules_phrase(modules: Iterable[str]) -> Text:
    """'k_proj, q_proj in layers 0, 1' — which kinds of module, in which layers."""
    modules = list(modules)
    kinds = sorted({_short(m) for m in modules})
    layers = sorted({_layer_of(m) for m in modules if _layer_of(m)}, key=int)
    text = ", ".join(kinds[:8]) + (", …" if len(kinds) > 8 else "")
    if not layers:
        return Text.verbatim(text)
    return Text("doctor.modules_in_layers", {"modules": text, "layers": _layers(layers)})


def _layers(layers: list[str]) -> Text:
    """'layers 0, 1, …' / 'layer 3'."""
    listed = f"{', '.join(layers[:8])}{', …' if len(layers) > 8 else ''}"
    return Text("doctor.layer" if len(layers) == 1 else "doctor.layers", {"layers": listed})


def _count(n: int, noun: str) -> Text:
    """'16 tensors' / '1 module': ``noun`` names catalog texts doctor.count.<noun> and doctor.count.<noun>.one."""
    return Text(f"doctor.count.{noun}" + (".one" if n == 1 else ""), {"n": n})


def _one(n: int, key: str) -> str:
    """``key`` for a count of many, ``key.one`` for one (English's has/have, is/are)."""
    return key + (".one" if n == 1 else "")


@dataclass
class _TensorKeys:
    """An adapter's tensor keys sorted the way vLLM's parse_fine_tuned_lora_name reads them."""

    modules: dict[str, _ModuleTensors] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)  # not a LoRA key at all
    named: list[str] = field(default_factory=list)  # the adapter's name left in the key
    dora: list[str] = field(default_factory=list)
    bias: list[str] = field(default_factory=list)


@dataclass
class _ModuleFaults:
    """Modules of the weights that vLLM cannot load as they are, by kind of fault."""

    unpaired: dict[str, list[str]] = field(default_factory=lambda: {"lora_A": [], "lora_B": []})  # lacking A / B
    unknown: list[str] = field(default_factory=list)  # not in the base
    fused: list[str] = field(default_factory=list)  # vLLM's packed name for a base with separate members
    inconsistent: list[tuple[str, Text]] = field(default_factory=list)  # the adapter's own shapes disagree
    misfits: list[tuple[str, Text]] = field(default_factory=list)  # shapes that do not fit the base weight


def _check_tensors(
    found: _Findings,
    q: str,
    tensors: Mapping[str, tuple[int, ...]],
    config: _AdapterConfig,
    base: BaseModelInfo | None,
    path: Path,
) -> None:
    """The weights as vLLM's LoRAModel.from_lora_tensors reads them: key names, then each module's pair and
    shapes against the base, then vLLM's packed groups."""
    keys = _sort_tensor_keys(tensors, config.modules_to_save)
    _check_key_names(found, q, tensors, keys, path)
    base_mods = base.modules if base is not None else {}
    faults = _check_modules(found, q, keys.modules, config, base)
    _check_pairs(found, q, faults.unpaired)
    _check_module_names(found, q, faults, base_mods)
    _check_shapes(found, q, faults, len(keys.modules))
    _check_packed(found, q, keys.modules, base_mods if base is not None else None)


def _sort_tensor_keys(tensors: Mapping[str, tuple[int, ...]], mts: Iterable[str]) -> _TensorKeys:
    keys = _TensorKeys()
    for key, shape in tensors.items():
        module, kind = _parse_key(key)
        if kind == "base_copy":
            continue  # PEFT's save_embedding_layers copy; vLLM skips it (is_base_embedding_weights)
        if kind == "other":
            stripped = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else key
            if not any(stripped.startswith(m + ".") or f".{m}." in stripped for m in mts):
                keys.bad.append(key)  # (modules_to_save copies are reported from the config)
            continue
        {"named": keys.named, "dora": keys.dora, "bias": keys.bias}.get(kind, []).append(key)
        if kind in ("named", "dora", "bias"):
            continue
        assert module is not None
        mt = keys.modules.setdefault(module, _ModuleTensors())
        if kind in ("A", "emb_A"):
            mt.a, mt.a_key = shape, key
        else:
            mt.b, mt.b_key = shape, key
        mt.embedding = mt.embedding or kind.startswith("emb")
    return keys


def _check_key_names(
    found: _Findings, q: str, tensors: Mapping[str, tuple[int, ...]], keys: _TensorKeys, path: Path
) -> None:
    """Tensors vLLM refuses by their name: none at all, not LoRA keys, the adapter's name kept, DoRA, bias."""
    if not tensors:
        found.add("error", "no_weights", Text("doctor.no_tensors", {"q": q, "file": WEIGHTS_FILE}))
    if keys.bad:
        params = {"q": q, "count": _count(len(keys.bad), "tensor"), "example": repr(keys.bad[0])}
        found.add("error", "bad_key_name", Text("doctor.bad_key_name", params))
    if keys.named:
        adapter_name = keys.named[0].rsplit(".", 2)[-2]
        count = _count(len(keys.named), "tensor")
        params = {"q": q, "count": count, "adapter": repr(adapter_name), "example": repr(keys.named[0])}
        found.add("error", "bad_key_name", Text("doctor.named_keys", params))
    if keys.dora:
        params = {
            "q": q,
            "count": _count(len(keys.dora), "dora_tensor"),
            "example": repr(keys.dora[0]),
            "path": str(path),
        }
        found.add("error", "dora", Text("doctor.dora_tensors", params))
    if keys.bias:
        params = {"q": q, "count": _count(len(keys.bias), "bias_tensor"), "example": repr(keys.bias[0])}
        found.add("error", "unsupported_feature", Text("doctor.bias_tensors", params))


def _check_modules(
    found: _Findings,
    q: str,
    modules: Mapping[str, _ModuleTensors],
    config: _AdapterConfig,
    base: BaseModelInfo | None,
) -> _ModuleFaults:
    """Each adapted module: its pair, its name in the base, its own shapes, their fit with the base weight.

    Embedding targets are reported here; the other faults are gathered and reported per kind by the caller.
    """
    base_mods = base.modules if base is not None else {}
    faults = _ModuleFaults()
    for module, mt in sorted(modules.items()):
        if mt.a is None or mt.b is None:
            faults.unpaired["lora_A" if mt.a is None else "lora_B"].append(module)
        if base is not None and module not in base_mods:
            parent, _, leaf = module.rpartition(".")
            members = PACKED_GROUPS.get(leaf)
            packed = members is not None and all(f"{parent}.{m}" in base_mods for m in members)
            (faults.fused if packed else faults.unknown).append(module)
            continue
        rr = _rank_for(module, config.r, config.rank_pattern) if config.r is not None else None
        labels = ("lora_embedding_A", "lora_embedding_B") if mt.embedding else ("lora_A", "lora_B")
        problems = _inconsistent_shapes(mt, rr, labels)
        if problems:
            faults.inconsistent.append((module, Text.join("; ", problems)))
            continue
        misfit = _misfit(mt, base_mods.get(module), labels)
        if misfit:
            faults.misfits.append((module, misfit))
        short = _short(module)
        if short in _EMBEDDING_NAMES or short == "lm_head":
            _check_embedding_target(found, q, short, base)
    return faults


def _inconsistent_shapes(mt: _ModuleTensors, rr: int | None, labels: tuple[str, str]) -> list[Text]:
    """The adapter's own consistency: 2-D tensors, one rank per module, the rank the config says."""
    problems = [
        Text("doctor.shape.not_2d", {"label": label, "shape": _fmt_shape(shape)})
        for label, shape in zip(labels, (mt.a, mt.b), strict=True)
        if shape is not None and len(shape) != 2
    ]
    if not problems:
        if mt.a is not None and mt.b is not None and mt.a[0] != mt.b[1]:
            params: dict[str, object] = {"a": labels[0], "ra": mt.a[0], "b": labels[1], "rb": mt.b[1]}
            problems.append(Text("doctor.shape.ranks_differ", params))
        elif rr is not None and mt.a is not None and mt.a[0] != rr:
            params = {"label": labels[0], "rank": mt.a[0], "file": CONFIG_FILE, "r": rr}
            problems.append(Text("doctor.shape.rank_not_r", params))
        elif rr is not None and mt.b is not None and mt.b[1] != rr:
            params = {"label": labels[1], "rank": mt.b[1], "file": CONFIG_FILE, "r": rr}
            problems.append(Text("doctor.shape.rank_not_r", params))
    return problems


def _misfit(mt: _ModuleTensors, base_shape: tuple[int, ...] | None, labels: tuple[str, str]) -> Text | None:
    """How A and B fail to fit the base weight [out_features, in_features]; None when they fit or it is unknown."""
    if base_shape is None or len(base_shape) != 2:
        return None
    out_f, in_f = base_shape
    if mt.embedding:  # base embedding weight is [vocab, hidden]; A is [r, vocab], B is [hidden, r]
        out_f, in_f = in_f, out_f
    fit = []
    if mt.a is not None and mt.a[1] != in_f:
        fit.append(
            Text(
                "doctor.shape.expected",
                {"label": labels[0], "shape": _fmt_shape(mt.a), "expected": f"[{mt.a[0]}, {in_f}]"},
            )
        )
    if mt.b is not None and mt.b[0] != out_f:
        fit.append(
            Text(
                "doctor.shape.expected",
                {"label": labels[1], "shape": _fmt_shape(mt.b), "expected": f"[{out_f}, {mt.b[1]}]"},
            )
        )
    if not fit:
        return None
    return Text("doctor.shape.for_base", {"fit": Text.join(Text("doctor.and"), fit), "base": _fmt_shape(base_shape)})


def _check_embedding_target(found: _Findings, q: str, short: str, base: BaseModelInfo | None) -> None:
    """LoRA on embed_tokens / lm_head: only for architectures whose vLLM class declares embedding_modules."""
    archs = set(base.architectures) if base is not None else set()
    if archs and not archs & EMBEDDING_LORA_ARCHS:
        params = {"q": q, "module": repr(short), "short": short, "archs": "/".join(sorted(archs))}
        found.add("error", "embedding_target", Text("doctor.embedding_target", params), group=f"emb:{short}")
    else:
        params = {"q": q, "module": repr(short)}
        found.add("warning", "embedding_target", Text("doctor.embedding_target.maybe", params), group=f"emb:{short}")


def _check_pairs(found: _Findings, q: str, unpaired: Mapping[str, list[str]]) -> None:
    """Modules with lora_A but no lora_B, or the other way round."""
    for lack, have in (("lora_B", "lora_A"), ("lora_A", "lora_B")):
        mods = unpaired[lack]
        if mods:
            params = {
                "q": q,
                "count": _count(len(mods), "module"),
                "modules": _modules_phrase(mods),
                "have": have,
                "lack": lack,
                "example": repr(mods[0]),
            }
            found.add("error", f"missing_{lack.lower()}", Text(_one(len(mods), "doctor.half_pair"), params))


def _check_module_names(found: _Findings, q: str, faults: _ModuleFaults, base_mods: Mapping[str, Any]) -> None:
    """Modules of the weights the base does not have: vLLM's fused names, other models' modules or layers."""
    fused, unknown = faults.fused, faults.unknown
    if fused:
        leaf = _short(fused[0])
        split_names = "/".join(PACKED_GROUPS[leaf])
        params = {
            "q": q,
            "count": _count(len(fused), "module"),
            "modules": _modules_phrase(fused),
            "leaf": repr(leaf),
            "example": repr(fused[0]),
            "split": split_names,
        }
        found.add("error", "fused_packed_key", Text("doctor.fused_packed_key", params))
    if unknown:
        layers = sorted({_layer_of(m) for m in unknown if _layer_of(m)}, key=int)
        base_layers = _count_layers(base_mods)
        missing_layers = [x for x in layers if int(x) >= base_layers] if base_layers else []
        why = Text("doctor.why.layers", {"n": base_layers}) if missing_layers else Text("doctor.why.no_module")
        params = {
            "q": q,
            "count": _count(len(unknown), "module"),
            "modules": _modules_phrase(unknown),
            "why": why,
            "example": repr(unknown[0]),
        }
        found.add("error", "unknown_tensor_module", Text(_one(len(unknown), "doctor.unknown_tensor_module"), params))


def _check_shapes(found: _Findings, q: str, faults: _ModuleFaults, n_modules: int) -> None:
    """Shapes that disagree with each other or the config, then shapes that do not fit the base weights."""
    inconsistent, misfits = faults.inconsistent, faults.misfits
    if inconsistent:
        module, text = inconsistent[0]
        params = {
            "q": q,
            "count": _count(len(inconsistent), "module"),
            "modules": _modules_phrase(m for m, _ in inconsistent),
            "example": repr(module),
            "detail": text,
        }
        found.add("error", "shape_mismatch", Text(_one(len(inconsistent), "doctor.inconsistent_shapes"), params))
    if misfits:
        module, text = misfits[0]
        params = {
            "q": q,
            "n": len(misfits),
            "count": _count(n_modules, "lora_module"),
            "modules": _modules_phrase(m for m, _ in misfits),
            "example": repr(module),
            "detail": text,
        }
        found.add("error", "shape_mismatch", Text("doctor.misfit", params))


def _count_layers(modules: Iterable[str]) -> int:
    layers = {m.group(1) for m in (re.search(r"\.layers\.(\d+)\.", "." + x) for x in modules) if m}
    return len(layers)


def _check_packed(
    found: _Findings, q: str, modules: Mapping[str, _ModuleTensors], base_mods: Mapping[str, Any] | None
) -> None:
    """A packed group (q/k/v -> qkv_proj, gate/up -> gate_up_proj) with only some members adapted.

    vLLM 0.32 pads the missing slices with None and serves the rest (PackedLoRALayerWeights.pack,
    set_lora skips None), so this is a warning, not an error; older vLLM crashed here with IndexError
    at ``lora_a[i]``, and an unintended partial set usually means a broken export.
    """
    partial: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
    parents: dict[str, set[str]] = {}
    for module in modules:
        parent, _, leaf = module.rpartition(".")
        parents.setdefault(parent, set()).add(leaf)
    for parent, leaves in parents.items():
        for packed, members in PACKED_GROUPS.items():
            have = tuple(m for m in members if m in leaves)
            if not have or len(have) == len(members):
                continue
            if base_mods is not None and not all(f"{parent}.{m}" in base_mods for m in members):
                continue  # the base does not pack these (or lacks them: reported elsewhere)
            lack = tuple(m for m in members if m not in leaves)
            partial.setdefault((packed, have, lack), []).append(_layer_of(parent + ".") or parent)
    for (packed, have, lack), layers in partial.items():
        params = {"q": q, "have": "/".join(have), "lack": "/".join(lack), "packed": packed, "where": _layers(layers)}
        found.add("warning", "partial_packed_group", Text("doctor.partial_packed_group", params))


def diagnose_model_dir(path: str | Path) -> Diagnosis:
    """Check a folder given as the *model*: an un-merged PEFT adapter there makes vLLM die with
    ``KeyError …lora_A.weight``."""
    path = Path(path)
    found = _Findings()
    adapter_base: str | None = None
    if not path.is_dir():
        found.add("error", "missing_model", Text("doctor.missing_model", {"path": str(path)}))
        return Diagnosis(path.name, path, found.result(), kind="model")
    cfg_path = path / CONFIG_FILE
    lora_keys = False
    for st in sorted(path.glob("*.safetensors"))[:64]:
        try:
            if any(_parse_key(k)[1] in ("A", "B", "emb_A", "emb_B") for k in read_safetensors_header(st)):
                lora_keys = True
                break
        except (OSError, ValueError):
            continue
    has_config = (path / "config.json").is_file()
    if cfg_path.is_file() and has_config and not lora_keys:
        found.add(
            "warning",
            "stray_adapter_config",
            Text("doctor.stray_adapter_config", {"path": str(path), "file": CONFIG_FILE}),
        )
    elif cfg_path.is_file() or lora_keys:
        try:
            adapter_base = read_json(cfg_path).get("base_model_name_or_path") if cfg_path.is_file() else None
        except (OSError, ValueError, AttributeError):
            adapter_base = None
        base_hint = adapter_base or "BASE_MODEL"
        found.add("error", "adapter_as_model", Text("doctor.adapter_as_model", {"path": str(path), "base": base_hint}))
    elif not has_config:
        found.add("error", "not_a_model", Text("doctor.not_a_model", {"path": str(path)}))
    return Diagnosis(path.name, path, found.result(), base_model_name_or_path=adapter_base, kind="model")


# ---------------------------------------------------------------- command line


def doctor_main(argv: list[str]) -> int:
    """``python -m backend doctor ADAPTER [--base MODEL] [--max-rank N] [--json]``; exit 1 on errors."""
    parser = argparse.ArgumentParser(
        prog="python -m backend doctor",
        description="Check a LoRA adapter folder against the base model before vLLM sees it.",
    )
    parser.add_argument("adapter", help="adapter folder, or the name of an adapter in [lora].modules / [lora].dir")
    parser.add_argument("--base", help="base model folder (default: the configured [model])")
    parser.add_argument("--max-rank", type=int, help="vLLM --max-lora-rank (default: [lora].max_lora_rank)")
    parser.add_argument("--as-model", action="store_true", help="check the folder as a *model* (un-merged adapter?)")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    args = parser.parse_args(argv)

    settings = None
    try:
        from ..settings import load_settings

        settings = load_settings()
    except ConfigError as exc:
        print(f"note: config not loaded ({exc}); using defaults", file=sys.stderr)

    if args.as_model:
        diagnosis = diagnose_model_dir(args.adapter)
    else:
        adapter = Path(args.adapter)
        if not adapter.exists() and settings is not None:
            if args.adapter in settings.lora.modules:
                adapter = settings.lora.adapter_path(args.adapter)
            elif (settings.lora.resolved_dir / args.adapter).is_dir():
                adapter = settings.lora.resolved_dir / args.adapter
        base: Path | None = Path(args.base) if args.base else None
        if base is None and settings is not None and settings.model.resolved_path.is_dir():
            base = settings.model.resolved_path
        max_rank = args.max_rank or (settings.lora.max_lora_rank if settings is not None else 16)
        diagnosis = diagnose_adapter(adapter, base, max_rank, name=adapter.name if adapter.name else args.adapter)
    if args.json:
        print(json.dumps(diagnosis.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(diagnosis.format_text())
    return 0 if diagnosis.ok else 1

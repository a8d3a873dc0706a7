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

Here: the config's checks (rank, features, targets, base) and the entry points; the findings and the base
model's reading are in ``diagnosis.py``, the tensors' names and shapes in ``doctor_tensors.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..settings import VLLM_LORA_RANKS
from ..text import Text
from .diagnosis import CONFIG_FILE as CONFIG_FILE
from .diagnosis import PACKED_GROUPS, WEIGHTS_FILE, AdapterConfig, Findings, parse_key, short_name
from .diagnosis import BaseModelInfo as BaseModelInfo
from .diagnosis import Diagnosis as Diagnosis
from .diagnosis import Finding as Finding
from .diagnosis import read_base_model as read_base_model
from .diagnosis import read_json as read_json
from .doctor_tensors import check_tensors
from .safetensors import read_safetensors_header, scan_values

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- the doctor


def _matches_target(module: str, target: str) -> bool:
    """PEFT's list semantics: exact name or a suffix at a '.' boundary."""
    return module == target or module.endswith("." + target)


def _norm_base_name(name: str) -> str:
    return name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()


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
    found = Findings()
    q = repr(name)
    _check_max_rank(found, max_rank)
    raw = _check_config_file(found, q, path)
    config = _check_config(found, q, raw) if raw is not None else AdapterConfig()
    if raw is not None and config.lora:
        _check_rank(found, q, config, max_rank)
        _check_features(found, q, raw, config, path)
        tensors = _check_weights_file(found, q, path)
        base = _check_base(found, q, base_dir)
        if base is not None:
            _check_base_match(found, q, config.base_name, base, base_aliases)
            _check_targets(found, q, config.targets, base, tensors)
        if tensors is not None:
            check_tensors(found, q, tensors, config, base, path)
            _check_values(found, q, path / WEIGHTS_FILE)
    base_label = str(base_dir) if base_dir is not None else ""
    return Diagnosis(name, path, found.result(), config.r, config.base_name, config.targets, base_label)


def _check_max_rank(found: Findings, max_rank: int) -> None:
    if max_rank not in VLLM_LORA_RANKS:
        ranks = ", ".join(map(str, VLLM_LORA_RANKS))
        found.add("error", "bad_max_rank", Text("doctor.bad_max_rank", {"max_rank": max_rank, "ranks": ranks}))


def _check_config_file(found: Findings, q: str, path: Path) -> dict[str, Any] | None:
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


def _check_config(found: Findings, q: str, cfg: Mapping[str, Any]) -> AdapterConfig:
    """peft_type, the keys vLLM requires and their types (PEFTHelper.from_dict)."""
    base_name = cfg.get("base_model_name_or_path") if isinstance(cfg.get("base_model_name_or_path"), str) else None
    peft_type = cfg.get("peft_type")
    if peft_type is None:
        found.add("warning", "missing_peft_type", Text("doctor.missing_peft_type", {"q": q, "file": CONFIG_FILE}))
    elif str(peft_type).upper() != "LORA":
        found.add("error", "not_lora", Text("doctor.not_lora", {"q": q, "peft_type": repr(peft_type)}))
        return AdapterConfig(base_name, lora=False)
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
    return AdapterConfig(base_name, True, r, rank_pattern, targets, tuple(mts))


def _check_rank(found: Findings, q: str, config: AdapterConfig, max_rank: int) -> None:
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


def _check_features(found: Findings, q: str, cfg: Mapping[str, Any], config: AdapterConfig, path: Path) -> None:
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


def _check_weights_file(found: Findings, q: str, path: Path) -> dict[str, tuple[int, ...]] | None:
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


def _check_values(found: Findings, q: str, weights: Path) -> None:
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


def _check_base(found: Findings, q: str, base_dir: str | Path | None) -> BaseModelInfo | None:
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
    found: Findings, q: str, base_name: str | None, base: BaseModelInfo, aliases: Iterable[str]
) -> None:
    if not base_name:
        return
    served = {_norm_base_name(n) for n in (str(base.path), base.name_or_path, *aliases) if n}
    if _norm_base_name(base_name) not in served:
        params = {"q": q, "trained": repr(base_name), "served": repr(base.path.name)}
        found.add("warning", "base_mismatch", Text("doctor.base_mismatch", params))


def _check_targets(
    found: Findings,
    q: str,
    targets: tuple[str, ...] | str,
    base: BaseModelInfo,
    tensors: Mapping[str, tuple[int, ...]] | None,
) -> None:
    names = list(base.modules)
    some = ", ".join(sorted({short_name(m) for m in base.linear_modules})[:12])
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
    lora_modules = {m for m, _ in (parse_key(k) for k in (tensors or {})) if m}
    for t in targets:
        if t in PACKED_GROUPS and any(short_name(m) == t for m in lora_modules):
            continue  # tensors for vLLM's fused name: reported as fused_packed_key
        if not any(_matches_target(m, t) for m in names):
            params = {"q": q, "module": repr(t), "some": some}
            found.add("error", "unknown_target_module", Text("doctor.unknown_target_module", params))
        elif tensors is not None and not any(_matches_target(m, t) for m in lora_modules):
            found.add(
                "warning", "target_without_tensors", Text("doctor.target_without_tensors", {"q": q, "module": repr(t)})
            )


def diagnose_model_dir(path: str | Path) -> Diagnosis:
    """Check a folder given as the *model*: an un-merged PEFT adapter there makes vLLM die with
    ``KeyError …lora_A.weight``."""
    path = Path(path)
    found = Findings()
    adapter_base: str | None = None
    if not path.is_dir():
        found.add("error", "missing_model", Text("doctor.missing_model", {"path": str(path)}))
        return Diagnosis(path.name, path, found.result(), kind="model")
    cfg_path = path / CONFIG_FILE
    lora_keys = False
    for st in sorted(path.glob("*.safetensors"))[:64]:
        try:
            if any(parse_key(k)[1] in ("A", "B", "emb_A", "emb_B") for k in read_safetensors_header(st)):
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

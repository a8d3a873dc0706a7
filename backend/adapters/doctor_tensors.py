"""The adapter doctor's checks of the weights file's tensors (their names and shapes) against the config and the
base model; vLLM 0.32's rules (vllm/lora/lora_model.py, utils.py). Entry point: ``check_tensors``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..text import Text
from .diagnosis import (
    CONFIG_FILE,
    EMBEDDING_LORA_ARCHS,
    EMBEDDING_NAMES,
    PACKED_GROUPS,
    PEFT_PREFIX,
    WEIGHTS_FILE,
    AdapterConfig,
    BaseModelInfo,
    Findings,
    parse_key,
    short_name,
)


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


def _layer_of(module: str) -> str:
    m = re.search(r"\.(\d+)\.", "." + module + ".")
    return m.group(1) if m else ""


def _fmt_shape(shape: Iterable[int] | None) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]" if shape is not None else "[?]"


def _modules_phrase(modules: Iterable[str]) -> Text:
    """'k_proj, q_proj in layers 0, 1' — which kinds of module, in which layers."""
    modules = list(modules)
    kinds = sorted({short_name(m) for m in modules})
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


def check_tensors(
    found: Findings,
    q: str,
    tensors: Mapping[str, tuple[int, ...]],
    config: AdapterConfig,
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
        module, kind = parse_key(key)
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
    found: Findings, q: str, tensors: Mapping[str, tuple[int, ...]], keys: _TensorKeys, path: Path
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
    found: Findings,
    q: str,
    modules: Mapping[str, _ModuleTensors],
    config: AdapterConfig,
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
        short = short_name(module)
        if short in EMBEDDING_NAMES or short == "lm_head":
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


def _check_embedding_target(found: Findings, q: str, short: str, base: BaseModelInfo | None) -> None:
    """LoRA on embed_tokens / lm_head: only for architectures whose vLLM class declares embedding_modules."""
    archs = set(base.architectures) if base is not None else set()
    if archs and not archs & EMBEDDING_LORA_ARCHS:
        params = {"q": q, "module": repr(short), "short": short, "archs": "/".join(sorted(archs))}
        found.add("error", "embedding_target", Text("doctor.embedding_target", params), group=f"emb:{short}")
    else:
        params = {"q": q, "module": repr(short)}
        found.add("warning", "embedding_target", Text("doctor.embedding_target.maybe", params), group=f"emb:{short}")


def _check_pairs(found: Findings, q: str, unpaired: Mapping[str, list[str]]) -> None:
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


def _check_module_names(found: Findings, q: str, faults: _ModuleFaults, base_mods: Mapping[str, Any]) -> None:
    """Modules of the weights the base does not have: vLLM's fused names, other models' modules or layers."""
    fused, unknown = faults.fused, faults.unknown
    if fused:
        leaf = short_name(fused[0])
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


def _check_shapes(found: Findings, q: str, faults: _ModuleFaults, n_modules: int) -> None:
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
    found: Findings, q: str, modules: Mapping[str, _ModuleTensors], base_mods: Mapping[str, Any] | None
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

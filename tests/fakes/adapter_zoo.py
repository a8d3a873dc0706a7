"""Tiny fake base models and PEFT LoRA adapters — good ones and a zoo of broken ones — built with numpy.

No torch: the files are shaped exactly like what transformers' ``save_pretrained`` and PEFT 0.21's
``save_pretrained`` write (same config fields, same tensor names and shapes), with zero weights.

    base = make_base_model(tmp_path / "tiny-llama")
    good = make_adapter(tmp_path / "good", base_name=str(base))
    broken = ZOO["rank_32"](tmp_path)            # one folder per broken case
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


@dataclass(frozen=True)
class TinyShape:
    """Sizes of the fake base. The default (head_dim 16) is for the doctor only: vLLM's CPU attention
    needs head_dim >= 32 — to serve one, use e.g. ``TinyShape(head_dim=32, vocab=len(tokenizer))`` with
    a Llama architecture (vLLM's Qwen2 ignores config.head_dim; use heads=2, kv_heads=1 there)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    vocab: int = 256

    def linear_shapes(self, layers: int | None = None) -> dict[str, tuple[int, int]]:
        """HF weight shape [out_features, in_features] of every linear module."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        out_in = {
            "q_proj": (q, self.hidden),
            "k_proj": (kv, self.hidden),
            "v_proj": (kv, self.hidden),
            "o_proj": (self.hidden, q),
            "gate_proj": (self.intermediate, self.hidden),
            "up_proj": (self.intermediate, self.hidden),
            "down_proj": (self.hidden, self.intermediate),
        }
        n = self.layers if layers is None else layers
        return {module_path(i, leaf): shape for i in range(n) for leaf, shape in out_in.items()}


TINY = TinyShape()
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = TINY.hidden, TINY.layers, TINY.heads, TINY.kv_heads, TINY.head_dim
INTERMEDIATE, VOCAB = TINY.intermediate, TINY.vocab

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PREFIX = "base_model.model."


def module_path(layer: int, leaf: str) -> str:
    part = "self_attn" if leaf in ATTN or leaf == "qkv_proj" else "mlp"
    return f"model.layers.{layer}.{part}.{leaf}"


def linear_shapes(layers: int = LAYERS) -> dict[str, tuple[int, int]]:
    """HF weight shape [out_features, in_features] of every linear module of the default tiny base."""
    return TINY.linear_shapes(layers)


def _zeros(shape: Iterable[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=np.float16)


def make_base_model(
    folder: Path,
    *,
    arch: str = "LlamaForCausalLM",
    model_type: str = "llama",
    tie: bool = False,
    sharded: bool = False,
    shape: TinyShape = TINY,
    seed: int | None = None,
) -> Path:
    """A Llama/Qwen2-shaped model folder: config.json + model.safetensors (or an index and two shards).

    Weights are zeros (the doctor reads only headers); ``seed`` gives small random weights instead, and
    norms of ones, so the folder also runs (add tokenizer files whose size is ``shape.vocab``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed) if seed is not None else None

    def weight(dims: tuple[int, ...]) -> np.ndarray:
        if rng is None:
            return _zeros(dims)
        return (rng.standard_normal(dims) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones((shape.hidden,), np.float16) if rng is not None else _zeros((shape.hidden,))

    config = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie,
        "torch_dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": weight((shape.vocab, shape.hidden)),
        "model.norm.weight": norm(),
    }
    if not tie:
        tensors["lm_head.weight"] = weight((shape.vocab, shape.hidden))
    for module, dims in shape.linear_shapes().items():
        tensors[module + ".weight"] = weight(dims)
        if model_type == "qwen2" and module.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj"):
            tensors[module + ".bias"] = _zeros(dims[:1])  # Qwen2 has q/k/v biases
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = norm()
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = norm()
    if not sharded:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def peft_config(
    r: int = 8, targets: Iterable[str] | str = ATTN, *, base_name: str | None = None, **overrides: object
) -> dict:
    """adapter_config.json as PEFT 0.21.2 writes it (same keys and defaults)."""
    config = {
        "alora_invocation_tokens": None,
        "alpha_pattern": {},
        "arrow_config": None,
        "auto_mapping": None,
        "base_model_name_or_path": base_name,
        "bias": "none",
        "corda_config": None,
        "ensure_weight_tying": False,
        "eva_config": None,
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": 2 * r,
        "lora_bias": False,
        "lora_dropout": 0.05,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "peft_type": "LORA",
        "peft_version": "0.21.2",
        "qalora_group_size": 16,
        "r": r,
        "rank_pattern": {},
        "revision": None,
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "target_parameters": None,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": None,
        "use_bdlora": None,
        "use_dora": False,
        "use_qalora": False,
        "use_rslora": False,
    }
    config.update(overrides)
    return config


def lora_tensors(
    r: int = 8,
    targets: Iterable[str] = ATTN,
    layers: Iterable[int] | None = None,
    shapes: Mapping[str, tuple[int, int]] | None = None,
    *,
    shape: TinyShape = TINY,
    seed: int | None = None,
) -> dict[str, np.ndarray]:
    """PEFT's saved keys: base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r].

    lora_B is a small constant (a trained adapter's: not zero, finite) unless ``seed`` asks for random values;
    ``zoo_all_zero`` has it zero, as PEFT initialises it (no effect).
    """
    layers = list(range(shape.layers) if layers is None else layers)
    shapes = shapes or shape.linear_shapes(max(max(layers, default=0) + 1, shape.layers))
    rng = np.random.default_rng(seed) if seed is not None else None
    out: dict[str, np.ndarray] = {}
    for i in layers:
        for leaf in targets:
            module = module_path(i, leaf)
            out_f, in_f = shapes[module]
            out[f"{PREFIX}{module}.lora_A.weight"] = np.full((r, in_f), 0.01, dtype=np.float32)
            out[f"{PREFIX}{module}.lora_B.weight"] = (
                np.full((out_f, r), 0.01, dtype=np.float32)
                if rng is None
                else (rng.standard_normal((out_f, r)) * 0.5).astype(np.float32)
            )
    return out


def make_adapter(
    folder: Path,
    *,
    r: int = 8,
    targets: Iterable[str] = ATTN,
    config_targets: object = None,
    base_name: str | None = None,
    config: Mapping[str, object] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
    edit: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    write_config: bool = True,
    shape: TinyShape = TINY,
    seed: int | None = None,
) -> Path:
    """A PEFT LoRA folder. ``targets``: modules given tensors; ``config_targets``: what the config lists."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = tuple(targets)
    if write_config:
        cfg = peft_config(r, config_targets if config_targets is not None else targets, base_name=base_name)
        cfg.update(config or {})
        (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    data = dict(tensors) if tensors is not None else lora_tensors(r, targets, shape=shape, seed=seed)
    if edit is not None:
        data = edit(data)
    save_file(data, str(folder / "adapter_model.safetensors"))
    (folder / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    return folder


# ---------------------------------------------------------------- the zoo of broken adapters


def _rename(old: str, new: str) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    return lambda d: {k.replace(old, new): v for k, v in d.items()}


def _reshape(key_part: str, shape: tuple[int, int]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    return lambda d: {k: (_zeros(shape) if key_part in k else v) for k, v in d.items()}


def zoo_rank_32(root: Path) -> Path:
    return make_adapter(root / "rank-32", r=32)


def zoo_target_config_only(root: Path) -> Path:
    """target_modules names c_attn (GPT-2's) which the base lacks; no tensors for it (vLLM: silent)."""
    return make_adapter(root / "target-config-only", config_targets=[*ATTN, "c_attn"])


def zoo_target_with_tensors(root: Path) -> Path:
    """target_modules and tensors both name c_attn, a module the base lacks."""

    def add_c_attn(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for i in range(LAYERS):
            d[f"{PREFIX}model.layers.{i}.self_attn.c_attn.lora_A.weight"] = _zeros((8, HIDDEN))
            d[f"{PREFIX}model.layers.{i}.self_attn.c_attn.lora_B.weight"] = _zeros((3 * HIDDEN, 8))
        return d

    return make_adapter(
        root / "target-with-tensors",
        targets=("q_proj", "v_proj"),
        config_targets=["q_proj", "v_proj", "c_attn"],
        edit=add_c_attn,
    )


def zoo_tensor_missing_module(root: Path) -> Path:
    """Trained on a 6-layer model: tensors for layers 2..5 name modules this 2-layer base lacks."""
    return make_adapter(root / "deeper-model", tensors=lora_tensors(8, ATTN, range(6), linear_shapes(6)))


def zoo_renamed_lora_a(root: Path) -> Path:
    """lora_A keys renamed to kohya-style lora_down; lora_B left alone."""
    return make_adapter(root / "renamed-lora-a", edit=_rename(".lora_A.weight", ".lora_down.weight"))


def zoo_adapter_name_in_keys(root: Path) -> Path:
    """model.state_dict() saved by hand: keys keep PEFT's adapter name ('default')."""
    return make_adapter(
        root / "named-keys", edit=lambda d: {k.replace(".weight", ".default.weight"): v for k, v in d.items()}
    )


def zoo_missing_lora_b(root: Path) -> Path:
    return make_adapter(
        root / "missing-lora-b", edit=lambda d: {k: v for k, v in d.items() if "v_proj.lora_B" not in k}
    )


def zoo_wrong_shape(root: Path) -> Path:
    """k_proj's lora_B has the q_proj output size (64) instead of the GQA k size (32)."""
    return make_adapter(root / "wrong-shape", edit=_reshape("k_proj.lora_B", (HIDDEN, 8)))


def zoo_missing_config(root: Path) -> Path:
    return make_adapter(root / "no-config", write_config=False)


def zoo_modules_to_save(root: Path) -> Path:
    def add_head(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        d[f"{PREFIX}lm_head.weight"] = _zeros((VOCAB, HIDDEN))
        return d

    return make_adapter(root / "modules-to-save", config={"modules_to_save": ["lm_head"]}, edit=add_head)


def zoo_dora(root: Path) -> Path:
    def add_magnitude(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for k in list(d):
            if k.endswith(".lora_B.weight"):
                d[k.replace(".lora_B.weight", ".lora_magnitude_vector")] = _zeros(d[k].shape[:1])
        return d

    return make_adapter(root / "dora", config={"use_dora": True}, edit=add_magnitude)


def zoo_half_packed(root: Path) -> Path:
    """q_proj and k_proj but no v_proj: two thirds of vLLM's packed qkv_proj."""
    return make_adapter(root / "half-packed", targets=("q_proj", "k_proj"))


def zoo_fused_qkv(root: Path) -> Path:
    """One fused qkv_proj tensor per layer (vLLM's internal name) for a base with separate q/k/v."""
    tensors = {}
    for i in range(LAYERS):
        tensors[f"{PREFIX}model.layers.{i}.self_attn.qkv_proj.lora_A.weight"] = _zeros((8, HIDDEN))
        tensors[f"{PREFIX}model.layers.{i}.self_attn.qkv_proj.lora_B.weight"] = _zeros(
            (HIDDEN + 2 * KV_HEADS * HEAD_DIM, 8)
        )
    return make_adapter(root / "fused-qkv", config_targets=["qkv_proj"], tensors=tensors)


def zoo_not_lora(root: Path) -> Path:
    return make_adapter(root / "ia3", config={"peft_type": "IA3"})


def _poison(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One lora_B with a NaN, one lora_A with an Inf (the values of a run that diverged)."""
    out = dict(d)
    b = sorted(k for k in out if ".lora_B." in k)[0]
    a = sorted(k for k in out if ".lora_A." in k)[-1]
    out[b] = out[b].copy()
    out[b][0, 0] = np.nan
    out[a] = out[a].copy()
    out[a][-1, -1] = np.inf
    return out


def zoo_nan_inf(root: Path) -> Path:
    return make_adapter(root / "nan_inf", edit=_poison)


def zoo_all_zero(root: Path) -> Path:
    """Saved right after PEFT created it: lora_B all zeros."""
    return make_adapter(root / "all_zero", edit=lambda d: {k: (v * 0 if ".lora_B." in k else v) for k, v in d.items()})


ZOO: dict[str, Callable[[Path], Path]] = {
    "rank_32": zoo_rank_32,
    "target_config_only": zoo_target_config_only,
    "target_with_tensors": zoo_target_with_tensors,
    "tensor_missing_module": zoo_tensor_missing_module,
    "renamed_lora_a": zoo_renamed_lora_a,
    "adapter_name_in_keys": zoo_adapter_name_in_keys,
    "missing_lora_b": zoo_missing_lora_b,
    "wrong_shape": zoo_wrong_shape,
    "missing_config": zoo_missing_config,
    "modules_to_save": zoo_modules_to_save,
    "dora": zoo_dora,
    "half_packed": zoo_half_packed,
    "fused_qkv": zoo_fused_qkv,
    "not_lora": zoo_not_lora,
    "nan_inf": zoo_nan_inf,
    "all_zero": zoo_all_zero,
}

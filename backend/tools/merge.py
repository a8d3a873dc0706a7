"""``python -m backend merge --base MODEL --adapter ADAPTER --out DIR``: fold a LoRA into its base.

    merge_main(["--base", base, "--adapter", adapter, "--out", out])   # exit 0 ok, 1 refused/failed, 2 bad args
    plan = preflight(base, adapter, out, dtype="auto")                 # MergeError, before any torch
    estimate_output_bytes(base, "float32"); check_free_space(out, needed, free=None)
    report = inspect_merged(folder, base)                              # static check of a result (no torch)
    run_merge(plan)                                                    # engine env: torch + peft

Why: merging is the standard fix for what vLLM cannot serve as an adapter (DoRA, modules_to_save,
embed_tokens/lm_head LoRA, ranks above 512) and for an un-merged PEFT folder passed as the model
(vLLM dies with ``KeyError …lora_A.weight``); the adapter doctor points here. Everything cheap is
checked first (doctor, base folder, --out, free disk); the merge itself (PEFT ``merge_and_unload``)
needs torch, so from the app environment the command re-runs itself with $QWENCHAT_ENGINE_PYTHON.
The result is written to a temp folder next to --out and renamed into place only after it has been
verified: an interrupted or failed merge leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from backend import contract
from backend.adapters.doctor import Diagnosis, diagnose_adapter
from backend.adapters.safetensors import read_safetensors_header, read_safetensors_metadata
from backend.errors import ModelPathError, QwenChatError
from backend.launcher.preflight import check_model_dir
from backend.settings import home_dir

logger = logging.getLogger(__name__)

#: Doctor findings that only say vLLM cannot serve the adapter *as an adapter*; PEFT merges them fine
#: (the doctor itself suggests this command for them). Every other error refuses the merge.
MERGE_FIXES = frozenset({"rank_too_large", "bad_max_rank", "modules_to_save", "dora", "embedding_target"})
DTYPES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "F64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5")
#: Tokenizer files are copied byte for byte: the merged folder tokenizes exactly like the base
#: (an AutoTokenizer round trip would rewrite tokenizer_class and move the chat template out of
#: tokenizer_config.json, which older readers ignore — DESIGN §4).
_TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "qwen.tiktoken",
)
_LICENSE_PREFIXES = ("license", "notice")
_CHILD_ENV = "QWENCHAT_MERGE_CHILD"  # set for the re-executed child: no second re-exec, no repeated notes
_PROBE_LEN = 8
_EMBEDDING_NAMES = ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_in", "embed_out")


class MergeError(QwenChatError):
    """The merge was refused or failed; the text names the bad value and the fix."""

    code: ClassVar[str] = "merge"
    text_key: ClassVar[str] = "error.merge"


def _say(text: str) -> None:
    print(f"[qwenchat] {text}", flush=True)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


# ---------------------------------------------------------------- preflight (no torch)


@dataclass(frozen=True)
class MergePlan:
    """What will be merged where, after every cheap check passed."""

    base: Path
    adapter: Path
    out: Path
    dtype: str
    force: bool
    needed_bytes: int
    free_bytes: int
    diagnosis: Diagnosis
    untie: bool = False  # give lm_head its own copy of the tied embedding before merging (peft#2777)


def _weight_files(folder: Path) -> list[Path]:
    """The base's weight files: safetensors if there are any, else pickles."""
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    return files or sorted(p for p in folder.glob("*.bin") if p.is_file())


def tokenizer_files(folder: Path) -> list[Path]:
    """Tokenizer (and license) files of a model folder, copied verbatim into the merged folder."""
    out = []
    for p in sorted(folder.iterdir()):
        name = p.name.lower()
        if not p.is_file() or name.startswith(".") or name.endswith(_WEIGHT_SUFFIXES):
            continue
        if p.name in _TOKENIZER_NAMES or name.endswith(".tiktoken") or name.startswith(_LICENSE_PREFIXES):
            out.append(p)
    return out


def _stored_dtype(base: Path) -> str | None:
    """The dtype the base's floating-point weights are stored in (safetensors header), e.g. "BF16"."""
    for st in sorted(base.glob("*.safetensors")):
        try:
            header = read_safetensors_metadata(st)
        except (OSError, ValueError, struct.error):
            continue
        for name, meta in header.items():
            if name != "__metadata__" and isinstance(meta, dict) and meta.get("dtype") in _DTYPE_BYTES:
                return str(meta["dtype"])
    return None


def adapts_embeddings(adapter: Path) -> bool:
    """The adapter changes embed_tokens or lm_head (LoRA on them, or full copies via modules_to_save)."""
    try:
        keys = list(read_safetensors_header(Path(adapter) / "adapter_model.safetensors"))
    except (OSError, ValueError):
        keys = []
    try:
        cfg = json.loads((Path(adapter) / "adapter_config.json").read_text(encoding="utf-8"))
        names = [*(cfg.get("modules_to_save") or []), *(cfg.get("target_modules") or [])]
    except (OSError, ValueError, AttributeError, TypeError):
        names = []
    return any(e in str(n) for n in [*keys, *names] for e in _EMBEDDING_NAMES)


def _tied(base: Path) -> bool:
    try:
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))


def _embedding_bytes(base: Path) -> int:
    for st in sorted(base.glob("*.safetensors")):
        try:
            header = read_safetensors_metadata(st)
        except (OSError, ValueError, struct.error):
            continue
        for name, meta in header.items():
            if name.endswith("embed_tokens.weight") and isinstance(meta, dict):
                start, end = meta.get("data_offsets", (0, 0))
                return int(end) - int(start)
    return 0


def estimate_output_bytes(base: Path, dtype: str = "auto", *, untie: bool = False) -> int:
    """Disk the merged folder needs: base weights (rescaled to ``dtype``) × 1.1, plus tokenizer files.

    ``untie``: lm_head gets its own copy of the embedding (a tied base whose adapter changes one of them).
    """
    weights = sum(p.stat().st_size for p in _weight_files(base)) + (_embedding_bytes(base) if untie else 0)
    stored = _stored_dtype(base)
    if dtype != "auto" and stored in _DTYPE_BYTES:
        weights = weights * _DTYPE_BYTES[dtype] // _DTYPE_BYTES[stored]
    return int(weights * 1.1) + sum(p.stat().st_size for p in tokenizer_files(base))


def _existing_ancestor(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(path.anchor or ".")


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(_existing_ancestor(path)).free


def check_free_space(out: Path, needed: int, free: int | None = None) -> int:
    """``free`` bytes at --out's filesystem (measured when None); MergeError naming both numbers if short."""
    where = _existing_ancestor(out)
    free = _free_bytes(out) if free is None else free
    if free < needed:
        raise MergeError(
            f"not enough free disk space for --out {out}: the merged model needs about {fmt_bytes(needed)} "
            f"({needed} bytes: base weights × 1.1 + tokenizer) but {where} has {fmt_bytes(free)} ({free} bytes) "
            "free; free up space there or choose --out on another disk"
        )
    return free


def _check_out(out: Path, base: Path, adapter: Path, force: bool) -> None:
    resolved = out.resolve()
    for label, other in (("--base", base), ("--adapter", adapter)):
        o = other.resolve()
        if resolved == o or o.is_relative_to(resolved):
            raise MergeError(f"--out {out} would overwrite {label} {other}; choose a new folder for the merged model")
    if out.exists() and not out.is_dir():
        raise MergeError(f"--out {out} is a file; choose a folder path for the merged model")
    if out.is_dir():
        entries = [p.name for p in out.iterdir()]
        if entries and not force:
            shown = ", ".join(sorted(entries)[:5]) + (", …" if len(entries) > 5 else "")
            raise MergeError(
                f"--out {out} already exists and is not empty ({shown}); choose a new folder, "
                "or pass --force to replace it"
            )


def preflight(
    base: str | Path,
    adapter: str | Path,
    out: str | Path,
    *,
    dtype: str = "auto",
    force: bool = False,
    free: int | None = None,
) -> MergePlan:
    """Every check that needs no torch, cheapest first; MergeError with the bad value and the fix."""
    base, adapter, out = Path(base), Path(adapter), Path(out)
    if dtype not in DTYPES:
        raise MergeError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        check_model_dir(base)
    except ModelPathError as exc:
        raise MergeError(
            f"--base {exc.path} {exc.problem}; pass the folder of the base model the adapter was "
            "trained on (config.json + *.safetensors)"
        ) from None
    diagnosis = diagnose_adapter(adapter, base, max_rank=512, name=adapter.name or str(adapter))
    blocking = [f for f in diagnosis.errors if f.code not in MERGE_FIXES]
    if blocking:
        raise MergeError(
            f"--adapter {adapter}: the adapter doctor found errors that a merge cannot fix; fix the "
            f"adapter first:\n{diagnosis.format_text()}"
        )
    _check_out(out, base, adapter, force)
    untie = _tied(base) and adapts_embeddings(adapter)
    needed = estimate_output_bytes(base, dtype, untie=untie)
    free = check_free_space(out, needed, free)
    return MergePlan(base, adapter, out, dtype, force, needed, free, diagnosis, untie)


# ---------------------------------------------------------------- the merged folder, statically


@dataclass(frozen=True)
class MergedReport:
    """What a merged folder holds, read from config.json and safetensors headers (no torch)."""

    folder: Path
    weight_files: tuple[str, ...]
    tensors: int
    size_bytes: int
    dtypes: tuple[str, ...]
    architectures: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())


def inspect_merged(folder: Path, base: Path | None = None) -> MergedReport:
    """Check a merged folder: config, weights, no ``lora_`` keys, no adapter_config.json, same tensors as the
    base. MergeError for what makes it unservable; name differences from the base are warnings."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MergeError(f"the merged folder {folder} has no readable config.json ({exc})") from None
    if (folder / "adapter_config.json").exists():
        raise MergeError(f"the merged folder {folder} holds adapter_config.json; vLLM would take it for an adapter")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MergeError(f"the merged folder {folder} has no *.safetensors weights")
    keys: dict[str, tuple[int, ...]] = {}
    dtypes: set[str] = set()
    for st in files:
        try:
            header = read_safetensors_metadata(st)
        except (OSError, ValueError, struct.error) as exc:
            raise MergeError(f"the merged weights {st} are unreadable ({exc})") from None
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            keys[name] = tuple(meta.get("shape", ())) if isinstance(meta, dict) else ()
            if isinstance(meta, dict) and meta.get("dtype"):
                dtypes.add(str(meta["dtype"]))
    lora = [k for k in keys if "lora_" in k]
    if lora:
        raise MergeError(
            f"the merged weights still hold {len(lora)} LoRA tensors (e.g. {lora[0]!r}); "
            "merge_and_unload did not fold the adapter in"
        )
    warnings: list[str] = []
    if base is not None:
        base_keys: dict[str, tuple[int, ...]] = {}
        for st in sorted(Path(base).glob("*.safetensors")):
            try:
                base_keys.update(
                    {
                        k: tuple(m.get("shape", ()))
                        for k, m in read_safetensors_metadata(st).items()
                        if k != "__metadata__" and isinstance(m, dict)
                    }
                )
            except (OSError, ValueError, struct.error):
                continue
        tied = bool(config.get("tie_word_embeddings", False))
        missing = sorted(k for k in base_keys if k not in keys and not (tied and k == "lm_head.weight"))
        reshaped = sorted(k for k in base_keys if k in keys and keys[k] != base_keys[k])
        extra = sorted(k for k in keys if base_keys and k not in base_keys)
        for names, noun, label in (
            (missing, "base tensor", "missing from the merged weights"),
            (reshaped, "tensor", "with a shape different from the base"),
            (extra, "new tensor", "not in the base (expected when the adapter changes embed_tokens/lm_head)"),
        ):
            if names:
                warnings.append(f"{len(names)} {noun}{'s' * (len(names) != 1)} {label}, e.g. {names[0]!r}")
    archs = tuple(a for a in config.get("architectures") or () if isinstance(a, str))
    return MergedReport(
        folder,
        tuple(p.name for p in files),
        len(keys),
        sum(p.stat().st_size for p in files),
        tuple(sorted(dtypes)),
        archs,
        tuple(warnings),
    )


# ---------------------------------------------------------------- the merge (engine env: torch + peft)


def have_torch() -> bool:
    """torch, peft and transformers are importable here (the engine env), checked without importing them."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "peft", "transformers"))


def _engine_env_hint() -> str:
    found = sorted(home_dir().glob("envs/engine-*/bin/python"))
    return str(found[-1]) if found else f"{home_dir()}/envs/engine-cpu-<hash>/bin/python"


def _same_python(a: str, b: str) -> bool:
    # Not .resolve(): every venv's python is a symlink to the same system interpreter.
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def run_in_engine_env(argv: list[str]) -> int:
    """Re-run this command with $QWENCHAT_ENGINE_PYTHON (set by start.sh / test.sh); 1 when there is none."""
    engine = os.environ.get(contract.ENV_ENGINE_PYTHON, "")
    command = " ".join(shlex.quote(a) for a in ["-m", "backend", "merge", *argv])
    if os.environ.get(_CHILD_ENV) or not engine or _same_python(engine, sys.executable):
        print(
            f"[qwenchat] merging needs torch and peft, which {sys.executable} does not have; run it with the "
            f"engine environment's python: {_engine_env_hint()} {command} (or set QWENCHAT_ENGINE_PYTHON to it)",
            file=sys.stderr,
        )
        return 1
    if not Path(engine).exists():
        print(
            f"[qwenchat] QWENCHAT_ENGINE_PYTHON={engine} does not exist; point it at the engine environment's "
            f"python (e.g. {_engine_env_hint()}) or run ./start.sh once to create it",
            file=sys.stderr,
        )
        return 1
    _say(f"torch/peft are not in this python; merging with the engine env ({engine})")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **{_CHILD_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    rc = subprocess.call([engine, "-m", "backend", "merge", *argv], env=env)
    return rc if rc in (0, 1, 2) else 1


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished temp folder to --out; a replaced --out is deleted only after that succeeded."""
    old: Path | None = None
    if out.is_dir():
        if any(out.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
        else:
            out.rmdir()
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _probe_ids(vocab: int) -> list[int]:
    # Fixed, spread-out token ids: no tokenizer needed, same for every run.
    return [(i * 7919 + 13) % vocab for i in range(_PROBE_LEN)]


@dataclass
class _Logits:
    """The probe's logits before and after the merge (in memory), to check the saved model against."""

    probe: Any  # torch.Tensor [1, _PROBE_LEN]
    unmerged: Any  # base + adapter
    expected: Any  # the merged model in memory
    dtype_name: str


def run_merge(plan: MergePlan, progress: Callable[[str], None] = _say) -> MergedReport:
    """Load base + adapter, merge_and_unload, save to a temp folder, verify, rename to ``plan.out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only; there is no hub to ask
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype: Any = "auto" if plan.dtype == "auto" else getattr(torch, plan.dtype)
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{plan.out.name}.merge-", dir=plan.out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the model from an engine running as another user
    try:
        logits = _merge_into(plan, tmp, torch_dtype, progress)
        progress("verifying …")
        report = inspect_merged(tmp, plan.base)
        _verify_saved(plan, tmp, torch_dtype, logits, progress)
        for w in report.warnings:
            progress(f"warning: {w}")
        _publish(tmp, plan.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MergedReport(
        plan.out,
        report.weight_files,
        report.tensors,
        report.size_bytes,
        report.dtypes,
        report.architectures,
        report.warnings,
    )


def _merge_into(plan: MergePlan, tmp: Path, torch_dtype: Any, progress: Callable[[str], None]) -> _Logits:
    """Base + adapter merged in memory and saved to ``tmp`` with the base's tokenizer files."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    progress(f"loading base {plan.base} (dtype {plan.dtype}) …")
    model = AutoModelForCausalLM.from_pretrained(str(plan.base), dtype=torch_dtype)
    dtype_name = str(model.dtype).removeprefix("torch.")
    probe = torch.tensor([_probe_ids(model.get_input_embeddings().weight.shape[0])])  # before PEFT wraps it
    if plan.untie and model.get_output_embeddings() is not None:
        # Merging a LoRA into a tied embed_tokens would also change lm_head (and vice versa): the merged
        # model would answer differently from base+adapter (measured: top token wrong at 8/8 probes).
        progress("untying lm_head from embed_tokens (the base ties them; the adapter changes one of them) …")
        embedding = model.get_input_embeddings().weight
        model.get_output_embeddings().weight = torch.nn.Parameter(embedding.detach().clone())
        model.config.tie_word_embeddings = False
        model.config.get_text_config().tie_word_embeddings = False
    progress(f"loading adapter {plan.adapter} …")
    model = PeftModel.from_pretrained(model, str(plan.adapter))
    model.eval()
    with torch.no_grad():
        unmerged = model(probe).logits.float()
    progress("merging (merge_and_unload) …")
    merged = model.merge_and_unload()
    with torch.no_grad():
        expected = merged(probe).logits.float()
    progress(f"saving to {plan.out} ({dtype_name}) …")
    merged.save_pretrained(str(tmp))
    copied = [p.name for p in tokenizer_files(plan.base)]
    for name in copied:
        shutil.copy2(plan.base / name, tmp / name)
    if not any(n.startswith("tokenizer") or n in ("vocab.json", "qwen.tiktoken") for n in copied):
        progress(f"warning: {plan.base} has no tokenizer files; copy them into {plan.out} before serving it")
    del model, merged
    gc.collect()
    return _Logits(probe, unmerged, expected, dtype_name)


def _verify_saved(
    plan: MergePlan, tmp: Path, torch_dtype: Any, logits: _Logits, progress: Callable[[str], None]
) -> None:
    """The saved model, reloaded, gives the merged model's logits and reproduces base + adapter; MergeError if not."""
    import torch
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch_dtype).eval()
    with torch.no_grad():
        got = reloaded(logits.probe).logits.float()
    del reloaded
    if not torch.isfinite(got).all():
        raise MergeError("the merged model produces non-finite logits; nothing was written — try --dtype float32")
    expected, unmerged, dtype_name = logits.expected, logits.unmerged, logits.dtype_name
    saved_diff = (got - expected).abs().max().item()
    scale = max(1.0, expected.abs().max().item())
    if saved_diff > 1e-4 * scale:
        raise MergeError(
            f"the merged model reloaded from disk differs from the merged model in memory "
            f"(max |Δlogit| {saved_diff:.3g}); the saved weights are wrong — nothing was written"
        )
    agree = int((got.argmax(-1) == unmerged.argmax(-1)).sum().item())
    merge_diff = (got - unmerged).abs().max().item()
    exact = dtype_name == "float32"
    progress(
        f"merged vs base+adapter on {_PROBE_LEN} probe tokens: top token agrees at {agree}/{_PROBE_LEN}, "
        f"max |Δlogit| {merge_diff:.3g}" + ("" if exact else f" ({dtype_name} rounding of merged weights)")
    )
    # float32 merges reproduce base+adapter to rounding noise; 16-bit weights add ~2^-8 relative error each.
    tolerance = (1e-3 if exact else 5e-2) * max(1.0, unmerged.abs().max().item())
    if merge_diff > tolerance:
        raise MergeError(
            f"the merged model does not reproduce base+adapter (max |Δlogit| {merge_diff:.3g} > "
            f"{tolerance:.3g} on {_PROBE_LEN} probe tokens, top token agrees at {agree}/{_PROBE_LEN}); "
            f"nothing was written to {plan.out}. "
            + (
                "Retry with --dtype float32."
                if not exact
                else "PEFT cannot merge this adapter faithfully; serve it unmerged if vLLM can."
            )
        )
    if agree < _PROBE_LEN:
        progress(
            f"warning: the top token differs from base+adapter at {_PROBE_LEN - agree} of {_PROBE_LEN} probe "
            f"positions ({dtype_name} rounding); --dtype float32 merges without rounding"
        )


def serve_hint(out: Path) -> list[str]:
    """How to serve the merged folder: with this app, and with vLLM directly."""
    path = shlex.quote(str(out.resolve()))
    engine = os.environ.get(contract.ENV_ENGINE_PYTHON) or sys.executable
    return [
        f"serve it with this app:  QWENCHAT_MODEL_PATH={path} ./start.sh",
        f"or with vLLM directly:   VLLM_CPU_KVCACHE_SPACE=1 {shlex.quote(engine)} "
        f"-m vllm.entrypoints.openai.api_server --model {path} --served-model-name {shlex.quote(out.resolve().name)}"
        f"   (on a GPU: vllm serve {path})",
    ]


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m backend merge",
        description="Merge a LoRA adapter into its base model (PEFT merge_and_unload) and save a model folder "
        "vLLM can serve without --enable-lora.",
    )
    p.add_argument("--base", required=True, help="base model folder (config.json + *.safetensors)")
    p.add_argument("--adapter", required=True, help="PEFT LoRA adapter folder (adapter_config.json + weights)")
    p.add_argument("--out", required=True, help="folder to write the merged model to (must be new or empty)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="dtype of the merged weights (default: auto = the base's own dtype)",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return p


def _notes(diagnosis: Diagnosis) -> None:
    for f in diagnosis.errors:
        _say(f"note: {f.code}: vLLM could not serve this as an adapter; merging fixes that ({f.message})")
    for f in diagnosis.warnings:
        _say(f"warning: {f.code}: {f.message}")


def merge_main(argv: list[str]) -> int:
    """``python -m backend merge --base MODEL --adapter ADAPTER --out DIR [--dtype D] [--force]``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad arguments, 0 for --help
        return exc.code if isinstance(exc.code, int) else 2
    child = bool(os.environ.get(_CHILD_ENV))
    try:
        plan = preflight(args.base, args.adapter, args.out, dtype=args.dtype, force=args.force)
    except QwenChatError as exc:
        print(f"[qwenchat] merge refused: {exc.user_text('en')}", file=sys.stderr)
        return 1
    if not child:
        _notes(plan.diagnosis)
        _say(
            f"checks passed: adapter {plan.adapter.name!r} (rank {plan.diagnosis.rank}) fits base {plan.base}; "
            f"about {fmt_bytes(plan.needed_bytes)} needed, {fmt_bytes(plan.free_bytes)} free"
        )
    if not have_torch():
        return run_in_engine_env(argv)
    try:
        report = run_merge(plan)
    except QwenChatError as exc:
        print(f"[qwenchat] merge failed: {exc.user_text('en')}", file=sys.stderr)
        return 1
    except Exception as exc:
        logger.debug("merge failed", exc_info=True)
        print(
            f"[qwenchat] merge failed: {type(exc).__name__}: {exc}. Nothing was written to {plan.out}; check "
            f"that --adapter {plan.adapter} was trained on --base {plan.base}",
            file=sys.stderr,
        )
        return 1
    _say(
        f"merged model ready: {plan.out.resolve()} ({', '.join(report.architectures) or 'model'}, "
        f"{report.tensors} tensors, {fmt_bytes(report.size_bytes)}, {'/'.join(report.dtypes)}; no lora_ keys)"
    )
    for line in serve_hint(plan.out):
        _say(line)
    return 0

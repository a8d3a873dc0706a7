"""What a runtime load accepts (``backend/adapters/folder.py``): a real folder directly inside [lora].dir
holding only regular files, weights as ``.safetensors`` — each refusal clear, naming the adapter and the
file, never a server path, and before the engine is asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.adapters.folder import discover_adapters, hide_paths, prepare_runtime_load
from backend.adapters.runtime import load_adapter_from_folder
from backend.errors import AdapterError, AdapterFileRefused, AdapterPathRefused
from tests.fakes import adapter_zoo as zoo
from tests.unit.adapters.test_runtime import FakeVLLM, serve


def good(folder: Path, name: str) -> Path:
    return zoo.make_adapter(folder / name, r=8, base_name="tiny-llama")


def symlinked_file(folder: Path, outside: Path) -> str:
    """The weights file replaced by a link to another adapter's weights (outside the folder)."""
    path = good(folder, "linked-file")
    (path / "adapter_model.safetensors").unlink()
    (path / "adapter_model.safetensors").symlink_to(good(outside, "donor") / "adapter_model.safetensors")
    return "linked-file"


def symlinked_folder(folder: Path, outside: Path) -> str:
    """A link inside [lora].dir to a good adapter folder that is also inside it: still refused."""
    (folder / "alias").symlink_to(good(folder, "real"), target_is_directory=True)
    return "alias"


def pickled(folder: Path, outside: Path) -> str:
    """PEFT's pre-safetensors format: adapter_model.bin (a pickle) instead of .safetensors."""
    path = good(folder, "pickled")
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    return "pickled"


def pickle_beside_safetensors(folder: Path, outside: Path) -> str:
    path = good(folder, "extra-pickle")
    (path / "checkpoint").mkdir()
    (path / "checkpoint" / "optimizer.pt").write_bytes(b"\x80\x04pickle")
    return "extra-pickle"


CASES = {
    "dot-dot": (
        lambda folder, outside: "../x",
        AdapterPathRefused,
        ["'../x'", "only folders directly inside [lora].dir"],
    ),
    "symlinked-file": (
        symlinked_file,
        AdapterFileRefused,
        ["'linked-file'", "adapter_model.safetensors", "symbolic link"],
    ),
    "symlinked-folder": (symlinked_folder, AdapterFileRefused, ["'alias'", "is a symbolic link", "copy the adapter"]),
    "bin": (pickled, AdapterFileRefused, ["'pickled'", "adapter_model.bin", "pickled", ".safetensors"]),
    "pickle-in-subfolder": (pickle_beside_safetensors, AdapterFileRefused, ["checkpoint/optimizer.pt", "pickled"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_runtime_load_refuses_it_clearly_without_a_server_path_and_before_the_engine(tmp_path, base, case):
    build, error, says = CASES[case]
    folder, outside = tmp_path / "lora-dir", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    name = build(folder, outside)
    fake = FakeVLLM()

    async def go() -> AdapterError:
        async with serve(fake) as url:
            with pytest.raises(error) as info:
                await load_adapter_from_folder(url, "k", folder, name, base, 16)
        return info.value

    exc = asyncio.run(asyncio.wait_for(go(), 20))
    assert fake.calls == [] and fake.loaded == {}
    for lang in ("en", "zh"):
        text = exc.user_text(lang)
        assert str(tmp_path) not in text and "/tmp" not in text, text
    text = exc.user_text("en")
    assert all(s in text for s in says), text
    assert "。" in exc.user_text("zh") or "：" in exc.user_text("zh")  # a Chinese text, not the English one


def test_the_same_adapter_without_the_offending_file_passes(tmp_path, base):
    folder = tmp_path / "lora-dir"
    good(folder, "plain")
    diagnosis = prepare_runtime_load(folder, "plain", base, 16)
    assert diagnosis.ok


def test_a_symlinked_adapter_folder_is_not_offered_in_the_dropdown(tmp_path):
    folder = tmp_path / "lora-dir"
    folder.mkdir()
    symlinked_folder(folder, tmp_path)
    assert [a.name for a in discover_adapters(folder)] == ["real"]


def test_hide_paths_replaces_whole_path_parts_longest_first():
    places = {"/srv/lora": "[lora].dir", "/srv/lora/static": "[lora].modules.s", "/home/u": "~"}
    assert hide_paths("in /srv/lora/x; see /srv/lora/static.", places) == "in [lora].dir/x; see [lora].modules.s."
    assert hide_paths("'/srv/lora' and /home/u/.cache", places) == "'[lora].dir' and ~/.cache"
    assert hide_paths("/srv/lora-2/x", places) == "/srv/lora-2/x"  # another folder: not this label

"""The adapters folder (``backend/adapters/folder.py``): the allow-list of names, discovery, and the doctor
run before a runtime load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.adapters.folder import AdapterInfo, discover_adapters, prepare_runtime_load, read_rank, resolve_adapter
from backend.errors import AdapterFileRefused, AdapterPathRefused, AdapterRejected
from tests.fakes import adapter_zoo as zoo

# ---------------------------------------------------------------- the adapters folder (allow-list)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../pirate",
        "pirate/..",
        "a/b",
        "a\\b",
        "/etc",
        "/tmp",
        "pi\x00rate",
        ".hidden",
        "C:evil",
        " pirate",
    ],
)
def test_names_that_escape_the_folder_are_refused(folder: Path, name: str) -> None:
    with pytest.raises(AdapterPathRefused) as exc:
        resolve_adapter(folder, name)
    text = exc.value.user_text()
    assert "[lora].dir" in text and str(folder) not in text  # the setting, never the server path


def test_absolute_path_to_a_real_adapter_is_refused(folder: Path) -> None:
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, str(folder / "pirate"))


def test_symlink_out_of_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    outside = zoo.make_adapter(tmp_path / "outside")
    os.symlink(outside, folder / "sneaky")
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, "sneaky")
    assert "sneaky" not in [a.name for a in discover_adapters(folder)]


def test_symlink_to_the_folder_itself_is_refused(folder: Path) -> None:
    os.symlink(folder, folder / "self")
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, "self")


def test_symlink_inside_the_folder_is_refused_too(folder: Path) -> None:
    os.symlink(folder / "pirate", folder / "arr")
    with pytest.raises(AdapterFileRefused) as exc:
        resolve_adapter(folder, "arr")
    assert "'arr'" in exc.value.user_text() and "symbolic link" in exc.value.user_text()
    assert "arr" not in [a.name for a in discover_adapters(folder)]


def test_broken_symlink_is_not_an_adapter(folder: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "gone", folder / "dangling")
    assert [a.name for a in discover_adapters(folder)] == ["pirate", "poet"]
    with pytest.raises(AdapterRejected):
        resolve_adapter(folder, "dangling")


def test_missing_adapters_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(AdapterRejected) as exc:
        resolve_adapter(tmp_path / "nope", "pirate")
    assert "does not exist" in exc.value.user_text()


def test_a_plain_name_resolves_inside(folder: Path) -> None:
    assert resolve_adapter(folder, "pirate") == (folder / "pirate").resolve()


def test_unknown_name_lists_what_is_there(folder: Path) -> None:
    with pytest.raises(AdapterRejected) as exc:
        resolve_adapter(folder, "ghost")
    assert "pirate, poet" in exc.value.user_text()


def test_discover_lists_adapters_with_rank_and_reports_unreadable_ones(folder: Path) -> None:
    (folder / "notes").mkdir()  # no adapter_config.json: not an adapter
    broken = folder / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{oops")
    infos = discover_adapters(folder)
    assert [i.name for i in infos] == ["broken", "pirate", "poet"]
    assert infos[1] == AdapterInfo("pirate", (folder / "pirate").resolve(), 8, "tiny-llama")
    assert infos[1].label == "pirate (r=8)"
    assert infos[0].rank is None and "adapter_config.json" in infos[0].problem
    assert read_rank(folder / "poet") == 16 and read_rank(broken) is None


def test_discover_on_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert discover_adapters(tmp_path / "nope") == []


def test_prepare_runtime_load_runs_the_doctor(folder: Path, base: Path) -> None:
    assert prepare_runtime_load(folder, "pirate", base, 16).ok
    with pytest.raises(AdapterRejected) as exc:
        prepare_runtime_load(folder, "poet", base, 8)
    assert "rank 16, above --max-lora-rank 8" in exc.value.user_text()
    with pytest.raises(AdapterPathRefused):
        prepare_runtime_load(folder, "../poet", base, 16)

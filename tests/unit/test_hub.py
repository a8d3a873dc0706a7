"""[model] path as a folder or a hub id (backend/hub.py, settings): what each string is, and when a downloaded
snapshot counts as a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend import hub
from backend.errors import ConfigError
from backend.hub import HubModel
from backend.settings import ROOT, ModelSettings, Settings


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("", "embedded"),
        ("Qwen/Qwen3-4B-Instruct-2507", "hub"),
        ("Qwen/Qwen3-4B-Instruct-2507@main", "hub"),
        ("Qwen/Qwen3-4B-Instruct-2507@0123456789abcdef0123456789abcdef01234567", "hub"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct@refs/pr/1", "hub"),
        ("tests", "folder"),  # an existing folder is a folder, whatever it looks like
        ("tests/unit", "folder"),  # owner/name shaped, but it exists here
        ("/models/Qwen3-4B-Instruct-2507", "folder"),  # plainly a path: a missing one is preflight's to name
        ("~/models/qwen", "folder"),
        ("./models/qwen", "folder"),
        ("my-model", "folder"),
        ("Qwen/Qwen3 4B", None),  # a space
        ("a/b/c/d", None),  # three slashes
        ("a/b/c", None),
        ("Qwen//Qwen3", None),
        ("Qwen/-bad", None),
        ("Qwen/a--b", None),
        ("Qwen/Qwen3@", None),
        ("Qwen/Qwen3@../x", None),
    ],
)
def test_model_path_is_a_folder_a_hub_id_or_neither(value: str, kind: str | None) -> None:
    assert hub.classify_model_path(value, ROOT) == kind


@pytest.mark.parametrize("value", ["Qwen/Qwen3 4B", "a/b/c/d", "Qwen//Qwen3"])
def test_neither_is_a_config_error_naming_the_setting_and_both_forms(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Settings(model=ModelSettings(path=value))
    text = exc.value.user_text("en")
    assert "model.path" in text and repr(value) in text
    assert "existing model folder" in text and "Qwen/Qwen3-4B-Instruct-2507" in text and "@revision" in text


def test_hub_id_is_served_by_its_repo_name_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    m = ModelSettings(path="Qwen/Qwen3-4B-Instruct-2507@v2")
    assert m.hub == HubModel("Qwen/Qwen3-4B-Instruct-2507", "v2")
    assert m.name == "Qwen3-4B-Instruct-2507"
    assert m.resolved_path == tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-4B-Instruct-2507" / "snapshots" / "v2"
    assert ModelSettings(path="Qwen/Qwen3-4B-Instruct-2507", served_model_name="qwen").name == "qwen"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.hub_cache_dir() == tmp_path / "elsewhere"


def _snapshot(cache: Path, model: HubModel, files: dict[str, int], present: list[str], listing: bool = True) -> Path:
    store = hub.storage_dir(model, cache)
    commit = "c" * 40
    (store / "refs").mkdir(parents=True)
    (store / "refs" / model.revision).write_text(commit)
    snap = store / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in present:
        (snap / name).write_bytes(b"x" * files[name])
    if listing:
        (store / "trees").mkdir()
        tree = {"format_version": 1, "files": {n: {"size": s, "blob_id": "b"} for n, s in files.items()}}
        (store / "trees" / f"{commit}.json").write_text(json.dumps(tree))
    return snap


FILES = {
    "config.json": 2,
    "tokenizer.json": 3,
    "model-00001-of-00002.safetensors": 5,
    "model-00002-of-00002.safetensors": 5,
    "model.safetensors.index.json": 4,
    "README.md": 1,
    "original/consolidated.00.pth": 9,
    "pytorch_model.bin": 9,
}
NEEDED = [
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
]


def test_only_what_vllm_reads_is_selected() -> None:
    assert hub.select_files(FILES) == NEEDED  # no README, no original/, no .bin beside safetensors
    assert hub.select_files(["config.json", "pytorch_model.bin", "original/x.bin"]) == [
        "config.json",
        "pytorch_model.bin",
    ]


def test_a_snapshot_missing_a_shard_is_not_a_model(tmp_path: Path) -> None:
    model = HubModel("o/m")
    snap = _snapshot(tmp_path, model, FILES, [n for n in NEEDED if not n.startswith("model-00002")])
    assert hub.complete_snapshot(model, tmp_path) is None
    (snap / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert hub.complete_snapshot(model, tmp_path) == snap


def test_a_copy_without_a_listing_is_judged_by_its_index(tmp_path: Path) -> None:
    model = HubModel("o/m")
    snap = _snapshot(tmp_path, model, FILES, ["config.json", "model-00001-of-00002.safetensors"], listing=False)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    assert hub.complete_snapshot(model, tmp_path) is None
    (snap / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert hub.complete_snapshot(model, tmp_path) == snap

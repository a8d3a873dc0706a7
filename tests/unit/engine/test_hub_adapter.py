"""A hub id in [lora] modules (#19): downloaded at start like [model] path's (engine/download.py --adapter, only
the adapter's files), checked by the adapter doctor, then given to vLLM as its snapshot folder; a 404, a gated repo
or a bad adapter is left out with one message, the other adapters kept. Against the fake hub
(tests/fakes/hub_server.py) serving the tiny LoRA of the tiny Qwen3 test model."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from backend import contract, hub
from backend.launcher import command, launch, prepare_bg
from backend.settings import LoggingSettings, LoraSettings, ModelSettings, Settings
from tests.conftest import free_port
from tests.fakes.hub_server import FakeHub
from tests.unit.engine.test_launch import run

GOOD, GATED, BROKEN = "acme/tiny-lora", "acme/gated-lora", "acme/broken-lora"


@pytest.fixture
def repos(test_models: Path, tmp_path: Path) -> dict[str, Path]:
    """The tiny LoRA as hub repos: as it is (with what an adapter repo also holds and vLLM does not read), gated,
    and with a rank above [lora] max_lora_rank (the doctor's finding)."""
    good = tmp_path / "repos" / "good"
    shutil.copytree(test_models / "tiny-qwen3-lora", good)
    (good / "training_args.bin").write_bytes(b"\0" * 1000)
    (good / "adapter_model.bin").write_bytes(b"\0" * 1000)  # beside the safetensors: not fetched
    broken = tmp_path / "repos" / "broken"
    shutil.copytree(good, broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "r": 64, "lora_alpha": 128}))
    return {GOOD: good, GATED: good, BROKEN: broken}


@pytest.fixture
def fake_hub(repos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with FakeHub(repos) as h:
        h.gated.add(GATED)
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "QWENCHAT_HUB_FREE_BYTES"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        yield h


def settings_with(test_models: Path, tmp_path: Path, modules: dict[str, str]) -> Settings:
    return Settings(
        model=ModelSettings(path=str(test_models / "tiny-qwen3"), served_model_name="tiny-qwen3"),
        lora=LoraSettings(modules=modules, max_loras=2, max_lora_rank=8, max_cpu_loras=4),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )


def prepare(settings: Settings, tmp_path: Path) -> tuple[prepare_bg.Preparer, list[str]]:
    said: list[str] = []
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    preparer = prepare_bg.Preparer(settings, "cpu", log_dir, log_dir / contract.STATUS_FILE_NAME, said.append)
    asyncio.run(preparer.download_adapters())
    return preparer, said


def engine_argv(settings: Settings, tmp_path: Path, preparer: prepare_bg.Preparer) -> tuple[list[str], list[str]]:
    """The engine command the launcher builds after the preparation, and what it said."""
    said: list[str] = []
    log_dir = tmp_path / "logs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "say", said.append)
        sup = launch._engine_supervisor(
            settings, "cpu", "k", log_dir, log_dir / contract.STATUS_FILE_NAME, preparer.adapter_errors
        )
    assert isinstance(sup, launch.Supervisor)
    return list(sup.cmd.argv), said


def lora_modules(argv: list[str]) -> dict[str, str]:
    i = argv.index("--lora-modules")
    entries = [a for a in argv[i + 1 :] if "=" in a and not a.startswith("-")]
    return dict(e.split("=", 1) for e in entries)


def test_a_hub_adapter_is_downloaded_checked_and_served_as_its_snapshot_folder(fake_hub, test_models, tmp_path):
    local = str(test_models / "tiny-qwen3-lora")
    settings = settings_with(test_models, tmp_path, {"pirate": GOOD, "local": local})
    assert prepare_bg.adapters_to_download(settings) == ["pirate"]
    assert prepare_bg.needs_preparing(settings)
    preparer, said = prepare(settings, tmp_path)
    assert preparer.adapter_errors == {}
    folder = hub.complete_snapshot(hub.HubModel(GOOD, adapter=True))
    assert folder is not None and folder.is_relative_to(tmp_path / "hf" / "hub" / "models--acme--tiny-lora")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert any("'pirate' downloaded" in line for line in said), said
    assert prepare_bg.adapters_to_download(settings) == []

    argv, told = engine_argv(settings, tmp_path, preparer)
    assert lora_modules(argv) == {"pirate": str(folder), "local": local}
    assert not [line for line in told if "left out" in line], told


def test_a_missing_a_gated_and_a_broken_hub_adapter_are_each_left_out_with_one_message(fake_hub, test_models, tmp_path):
    modules = {"good": GOOD, "nope": "acme/no-such-lora", "old": f"{GOOD}@v9", "gated": GATED, "broken": BROKEN}
    settings = settings_with(test_models, tmp_path, modules)
    preparer, _ = prepare(settings, tmp_path)
    assert sorted(preparer.adapter_errors) == ["gated", "nope", "old"]
    argv, told = engine_argv(settings, tmp_path, preparer)
    assert list(lora_modules(argv)) == ["good"]  # the others never reach vLLM
    left_out = {line.split("'")[1]: line for line in told if "left out" in line}
    assert sorted(left_out) == ["broken", "gated", "nope", "old"], told
    assert "acme/no-such-lora" in left_out["nope"] and "HTTP 404" in left_out["nope"]
    assert "[lora] modules" in left_out["nope"]
    assert "revision v9" in left_out["old"] and "[lora] modules" in left_out["old"]
    assert GATED in left_out["gated"] and "HF_TOKEN" in left_out["gated"]
    assert "rank" in left_out["broken"].lower() and "64" in left_out["broken"], left_out["broken"]
    # nothing of a failed download is taken for an adapter; the broken one is downloaded, and refused by the doctor
    assert hub.complete_snapshot(hub.HubModel(GATED, adapter=True)) is None
    assert hub.complete_snapshot(hub.HubModel(BROKEN, adapter=True)) is not None
    # the UI's copy of the reasons: in the viewer's language, without server paths
    reasons = json.loads((tmp_path / "logs" / contract.EXCLUDED_ADAPTERS_FILE_NAME).read_text())
    assert sorted(reasons) == ["broken", "gated", "nope", "old"]
    assert str(tmp_path) not in json.dumps(reasons)


def test_a_hub_adapter_with_no_hub_to_reach_and_no_copy_names_the_id_and_the_cache(test_models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    settings = settings_with(test_models, tmp_path, {"pirate": GOOD})
    preparer, _ = prepare(settings, tmp_path)
    argv, told = engine_argv(settings, tmp_path, preparer)
    assert "--lora-modules" not in argv
    [line] = [line for line in told if "left out" in line]
    assert "cannot reach http://127.0.0.1" in line and GOOD in line and "hf download" in line, line


def test_a_hub_adapter_not_downloaded_is_left_out_when_nothing_downloaded_it(test_models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    settings = settings_with(test_models, tmp_path, {"pirate": GOOD})
    good, bad = launch.static_adapters(settings)
    assert good == {} and GOOD in str(bad["pirate"]) and "./start.sh downloads it" in str(bad["pirate"])


def test_a_download_of_an_adapter_fetches_only_its_files(fake_hub, tmp_path):
    import subprocess
    import sys

    from backend.settings import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "backend", "download-model", "--adapter", GOOD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    fetched = {path.rsplit("/", 1)[1] for m, path, _, _ in fake_hub.requests if m == "GET" and "/resolve/" in path}
    assert fetched == {"adapter_config.json", "adapter_model.safetensors"}


def test_the_dry_run_shows_a_hub_adapter_resolved(fake_hub, test_models, tmp_path):
    modules = f"pirate={GOOD}"
    env = {
        "QWENCHAT_MODEL_PATH": str(test_models / "tiny-qwen3"),
        "QWENCHAT_LORA_MODULES": modules,
        "HF_HOME": str(tmp_path / "hf"),
    }
    out = run(["serve", "--dry-run"], tmp_path, **env)
    assert out.returncode == 0, out.stdout + out.stderr
    store = tmp_path / "hf" / "hub" / "models--acme--tiny-lora"
    assert f"pirate={store}/snapshots/main" in out.stdout, out.stdout
    assert f"[lora] modules.pirate is the hub adapter {GOOD}: a real start downloads it" in out.stdout

    settings = settings_with(test_models, tmp_path, {"pirate": GOOD})
    prepare(settings, tmp_path)
    folder = hub.complete_snapshot(hub.HubModel(GOOD, adapter=True))
    out = run(["serve", "--dry-run"], tmp_path, **env)
    assert out.returncode == 0 and f"pirate={folder}" in out.stdout, out.stdout
    assert "downloads it" not in out.stdout


def test_the_engine_command_never_gets_a_hub_id(test_models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    settings = settings_with(test_models, tmp_path, {"pirate": GOOD})
    adapters, _ = launch.static_adapters(settings, check=False)
    cmd = command.build_engine_command(
        settings, engine="cpu", python="python", api_key="k", adapters=adapters, chat_template=None
    )
    assert f"pirate={GOOD}" not in cmd.argv and lora_modules(list(cmd.argv))["pirate"].startswith(str(tmp_path))


def test_an_adapter_repo_gives_its_config_and_safetensors_and_the_bin_only_without_them(tmp_path):
    names = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md", "tokenizer.json"]
    assert hub.select_files(names, adapter=True) == ["adapter_config.json", "adapter_model.safetensors"]
    assert hub.select_files(names[:1] + names[2:], adapter=True) == ["adapter_config.json", "adapter_model.bin"]
    # without the hub's listing (a copy made by other means): config and weights make it complete
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    assert hub.missing_files(folder, None, adapter=True) == ["adapter_model.safetensors"]
    (folder / "adapter_model.bin").write_bytes(b"0")
    assert hub.missing_files(folder, None, adapter=True) == []


def test_prepare_in_the_foreground_downloads_a_hub_adapter_and_names_a_missing_one(fake_hub, test_models, tmp_path):
    env = {"QWENCHAT_MODEL_PATH": str(test_models / "tiny-qwen3"), "HF_HOME": str(tmp_path / "hf")}
    out = run(["prepare"], tmp_path, QWENCHAT_LORA_MODULES=f"pirate={GOOD}", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert hub.complete_snapshot(hub.HubModel(GOOD, adapter=True)) is not None
    out = run(["prepare"], tmp_path, QWENCHAT_LORA_MODULES="nope=acme/no-such-lora", **env)
    assert out.returncode == 2 and "there is no adapter acme/no-such-lora" in out.stdout + out.stderr


def test_a_half_downloaded_hub_adapter_is_never_served_and_the_next_start_completes_it(fake_hub, test_models, tmp_path):
    settings = settings_with(test_models, tmp_path, {"pirate": GOOD})
    prepare(settings, tmp_path)
    model = hub.HubModel(GOOD, adapter=True)
    folder = hub.complete_snapshot(model)
    assert folder is not None
    (folder / "adapter_model.safetensors").unlink()  # a download stopped before the weights were linked
    assert hub.complete_snapshot(model) is None and prepare_bg.adapters_to_download(settings) == ["pirate"]
    good, bad = launch.static_adapters(settings)
    assert good == {} and "not downloaded yet" in str(bad["pirate"])
    fake_hub.served = 0
    preparer, _ = prepare(settings, tmp_path)
    assert preparer.adapter_errors == {} and hub.complete_snapshot(model) == folder
    assert fake_hub.served == 0  # its whole blob was in the cache: linked again, not fetched again
    argv, _ = engine_argv(settings, tmp_path, preparer)
    assert lora_modules(argv) == {"pirate": str(folder)}

"""A hub id in [model] path at start (#19): what the dry run prints, what a start without the download says, the
status line's words for the download, and a failed download's reason for the browser (no server paths) and the
terminal (with them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend import contract, hub
from backend.chat.health_classify import supervisor_starting_text
from backend.contract import PHASE_DOWNLOAD_MODEL, EngineStatus, SupervisorState
from backend.launcher import prepare_bg
from backend.settings import ModelSettings, Settings
from backend.tools import download
from tests.unit.engine.test_launch import QWEN3_4B_CONFIG, run

pytestmark = pytest.mark.product  # it runs `python -m backend serve` (tests/support/marks.py)


QWEN = "Qwen/Qwen3-4B-Instruct-2507"


def test_the_dry_run_of_a_hub_id_serves_its_snapshot_folder_in_the_cache_offline(tmp_path):
    out = run(["serve", "--dry-run"], tmp_path, QWENCHAT_MODEL_PATH=QWEN, HF_HOME=str(tmp_path / "hf"))
    assert out.returncode == 0, out.stdout + out.stderr
    store = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-4B-Instruct-2507"
    assert f"--model {store}/snapshots/main " in out.stdout  # not <checkout>/Qwen/Qwen3-4B-Instruct-2507
    assert "--served-model-name Qwen3-4B-Instruct-2507 " in out.stdout and "HF_HUB_OFFLINE=1" in out.stdout
    assert f"a real start downloads it into {store} first" in out.stdout
    assert "the estimates below use the built-in shape of Qwen3-4B-Instruct-2507" in out.stdout

    # downloaded (a snapshot with its listing): the dry run names that folder and says nothing of a download
    commit = "b" * 40
    snap = store / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(QWEN3_4B_CONFIG)
    (snap / "model.safetensors").write_bytes(b"0")
    (store / "refs").mkdir()
    (store / "refs" / "main").write_text(commit)
    out = run(["serve", "--dry-run"], tmp_path, QWENCHAT_MODEL_PATH=QWEN, HF_HOME=str(tmp_path / "hf"))
    assert out.returncode == 0 and f"--model {snap} " in out.stdout and "downloads it" not in out.stdout, out.stdout


def test_serve_without_prepare_names_a_hub_id_not_downloaded_and_how_to_get_it(tmp_path):
    out = run(["serve"], tmp_path, QWENCHAT_MODEL_PATH=QWEN, HF_HOME=str(tmp_path / "hf"))
    assert out.returncode == 2
    said = out.stdout + out.stderr
    assert QWEN in said and "not all downloaded yet" in said and "./start.sh" in said, said


@pytest.mark.parametrize("value", ["Qwen/Qwen3 4B", "a/b/c/d"])
def test_a_start_with_neither_a_folder_nor_a_hub_id_is_a_config_error(tmp_path, value):
    out = run(["engine-kind"], tmp_path, QWENCHAT_MODEL_PATH=value)
    assert out.returncode == 2
    assert f"model.path = {value!r}" in out.stderr and "hub id" in out.stderr, out.stderr


def test_the_status_line_says_how_far_the_download_is_in_both_languages():
    status = EngineStatus(
        state=SupervisorState.PREPARING,
        phase=PHASE_DOWNLOAD_MODEL,
        progress=34,
        bytes_done=2_700_000_000,
        bytes_total=8_000_000_000,
        bytes_rate=45_000_000,
    )
    said = supervisor_starting_text(status)
    assert said.in_("en") == "downloading the model 34 % · 2.7 of 8.0 GB · 45 MB/s"
    assert said.in_("zh-CN") == "正在下载模型 34% · 2.7 / 8.0 GB · 45 MB/s"
    before = supervisor_starting_text(EngineStatus(state=SupervisorState.PREPARING, phase=PHASE_DOWNLOAD_MODEL))
    assert (before.in_("en"), before.in_("zh-CN")) == ("downloading the model", "正在下载模型")


def test_a_hub_id_not_all_downloaded_needs_preparing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    settings = Settings(model=ModelSettings(path=QWEN))
    assert prepare_bg.needs_download(settings)
    store = hub.storage_dir(hub.HubModel(QWEN))
    snap = store / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (store / "refs").mkdir()
    (store / "refs" / "main").write_text("c" * 40)
    (snap / "config.json").write_text("{}")
    assert prepare_bg.needs_download(settings)  # no weights: a stopped download is not a model
    (snap / "model.safetensors").write_bytes(b"0")
    assert not prepare_bg.needs_download(settings)
    assert settings.model.resolved_path == snap


def test_a_failed_download_tells_the_browser_without_paths_and_the_terminal_with_them(tmp_path):
    said: list[str] = []
    status_path = tmp_path / contract.STATUS_FILE_NAME
    preparer = prepare_bg.Preparer(Settings(), "cpu", tmp_path, status_path, said.append)
    params = {"id": QWEN, "endpoint": "https://huggingface.co", "detail": "refused", "cache": "/srv/hf/hub"}
    params["folder"] = "models--Qwen--Qwen3-4B-Instruct-2507"
    line = download.ERROR_PREFIX + json.dumps({"key": "download.offline", "params": params})
    failed = preparer.fail(PHASE_DOWNLOAD_MODEL, 2, ["something", line, "[qwenchat] ..."])
    assert "/srv/hf/hub" in failed.said and QWEN in failed.said
    en, zh = failed.reason.in_("en"), failed.reason.in_("zh-CN")
    assert "/srv/" not in en + zh and "…/hub" in en
    st = EngineStatus.read(status_path)
    assert st is not None and st.state is SupervisorState.DOWN and st.cause == "download_model_failed"
    assert (
        st.reason == failed.reason and zh.startswith("无法连接") and Path(st.log_path).name == (prepare_bg.DOWNLOAD_LOG)
    )

"""`python -m backend download-model` (engine/download.py) against a fake hub (tests/fakes/hub_server.py) serving
the tiny Qwen3 test model: progress, only the files vLLM reads, a stopped download resumed, and each bad case ending
in one message naming the id, the revision, HF_TOKEN, HF_ENDPOINT or the cache folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend import hub
from backend.settings import ROOT
from backend.tools import download
from tests.conftest import free_port
from tests.fakes.hub_server import FakeHub

REPO = "qwen/tiny"
MB = 1_000_000


@pytest.fixture
def repo(test_models: Path, tmp_path: Path) -> Path:
    """The tiny Qwen3 as a hub repo, with what a real repo also holds and vLLM does not read."""
    folder = tmp_path / "repo"
    shutil.copytree(test_models / "tiny-qwen3", folder, ignore=shutil.ignore_patterns(".*"))
    (folder / "README.md").write_text("# tiny\n")
    (folder / "original").mkdir()
    (folder / "original" / "consolidated.00.pth").write_bytes(b"\0" * 300_000)
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 200_000)  # beside the safetensors: not fetched
    return folder


@pytest.fixture
def fake_hub(repo: Path):
    with FakeHub({REPO: repo}) as h:
        yield h


def env_for(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "QWENCHAT_"))}
    env.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1", **extra})
    return env


def run(env: dict[str, str], model: str = REPO, *more: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "backend", "download-model", model, *more]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def error_of(done: subprocess.CompletedProcess[str]) -> tuple[str, dict]:
    assert done.returncode == 2, done.stderr[-3000:]
    told = download.parse_error(done.stderr.splitlines())
    assert told is not None, done.stderr[-3000:]
    return told


def wanted(repo: Path) -> dict[str, int]:
    return {n: (repo / n).stat().st_size for n in hub.select_files(p.name for p in repo.iterdir())}


def file_gets(h: FakeHub) -> list[str]:
    return [
        path.split("/resolve/", 1)[1].split("/", 1)[1]
        for m, path, _, _ in h.requests
        if m == "GET" and "/resolve/" in path
    ]


def test_a_download_reports_progress_and_fetches_only_what_vllm_reads(fake_hub, repo, tmp_path):
    fake_hub.rate = 6 * MB  # per file response: a few seconds, so progress is seen between the ends
    done = run(env_for(tmp_path, fake_hub.url))
    assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder == hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "hf" / "hub")
    need = wanted(repo)
    assert sorted(file_gets(fake_hub)) == sorted(need)  # no README, no original/, no .bin beside the safetensors
    for name in need:
        assert (folder / name).read_bytes() == (repo / name).read_bytes()
    progress = [p for line in done.stderr.splitlines() if (p := download.parse_progress(line))]
    dones = [d for d, _, _ in progress]
    assert dones == sorted(dones) and dones[-1] == sum(need.values())
    assert {t for _, t, _ in progress} == {sum(need.values())}
    assert any(0 < d < sum(need.values()) and rate > 0 for d, _, rate in progress), progress
    assert fake_hub.served == sum(need.values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["launcher-stop", "ctrl-c-in-prepare"])
def test_a_stopped_download_resumes_and_fetches_only_what_is_missing(fake_hub, repo, tmp_path, sig):
    """Ctrl-C midway (the launcher stops the download's process group with SIGTERM; `python -m backend prepare`
    gets the terminal's SIGINT), then a new start: the second run fetches exactly the bytes not on disk, from where
    each file stopped (Range), and the files are whole and right."""
    fake_hub.rate = 2 * MB
    env = env_for(tmp_path, fake_hub.url)
    argv = [sys.executable, "-m", "backend", "download-model", REPO]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, start_new_session=True)
    total = sum(wanted(repo).values())
    deadline = time.monotonic() + 120
    while fake_hub.served < 0.45 * total and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    assert proc.wait(10) != 0  # at once, not when the files in flight are done
    first = fake_hub.served
    assert 0.4 * total < first < total
    store = hub.storage_dir(hub.HubModel(REPO), tmp_path / "hf" / "hub")
    partial = sum(p.stat().st_size for p in (store / "blobs").glob("*.incomplete"))
    finished = sum(p.stat().st_size for p in (store / "blobs").iterdir() if not p.name.endswith(".incomplete"))
    assert partial > 0 and finished > 0  # a file stopped midway is kept, and the small ones are whole
    assert hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "hf" / "hub") is None  # not taken for a model

    fake_hub.rate, fake_hub.served = 0, 0
    # the disk check counts what is on disk already (whole blobs and partial files): room for the rest is enough
    done = run(env | {download.ENV_FREE_BYTES: str(total - partial - finished)})
    assert done.returncode == 0, done.stderr[-3000:]
    second = fake_hub.served
    print(f"first run: {first} bytes served before the stop; second run: {second} of {total}")
    assert second == total - partial - finished < total
    assert any(rng.startswith("bytes=") for m, _, status, rng in fake_hub.requests if m == "GET" and status == 206)
    folder = Path(done.stdout.strip().splitlines()[-1])
    for name in wanted(repo):
        assert (folder / name).read_bytes() == (repo / name).read_bytes()
    assert not list((store / "blobs").glob("*.incomplete"))


def test_a_gated_repo_without_a_token_names_hf_token_and_with_it_downloads(fake_hub, tmp_path):
    fake_hub.gated.add(REPO)
    key, params = error_of(run(env_for(tmp_path, fake_hub.url)))
    text = download.t(key, "en", **params)
    assert key == "download.needs_token" and "HF_TOKEN" in text and REPO in text and "401" in text
    key, params = error_of(run(env_for(tmp_path, fake_hub.url, HF_TOKEN="hf_wrong")))
    assert key == "download.token_refused" and "HF_TOKEN" in download.t(key, "en", **params)
    assert not file_gets(fake_hub)
    done = run(env_for(tmp_path, fake_hub.url, HF_TOKEN=fake_hub.token))
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("model", "key", "named"),
    [
        ("qwen/nothing-here", "download.no_repo", ["qwen/nothing-here"]),
        (f"{REPO}@v9", "download.no_revision", [REPO, "v9"]),
    ],
)
def test_an_unknown_repo_or_revision_names_the_id_and_revision(fake_hub, tmp_path, model, key, named):
    got, params = error_of(run(env_for(tmp_path, fake_hub.url), model))
    text = download.t(got, "en", **params)
    assert got == key and all(n in text for n in named) and "404" in text, text
    assert not (tmp_path / "hf" / "hub" / "models--qwen--tiny" / "snapshots").exists()


def test_too_little_disk_is_said_with_both_numbers_before_any_file_is_fetched(fake_hub, repo, tmp_path):
    key, params = error_of(run(env_for(tmp_path, fake_hub.url, **{download.ENV_FREE_BYTES: str(MB)})))
    text = download.t(key, "en", **params)
    assert key == "download.disk" and params["need_bytes"] == sum(wanted(repo).values())
    assert params["free_bytes"] == MB and "36 MB" in text and "1.0 MB" in text and "HF_HOME" in text, text
    assert not file_gets(fake_hub)


def test_a_repo_over_the_size_cap_is_refused_with_both_sizes_before_any_file_is_fetched(fake_hub, repo, tmp_path):
    key, params = error_of(run(env_for(tmp_path, fake_hub.url), REPO, "--max-bytes", str(MB)))
    text = download.t(key, "en", **params)
    assert key == "download.too_big" and params["size_bytes"] == sum(wanted(repo).values())
    assert "36 MB" in text and "1.0 MB" in text and "[hub] max_download_gb" in text, text
    assert not file_gets(fake_hub)
    done = run(env_for(tmp_path, fake_hub.url), REPO, "--max-bytes", str(100 * MB))  # under the cap: downloaded
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_repo_whose_size_the_hub_does_not_give_is_refused_under_a_cap(fake_hub, tmp_path):
    fake_hub.unsized.add(REPO)
    key, params = error_of(run(env_for(tmp_path, fake_hub.url), REPO, "--max-bytes", str(100 * MB)))
    assert key == "download.size_unknown" and "config.json" in params["files"], params
    assert "max_download_gb = 0" in download.t(key, "en", **params)
    assert not file_gets(fake_hub)


def test_an_endpoint_that_is_a_web_page_is_named(fake_hub, tmp_path):
    fake_hub.web_page = True
    key, params = error_of(run(env_for(tmp_path, fake_hub.url)))
    text = download.t(key, "en", **params)
    assert key == "download.not_a_hub" and f"HF_ENDPOINT={fake_hub.url}" in text, text


def test_a_connection_dropped_mid_file_is_retried_then_a_clear_error(fake_hub, repo, tmp_path):
    fake_hub.drops, fake_hub.drop_at = 2, 500_000  # two responses cut after 0.5 MB: resumed, whole in the end
    done = run(env_for(tmp_path, fake_hub.url))
    assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert (folder / "model.safetensors").read_bytes() == (repo / "model.safetensors").read_bytes()

    fake_hub.drops, fake_hub.drop_at = 10_000, 0  # every response cut before its first byte: retries run out
    key, params = error_of(run(env_for(tmp_path / "again", fake_hub.url)))
    text = download.t(key, "en", **params)
    assert key == "download.dropped" and params["file"] in wanted(repo) and "start again" in text, text
    assert hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "again" / "hf" / "hub") is None


def test_no_network_and_no_copy_names_the_id_the_cache_and_how_to_copy_then_a_copy_needs_no_network(fake_hub, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"
    key, params = error_of(run(env_for(tmp_path, nowhere)))
    text = download.t(key, "en", **params)
    assert key == "download.offline" and REPO in text and str(tmp_path / "hf" / "hub") in text
    assert f"hf download {REPO}" in text and "models--qwen--tiny" in text, text

    assert run(env_for(tmp_path, fake_hub.url)).returncode == 0
    fake_hub.requests.clear()
    for env in (env_for(tmp_path, nowhere), env_for(tmp_path, nowhere, HF_HUB_OFFLINE="1")):
        done = run(env)
        assert done.returncode == 0 and Path(done.stdout.strip()).is_dir(), done.stderr[-3000:]
    assert not fake_hub.requests


def test_progress_and_error_lines_read_back(tmp_path):
    assert download.parse_progress('[download] {"done": 5, "total": 10, "rate": 2}') == (5, 10, 2)
    assert download.parse_progress("[download] garbled") is None
    line = download.ERROR_PREFIX + json.dumps({"key": "download.no_repo", "params": {"id": "a/b", "endpoint": "e"}})
    assert download.parse_error(["x", line, "[qwenchat] …"]) == ("download.no_repo", {"id": "a/b", "endpoint": "e"})
    assert hub.bytes_of(2_700_000_000, 8_000_000_000) == ("2.7", "8.0 GB")
    assert hub.human_bytes(45_300_000) == "45 MB" and hub.human_bytes(812) == "812 B"


def _http_error(status: int, url: str, content_type: str = "application/json", code: str = "") -> Exception:
    """The exception huggingface_hub itself raises for this answer (its own hf_raise_for_status)."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    headers = {"content-type": content_type, **({"X-Error-Code": code} if code else {})}
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except Exception as exc:  # noqa: BLE001 - the one we want
        return exc
    raise AssertionError(f"{status} raised nothing")


def _translation_cases() -> list[tuple[str, Exception, str, dict[str, str]]]:
    import errno

    import httpx2
    from huggingface_hub import errors as hf_errors

    api = "https://hub.example/api/models/qwen/tiny/revision/main"
    file = "https://hub.example/qwen/tiny/resolve/abc/model.safetensors"
    return [
        ("gated 401", _http_error(401, api, code="GatedRepo"), "download.needs_token", {}),
        ("missing or private, no token", _http_error(401, api, code="RepoNotFound"), "download.no_repo_or_private", {}),
        (
            "private, a token refused",
            _http_error(401, api, code="RepoNotFound"),
            "download.token_refused",
            {"HF_TOKEN": "x"},
        ),
        ("forbidden 403", _http_error(403, file), "download.needs_token", {}),
        ("a token refused", _http_error(401, api, code="GatedRepo"), "download.token_refused", {"HF_TOKEN": "x"}),
        ("no repo", _http_error(404, api, code="RepoNotFound"), "download.no_repo", {}),
        ("no revision", _http_error(404, api, code="RevisionNotFound"), "download.no_revision", {}),
        ("a web site's 404", _http_error(404, api, content_type="text/html; charset=utf-8"), "download.not_a_hub", {}),
        ("hub down", _http_error(503, api), "download.http", {}),
        ("no network", httpx2.ConnectError("refused"), "download.offline", {}),
        ("offline mode", hf_errors.OfflineModeIsEnabled("HF_HUB_OFFLINE=1"), "download.offline", {}),
        ("a web page's body", ValueError("Expecting value: line 1 column 1"), "download.not_a_hub", {}),
        ("full disk", OSError(errno.ENOSPC, "No space left on device"), "download.disk_full", {}),
    ]


@pytest.mark.parametrize("case", range(13))
def test_each_hub_failure_becomes_its_own_message(case, monkeypatch):
    cases = _translation_cases()
    assert len(cases) == 13  # the parametrize range above
    name, exc, key, env = cases[case]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = download.translate(exc, hub.HubModel("qwen/tiny"), file="model.safetensors")
    assert got.key == key, name
    assert "qwen/tiny" in str(got) or "HF_ENDPOINT" in str(got), str(got)
    if key in ("download.needs_token", "download.token_refused", "download.no_repo_or_private"):
        assert "HF_TOKEN" in str(got)


def test_no_network_names_the_setting_of_what_was_downloading_a_model_or_an_adapter():
    """The way out for a copy made by hand: [model] path for a model, [lora] modules for an adapter (it said
    [model] path for both); in either language, and /adapters at run time has its own words for it."""
    import httpx2

    model, adapter = hub.HubModel("qwen/tiny"), hub.HubModel("me/tiny-lora").as_adapter()
    for target, key, setting in (
        (model, "download.offline", "[model] path"),
        (adapter, "download.adapter_offline", "[lora] modules"),
    ):
        got = download.translate(httpx2.ConnectError("refused"), target)
        assert got.key == key and got.key in download.OFFLINE_KEYS
        for lang in ("en", "zh-CN"):
            text = download.t(got.key, lang, **got.params)
            assert setting in text and target.repo_id in text, text
            assert ("[model] path" in text) is (target is model), text
    from backend.adapters.hub_runtime import RUNTIME_KEYS

    assert RUNTIME_KEYS["download.adapter_offline"] == RUNTIME_KEYS["download.offline"] == "adapter_hub.offline"


def test_a_connection_dropped_mid_file_is_told_as_such():
    import httpx2

    got = download.translate(httpx2.RemoteProtocolError("peer closed"), hub.HubModel("qwen/tiny"), file="x.safetensors")
    assert got.key == "download.dropped" and "x.safetensors" in str(got) and "start again" in str(got)


def test_prepare_downloads_a_hub_id_in_the_foreground(fake_hub, tmp_path):
    env = env_for(tmp_path, fake_hub.url, QWENCHAT_MODEL_PATH=REPO, QWENCHAT_CONFIG=str(ROOT / "tests" / "config.toml"))
    done = subprocess.run(
        [sys.executable, "-m", "backend", "prepare"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    folder = hub.complete_snapshot(hub.HubModel(REPO), tmp_path / "hf" / "hub")
    assert folder is not None and f"model: {folder} (the hub's {REPO})" in done.stdout, done.stdout
    assert "[qwenchat] downloading the model 100 % · 35.7 of 35.7 MB · " in done.stderr  # for people
    assert "[download] " not in done.stderr

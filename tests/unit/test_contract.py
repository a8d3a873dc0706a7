"""The launcher–UI contract (backend/contract.py): the status file both sides share, and its names."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from backend import contract
from backend.contract import EngineStatus, SupervisorState
from backend.launcher.command import Command
from backend.launcher.supervisor import Supervisor
from backend.settings import ROOT
from backend.text import Text

FULL = EngineStatus(
    state=SupervisorState.RESTARTING,
    pid=4242,
    attempt=2,
    max_attempts=5,
    reason=Text("cause.lora.advice", {"reason": Text("cause.lora.adapter", {"name": "pirate"})}),
    cause="oom_gpu",
    message="the engine ran out of memory; restarting — attempt 2 of 5",
    log_path="/logs/engine.log",
    since=1700000000.5,
    updated=1700000001.25,
)

#: The file's keys, in the order the supervisor has always written them.
KEYS = [
    "state",
    "pid",
    "attempt",
    "max_attempts",
    "reason",
    "cause",
    "message",
    "log_path",
    "since",
    "updated",
    "phase",
    "progress",
    "bytes_done",
    "bytes_total",
    "bytes_rate",
]


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_written_status_reads_back_equal(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    FULL.write(path)
    assert EngineStatus.read(path) == FULL
    assert json.loads(path.read_text(encoding="utf-8"))["state"] == "restarting"


def test_the_reason_is_a_catalog_text_made_in_the_readers_language(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    FULL.write(path)
    assert json.loads(path.read_text(encoding="utf-8"))["reason"] == {
        "key": "cause.lora.advice",
        "params": {"reason": {"key": "cause.lora.adapter", "params": {"name": "pirate"}}},
    }
    seen = EngineStatus.read(path)
    assert seen is not None and seen.reason is not None
    assert seen.reason.in_("zh-CN").startswith("适配器 'pirate'") and str(seen.reason).startswith("adapter 'pirate'")


def test_a_file_from_before_the_catalog_texts_reads_its_english_reason(tmp_path):
    """An older launcher wrote reason (English) and reason_zh: the reason reads as its words; reason_zh is ignored."""
    old = {"state": "restarting", "pid": 7, "reason": "the engine ran out of memory", "reason_zh": "引擎内存不足"}
    status = EngineStatus.read(write_json(tmp_path / "s.json", old))
    assert status is not None and status.reason is not None and status.pid == 7
    assert status.reason.in_("zh-CN") == status.reason.in_("en") == "the engine ran out of memory"


def test_updated_is_the_time_of_writing_unless_given(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    before = time.time()
    EngineStatus(state=SupervisorState.RUNNING).write(path)
    status = EngineStatus.read(path)
    assert status is not None and status.updated is not None and before <= status.updated <= time.time()


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        "[]",
        '"running"',
        "{}",
        '{"state": 3}',
        '{"state": null}',
        b"\xff\xfe",
    ],
    ids=["empty", "garbled", "a-list", "a-string", "no-state", "state-not-text", "state-null", "not-utf8"],
)
def test_a_garbled_or_stateless_file_reads_as_none(tmp_path, content):
    path = tmp_path / contract.STATUS_FILE_NAME
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    assert EngineStatus.read(path) is None


def test_a_missing_file_or_a_folder_in_its_place_reads_as_none(tmp_path):
    assert EngineStatus.read(tmp_path / "absent.json") is None
    assert EngineStatus.read(tmp_path) is None  # IsADirectoryError is an OSError


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("pid", "4242", None),
        ("pid", True, None),  # bool is an int in Python, not a pid
        ("pid", 4242.0, 4242),
        ("pid", float("nan"), None),  # json writes NaN; int(nan) would raise
        ("attempt", float("inf"), None),
        ("attempt", [2], None),
        ("max_attempts", "5", None),
        ("since", 1700000000, 1700000000.0),
        ("since", "yesterday", None),
        ("updated", {}, None),
        ("reason", 5, None),
        ("reason", {"key": "cause.unknown"}, None),  # no params: not a text this version wrote
        ("cause", None, ""),
        ("message", ["a"], ""),
        ("log_path", 0, ""),
        ("phase", 3, ""),
        ("progress", "60 %", None),
        ("progress", 59.0, 59),
    ],
)
def test_a_wrong_typed_field_reads_as_its_empty_value_and_the_rest_still_reads(tmp_path, key, value, expected):
    data = FULL.to_json() | {key: value}
    status = EngineStatus.read(write_json(tmp_path / contract.STATUS_FILE_NAME, data))
    assert status is not None
    assert getattr(status, key) == expected
    assert dataclasses.replace(status, **{key: getattr(FULL, key)}) == FULL


def test_an_unknown_state_is_kept_as_text_and_is_none_of_the_members(tmp_path):
    status = EngineStatus.read(write_json(tmp_path / "s.json", {"state": "hibernating", "pid": 7}))
    assert status is not None and status.state == "hibernating" and status.pid == 7
    assert not isinstance(status.state, SupervisorState)
    assert status.state not in list(SupervisorState)


def test_a_known_state_read_from_the_file_is_the_enum_member(tmp_path):
    status = EngineStatus.read(write_json(tmp_path / "s.json", {"state": "down"}))
    assert status is not None and status.state is SupervisorState.DOWN


def test_preparing_with_its_phase_and_progress_reads_back_equal(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    written = EngineStatus(
        state=SupervisorState.PREPARING, phase=contract.PHASE_INSTALL_ENGINE, progress=60, since=1700000000.0
    )
    written.write(path)
    read = EngineStatus.read(path)
    assert read is not None and read.state is SupervisorState.PREPARING
    assert (read.phase, read.progress, read.pid) == ("install_engine", 60, None)
    assert dataclasses.replace(read, updated=None) == written
    assert json.loads(path.read_text(encoding="utf-8"))["state"] == "preparing"


def test_a_file_from_before_the_preparing_state_reads_with_no_phase_and_no_progress(tmp_path):
    """Backwards compatible: a status file an older launcher wrote (no phase/progress keys) still reads."""
    old = FULL.to_json()
    del old["phase"], old["progress"]
    status = EngineStatus.read(write_json(tmp_path / "s.json", old))
    assert status == FULL and (status.phase, status.progress) == ("", None)


def test_writing_replaces_the_file_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    EngineStatus(state=SupervisorState.STARTING).write(path)
    first_inode = path.stat().st_ino
    EngineStatus(state=SupervisorState.RUNNING).write(path)
    # A new file renamed over the old one (a reader never sees half a file), not the old one rewritten.
    assert path.stat().st_ino != first_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == [contract.STATUS_FILE_NAME]
    assert json.loads(path.read_text(encoding="utf-8"))["state"] == "running"


def test_the_keys_the_supervisor_writes_are_exactly_the_ones_the_ui_reads(tmp_path):
    path = tmp_path / contract.STATUS_FILE_NAME
    sup = Supervisor(
        Command(("true",)),
        log_path=tmp_path / "engine.log",
        status_path=path,
        health_url="http://127.0.0.1:9/health",
        attempts=5,
        window_s=60,
        startup_timeout=10,
    )
    sup.proc = types.SimpleNamespace(pid=4242)  # type: ignore[assignment]
    sup._status(
        SupervisorState.RESTARTING,
        Text("cause.no_cache_blocks_gpu"),
        "oom_gpu",
        2,
        "the engine ran out of memory; restarting — attempt 2 of 5",
    )
    written = json.loads(path.read_text(encoding="utf-8"))
    assert list(written) == KEYS
    assert [f.name for f in dataclasses.fields(EngineStatus)] == KEYS
    # and the reader takes every one of them: changing any key changes what the UI sees
    seen = EngineStatus.read(path)
    assert seen is not None and seen.state is SupervisorState.RESTARTING and seen.pid == 4242
    for key in KEYS:
        number = isinstance(written[key], (int, float)) or written[key] is None  # progress: null unless preparing
        other = {"state": "stopped"} if key == "state" else {key: 99 if number else "x"}
        changed = EngineStatus.read(write_json(tmp_path / "changed.json", written | other))
        assert changed != seen, key


@pytest.mark.parametrize("script", ["start.sh", "test.sh"])
def test_the_engine_python_variable_is_the_one_the_shell_scripts_export(script):
    assert f"export {contract.ENV_ENGINE_PYTHON}" in (ROOT / script).read_text(encoding="utf-8")


def test_the_contract_imports_neither_side_nor_any_third_party_package():
    code = (
        "import json, sys, backend.contract; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}"
        " | {m for m in sys.modules if m.startswith('backend.')})))"
    )
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["backend", "backend.contract", "backend.text"]  # text: the catalog's loader

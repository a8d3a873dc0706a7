"""engine.log / ui.log are size-capped: the launcher pumps each child's output into a rotating log, and the
tail the log diagnosis reads stays whole across a rotation."""

from __future__ import annotations

import sys

import pytest

from backend.launcher import log_diagnosis, logfile, supervisor
from backend.launcher.command import Command
from backend.settings import ROOT, ConfigError, LoggingSettings

RECORDED = ROOT / "tests" / "logs" / "cpu_kvcache_space_not_integer.log"


def test_the_log_rotates_at_the_limit_keeping_the_backups_and_the_whole_tail(tmp_path):
    path = tmp_path / "engine.log"
    log = logfile.RotatingLog(path, max_bytes=1000, backups=2)
    lines = [f"line {i:04d} {'x' * 89}\n".encode() for i in range(60)]  # 100 bytes each, 6000 in all
    for line in lines:
        log.write(line)
    log.close()
    files = [path, logfile.rotated(path, 1), logfile.rotated(path, 2)]
    assert all(f.exists() and f.stat().st_size <= 1000 for f in files)
    assert not logfile.rotated(path, 3).exists()  # older than the backups: deleted
    written = b"".join(lines)
    assert b"".join(f.read_bytes() for f in reversed(files)) == written[-3000:]  # in order, nothing lost
    assert path.stat().st_size == 1000
    log = logfile.RotatingLog(path, max_bytes=1000, backups=2)  # reopened: appends, then rotates
    log.write(b"after the reopen\n")
    log.close()
    assert path.read_bytes() == b"after the reopen\n"  # just rotated: the current file holds one line
    tail = logfile.read_tail(path, 1017)
    assert tail.encode() == written[-1000:] + b"after the reopen\n"  # the tail reaches into engine.log.1
    assert logfile.read_tail(tmp_path / "missing.log") == ""


def test_a_rotation_inside_the_failure_keeps_its_cause_readable(tmp_path):
    """The rotation falls in the middle of the recorded failure: the diagnosis still reads all of it."""
    path = tmp_path / "engine.log"
    recorded = RECORDED.read_text()
    expected = log_diagnosis.classify_failure(recorded)
    assert expected is not None and expected.kind != "unknown"
    log = logfile.RotatingLog(path, max_bytes=65536, backups=2)
    log.write(f"\n{log_diagnosis.ATTEMPT_MARKER} 2026-01-01 00:00:00: python -m vllm...\n".encode())
    noise = b"INFO 01-01 00:00:00 [loader.py:1] noise " + b"y" * 40 + b"\n"
    while path.stat().st_size + len(noise) < 65536 - len(recorded) // 2:
        log.write(noise)
    for line in recorded.splitlines(keepends=True):  # the pipe delivers it in pieces
        log.write(line.encode())
    log.close()
    assert 0 < path.stat().st_size < len(recorded.encode())  # the current file holds only the end of it
    tail = supervisor.read_tail(path)
    assert tail.endswith(recorded) and log_diagnosis.ATTEMPT_MARKER in tail
    cause = log_diagnosis.classify_failure(tail)
    assert cause is not None and (cause.kind, cause.reason) == (expected.kind, expected.reason)
    assert log_diagnosis.tail_relevant(tail) == log_diagnosis.tail_relevant(recorded)
    assert log_diagnosis.classify_failure(path.read_text()) != expected  # the current file alone would not do


def test_a_childs_output_goes_through_the_pipe_into_the_capped_log_and_its_last_lines_are_read(tmp_path):
    path = tmp_path / "engine.log"
    recorded = RECORDED.read_text()
    script = (
        "import sys\n"
        "for i in range(4000): print(f'INFO noise line {i:05d} ' + 'y' * 60)\n"
        f"sys.stdout.write({recorded!r}); sys.stdout.flush(); sys.exit(1)\n"
    )
    proc = supervisor.start_process(Command((sys.executable, "-c", script), {}, ()), path, max_bytes=65536, backups=2)
    assert proc.wait(timeout=60) == 1
    supervisor.settle_log(proc)  # what the supervisor does before it diagnoses an exit
    files = [path, logfile.rotated(path, 1), logfile.rotated(path, 2)]
    assert all(f.exists() and f.stat().st_size <= 65536 for f in files)  # 300 KB written, about 192 KB kept
    assert not logfile.rotated(path, 3).exists()
    tail = supervisor.read_tail(path)
    assert tail.endswith(recorded)
    assert log_diagnosis.classify_failure(tail) == log_diagnosis.classify_failure(recorded)


def test_the_launch_marker_is_written_before_the_childs_output(tmp_path):
    path = tmp_path / "ui.log"
    proc = supervisor.start_process(Command((sys.executable, "-c", "print('hello from the child')"), {}, ()), path)
    assert proc.wait(timeout=30) == 0
    supervisor.settle_log(proc)
    text = path.read_text()
    assert text.index(log_diagnosis.ATTEMPT_MARKER) < text.index("hello from the child")


@pytest.mark.parametrize(
    "field, value, expected",
    [("max_bytes", 100, "at least 65536"), ("max_bytes", "20MB", "size in bytes"), ("backups", 0, "from 1 to 99")],
)
def test_bad_log_limits_are_refused_with_the_key(field, value, expected):
    with pytest.raises(ConfigError) as err:
        LoggingSettings(**{field: value})
    assert f"logging.{field}" in str(err.value) and expected in str(err.value)
    assert LoggingSettings().max_bytes == 20 * 1024 * 1024 and LoggingSettings().backups == 3

"""files.own_directory: one Chainlit files folder per UI process; those of killed processes are removed at the
next start, never a live process's, another user's, or anything else in the temp folder."""

from __future__ import annotations

import os
import subprocess
import sys

from backend.chat import files


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_folder_per_process_and_the_folders_of_killed_processes_are_removed(tmp_path):
    killed = tmp_path / f"qwenchat-files-{dead_pid()}-abc123"
    (killed / "session-1").mkdir(parents=True)
    (killed / "session-1" / "export.md").write_text("a chat")
    alive = tmp_path / f"qwenchat-files-{os.getppid()}-def456"  # the parent of this test: alive
    alive.mkdir()
    other = tmp_path / "qwenchat-pg-xyz"  # not a files folder
    other.mkdir()
    loose = tmp_path / f"qwenchat-files-{dead_pid()}-file"  # a file, not a folder: not ours to delete
    loose.write_text("x")

    mine = files.own_directory(tmp_path)

    assert mine.is_dir() and mine.name.startswith(f"qwenchat-files-{os.getpid()}-")
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    assert not killed.exists()
    assert alive.is_dir() and other.is_dir() and loose.is_file()
    again = files.own_directory(tmp_path)  # a second app import in the same process: its own, the first kept
    assert again != mine and mine.is_dir() and again.is_dir()


def test_a_symlink_named_like_a_killed_processs_folder_is_left_alone(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    link = tmp_path / f"qwenchat-files-{dead_pid()}-link"
    link.symlink_to(target)
    assert files.remove_stale(tmp_path) == []
    assert (target / "keep.txt").read_text() == "keep" and link.is_symlink()


def test_a_missing_temp_folder_removes_nothing(tmp_path):
    assert files.remove_stale(tmp_path / "nope") == []

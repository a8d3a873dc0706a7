"""Password hashes for [login] users, and `python -m backend hash-password`."""

from __future__ import annotations

import subprocess
import sys

from backend import passwords
from backend.settings import ROOT


def test_a_hash_verifies_its_password_only():
    stored = passwords.hash_password("correct horse", iterations=passwords.MIN_ITERATIONS)
    assert passwords.is_password_hash(stored)
    assert passwords.verify_password("correct horse", stored)
    assert not passwords.verify_password("correct horsE", stored)
    assert not passwords.verify_password("", stored)


def test_two_hashes_of_one_password_differ_by_their_salt():
    a, b = (passwords.hash_password("pw", iterations=passwords.MIN_ITERATIONS) for _ in range(2))
    assert a != b and passwords.verify_password("pw", a) and passwords.verify_password("pw", b)


def test_malformed_or_weak_hashes_are_refused():
    good = passwords.hash_password("pw", iterations=passwords.MIN_ITERATIONS)
    weak = passwords.hash_password("pw", iterations=1000)
    for value in ("pw", "", good.upper(), good + "00", weak, good.replace("pbkdf2_sha256", "md5")):
        assert not passwords.is_password_hash(value)
        assert not passwords.verify_password("pw", value)


def test_the_hash_password_command_prints_a_usable_hash_and_refuses_short_ones():
    cmd = [sys.executable, "-m", "backend", "hash-password"]
    done = subprocess.run(cmd, input="viewer-password\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    stored = done.stdout.strip()
    assert passwords.verify_password("viewer-password", stored) and "viewer-password" not in done.stdout
    short = subprocess.run(cmd, input="short\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert short.returncode == 2 and short.stdout == "" and "at least 8 characters" in short.stderr

"""What the product prints is safe to print: URL passwords masked in texts and logs, log records one line."""

from __future__ import annotations

import io
import logging

import pytest

from backend import logsafe
from backend.errors import ServerUnreachable


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("http://bob:s3cret@gpu:8000/v1", "http://bob:***@gpu:8000/v1"),
        ("cannot reach https://u:p%40ss@host/v1 (refused)", "cannot reach https://u:***@host/v1 (refused)"),
        ("http://:token@host/v1", "http://:***@host/v1"),
        ("http://host:8000/v1", "http://host:8000/v1"),  # a port is not a password
        ("mail bob@example.com", "mail bob@example.com"),
    ],
)
def test_the_password_of_a_url_is_masked_and_nothing_else(given, shown):
    assert logsafe.mask_credentials(given) == shown


def test_an_error_naming_an_openai_base_url_with_a_password_shows_it_masked():
    error = ServerUnreachable("http://bob:s3cret@127.0.0.1:1/v1", "connection refused")
    for lang in ("en", "zh-CN"):
        text = error.user_text(lang)
        assert "s3cret" not in text and "http://bob:***@127.0.0.1:1/v1" in text, text


@pytest.fixture
def log_lines():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("qwenchat.test.logsafe")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logsafe.install()
    yield logger, stream
    logger.removeHandler(handler)


@pytest.mark.parametrize(
    "typed",
    ["x\nINFO backend.chat.service: FAKE LINE", "x\rFAKE", "x\u2028FAKE", "x\x1b[2KFAKE", "x\x00FAKE"],
    ids=["newline", "carriage-return", "line-separator", "escape", "nul"],
)
def test_user_text_with_a_control_character_cannot_forge_a_log_line(log_lines, typed):
    logger, stream = log_lines
    logger.warning("adapter %s from the hub not added: %s", typed, ValueError(typed))
    logger.info(f"an f-string message with {typed}")
    logger.info("a mapping %(name)s", {"name": typed})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert all("FAKE" in line and line.startswith(("WARNING", "INFO")) for line in lines), lines


def test_a_url_with_a_password_is_masked_in_the_log(log_lines):
    logger, stream = log_lines
    logger.warning("cannot reach %s", "http://bob:s3cret@gpu/v1")
    assert "s3cret" not in stream.getvalue() and "bob:***@gpu" in stream.getvalue()


def test_a_traceback_stays_whole(log_lines):
    logger, stream = log_lines
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    assert "Traceback (most recent call last):\n" in stream.getvalue()

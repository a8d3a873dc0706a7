"""backend/chat/logthread.py: log lines written by a thread of their own, the same lines in the same order."""

from __future__ import annotations

import logging
import logging.handlers
import threading

import pytest

from backend.chat import logthread


class FullPipe:
    """A stream whose writes block until released (the pipe to the launcher, full); notes who wrote what."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.text = ""
        self.threads: set[int] = set()
        self.released_before_write: list[bool] = []

    def write(self, text: str) -> int:
        self.released_before_write.append(self.gate.wait(10))
        self.threads.add(threading.get_ident())
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def pipe(monkeypatch):
    stream = FullPipe()
    handler = logging.StreamHandler(stream)  # what Chainlit's CLI puts on the root logger (stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.INFO)
    yield stream, handler
    logthread.stop()


def test_a_blocked_write_does_not_block_the_caller_and_every_line_arrives_in_order(pipe):
    stream, handler = pipe
    root = logging.getLogger()
    assert logthread.move_off_the_loop()
    log = logging.getLogger("backend.test")
    log.info("first %s", "line")  # the write blocks: on the caller's thread this call would wait the full 10 s
    log.warning("second")
    stream.gate.set()  # only after both calls returned
    logthread.stop()  # writes what is queued
    assert stream.text == "INFO backend.test: first line\nWARNING backend.test: second\n"
    assert stream.released_before_write == [True, True], "the caller waited for the write"
    assert threading.get_ident() not in stream.threads
    assert handler in root.handlers, "stop() gives the root logger its handlers back"
    assert not any(isinstance(h, logging.handlers.QueueHandler) for h in root.handlers)


def test_once_per_process_other_handlers_stay_and_nothing_without_a_stream_handler(pipe, monkeypatch):
    stream, handler = pipe
    stream.gate.set()
    root = logging.getLogger()
    other = logging.NullHandler()  # e.g. a test's log capture: not moved
    root.addHandler(other)
    assert logthread.move_off_the_loop()
    assert not logthread.move_off_the_loop()
    assert handler not in root.handlers and other in root.handlers
    assert any(isinstance(h, logging.handlers.QueueHandler) for h in root.handlers)
    logthread.stop()
    monkeypatch.setattr(root, "handlers", [other])
    assert not logthread.move_off_the_loop()


def test_an_exception_keeps_its_traceback(pipe):
    stream, _ = pipe
    stream.gate.set()
    logthread.move_off_the_loop()
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("backend.test").exception("failed")
    logthread.stop()
    assert stream.text.startswith("ERROR backend.test: failed\nTraceback (most recent call last):")
    assert "ValueError: boom" in stream.text

"""The Chainlit process's log lines written by a thread of their own, not by the event loop.

Chainlit's CLI logs to stdout, which is a pipe to the launcher (it writes ui.log, size-capped). Each record was
formatted and written (a write and a flush: a system call) by whichever task logged it, on the one event loop of
the process; with the launcher starved on a loaded machine the pipe fills and the write blocks every session at
once. ``move_off_the_loop()`` puts one ``QueueHandler`` in place of the root logger's handlers: a record only
goes into a queue (its message made once, as ``QueueHandler`` does), and a ``QueueListener`` thread hands it to
the handlers that were there, which format and write it as before. The lines and their order are unchanged.
Called once per process (again: nothing happens); the thread is stopped, after writing what is queued, at exit.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue

_listener: logging.handlers.QueueListener | None = None


def move_off_the_loop() -> bool:
    """Route the root logger's stream handlers (stdout, stderr, files: exactly those classes, as Chainlit's CLI and
    ``logging.basicConfig`` make them; any other handler, a test's capture, stays where it is) through a queue and
    a writer thread; False when already done or when there is none (nothing to move)."""
    global _listener
    root = logging.getLogger()
    handlers = [h for h in root.handlers if type(h) in (logging.StreamHandler, logging.FileHandler)]
    if _listener is not None or not handlers:
        return False
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, *handlers, respect_handler_level=True)
    listener.start()
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(records))
    _listener = listener
    atexit.register(stop)
    return True


def stop() -> None:
    """Write what is queued and stop the thread; the original handlers take the root logger back."""
    global _listener
    listener, _listener = _listener, None
    if listener is None:
        return
    listener.stop()  # writes every record still queued
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.handlers.QueueHandler) and handler.queue is listener.queue:
            root.removeHandler(handler)
    for handler in listener.handlers:
        root.addHandler(handler)

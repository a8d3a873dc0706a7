"""What this process changes in Chainlit's server once: its files folder, the socket's message size and ping
timeout, httpx's log line per request, the timestamps of its messages, the browser-cookie and security middleware, and
the tasks started with the app."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import chainlit as cl
import chainlit.config as chainlit_config_module
import chainlit.server as chainlit_server
from chainlit.server import app as http_app
from chainlit.server import sio

from backend.chat import files
from backend.settings import Settings
from backend.storage import history, preferences
from backend.ui.chat import log_unserved_starters
from backend.ui.context import Ui
from backend.web import body_limit, loopstats, metrics, security, sessions

# One socket message may carry a pasted document: python-engineio's default cap (1 MB) closes the
# connection on a larger one and the message is lost. 256K tokens of CJK text are ~3 MB of UTF-8;
# 16 MB leaves room for a paste the budget then trims, with a clear message, on the same connection.
MAX_SOCKET_MESSAGE = 16 * 1024 * 1024

# Seconds a ping may wait for its pong before engine.io calls the socket gone (python-engineio's default: 20 s;
# a ping every 25 s). Under load the pong is late through no fault of the network: long answers next to vLLM-CPU
# starve this loop and the browser's for seconds, and a ping waits behind the tokens queued before it (pings 50 s
# apart were seen on 2 busy cores). 120 s rides that out; a browser really gone is noticed within 145 s (its
# answer ends anyway; backend/ui/reconnect.py's replay reads the window from here). It is the only heartbeat:
# uvicorn's websocket keepalive under it is off (backend/ui/launch.py).
PING_TIMEOUT = 120

QUIET_LOGGERS = ("httpx", "httpx2")  # INFO lines per request


def own_files_directory() -> Path:
    """Chainlit deletes <app root>/.files when its process stops: a folder of this process's own, so another UI
    process on the same checkout (a second port) stopping cannot take this one's uploads and files with it.
    Owner-only (0700); also removes those of killed UI processes."""
    directory = files.own_directory()
    chainlit_config_module.FILES_DIRECTORY = directory  # both read at use
    chainlit_server.FILES_DIRECTORY = directory  # type: ignore[attr-defined]
    return directory


class _NonBlockingTime:
    """Chainlit 2.12's Message and Step constructors call time.sleep(0.001), so that consecutive objects get
    distinct timestamps. On the event loop that blocks every session: ~1 ms per message or step, ~3.5 ms on a
    loaded machine (the largest stall found by bench/concurrency.py's profile). This keeps the guarantee,
    a later timestamp, by waiting for the microsecond clock to move (about 1 µs), without the sleep."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds: float) -> None:
        now = time.time_ns() // 1000
        while time.time_ns() // 1000 == now:
            pass


def patch(settings: Settings) -> None:
    """The socket's message size and ping timeout, the constructors' sleep, and the middleware (each once per
    process)."""
    sio.eio.max_http_buffer_size = MAX_SOCKET_MESSAGE
    sio.eio.ping_timeout = PING_TIMEOUT
    # httpx logs every request at INFO ("HTTP Request: POST ... 200 OK"): beside the client's own line per answer
    # ("done: ..."), one more line per request written on the event loop. Its warnings stay.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # By the classes' own globals: the package's name "chainlit.step" is the @step decorator, not the module.
    for cls in (cl.Message, cl.Step):
        cls.__init__.__globals__["time"] = _NonBlockingTime()
    # Without login, the page sets a browser cookie that the websocket carries: settings survive a reload.
    if not any(getattr(m, "cls", None) is preferences.BrowserCookieMiddleware for m in http_app.user_middleware):
        http_app.add_middleware(preferences.BrowserCookieMiddleware)
    # A token revoked at logout is taken out of every later request and socket (backend/web/sessions.py); the
    # revocations are kept beside the login secret, so a restart does not let them in again.
    sessions.install(http_app, history.db_path(settings).parent if settings.login.enable else None)
    # Every request body bounded by route before any route (and the login check in its dependencies) reads it.
    uploads = settings.uploads
    upload = int(uploads.max_mb * 1024 * 1024) if uploads.enabled else None
    body_limit.install(http_app, socket_message=MAX_SOCKET_MESSAGE, upload=upload, login=settings.login.enable)
    # Outermost: origin check (HTTP and the socket.io websocket/polling), security headers, login throttle.
    security.install(http_app, settings)


async def on_app_startup(ui: Ui) -> None:
    """Poll the engine from the first second, so the status line is right before anyone chats."""
    loopstats.start_from_environment()  # benchmarks only: nothing unless QWENCHAT_LOOPSTATS is set
    await ui.service.start()
    if ui.outbox is not None:  # writes a UI process left unstored (killed, or the database was down) go again
        await ui.outbox.start()
    ui.tasks.add(asyncio.create_task(log_unserved_starters(ui)))
    ui.tasks.add(asyncio.create_task(count_restarts(ui)))


async def count_restarts(ui: Ui) -> None:
    """Every poller snapshot to /metrics, so a restart between two scrapes is still counted."""
    async with ui.service.poller.subscribe() as statuses:
        async for status in statuses:
            metrics.METRICS.observe_engine(status)

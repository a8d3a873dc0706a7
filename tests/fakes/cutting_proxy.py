"""A TCP proxy that can cut the network (issue #20, "Wi-Fi blips lose nothing"): a browser talks to the UI through it,
and ``cut()`` closes every open connection and refuses new ones (each is closed as soon as it is accepted) until
``resume()`` or for ``seconds``. That is a real cut for the browser's websocket, which Playwright's offline
emulation may leave open.

asyncio, on 127.0.0.1, in a thread of its own, so that synchronous tests (Playwright's sync API) can use it:
``with CuttingProxy(port) as proxy: page.goto(f"http://127.0.0.1:{proxy.port}")``. The browser's Host and Origin
name the proxy's port, as they would an ssh tunnel's: the UI accepts that (backend/web/security.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

HOST = "127.0.0.1"
CHUNK = 65536
T = TypeVar("T")


class CuttingProxy:
    def __init__(self, target_port: int, target_host: str = HOST) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.cuts = 0  # how many cuts so far
        self.closed_by_cut = 0  # connections closed by cuts
        self.refused = 0  # connections refused while cut
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cutting-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._cut_until = 0.0  # monotonic time until which connections are refused (inf: until resume)

    # ---------------------------------------------------------------- the test's side (any thread)

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, HOST, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            self._close_all()

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def cut(self, seconds: float | None = None) -> int:
        """Close every open connection now and refuse new ones for ``seconds`` (None: until ``resume``). Returns how
        many connections were closed."""

        async def go() -> int:
            self._cut_until = float("inf") if seconds is None else time.monotonic() + seconds
            self.cuts += 1
            return self._close_all()

        return self._call(go())

    def resume(self) -> None:
        """Accept connections again."""

        async def go() -> None:
            self._cut_until = 0.0

        self._call(go())

    @property
    def is_cut(self) -> bool:
        return time.monotonic() < self._cut_until

    # ---------------------------------------------------------------- the proxy (its own loop)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _close_all(self) -> int:
        closed = len(self._open)
        for writer in list(self._open):
            with contextlib.suppress(Exception):
                writer.transport.abort()  # no FIN handshake to wait for: the link is gone
        self._open.clear()
        self.closed_by_cut += closed
        return closed

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()  # one side ended: end the other (a cut's are aborted already)

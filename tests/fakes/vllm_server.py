"""A small vLLM look-alike (aiohttp, 127.0.0.1 only) whose behaviour tests switch while it runs.

    engine = FakeEngine(api_key="k")          # takes a free port (bound, so no one else gets it); nothing listens yet
    await engine.start()                      # listen (again) on the same port
    engine.probe = "hang"                     # "ok" | "hang" | "error" | "slow"
    engine.models.append(adapter("pirate"))   # the next /v1/models lists it
    await engine.stop()                       # connection refused from now on

Routes: GET /health, GET /v1/models, POST /v1/chat/completions (non-streaming, one token), GET /metrics (vLLM's
request gauges, from ``running`` and ``waiting``; ``metrics = False``: 404).
A hung generation waits at most ``hang_limit`` seconds and is released by stop().
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from aiohttp import web


def reserved_port() -> socket.socket:
    """A socket bound to a free port, and kept. A port picked and let go (bound, closed) was free for anyone until the
    server bound it again, and another process's outgoing connection once took it in between (EADDRINUSE in a full
    run). The kernel gives a bound port to no connection and no other bind."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def base(model_id: str = "base-model", max_model_len: int = 8192) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "root": f"/models/{model_id}",
        "parent": None,
        "max_model_len": max_model_len,
    }


def adapter(name: str, parent: str = "base-model") -> dict[str, Any]:
    return {"id": name, "object": "model", "root": f"/adapters/{name}", "parent": parent, "max_model_len": None}


class FakeEngine:
    def __init__(self, api_key: str = "", port: int | None = None) -> None:
        self._reserved = None if port else reserved_port()  # listened on by the first start()
        self.port = port or self._reserved.getsockname()[1]
        self.api_key = api_key
        self.health_status = 200
        self.models: list[dict[str, Any]] = [base()]
        self.models_status = 200  # else /v1/models answers this status with a vLLM-shaped error
        self.probe = "ok"
        self.probe_delay = 0.0  # seconds, for "slow"
        self.hang_limit = 10.0
        self.seen: list[tuple[str, str]] = []  # (path, Authorization header)
        self.probes = 0
        self.running, self.waiting = 0, 0  # what GET /metrics says
        self.metrics = True
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def listening(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        self._release = asyncio.Event()
        runner = web.AppRunner(app, shutdown_timeout=0.2, handler_cancellation=True, access_log=None)
        await runner.setup()
        sock, self._reserved = self._reserved, None
        site: web.BaseSite
        if sock is not None:
            site = web.SockSite(runner, sock)
        else:  # again, on the port it had (reuse_address: past the last run's TIME_WAIT)
            site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self._runner = runner

    async def stop(self) -> None:
        if self._reserved is not None:  # never started
            self._reserved.close()
            self._reserved = None
        self._release.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _denied(self, request: web.Request) -> web.Response | None:
        self.seen.append((request.path, request.headers.get("Authorization", "")))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)  # vLLM 0.32's exact body
        return None

    async def _health(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, request.headers.get("Authorization", "")))
        return web.Response(status=self.health_status)  # vLLM: empty body, no auth check

    async def _metrics(self, request: web.Request) -> web.Response:
        """vLLM's Prometheus text: its gauges once per served model name (here the base and one adapter name's
        label set, as a server with several names shows), beside metrics of other names."""
        if denied := self._denied(request):
            return denied
        if not self.metrics:
            return web.Response(status=404, text="Not Found")
        lines = []
        for name, value in (("running", self.running), ("waiting", self.waiting)):
            lines += [
                f"# HELP vllm:num_requests_{name} Number of requests {name}.",
                f"# TYPE vllm:num_requests_{name} gauge",
                f'vllm:num_requests_{name}{{engine="0",model_name="base-model"}} {float(value - value // 2)}',
                f'vllm:num_requests_{name}{{engine="0",model_name="other"}} {float(value // 2)}',
            ]
        lines += ['vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0', "vllm:other_total 5.0"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        if self.models_status != 200:
            error = {"message": "no worker available", "type": "ServiceUnavailable", "code": self.models_status}
            return web.json_response({"error": error}, status=self.models_status)
        return web.json_response({"object": "list", "data": list(self.models)})

    async def _chat(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        self.probes += 1
        body = await request.json()
        if self.probe == "hang":
            try:
                await asyncio.wait_for(self._release.wait(), self.hang_limit)
            except TimeoutError:
                pass
        elif self.probe == "slow":
            await asyncio.sleep(self.probe_delay)
        elif self.probe == "error":
            return web.json_response(
                {
                    "error": {
                        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                },
                status=500,
            )
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "pong"}, "finish_reason": "length"}
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
            }
        )

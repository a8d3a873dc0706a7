"""A fault-injecting OpenAI-compatible server (aiohttp, 127.0.0.1 only) for tests.

The behaviour of each request is chosen by a *mode spec*, taken from (first match wins):

1. the request's ``model`` when it starts with ``fault:`` or ``normal:``
   (``"fault:stall-mid:at=3:stall=5"``, ``"normal:tokens=20:rate=50"``);
2. a ``[[fault:...]]`` / ``[[normal:...]]`` directive inside the last user message
   (handy from a browser: type ``[[fault:drop-mid]] hello``);
3. the server default (``--mode``, or ``POST /fake/mode {"mode": ...}``), used for the
   served base and adapter names. Any other model name gets vLLM's exact 404 body.

Spec grammar: ``normal[:key=value...]`` or ``fault:<name>[:key=value...]``. Keys:
``tokens`` (default 8), ``rate`` (tokens/s, 0 = no pause; default 0), ``at`` (token index
where a mid-stream fault fires; default 3), ``stall`` (seconds, default 30; every stall
ends early when the client disconnects), ``fail`` (only the first N attempts of this
spec misbehave, later ones are normal — for retry tests), ``retry_after`` (503/429
``Retry-After`` value, default ``1``), ``param`` (``input_tokens``|``max_tokens`` for
``overflow-400``), ``limit`` (the context length ``overflow-400`` names; default the served ``max_model_len``: a
server smaller than it says), ``finish`` (the finish reason the answer ends with, e.g. ``content_filter``,
``tool_calls`` or one nobody knows; default ``stop``, or ``length`` at ``max_tokens``), ``router=1`` (an ``http-503``
answered as vllm-router 0.1.17 does with no routable worker: its plain text ``NO_WORKERS``), ``interval`` (tokens per
chunk after the first, as vLLM's ``--stream-interval``; a request's ``stream_interval`` raises it), ``model`` (only
requests for that model follow the spec, others get the default mode: one side of a compare fails). Faults are
listed in ``FAULTS``; ``http-<status>`` works for any status.

A scripted answer (``POST /fake/script {"chunks": ["set key", ":value"], "hold": 2}``) replaces the ``w0 w1 …``
tokens of every normal streamed answer with those content chunks, as given (a sequence split across chunks
stays split), ``hold`` seconds before the last one; ``{"chunks": null}`` or ``/fake/reset`` ends it.

``image=PORT`` (any mode) starts the answer with a markdown image pointing at a local listener,
``![x](http://127.0.0.1:PORT/leak.png?c=N)`` (N: the request's index): does the browser fetch it?

Every request is recorded (``RequestRecord``): attempt number per spec, stream flag,
``X-Request-Id`` header, the parsed messages, chunks sent, and whether the client
closed the connection before the server finished (``disconnected`` — what the Stop
button must cause). Other processes read them from ``GET /fake/requests``.

Use as ``async with FakeServer() as srv: srv.base_url`` or standalone:
``python -m tests.fakes.openai_server --port 8011`` (then ``OPENAI_BASE_URL=http://127.0.0.1:8011/v1``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

HOST = "127.0.0.1"
MAX_STALL = 30.0  # hard cap on any stall, whatever the spec says
POLL = 0.01  # disconnect polling step during stalls

#: vllm-router 0.1.17's answer when it has no worker to route to (restarted, its workers not admitted yet).
NO_WORKERS = "No available workers (all circuits open or unhealthy)"

FAULTS: dict[str, str] = {
    "empty-choices-first": "first chunk has `choices: []` and no usage; then a normal answer",
    "usage-only-final": "normal answer, then a usage-only chunk (`choices: []`) even without include_usage",
    "no-delta": "a choice without `delta` mid-stream and on the finish chunk (non-stream: no `message`)",
    "null-content": "`delta.content: null` chunks between tokens (non-stream: `content: null`, finish stop)",
    "no-finish": "tokens, then [DONE]; `finish_reason` never set",
    "role-only-first": "first chunk `delta: {role}` without a `content` key",
    "stall-first": "role chunk, then silence for `stall` s before the first token (non-stream: before the body)",
    "stall-mid": "`at` tokens, then silence for `stall` s, then the rest",
    "drop-mid": "`at` tokens, then the TCP connection is closed mid-body (non-stream: before any response)",
    "error-mid": '`at` tokens, then `data: {"error": {...}}` (vLLM shape; `status`/`param` adjustable)',
    "error-mid-flat": '`at` tokens, then the old flat `data: {"object": "error", "message": ...}`',
    "http-500": "HTTP 500 with vLLM's error body",
    "http-503": "HTTP 503 with `Retry-After` (any `http-<status>` works the same way)",
    "overflow-400": "HTTP 400, vLLM's exact context-overflow body (`param` input_tokens or max_tokens)",
    "unknown-model-404": "HTTP 404, vLLM's exact unknown-model body",
    "non-json": "`at` tokens, then a `data:` line that is not JSON (non-stream: a body that is not JSON)",
    "empty-choices": "every chunk has `choices: []` (non-stream: `choices: []`)",
    "empty-stream": "`data: [DONE]` and nothing else (non-stream: `{}`)",
    "invalid-utf8": "a multi-byte character split across two writes, plus invalid UTF-8 bytes in content",
    "several-choices": "two choices per chunk, index 1 listed first",
    "other-choice-chunks": "a server ignoring n = 1: chunks of choice 1 (text `X`) interleaved with ours, one choice "
    "per chunk, choice 1 first (non-stream: two choices, index 1 listed first)",
    "extra-fields": "unknown fields at every level",
    "think-inline": "`<think>…</think>` inline in content, tags split across chunks",
    "reasoning-field": "`delta.reasoning_content` chunks before the content",
    "slow-headers": "silence for `stall` s before the response headers",
    "json-body": "a streaming request answered with one whole JSON `chat.completion` body (stream: true ignored)",
    "json-error-200": "HTTP 200 whose whole body is vLLM's JSON error object (both)",
    "html-200": "HTTP 200 with an HTML login page, as a proxy's sign-in would answer (both)",
    "html-502": "HTTP 502 with a proxy's HTML error page (both)",
    "text-200": "HTTP 200 with a plain-text body (both)",
    "sse-wrong-type": "a normal event stream sent as `Content-Type: text/plain` (non-stream: JSON sent as text/plain)",
    "eof-no-finish": "`at` tokens, then the body ends cleanly: no finish_reason, no [DONE] (non-stream: JSON cut short)",
    "finish-no-done": "a normal answer with its finish_reason, then the body ends without [DONE] (non-stream: normal)",
    "tool-calls": "the model calls a tool `get_weather` (no text), finish_reason `tool_calls`",
}

LOGIN_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Sign in - Corporate Proxy</title></head>"
    '<body><form action="/login"><input name="user"><input type="password" name="pw"></form></body></html>'
)
BAD_GATEWAY_PAGE = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>"
    "\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
PLAIN_TEXT = "upstream connect error or disconnect/reset before headers"
TOOL_CALL = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": ""}}

MODE_RE = re.compile(r"\[\[((?:fault|normal)(?::[\w.=\-]+)*)\]\]")


def image_markdown(port: int, index: int) -> str:
    """What ``image=PORT`` puts before the answer: a remote image a browser must not load."""
    return f"![x](http://{HOST}:{port}/leak.png?c={index}) "


def token_text(i: int) -> str:
    """The i-th token a normal answer streams."""
    return f"w{i} "


def expected_text(tokens: int) -> str:
    """The whole text of a normal answer of ``tokens`` tokens."""
    return "".join(token_text(i) for i in range(tokens))


def vllm_error(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def overflow_body(param: str = "input_tokens", max_model_len: int = 8192, max_tokens: int = 1024) -> dict[str, Any]:
    """vLLM's exact 400 body for a prompt (or max_tokens) that does not fit max_model_len."""
    if param == "max_tokens":
        have = max_model_len - max_tokens + 100
        msg = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {have} input tokens "
            f"({max_tokens} > {max_model_len} - {have})."
        )
    else:
        msg = (
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{max_model_len + 808} input tokens. Please reduce the length of the input messages."
        )
    return vllm_error(msg, "BadRequestError", 400, param)


def not_found_body(model: str) -> dict[str, Any]:
    """vLLM's exact 404 body for an unknown model or adapter."""
    return vllm_error(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")


_STATUS_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


@dataclass(frozen=True)
class Mode:
    """A parsed mode spec."""

    spec: str
    fault: str | None = None  # None: a normal answer
    tokens: int = 8
    rate: float = 0.0
    at: int = 3
    stall: float = MAX_STALL
    fail: int | None = None
    retry_after: str = "1"
    param: str = "input_tokens"
    image: int = 0  # a port: the answer starts with a markdown image from http://127.0.0.1:<port>
    status: int = 500
    finish: str = ""
    interval: int = 1  # tokens per chunk after the first (vLLM's --stream-interval)
    model: str = ""  # only requests for this model follow the spec; others get the default mode (compare tests)
    router: int = 0  # 1: an http-503 is vllm-router's "no available workers" (plain text), not vLLM's JSON error
    limit: int = 0  # overflow-400: the context length its body names (0: the served max_model_len)

    @classmethod
    def parse(cls, spec: str) -> Mode:
        parts = spec.split(":")
        family, rest = parts[0], parts[1:]
        kw: dict[str, Any] = {"spec": spec}
        if family == "fault":
            if not rest:
                raise ValueError(f"mode {spec!r}: name the fault, e.g. fault:stall-mid")
            name, rest = rest[0], rest[1:]
            if name not in FAULTS and not re.fullmatch(r"http-\d{3}", name):
                raise ValueError(f"mode {spec!r}: unknown fault {name!r}; known: {', '.join(FAULTS)}, http-<status>")
            kw["fault"] = name
            if name.startswith("http-"):
                kw["status"] = int(name[5:])
            if name == "error-mid":
                kw["status"] = 500
        elif family != "normal":
            raise ValueError(f"mode {spec!r}: must start with 'normal' or 'fault:'")
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep or key not in types or key in ("spec", "fault"):
                raise ValueError(
                    f"mode {spec!r}: bad option {item!r}; use key=value with keys "
                    "tokens, rate, at, stall, fail, retry_after, param, status, finish, interval, model, router, limit"
                )
            conv = {"int": int, "float": float, "int | None": int}.get(str(types[key]), str)
            kw[key] = conv(value)
        mode = cls(**kw)
        if mode.stall > MAX_STALL:
            mode = dataclasses.replace(mode, stall=MAX_STALL)
        return mode

    def effective(self, attempt: int) -> Mode:
        """With ``fail=N``, attempts after the N-th behave normally."""
        if self.fail is not None and attempt > self.fail:
            return dataclasses.replace(self, fault=None)
        return self


USER_START_CHARS = 80
PID_HEADER = "X-Fake-Pid"


@dataclass
class RequestRecord:
    """What the server saw and did for one POST /v1/chat/completions."""

    index: int
    spec: str
    attempt: int  # 1-based, per spec string
    model: str
    stream: bool
    request_id: str | None  # the X-Request-Id header
    messages: list[Any]
    body_bytes: int
    max_tokens: int | None = None
    priority: int | None = None  # vLLM's scheduling priority, when the client sent one
    peer: str = ""  # the client's "host:port": the same for requests that reused one connection
    status: int = 200
    chunks_sent: int = 0
    disconnected: bool = False  # the client closed the connection before we were done
    completed: bool = False  # the handler reached its own end
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("finished", "messages")}
        d["message_chars"] = sum(
            len(m.get("content") or "")
            for m in self.messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
        last = self.messages[-1] if self.messages and isinstance(self.messages[-1], dict) else {}
        d["last_message"] = last.get("content") if isinstance(last.get("content"), str) else None  # its documents too
        # the start of each user message, in order (whether a turn was lost: tests/soak/test_faults.py)
        d["user_starts"] = [
            m["content"][:USER_START_CHARS]
            for m in self.messages
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
        ]
        return d


class _Disconnected(Exception):
    """The client went away while we were writing or stalling."""


class _Dropped(Exception):
    """We closed the connection on purpose (fault drop-mid)."""


class FakeServer:
    """The server; an async context manager. ``base_url`` ends in /v1."""

    def __init__(
        self,
        *,
        port: int = 0,
        model: str = "fake-qwen",
        adapter: str = "fake-adapter",
        max_model_len: int = 8192,
        default_mode: str = "normal",
    ) -> None:
        Mode.parse(default_mode)
        self.port = port
        self.model = model
        self.adapter = adapter
        self.max_model_len = max_model_len
        self.default_mode = default_mode
        self.records: list[RequestRecord] = []
        self._attempts: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._writers: set[web.StreamResponse] = set()
        # runtime LoRA (vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING): name -> path, listed by /v1/models
        self.runtime_adapters: dict[str, str] = {}
        self.lora_calls: list[tuple[str, dict[str, Any], str]] = []  # (path, body, Authorization header)
        self.lora_fault: int | None = None  # every (un)load answers this HTTP status with vLLM's error body
        self.lineage = True  # False: /v1/models without parent/root, as behind LiteLLM or a router
        # the base model's root in /v1/models (vLLM: the folder it serves); a test points it at a folder whose
        # config.json makes the fake look like a vision model
        self.root = f"/models/{model}"
        # True: /health and every chat request answer 503 (an engine that stopped answering; the poller says DOWN)
        self.down = False
        self.script: list[str] | None = None  # content chunks every normal streamed answer sends instead of tokens
        self.script_hold = 0.0  # seconds before the script's last chunk (a test reads the page mid-answer)

    # ------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # 10 MB prompts must arrive
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_get("/fake/requests", self._requests)
        app.router.add_post("/fake/reset", self._reset)
        app.router.add_post("/fake/mode", self._set_mode)
        app.router.add_post("/fake/script", self._set_script)
        return app

    async def start(self) -> FakeServer:
        self._runner = web.AppRunner(self.app(), shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._closing = True  # ends every stall at its next poll
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def open_connections(self) -> int:
        """Client connections open now (kept alive or busy)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # ------------------------------------------------------------ facts for tests

    def attempts(self, spec: str) -> int:
        """How many requests arrived with this mode spec."""
        return self._attempts.get(spec, 0)

    def reset(self) -> None:
        self.script, self.script_hold = None, 0.0
        self.records.clear()
        self._attempts.clear()

    async def wait_finished(self, record: RequestRecord, timeout: float = 5.0) -> RequestRecord:
        """Wait (bounded) until the handler for ``record`` has ended."""
        await asyncio.wait_for(record.finished.wait(), timeout)
        return record

    # ------------------------------------------------------------ plain routes

    async def _health(self, request: web.Request) -> web.Response:
        # its pid: a test that started it on a port another process took meanwhile must not take that one for it
        return web.Response(status=503 if self.down else 200, headers={PID_HEADER: str(os.getpid())})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "fake"})

    async def _models(self, request: web.Request) -> web.Response:
        now = int(time.time())

        def card(mid: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
            lineage = {"root": root, "parent": parent} if self.lineage else {}
            return {
                "id": mid,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                **lineage,
                "max_model_len": max_len,
                "permission": [],
            }

        return web.json_response(
            {
                "object": "list",
                "data": [
                    card(self.model, self.root, None, self.max_model_len),
                    card(self.adapter, f"/adapters/{self.adapter}", self.model, None),
                    *(card(n, p, self.model, None) for n, p in self.runtime_adapters.items()),
                ],
            }
        )

    async def _load_lora(self, request: web.Request) -> web.Response:
        """vLLM's /v1/load_lora_adapter: plain-text success, 400 when loaded already (``lora_fault``: that status)."""
        body = await request.json()
        self.lora_calls.append((request.path, body, request.headers.get("Authorization", "")))
        name = body.get("lora_name")
        if self.lora_fault:
            msg = f"fake LoRA fault {self.lora_fault} loading {name}"
            return web.json_response(
                vllm_error(msg, _STATUS_TYPES.get(self.lora_fault, "Error"), self.lora_fault), status=self.lora_fault
            )
        if name in self.runtime_adapters or name == self.adapter:
            msg = f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
            return web.json_response(vllm_error(msg, "BadRequestError", 400), status=400)
        self.runtime_adapters[name] = str(body.get("lora_path"))
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        """vLLM's /v1/unload_lora_adapter: 404 for a name it does not have."""
        body = await request.json()
        self.lora_calls.append((request.path, body, request.headers.get("Authorization", "")))
        name = body.get("lora_name")
        if self.lora_fault:
            msg = f"fake LoRA fault {self.lora_fault} unloading {name}"
            return web.json_response(
                vllm_error(msg, _STATUS_TYPES.get(self.lora_fault, "Error"), self.lora_fault), status=self.lora_fault
            )
        if name not in self.runtime_adapters:
            return web.json_response(
                vllm_error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404), status=404
            )
        del self.runtime_adapters[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _requests(self, request: web.Request) -> web.Response:
        return web.json_response([r.to_json() for r in self.records])

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _set_script(self, request: web.Request) -> web.Response:
        data = await request.json()
        chunks = data.get("chunks") if isinstance(data, dict) else None
        if chunks is not None and not (isinstance(chunks, list) and all(isinstance(c, str) for c in chunks)):
            msg = f"script {chunks!r}: give 'chunks' as a list of strings (null ends the script)"
            return web.json_response(vllm_error(msg, "BadRequestError", 400), status=400)
        self.script, self.script_hold = chunks, float(data.get("hold") or 0)
        return web.json_response({"chunks": chunks, "hold": self.script_hold})

    async def _set_mode(self, request: web.Request) -> web.Response:
        data = await request.json()
        try:
            Mode.parse(data["mode"])
        except (KeyError, TypeError, ValueError) as exc:
            return web.json_response(vllm_error(str(exc), "BadRequestError", 400), status=400)
        self.default_mode = data["mode"]
        return web.json_response({"mode": self.default_mode})

    # ------------------------------------------------------------ chat

    def _pick_spec(self, model: str, messages: Any) -> str | None:
        if model.startswith(("fault:", "normal")) and (model == "normal" or ":" in model):
            return model
        if isinstance(messages, list):
            for m in reversed(messages):
                if isinstance(m, dict) and m.get("role") == "user":
                    found = MODE_RE.search(m["content"]) if isinstance(m.get("content"), str) else None
                    if found:
                        return found.group(1)
                    break
        if model in (self.model, self.adapter) or model in self.runtime_adapters:
            return self.default_mode
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            return web.json_response(vllm_error(f"invalid JSON body: {exc}", "BadRequestError", 400), status=400)
        if self.down:
            return web.json_response(vllm_error("the fake engine is down", "ServiceUnavailableError", 503), status=503)
        model = str(body.get("model", ""))
        messages = body.get("messages") or []
        spec = self._pick_spec(model, messages)
        self._attempts[spec or model] = attempt = self._attempts.get(spec or model, 0) + 1
        rec = RequestRecord(
            index=len(self.records),
            spec=spec or model,
            attempt=attempt,
            model=model,
            stream=bool(body.get("stream")),
            request_id=request.headers.get("X-Request-Id"),
            messages=messages if isinstance(messages, list) else [],
            body_bytes=len(raw),
            max_tokens=body.get("max_tokens"),
            priority=body.get("priority"),
            peer=":".join(map(str, (request.transport.get_extra_info("peername") or ()) if request.transport else ())),
        )
        self.records.append(rec)
        try:
            if spec is None:
                return self._json(rec, not_found_body(model), 404)
            try:
                mode = Mode.parse(spec).effective(attempt)
                if mode.model and mode.model != model:  # the directive names the other model: answer normally
                    mode = Mode.parse(self.default_mode if model in (self.model, self.adapter) else "normal")
            except ValueError as exc:
                return self._json(rec, vllm_error(str(exc), "BadRequestError", 400), 400)
            return await self._answer(request, rec, mode, body)
        except _Disconnected:
            rec.disconnected = True
            return web.Response(status=499)  # never reaches the client; keeps aiohttp quiet
        except _Dropped:
            rec.completed = True
            return web.Response(status=499)
        finally:
            rec.ended_at = time.monotonic()
            rec.finished.set()

    def _json(
        self, rec: RequestRecord, body: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        rec.status = status
        rec.completed = True
        return web.json_response(body, status=status, headers=headers)

    async def _stall(self, request: web.Request, seconds: float) -> None:
        """Sleep up to ``seconds`` (capped), in small steps; raise _Disconnected when the client leaves."""
        deadline = time.monotonic() + min(seconds, MAX_STALL)
        while time.monotonic() < deadline and not self._closing:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise _Disconnected()
            await asyncio.sleep(min(POLL, deadline - time.monotonic()))

    async def _answer(
        self, request: web.Request, rec: RequestRecord, mode: Mode, body: dict[str, Any]
    ) -> web.StreamResponse:
        fault = mode.fault
        model = rec.model
        if fault == "unknown-model-404":
            return self._json(rec, not_found_body(model), 404)
        if fault == "overflow-400":
            limit = mode.limit or self.max_model_len
            return self._json(rec, overflow_body(mode.param, limit, rec.max_tokens or 1024), 400)
        if fault == "http-503" and mode.router:  # vllm-router with no routable worker: plain text, no error fields
            rec.status, rec.completed = 503, True
            return web.Response(status=503, text=NO_WORKERS, content_type="text/plain")
        if fault is not None and fault.startswith("http-"):
            status = mode.status
            headers = {"Retry-After": mode.retry_after} if status in (429, 503) else None
            msg = f"fake server: HTTP {status} on attempt {rec.attempt}"
            return self._json(rec, vllm_error(msg, _STATUS_TYPES.get(status, "APIError"), status), status, headers)
        if fault == "slow-headers":
            await self._stall(request, mode.stall)
        if fault in ("html-200", "html-502"):
            status = 200 if fault == "html-200" else 502
            rec.status, rec.completed = status, True
            page = LOGIN_PAGE if status == 200 else BAD_GATEWAY_PAGE
            return web.Response(status=status, text=page, content_type="text/html")
        if fault == "text-200":
            rec.status, rec.completed = 200, True
            return web.Response(text=PLAIN_TEXT, content_type="text/plain")
        if fault == "json-error-200":
            return self._json(rec, vllm_error("fake engine failure in a 200 body", "InternalServerError", 500))
        if fault == "json-body":
            return await self._complete(request, rec, mode)
        if rec.stream:
            return await self._stream(request, rec, mode, body)
        return await self._complete(request, rec, mode)

    # ------------------------------------------------------------ non-streaming

    async def _complete(self, request: web.Request, rec: RequestRecord, mode: Mode) -> web.StreamResponse:
        fault = mode.fault
        n, finish = self._length(mode, rec)
        text = expected_text(n)
        message: dict[str, Any] | None = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        out: dict[str, Any] = {
            "id": f"chatcmpl-{rec.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": rec.model,
            "choices": [choice],
            "usage": self._usage(rec, n),
        }
        if fault in ("stall-first", "stall-mid"):
            await self._stall(request, mode.stall)
        elif fault == "drop-mid":
            if request.transport is not None:
                request.transport.close()
            raise _Dropped()
        elif fault == "error-mid":
            return self._json(rec, vllm_error("fake engine failure", "InternalServerError", mode.status, None))
        elif fault == "error-mid-flat":
            return self._json(
                rec,
                {
                    "object": "error",
                    "message": "fake engine failure (flat)",
                    "type": "InternalServerError",
                    "param": None,
                    "code": mode.status,
                },
            )
        elif fault == "non-json":
            rec.status, rec.completed = 200, True
            return web.Response(body=b"this is not json", content_type="application/json")
        elif fault in ("empty-choices", "empty-choices-first"):
            out["choices"] = []
        elif fault == "empty-stream":
            out = {}
        elif fault == "no-delta":
            del choice["message"]
        elif fault == "null-content":
            choice["message"] = {"role": "assistant", "content": None}
        elif fault == "no-finish":
            choice["finish_reason"] = None
        elif fault in ("several-choices", "other-choice-chunks"):
            out["choices"] = [
                {"index": 1, "message": {"role": "assistant", "content": "OTHER"}, "finish_reason": "stop"},
                choice,
            ]
        elif fault == "extra-fields":
            out["x_unknown"] = {"a": 1}
            choice["x_extra"] = [1, 2]
            choice["message"]["x_more"] = "?"
        elif fault == "think-inline":
            choice["message"]["content"] = "<think>\nreasoning\n</think>\n\n" + text
        elif fault == "reasoning-field":
            choice["message"]["reasoning_content"] = "reasoning"
        elif fault == "sse-wrong-type":
            rec.status, rec.completed = 200, True
            return web.Response(text=json.dumps(out), content_type="text/plain")
        elif fault == "eof-no-finish":
            rec.status, rec.completed = 200, True
            cut = json.dumps(out).encode()
            return web.Response(body=cut[: len(cut) // 2], content_type="application/json")
        elif fault == "tool-calls":
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [{**TOOL_CALL}]}
            choice["message"]["tool_calls"][0]["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            choice["finish_reason"] = "tool_calls"
        elif fault == "invalid-utf8":
            raw = json.dumps(out, ensure_ascii=False).encode()
            raw = raw.replace(text.encode(), b"ok \xe4\xb8\xad bad\xff\xfe end", 1)
            rec.status, rec.completed = 200, True
            return web.Response(body=raw, content_type="application/json")
        return self._json(rec, out)

    def _length(self, mode: Mode, rec: RequestRecord) -> tuple[int, str]:
        n = mode.tokens
        if isinstance(rec.max_tokens, int) and 0 <= rec.max_tokens < n:
            return rec.max_tokens, mode.finish or "length"
        return n, mode.finish or "stop"

    def _usage(self, rec: RequestRecord, completion: int) -> dict[str, int]:
        prompt = sum(len(json.dumps(m, ensure_ascii=False)) for m in rec.messages) // 4 + 1
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # ------------------------------------------------------------ streaming

    async def _stream(
        self, request: web.Request, rec: RequestRecord, mode: Mode, body: dict[str, Any]
    ) -> web.StreamResponse:
        fault = mode.fault
        ctype = "text/plain; charset=utf-8" if fault == "sse-wrong-type" else "text/event-stream"
        resp = web.StreamResponse(status=200, headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        n, finish = self._length(mode, rec)
        at = max(0, min(mode.at, n))
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))

        async def raw(data: bytes) -> None:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise _Disconnected()
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError) as exc:  # closing transport / reset by peer
                raise _Disconnected() from exc
            rec.chunks_sent += 1

        async def send(obj: Any) -> None:
            if fault == "other-choice-chunks" and obj.get("choices"):  # choice 1's own chunk before each of ours
                other = {**obj, "choices": [{**obj["choices"][0], "index": 1, "delta": {"content": "X"}}]}
                await raw(b"data: " + json.dumps(other, ensure_ascii=False).encode() + b"\n\n")
            await raw(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")

        def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, **top: Any) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
            if delta is not None:
                c["delta"] = delta
            out: dict[str, Any] = {
                "id": f"chatcmpl-{rec.index}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": rec.model,
                "choices": [c],
            }
            if fault == "several-choices":
                out["choices"] = [{"index": 1, "delta": {"content": "X"}, "finish_reason": finish_reason}, c]
            elif fault == "extra-fields":
                out["x_unknown"] = {"nested": [1, 2]}
                c["x_extra"] = True
                if delta is not None:
                    delta["x_more"] = "?"
            elif fault == "empty-choices":
                out["choices"] = []
            out.update(top)
            return out

        next_at = time.monotonic()

        async def pause() -> None:  # token i is due at start + i/rate: sleep overheads do not add up
            nonlocal next_at
            if mode.rate > 0:
                next_at += 1.0 / mode.rate
                await self._stall(request, next_at - time.monotonic())

        if fault == "empty-stream":
            await raw(b"data: [DONE]\n\n")
            return self._done(rec, resp)
        if fault == "empty-choices-first":
            await send(
                {
                    "id": f"chatcmpl-{rec.index}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": rec.model,
                    "choices": [],
                }
            )
        await send(chunk({"role": "assistant"} if fault == "role-only-first" else {"role": "assistant", "content": ""}))
        if mode.image:
            await send(chunk({"content": image_markdown(mode.image, rec.index)}))
        if fault == "stall-first":
            await self._stall(request, mode.stall)
        if fault == "tool-calls":
            await send(chunk({"tool_calls": [TOOL_CALL]}))
            await send(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}))
            await send(chunk({}, "tool_calls"))
            await raw(b"data: [DONE]\n\n")
            return self._done(rec, resp)
        if fault == "reasoning-field":
            for piece in ("rea", "son", "ing"):
                await send(chunk({"reasoning_content": piece}))
        if fault == "think-inline":
            for piece in ("<thi", "nk>\nrea", "soning</th", "ink>\n\n"):
                await send(chunk({"content": piece}))
        if fault == "invalid-utf8":
            # "中" is e4 b8 ad: split its bytes over two writes (valid once joined), then
            # bytes that are never valid UTF-8 (ff, and a truncated e4 b8).
            head = json.dumps(chunk({"content": "ok @"}), ensure_ascii=False).encode()
            first, second = head.split(b"@")
            await raw(b"data: " + first + b"\xe4\xb8")
            await asyncio.sleep(0.02)
            await raw(b"\xad" + second + b"\n\n")
            bad = json.dumps(chunk({"content": " bad@ end "}), ensure_ascii=False).encode()
            await raw(b"data: " + bad.replace(b"@", b"\xff\xe4\xb8") + b"\n\n")
        if self.script is not None and fault is None:
            script, hold, n = self.script, self.script_hold, len(self.script)
            for i, piece in enumerate(script):
                if hold and i == len(script) - 1:
                    await self._stall(request, hold)
                await send(chunk({"content": piece}))
        # tokens per chunk after the first: the larger of the mode's and the request's (as vLLM clamps a request's
        # stream_interval to its engine's)
        interval, pending = max(mode.interval, int(body.get("stream_interval") or 1)), []
        for i in range(n if self.script is None or fault is not None else 0):
            if i == at and fault is not None:
                if fault == "stall-mid":
                    await self._stall(request, mode.stall)
                elif fault == "drop-mid":
                    # Close mid-body: the chunked encoding never terminates, as when a proxy or
                    # the engine dies. aiohttp then cannot finish the response.
                    if request.transport is not None:
                        request.transport.close()
                    raise _Dropped()
                elif fault == "error-mid":
                    param = mode.param if mode.status == 400 else None
                    await send(
                        vllm_error(
                            "fake engine failure mid-stream",
                            _STATUS_TYPES.get(mode.status, "APIError"),
                            mode.status,
                            param,
                        )
                    )
                    await raw(b"data: [DONE]\n\n")
                    return self._done(rec, resp)
                elif fault == "error-mid-flat":
                    await send(
                        {
                            "object": "error",
                            "message": "fake engine failure mid-stream (flat)",
                            "type": "InternalServerError",
                            "param": None,
                            "code": mode.status,
                        }
                    )
                    await raw(b"data: [DONE]\n\n")
                    return self._done(rec, resp)
                elif fault == "non-json":
                    await raw(b"data: {this is not json\n\n")
                elif fault == "eof-no-finish":
                    await resp.write_eof()  # a clean end of the body: no finish_reason, no [DONE]
                    return self._done(rec, resp)
                elif fault == "no-delta":
                    await send(chunk(None))
            if fault == "null-content":
                await send(chunk({"content": None}))
            pending.append(token_text(i))
            # vLLM's --stream-interval: the first token at once, then a chunk per `interval` tokens, and the rest
            if i == 0 or len(pending) >= interval or i == n - 1 or (fault is not None and i + 1 == at):
                await send(chunk({"content": "".join(pending)}))
                pending.clear()
            await pause()
        if fault == "no-finish":
            pass
        elif fault == "no-delta":
            await send(chunk(None, finish))
        else:
            await send(chunk({"content": ""}, finish))
        if include_usage or fault == "usage-only-final":
            await send(
                {
                    "id": f"chatcmpl-{rec.index}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": rec.model,
                    "choices": [],
                    "usage": self._usage(rec, n),
                }
            )
        if fault == "finish-no-done":
            await resp.write_eof()
            return self._done(rec, resp)
        await raw(b"data: [DONE]\n\n")
        return self._done(rec, resp)

    def _done(self, rec: RequestRecord, resp: web.StreamResponse) -> web.StreamResponse:
        rec.completed = True
        return resp


# ---------------------------------------------------------------- standalone


async def _serve(port: int, mode: str, model: str, adapter: str, max_model_len: int) -> None:
    server = FakeServer(port=port, model=model, adapter=adapter, max_model_len=max_model_len, default_mode=mode)
    await server.start()
    print(
        f"fake OpenAI server listening on {server.base_url} (model {model!r}, adapter {adapter!r}, mode {mode!r})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.fakes.openai_server", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)")
    p.add_argument("--mode", default="normal", help="default mode spec for the served names (default: normal)")
    p.add_argument("--model", default="fake-qwen", help="served base model name")
    p.add_argument("--adapter", default="fake-adapter", help="served adapter name")
    p.add_argument("--max-model-len", type=int, default=8192)
    args = p.parse_args(argv)
    try:
        Mode.parse(args.mode)
    except ValueError as exc:
        p.error(str(exc))
    asyncio.run(_serve(args.port, args.mode, args.model, args.adapter, args.max_model_len))


if __name__ == "__main__":
    main()

"""The engine's own door: an ASGI middleware every vLLM process we start loads (issue #18).

    python -m vllm.entrypoints.openai.api_server … --middleware backend.engine_plugins.gate.EngineGate
    env VLLM_API_KEY=<key> QWENCHAT_ENGINE_HOSTS=localhost,127.0.0.1,::1 QWENCHAT_ENGINE_PORT=8000

vLLM 0.32 checks its key only on paths that start with ``/v1``, ``/v2``, ``/inference`` or ``/cohere``: with
runtime LoRA loading on, ``POST /invocations`` answered a chat and ``POST /adapters`` registered any folder as an
adapter, with no key; ``/tokenize``, ``/metrics``, ``/version`` are open too, and vLLM has no Host check. vLLM adds
a ``--middleware`` class with ``app.add_middleware`` after its own (CORS, key, scaling), so this one is the
outermost: it sees every request before vLLM's middlewares and routes. What it lets through:

    refused (first match)                                   status  log kind (each logged once)
    any ``Origin`` header (``Origin: null`` too)            403     origin     no browser talks to the engine
    a Host that is not one the engine is reached by         403     host       DNS rebinding
    a key in the query string (a key-like name or the key)  401     query_key  URLs land in access logs
    no ``Authorization: Bearer <key>`` (except GET /health) 401     no_key
    a wrong key                                             401     wrong_key

Every path and method, HTTP and websocket (a refused websocket is closed before it is accepted: the server
answers the handshake with 403). ``GET /health`` alone needs no key: the supervisor's and vllm-router's health
checks call it. A refusal's body is fixed per status, in vLLM's error shape, and never echoes the request.

Host names the engine answers to: ``QWENCHAT_ENGINE_HOSTS`` (the launcher sets loopback and ``[network] engine_host``),
any IP address (a rebinding page's Host is always a name), and the machine's own host name when the engine
listens on every address (``[network] engine_host = "0.0.0.0"``, where remote UIs and routers reach it by name); with a
port, it must be ``QWENCHAT_ENGINE_PORT`` (vllm-router sends the worker URL's host and port, measured).

This module runs inside the engine's process: the standard library only (no starlette, nothing of ours).
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)
# vLLM leaves the root logger at ERROR (its own loggers are "vllm.*"): without a level of its own this logger's
# warnings would be dropped in the engine; they reach the engine log through the root's handlers or stderr.
logger.setLevel(logging.INFO)

#: The import path vLLM's ``--middleware`` takes.
MIDDLEWARE = f"{__name__}.EngineGate"
#: Comma-separated Host names the engine answers to (set by command.build_engine_command).
ENV_HOSTS = "QWENCHAT_ENGINE_HOSTS"
#: The port the engine listens on; a Host header's port must be this one.
ENV_PORT = "QWENCHAT_ENGINE_PORT"
#: The key (vLLM reads the same variable).
ENV_KEY = "VLLM_API_KEY"
#: Open without a key: (method, path).
OPEN_ROUTES = frozenset({("GET", "/health")})
#: Query parameter names that carry a key in other APIs; refused whatever their value.
KEY_PARAMS = frozenset({"api_key", "api-key", "apikey", "key", "token", "access_token", "authorization", "bearer"})
#: Addresses meaning "every interface": the machine's own name is then a way to reach the engine too.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Refusal(enum.Enum):
    """Why a request was refused: (status, what the log says once)."""

    ORIGIN = (403, "an Origin header (a browser; nothing in a browser may call the engine)")
    HOST = (403, "a Host header that is not a name or address of the engine")
    QUERY_KEY = (401, "a key in the query string (send it as Authorization: Bearer <key>)")
    NO_KEY = (401, "no engine key (Authorization: Bearer <key>)")
    WRONG_KEY = (401, "a wrong engine key")

    @property
    def status(self) -> int:
        return int(self.value[0])


#: The whole body of a refusal, by status: vLLM's error shape, no part of the request in it.
BODIES = {
    401: json.dumps(
        {
            "error": {
                "message": "The engine key is missing or wrong: send it as 'Authorization: Bearer <key>'.",
                "type": "AuthenticationError",
                "param": None,
                "code": 401,
            }
        }
    ).encode(),
    403: json.dumps(
        {
            "error": {
                "message": "Forbidden: the engine answers no browser (no Origin header) and only to its own names "
                "and IP addresses in the Host header.",
                "type": "PermissionDeniedError",
                "param": None,
                "code": 403,
            }
        }
    ).encode(),
}


def split_host(value: str) -> tuple[str, int | None] | None:
    """``"Name:8000"`` → ("name", 8000), ``"[::1]"`` → ("::1", None); None when it is not a host[:port]."""
    try:
        parts = urllib.parse.urlsplit("//" + value)
        name, port = parts.hostname, parts.port
    except ValueError:  # a port out of range or not a number, a broken [IPv6]
        return None
    if not name or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return name.rstrip("."), port


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def engine_names(listed: Iterable[str]) -> frozenset[str]:
    """The Host names to answer to: ``listed`` (lower case), plus this machine's name when one of them is a
    wildcard address (the engine then listens on every interface)."""
    names = {n.strip().strip("[]").lower() for n in listed}
    if names & WILDCARD_HOSTS:
        machine = socket.gethostname().lower()
        names |= {machine, machine.split(".")[0]}
    return frozenset(n for n in names if n and n not in WILDCARD_HOSTS)


def host_allowed(value: str, names: frozenset[str], port: int | None) -> bool:
    """Whether a Host header names this engine: a listed name or any IP address, and the engine's port if any."""
    parsed = split_host(value)
    if parsed is None:
        return False
    name, given_port = parsed
    if given_port is not None and port is not None and given_port != port:
        return False
    return name in names or is_ip(name)


class EngineGate:
    """ASGI middleware: the key on every request but ``GET /health``; no browser; only the engine's Host names.

    vLLM constructs it with the app alone (``app.add_middleware(EngineGate)``); the key, names and port come
    from the environment (keyword arguments for tests). Without a key it refuses to start."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        key: str | None = None,
        hosts: Iterable[str] | None = None,
        port: int | None = None,
    ) -> None:
        self.app = app
        key = os.environ.get(ENV_KEY, "") if key is None else key
        if not key:
            raise ValueError(f"{ENV_KEY} is empty: the engine gate ({MIDDLEWARE}) needs the engine key")
        self._key = key.encode()
        if hosts is None:
            hosts = os.environ.get(ENV_HOSTS, ",".join(LOOPBACK_NAMES)).split(",")
        if port is None and os.environ.get(ENV_PORT, "").isdigit():
            port = int(os.environ[ENV_PORT])
        self.names = engine_names(hosts)
        self.port = port
        self._logged: set[Refusal] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        self._log_once(refusal, scope)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        body = BODIES[refusal.status]
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def check(self, scope: Scope) -> Refusal | None:
        """The first reason to refuse this request (the table in the module docstring), or None."""
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(bytes(name).lower(), []).append(bytes(value))
        if b"origin" in headers:
            return Refusal.ORIGIN
        hosts = headers.get(b"host", [])
        if len(hosts) != 1 or not host_allowed(hosts[0].decode("latin-1"), self.names, self.port):
            return Refusal.HOST
        if self._key_in_query(scope.get("query_string", b"")):
            return Refusal.QUERY_KEY
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if scope["type"] == "http" and (scope["method"], path) in OPEN_ROUTES:
            return None
        auth = headers.get(b"authorization", [])
        if not auth:
            return Refusal.NO_KEY
        scheme, _, token = auth[0].partition(b" ")
        if len(auth) != 1 or scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
            return Refusal.WRONG_KEY
        return None

    def _key_in_query(self, query: bytes) -> bool:
        pairs = urllib.parse.parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        return any(
            name.lower() in KEY_PARAMS or hmac.compare_digest(value.encode("utf-8", "replace"), self._key)
            for name, value in pairs
        )

    def _log_once(self, refusal: Refusal, scope: Scope) -> None:
        """The first refusal of each kind, with its method, path and client; never a header's value."""
        if refusal in self._logged:
            return
        self._logged.add(refusal)
        client = scope.get("client") or ("?", 0)
        names = (
            f" (it answers to {', '.join(sorted(self.names))} and any IP address)" if refusal is Refusal.HOST else ""
        )
        logger.warning(
            "engine gate: refused %s %r from %s: %s%s (%d); later refusals of this kind are not logged",
            scope.get("method", "WEBSOCKET"),
            str(scope["path"])[:80],
            client[0],
            refusal.value[1],
            names,
            refusal.status,
        )

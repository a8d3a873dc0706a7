"""Request bodies bounded before any route runs: a size per route, 413 before the rest is read.

    install(http_app, socket_message=MAX_SOCKET_MESSAGE)   # ui/server.py, inside the security middleware
    BodyLimitMiddleware(asgi_app, limits=BodyLimits(...))
    BodyLimits().limit_for("/project/thread") -> 1 MiB

FastAPI reads a route's whole body (JSON, or a form spooled to disk and then into memory) before its dependencies
run, the login check among them: without a bound, a 64 MB JSON body sent without a cookie was read whole and only
then answered 401/422. This middleware sits in front of every route and the socket.io mount:

- a ``Content-Length`` above the route's limit is answered 413 at once, nothing read;
- a body without one (``Transfer-Encoding: chunked``) is counted as the route reads it; the chunk that crosses the
  limit is not handed on: the route gets an error instead (``BodyTooLarge``), and the client 413 (uvicorn then
  closes the connection rather than read the rest);
- the limits: socket.io's polling POSTs carry whole chat messages (``MAX_SOCKET_MESSAGE`` of engine.io, plus room
  for framing); ``POST /login`` a form (64 KiB); ``POST /project/file`` one attached file (``[uploads] max_mb`` plus
  the form's framing; ``DEFAULT_LIMIT`` with uploads off) and every other route ``DEFAULT_LIMIT`` (1 MiB: Chainlit's
  JSON routes carry ids, a thread name, a feedback comment).
- with login on, ``POST /project/file`` without any login token (Chainlit's ``access_token`` cookie, or an
  ``Authorization`` header) is answered 401 before its body is read: the one route whose limit is a whole file
  would otherwise take ``[uploads] max_mb`` from anyone before Chainlit's login check (a token that is there but
  wrong is still read up to that limit, then refused by Chainlit).

A plain ASGI class (Starlette's BaseHTTPMiddleware buffers and does not see websockets); no Chainlit import.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 1024 * 1024  # bytes of any route's body not named below
LOGIN_LIMIT = 64 * 1024  # POST /login: a user name and a password (security.MAX_LOGIN_BODY reads the same)
SOCKET_FRAMING = 1024 * 1024  # over engine.io's own message cap: packet framing, a few packets in one poll
SOCKET_PATH = "/ws/socket.io"
UPLOAD_FRAMING = 64 * 1024  # over one file's own bytes: the multipart form's boundaries and headers
AUTH_COOKIE = (
    "access_token"  # Chainlit's login cookie (CHAINLIT_AUTH_COOKIE_NAME's default; long ones are split _0, _1)
)


class BodyTooLarge(Exception):
    """A request body grew past its route's limit while it was being read."""


@dataclass(frozen=True)
class BodyLimits:
    """Bytes of body allowed per route: ``socket`` for socket.io's polling POSTs, ``login`` for POST /login,
    ``upload`` for POST /project/file, ``default`` for everything else."""

    socket: int = 16 * 1024 * 1024 + SOCKET_FRAMING
    login: int = LOGIN_LIMIT
    upload: int = DEFAULT_LIMIT
    default: int = DEFAULT_LIMIT
    upload_needs_login: bool = False  # [login] enable: an upload without any token is refused unread

    def limit_for(self, path: str) -> int:
        path = path.rstrip("/") or "/"
        if path.endswith(SOCKET_PATH) or f"{SOCKET_PATH}/" in path:
            return self.socket
        if path.endswith("/login") and not path.endswith("/auth/login"):
            return self.login
        if path.endswith("/project/file"):
            return self.upload
        return self.default


def carries_login(scope: dict[str, Any]) -> bool:
    """Whether the request carries a login token at all (Chainlit checks it: only its presence is looked at here)."""
    for key, value in scope.get("headers") or []:
        name = bytes(key).lower()
        if name == b"authorization":
            return True
        if name == b"cookie" and any(
            part.strip().startswith(AUTH_COOKIE) for part in bytes(value).decode("latin-1").split(";")
        ):
            return True
    return False


def declared_length(scope: dict[str, Any]) -> int | None:
    """The request's Content-Length (None without one; -1 when it is no number: refused like a too-large one)."""
    for key, value in scope.get("headers") or []:
        if bytes(key).lower() == b"content-length":
            text = bytes(value).decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None


class BodyLimitMiddleware:
    """ASGI: refuses a request body above its route's limit with 413, declared or streamed (see the module doc)."""

    def __init__(self, app: Any, *, limits: BodyLimits | None = None) -> None:
        self.app = app
        self.limits = limits or BodyLimits()
        self.refused = 0  # requests answered 413 (the log names only the first few)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path") or "")
        limit = self.limits.limit_for(path)
        if self.limits.upload_needs_login and limit == self.limits.upload and not carries_login(scope):
            self._note(scope, limit, "an upload without a login", status=401)
            await _refused(send, 401, "log in first: uploads need a login\n")
            return
        declared = declared_length(scope)
        if declared is not None and not 0 <= declared <= limit:
            self._note(scope, limit, f"Content-Length {declared}")
            await _too_large(send, limit)
            return
        state = {"read": 0, "over": False, "started": False}

        async def counted() -> dict[str, Any]:
            if state["over"]:
                return {"type": "http.disconnect"}
            message = dict(await receive())
            if message.get("type") == "http.request":
                state["read"] += len(message.get("body") or b"")
                if state["read"] > limit:
                    state["over"] = True
                    raise BodyTooLarge(f"request body of {path} past {limit} bytes")
            return message

        async def watched(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not state["over"]:
                raise
        if state["over"] and not state["started"]:
            self._note(scope, limit, f"over {limit} bytes streamed")
            await _too_large(send, limit)

    def _note(self, scope: dict[str, Any], limit: int, what: str, status: int = 413) -> None:
        self.refused += 1
        if self.refused <= 100 or self.refused % 1000 == 0:
            logger.warning(
                "refused a %s %s body (%s; this route takes at most %d bytes): answered %d before reading it "
                "(%d refused so far)",
                scope.get("method", "?"),
                repr(str(scope.get("path") or ""))[:200],
                what,
                limit,
                status,
                self.refused,
            )


async def _too_large(send: Any, limit: int) -> None:
    await _refused(send, 413, f"request body too large: this route takes at most {limit} bytes\n")


async def _refused(send: Any, status: int, text: str) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(http_app: Any, *, socket_message: int, upload: int | None, login: bool = False) -> None:
    """Put the limit in front of Chainlit's routes and its socket.io mount (idempotent); ``socket_message``:
    engine.io's ``max_http_buffer_size``; ``upload``: one attached file's bytes ([uploads] max_mb; None: uploads
    off, the default limit); ``login``: [login] enable (an upload without a token is refused unread)."""
    if any(m.cls is BodyLimitMiddleware for m in http_app.user_middleware):
        return
    limits = BodyLimits(
        socket=socket_message + SOCKET_FRAMING,
        upload=DEFAULT_LIMIT if upload is None else upload + UPLOAD_FRAMING,
        upload_needs_login=login,
    )
    http_app.add_middleware(BodyLimitMiddleware, limits=limits)

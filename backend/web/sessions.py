"""Login tokens that end: revoked on logout, valid ``[login] session_hours``, and void when a password changes.

    install(http_app)                  # ui/server.py: before Chainlit's routes and its socket
    REVOKED.revoke(token) / REVOKED.is_revoked(token)

Chainlit's login token is a signed JWT in the ``access_token`` cookie (split into ``access_token_0``, ``_1`` … when
long) or an ``Authorization: Bearer`` header. Chainlit's ``POST /logout`` only clears the cookie: a copy of the token
stayed valid until it expired. Here:

- ``POST /logout`` records the token it carries as revoked (its SHA-256, until the token's own expiry);
- a request or socket that carries a revoked token has the token taken out of its headers before Chainlit sees it:
  to Chainlit it is not logged in (401, the login page);
- how long a token lasts is ``[login] session_hours`` (chainlit_settings sets Chainlit's ``user_session_timeout``);
- a changed password (or account list) changes the secret tokens are signed with (``login.session_secret``): every
  earlier token stops verifying.

The revoked set lives in this process (a restart forgets it; the tokens it held still expire within
``session_hours``); at most ``MAX_REVOKED`` entries, the soonest to expire dropped first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from http.cookies import CookieError, SimpleCookie
from typing import Any

logger = logging.getLogger(__name__)

MAX_REVOKED = 100_000
DEFAULT_LIFETIME_S = 24 * 3600.0  # for a token whose expiry cannot be read


def cookie_name() -> str:
    return os.environ.get("CHAINLIT_AUTH_COOKIE_NAME", "access_token")


def _expiry(token: str) -> float:
    import jwt

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        return float(claims.get("exp") or time.time() + DEFAULT_LIFETIME_S)
    except (jwt.PyJWTError, TypeError, ValueError):  # not a JWT at all: kept for the default lifetime
        return time.time() + DEFAULT_LIFETIME_S


class RevokedTokens:
    """SHA-256 of revoked tokens → their expiry; an expired entry is dropped (the token is refused anyway)."""

    def __init__(self, limit: int = MAX_REVOKED) -> None:
        self.limit = limit
        self._until: dict[str, float] = {}

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()

    def revoke(self, token: str) -> None:
        now = time.time()
        self._until = (
            {k: v for k, v in self._until.items() if v > now} if len(self._until) >= self.limit else self._until
        )
        while len(self._until) >= self.limit:
            del self._until[min(self._until, key=self._until.__getitem__)]
        self._until[self._key(token)] = _expiry(token)

    def is_revoked(self, token: str) -> bool:
        until = self._until.get(self._key(token))
        return until is not None and until > time.time()

    def __len__(self) -> int:
        return len(self._until)


REVOKED = RevokedTokens()


def _cookies(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for key, value in headers:
        if key.lower() == b"cookie":
            try:
                jar.load(bytes(value).decode("latin-1"))
            except CookieError:
                continue
    return {name: morsel.value for name, morsel in jar.items()}


def tokens_of(scope: dict[str, Any]) -> list[str]:
    """The login tokens a request carries: the cookie (whole or in chunks) and a bearer header."""
    headers = list(scope.get("headers") or [])
    cookies, name = _cookies(headers), cookie_name()
    found = []
    whole = cookies.get(name) or "".join(cookies[f"{name}_{i}"] for i in range(64) if f"{name}_{i}" in cookies)
    if whole:
        found.append(whole)
    for key, value in headers:
        if key.lower() == b"authorization":
            scheme, _, token = bytes(value).decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                found.append(token.strip())
    return found


def _without_tokens(scope: dict[str, Any]) -> dict[str, Any]:
    """The scope with its login cookie(s) and bearer header taken out (other cookies stay)."""
    name = cookie_name()
    kept: list[tuple[bytes, bytes]] = []
    for key, value in scope.get("headers") or []:
        lower = key.lower()
        if lower == b"authorization":
            continue
        if lower == b"cookie":
            parts = [p for p in bytes(value).decode("latin-1").split(";") if p.strip()]
            rest = [p for p in parts if not p.strip().split("=", 1)[0].startswith(name)]
            if rest:
                kept.append((key, ";".join(rest).strip().encode("latin-1")))
            continue
        kept.append((key, value))
    return {**scope, "headers": kept}


class SessionRevocationMiddleware:
    """ASGI: records the token of ``POST /logout`` as revoked; takes a revoked token out of every request."""

    def __init__(self, app: Any, *, revoked: RevokedTokens | None = None, logout_path: str = "/logout") -> None:
        self.app, self.revoked, self.logout_path = app, revoked or REVOKED, logout_path

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        tokens = tokens_of(scope)
        if scope.get("type") == "http" and scope.get("method") == "POST" and scope.get("path") == self.logout_path:
            for token in tokens:
                self.revoked.revoke(token)
            if tokens:
                logger.info("logout: the session's token is revoked (%d revoked tokens kept)", len(self.revoked))
        elif any(self.revoked.is_revoked(token) for token in tokens):
            scope = _without_tokens(scope)
        await self.app(scope, receive, send)


def install(http_app: Any) -> None:
    """In front of Chainlit's routes and its socket.io mount (idempotent)."""
    if not any(m.cls is SessionRevocationMiddleware for m in http_app.user_middleware):
        http_app.add_middleware(SessionRevocationMiddleware)

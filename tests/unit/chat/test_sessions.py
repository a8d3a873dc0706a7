"""Login tokens that end: the token of POST /logout is revoked, and a later request carrying it is not logged in."""

from __future__ import annotations

import secrets
import time
from typing import Any

import jwt
import pytest

from backend.web.sessions import RevokedTokens, SessionRevocationMiddleware, tokens_of


def token(seconds: float = 3600) -> str:
    claims = {"identifier": "alice", "exp": int(time.time() + seconds), "n": secrets.token_hex(8)}  # each its own
    return jwt.encode(claims, "k" * 32, algorithm="HS256")


class Seen:
    """An app that records the headers it was given."""

    def __init__(self) -> None:
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.headers.append(dict(scope["headers"]))


async def call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> None:
    await app({"type": "http", "method": method, "path": path, "headers": headers}, None, None)


@pytest.mark.asyncio
async def test_logout_then_the_old_token_is_not_logged_in_by_cookie_nor_by_header():
    inner, revoked = Seen(), RevokedTokens()
    app = SessionRevocationMiddleware(inner, revoked=revoked)
    alice, bob = token(), token()
    cookie = (b"cookie", f"theme=dark; access_token={alice}".encode())
    await call(app, "GET", "/user", [cookie])
    assert inner.headers[-1][b"cookie"] == cookie[1]  # before the logout: passed on as it is
    await call(app, "POST", "/logout", [cookie])
    await call(app, "GET", "/user", [cookie])
    assert inner.headers[-1][b"cookie"] == b"theme=dark"  # the login cookie taken out, the others kept
    await call(app, "GET", "/user", [(b"authorization", f"Bearer {alice}".encode())])
    assert b"authorization" not in inner.headers[-1]
    await call(app, "GET", "/user", [(b"cookie", f"access_token={bob}".encode())])
    assert inner.headers[-1][b"cookie"] == f"access_token={bob}".encode()  # another session: untouched


def test_a_chunked_cookie_is_read_whole():
    long = token() + "x" * 4000
    cookie = f"access_token_0={long[:3000]}; access_token_1={long[3000:]}".encode()
    assert tokens_of({"headers": [(b"cookie", cookie)]}) == [long]


def test_the_revoked_set_is_bounded_and_forgets_expired_tokens():
    revoked = RevokedTokens(limit=3)
    old = [token(-10) for _ in range(2)]  # expired already: refused by their signature's expiry anyway
    for t in old:
        revoked.revoke(t)
    fresh = [token(3600 + i) for i in range(3)]
    for t in fresh:
        revoked.revoke(t)
    assert len(revoked) <= 3 and all(revoked.is_revoked(t) for t in fresh[-2:])
    assert not any(revoked.is_revoked(t) for t in old)

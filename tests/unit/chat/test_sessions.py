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


# ---------------------------------------------------------------- kept in a file: a restart does not forget them


@pytest.mark.asyncio
async def test_a_token_revoked_before_a_restart_is_still_refused_after_it(tmp_path):
    path = tmp_path / "logs" / "revoked-tokens"
    inner = Seen()
    alice, bob = token(), token()
    before = SessionRevocationMiddleware(inner, revoked=RevokedTokens(path=path))
    await call(before, "POST", "/logout", [(b"cookie", f"access_token={alice}".encode())])
    after = SessionRevocationMiddleware(inner, revoked=RevokedTokens(path=path))  # the UI process started again
    await call(after, "GET", "/user", [(b"cookie", f"access_token={alice}".encode())])
    assert b"cookie" not in inner.headers[-1], "the token revoked before the restart was let in after it"
    await call(after, "GET", "/user", [(b"cookie", f"access_token={bob}".encode())])
    assert inner.headers[-1][b"cookie"] == f"access_token={bob}".encode()
    assert path.stat().st_mode & 0o777 == 0o600
    assert alice not in path.read_text() and bob not in path.read_text()  # hashes only


def test_a_revocation_by_another_ui_process_on_the_same_folder_is_seen_at_the_next_check(tmp_path):
    path = tmp_path / "revoked-tokens"
    one, two = RevokedTokens(path=path), RevokedTokens(path=path)
    alice = token()
    assert not two.is_revoked(alice)
    one.revoke(alice)
    assert two.is_revoked(alice)


def test_the_file_keeps_only_live_entries_and_survives_lines_it_cannot_read(tmp_path):
    path = tmp_path / "revoked-tokens"
    kept = RevokedTokens(path=path)
    old, fresh = token(-10), token()
    kept.revoke(old)
    kept.revoke(fresh)
    with path.open("a") as f:
        f.write("not a line of ours\n" + "ab" * 32 + " soon\n" + "cd" * 32)  # the last one cut mid-write
    again = RevokedTokens(path=path)  # read back at start: expired and unreadable lines dropped from the file
    assert again.is_revoked(fresh) and not again.is_revoked(old)
    assert len(path.read_text().splitlines()) == 1


def test_the_file_is_rewritten_once_it_holds_twice_its_live_entries(tmp_path):
    path = tmp_path / "revoked-tokens"
    kept = RevokedTokens(path=path)
    for _ in range(2100):
        kept.revoke(token(-10))  # each one expired at once: nothing live to keep
    assert len(path.read_text().splitlines()) <= 2001
    kept.revoke(survivor := token())
    assert RevokedTokens(path=path).is_revoked(survivor)


def test_a_folder_that_cannot_be_written_keeps_the_revocations_in_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    kept = RevokedTokens(path=blocker / "revoked-tokens")  # its folder is a file
    alice = token()
    kept.revoke(alice)
    assert kept.is_revoked(alice) and kept.path is None

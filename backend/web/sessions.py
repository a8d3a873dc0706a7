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

The revoked set is kept in a file beside the login secret (``revoked-tokens`` in the history's folder, owner-only;
``install(http_app, folder)``), one line per token, ``<sha256> <expiry>``: a UI restart reads it back, so a token
revoked before the restart stays refused. Each check first reads what other UI processes on the same folder appended
since (one ``stat`` per request that carries a token). Bounded: at most ``MAX_REVOKED`` entries, the soonest to expire
dropped first; expired lines are dropped whenever the file is rewritten (at start, and when it holds twice as many
lines as live entries). Without a folder (tests, login off) the set lives in this process only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_REVOKED = 100_000
REVOKED_FILE = "revoked-tokens"  # beside login.SECRET_FILE
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
    """SHA-256 of revoked tokens → their expiry; an expired entry is dropped (the token is refused anyway). With a
    ``path``, every revocation is appended there and read back at start and by the other processes using it."""

    def __init__(self, limit: int = MAX_REVOKED, path: Path | None = None) -> None:
        self.limit = limit
        self._until: dict[str, float] = {}
        self.path: Path | None = None
        self._read_at = (0, 0)  # (inode, offset) of the file read so far
        self._lines = 0  # lines in the file since it was last rewritten
        if path is not None:
            self.keep_in(path)

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()

    def keep_in(self, path: Path) -> None:
        """Keep the revocations in ``path`` from now on: what it holds is read (expired lines dropped from it)."""
        if path != self.path:
            self._until, self._read_at, self.path = {}, (0, 0), path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()
        except OSError as exc:
            logger.warning("sessions: revoked tokens not kept in %s (%s): a restart forgets them", path, exc)
            self.path = None

    def revoke(self, token: str) -> None:
        key, until = self._key(token), _expiry(token)
        self._add(key, until)
        if self.path is None:
            return
        try:
            with self._locked() as fd:
                os.write(fd, f"{key} {until:.0f}\n".encode())
            self._lines += 1
            if self._lines > 2 * max(self._live(), 1000):
                self._rewrite()
        except OSError as exc:
            logger.warning("sessions: a revoked token not written to %s (%s): a restart forgets it", self.path, exc)

    def is_revoked(self, token: str) -> bool:
        self._read_new()
        until = self._until.get(self._key(token))
        return until is not None and until > time.time()

    def __len__(self) -> int:
        return len(self._until)

    def _live(self) -> int:
        now = time.time()
        return sum(1 for v in self._until.values() if v > now)

    def _add(self, key: str, until: float) -> None:
        if key not in self._until and len(self._until) >= self.limit:
            now = time.time()
            self._until = {k: v for k, v in self._until.items() if v > now}
            while len(self._until) >= self.limit:
                del self._until[min(self._until, key=self._until.__getitem__)]
        self._until[key] = max(until, self._until.get(key, 0.0))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """The file open for appending under its lock: the one at ``path`` now (not one a rewrite replaced)."""
        assert self.path is not None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    yield fd
                    return
            finally:
                os.close(fd)  # also releases the lock

    def _read_new(self) -> None:
        """Add what was appended to the file since it was last read (by this process or another)."""
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            inode, offset = self._read_at
            if (st.st_ino, st.st_size) == (inode, offset):
                return
            offset = offset if st.st_ino == inode and st.st_size >= offset else 0
            with self.path.open("rb") as f:
                f.seek(offset)
                data = f.read(st.st_size - offset)
        except OSError:
            return
        whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self._read_at = (st.st_ino, offset + len(whole))
        now = time.time()
        for line in whole.decode("ascii", "replace").splitlines():
            key, _, until = line.partition(" ")
            with contextlib.suppress(ValueError):
                if len(key) == 64 and float(until) > now:
                    self._add(key, float(until))

    def _rewrite(self) -> None:
        """The file with only the live entries (read first), replaced whole under its lock."""
        assert self.path is not None
        with self._locked():  # no append between the read and the replace
            self._read_new()
            now = time.time()
            live = {k: v for k, v in self._until.items() if v > now}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(out, "w") as f:
                f.writelines(f"{k} {v:.0f}\n" for k, v in live.items())
            os.replace(tmp, self.path)
            st = os.stat(self.path)
            self._until, self._read_at, self._lines = live, (st.st_ino, st.st_size), len(live)


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


def install(http_app: Any, folder: Path | None = None) -> None:
    """In front of Chainlit's routes and its socket.io mount (idempotent); the revocations kept in ``folder``."""
    if folder is not None:
        REVOKED.keep_in(folder / REVOKED_FILE)
    if not any(m.cls is SessionRevocationMiddleware for m in http_app.user_middleware):
        http_app.add_middleware(SessionRevocationMiddleware)

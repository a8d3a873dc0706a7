"""Password login for ``[login].enable``: the login secret Chainlit signs its tokens with, and the password check."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy import Column, MetaData, Table, Text, text
from sqlalchemy.engine import Connection

from backend.passwords import ALGORITHM, ITERATIONS, verify_password
from backend.settings import Settings
from backend.storage.database import Store, ensure_tables

logger = logging.getLogger(__name__)

SECRET_FILE = "chainlit-auth-secret"


#: Session secrets this process derived (session_secret) and put in CHAINLIT_AUTH_SECRET: never a base.
_DERIVED: set[str] = set()


def auth_secret(folder: Path, env: Mapping[str, str] = os.environ) -> str:
    """CHAINLIT_AUTH_SECRET, or one generated once and kept in ``folder`` so logins survive restarts."""
    if env.get("CHAINLIT_AUTH_SECRET") and env["CHAINLIT_AUTH_SECRET"] not in _DERIVED:
        return env["CHAINLIT_AUTH_SECRET"]
    path = folder / SECRET_FILE
    try:
        secret = path.read_text().strip()
        if secret:
            os.chmod(path, 0o600)
            return secret
    except FileNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


SECRETS = MetaData()
Table("qwenchat_secrets", SECRETS, Column("name", Text(), primary_key=True), Column("value", Text(), nullable=False))


def shared_auth_secret(st: Store, env: Mapping[str, str] = os.environ) -> str:
    """CHAINLIT_AUTH_SECRET, or one kept in the database (PostgreSQL): the first UI process to start writes
    it (insert if absent), every other one reads the same, so a login on one UI process is valid on all."""
    if env.get("CHAINLIT_AUTH_SECRET") and env["CHAINLIT_AUTH_SECRET"] not in _DERIVED:
        return env["CHAINLIT_AUTH_SECRET"]
    ensure_tables(st, SECRETS, "secrets", 1)

    def read_or_create(conn: Connection) -> str:
        conn.execute(
            text(
                "INSERT INTO qwenchat_secrets (name, value) VALUES ('chainlit_auth', :v) ON CONFLICT (name) DO NOTHING"
            ),
            {"v": secrets.token_urlsafe(48)},
        )
        return str(conn.execute(text("SELECT value FROM qwenchat_secrets WHERE name = 'chainlit_auth'")).scalar_one())

    return st.run(read_or_create)


def session_secret(base: str, username: str, password: str) -> str:
    """What Chainlit signs its login tokens with: the stored secret bound to the user name and password.

    Changing the password (or the name) changes it, so every token issued before stops verifying: the
    sessions signed in with the old password are over. Only a hash of the password goes in.
    """
    pw_hash = hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest()
    message = b"qwenchat-session\0" + username.encode("utf-8", "surrogatepass") + b"\0" + pw_hash
    derived = hmac.new(base.encode(), message, hashlib.sha256).hexdigest()
    _DERIVED.add(derived)
    return derived


def check_password(settings: Settings, username: str, password: str) -> bool:
    """The login check: ``[login].username`` / ``[login].password`` (or QWENCHAT_LOGIN_PASSWORD), then the hashed
    ``[login].users`` accounts. Always exactly one PBKDF2, whoever the name is: the admin name (its password is
    compared in constant time, the hash runs against a dummy), a ``[login].users`` name (its own hash) and an unknown
    name (the dummy) take the same time, so the answer's timing does not say which names exist."""
    login = settings.login
    if not login.enable or not login.password:
        return False
    typed = password.encode("utf-8", "surrogatepass")
    is_admin = hmac.compare_digest(username.encode("utf-8", "surrogatepass"), login.username.encode())
    stored = None if is_admin else login.users.get(username)
    hash_ok = verify_password(password, stored or DUMMY_HASH)
    if is_admin:
        return hmac.compare_digest(typed, login.password.encode("utf-8", "surrogatepass"))
    return hash_ok and stored is not None


#: What a name without a hash is checked against: a well-formed hash of nothing anyone can type (a random salt and
#: digest), with the iterations of every hash ``hash-password`` makes. Nothing to compute at start.
DUMMY_HASH = f"{ALGORITHM}${ITERATIONS}${secrets.token_hex(16)}${secrets.token_hex(32)}"

#: PBKDF2 (~0.25 s each) runs here: not on the event loop, and not in the loop's default pool, where token counting
#: runs (``asyncio.to_thread`` in counters.py), so a burst of sign-ins cannot hold back the budget of open chats.
LOGIN_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="qwenchat-login")


async def verify_login(settings: Settings, username: str, password: str) -> bool:
    """``check_password`` on the login pool (backend/ui/login.py's password callback)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(LOGIN_POOL, check_password, settings, username, password)


def accounts_fingerprint(settings: Settings) -> str:
    """Every account's name and password hash, for ``session_secret``: adding, removing or changing a
    ``[login].users`` account signs everyone out, as changing ``[login].password`` does."""
    return "".join(f"\0{name}\0{stored}" for name, stored in sorted(settings.login.users.items()))

"""Password login for ``[ui].auth``: the login secret Chainlit signs its tokens with, and the password check."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from ..settings import Settings

logger = logging.getLogger(__name__)

SECRET_FILE = "chainlit-auth-secret"


def auth_secret(folder: Path, env: Mapping[str, str] = os.environ) -> str:
    """CHAINLIT_AUTH_SECRET, or one generated once and kept in ``folder`` so logins survive restarts."""
    if env.get("CHAINLIT_AUTH_SECRET"):
        return env["CHAINLIT_AUTH_SECRET"]
    path = folder / SECRET_FILE
    try:
        secret = path.read_text().strip()
        if secret:
            return secret
    except FileNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def check_password(settings: Settings, username: str, password: str) -> bool:
    """Constant-time check against ``[ui].username`` / ``[ui].password`` (or QWENCHAT_UI_PASSWORD)."""
    ui = settings.ui
    if not ui.auth or not ui.password:
        return False
    user_ok = hmac.compare_digest(username.encode("utf-8", "surrogatepass"), ui.username.encode())
    pass_ok = hmac.compare_digest(password.encode("utf-8", "surrogatepass"), ui.password.encode())
    return user_ok and pass_ok

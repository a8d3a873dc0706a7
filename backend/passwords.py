"""Password hashes for the extra login accounts (``[login] users``): PBKDF2-SHA256 from the standard library.

    hash_password("s3cret")            # "pbkdf2_sha256$600000$<salt hex>$<hash hex>" (python -m backend hash-password)
    verify_password("s3cret", stored)  # constant-time; False for a malformed hash
    is_password_hash(value)            # the format check settings.py runs at start

Only hex in the stored form (no '=' or ','), so a hash also fits ``QWENCHAT_LOGIN_USERS="alice=pbkdf2_sha256$..."``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

ALGORITHM = "pbkdf2_sha256"
ITERATIONS = 600_000  # OWASP's 2023 figure for PBKDF2-HMAC-SHA256
MIN_ITERATIONS = 100_000
MIN_PASSWORD_LENGTH = 8  # characters: hash-password refuses a shorter one, and the start a shorter [login] password
_FORMAT = re.compile(r"pbkdf2_sha256\$(\d{1,9})\$([0-9a-f]{16,128})\$([0-9a-f]{64})")


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogatepass"), salt, iterations)
    return f"{ALGORITHM}${iterations}${salt.hex()}${digest.hex()}"


def is_password_hash(value: str) -> bool:
    match = _FORMAT.fullmatch(value)
    return match is not None and int(match.group(1)) >= MIN_ITERATIONS


def verify_password(password: str, stored: str) -> bool:
    match = _FORMAT.fullmatch(stored)
    if match is None or not is_password_hash(stored):
        return False
    iterations, salt, expected = int(match.group(1)), bytes.fromhex(match.group(2)), match.group(3)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogatepass"), salt, iterations)
    return hmac.compare_digest(digest.hex(), expected)

"""Soak and chaos tests: many sessions through Chainlit's socket protocol for a bounded time.

CI runs the short versions; ``QWENCHAT_SOAK=long`` runs the long ones (more sessions, turns, kills).
Every load targets 127.0.0.1 only and every loop is bounded in count and time.
"""

from __future__ import annotations

import os

import pytest

LEVELS = ("short", "long")


@pytest.fixture(scope="session")
def soak_level() -> str:
    level = os.environ.get("QWENCHAT_SOAK", "short")
    if level not in LEVELS:
        pytest.fail(f"QWENCHAT_SOAK={level!r}: use 'short' (the default, CI) or 'long'")
    return level

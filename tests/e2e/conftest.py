"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e


@pytest.fixture(scope="module")
def browser():
    """One headless Debian Chromium per test module (its pages and contexts are the tests' own)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=e2e.chromium_path(), args=e2e.CHROMIUM_ARGS, headless=True)
        yield b
        b.close()

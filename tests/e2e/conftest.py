"""Fixtures shared by the end-to-end tests (``browser``, ``fake_openai`` and ``external_app`` are in tests/conftest.py).

Shared by kind (tests/support/shared.py): each starts at its first user and stops after the last module that uses
it, and the modules that use one run one after another.
"""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e
from tests.support.shared import SHARED

EMBEDDED_PRODUCT, LOGIN_APP = SHARED.kind("embedded_product"), SHARED.kind("login_app")

#: The product as start.sh launches it on the embedded model and its demo adapter, for test_chat and test_compare:
#: greedy answers, and a small token budget (1,200 - 150 reply) so a few long messages push early turns out.
EMBEDDED_ENV = {
    "QWENCHAT_MODEL_TEMPERATURE": "0",
    "QWENCHAT_MODEL_MAX_MODEL_LEN": "1200",
    "QWENCHAT_BUDGET_REPLY_RESERVE": "150",
}


@pytest.fixture(scope="module")
def embedded_product(tmp_path_factory) -> e2e.LiveApp:
    """`python -m backend serve` on vLLM-CPU with the embedded model and the demo adapter (EMBEDDED_ENV), ready;
    shared by the modules that chat with it (each in its own browser context). A test that kills its engine
    launches its own."""
    return SHARED.get(
        EMBEDDED_PRODUCT, lambda: e2e.launch(tmp_path_factory.mktemp("e2e-embedded"), EMBEDDED_ENV), e2e.stop
    )


@pytest.fixture(scope="module")
def login_app(fake_openai, tmp_path_factory) -> e2e.LiveApp:
    """`python -m backend serve` in external mode on the shared fake server with login on, a second account and
    branding (e2e.login_app_env: the owner, the viewer, a starter, a logo); its UI's language the browser's. For the
    modules whose tests each log in as these accounts and need nothing else of it (test_share,
    test_fidelity_history)."""

    def start() -> e2e.LiveApp:
        tmp = tmp_path_factory.mktemp("e2e-login")
        return e2e.launch(tmp, e2e.login_app_env(tmp, fake_openai), wait_engine=False, timeout=120)

    return SHARED.get(LOGIN_APP, start, e2e.stop)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed browser test's report says what each page still open showed at that moment (its address, what the
    composer held, the end of its text): a timeout alone does not say which side stalled."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "browser" in getattr(item, "fixturenames", ()):
        running = SHARED.value("browser")  # (playwright, browser)
        report.sections.append(("pages at the failure", e2e.pages_now(running[1] if running else None)))

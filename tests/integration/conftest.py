"""The integration modules' shared product (tests/support/shared.py)."""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e
from tests.support.shared import SHARED

SOCKET_APP = SHARED.kind("socket_app")


@pytest.fixture(scope="module")
def socket_app(fake_openai: str, tmp_path_factory: pytest.TempPathFactory) -> e2e.LiveApp:
    """The product launched as start.sh launches it on the shared fake server, login on with a second account (Bob),
    each client's language, history in SQLite (``history_db``), ready: for the modules that talk to it over
    Chainlit's socket and need nothing else of it (test_message_ids, test_fair_share_socket, test_streaming_history).
    Each test uses chats of its own."""
    from tests.integration.test_message_ids import launch

    return SHARED.get(SOCKET_APP, lambda: launch(fake_openai, tmp_path_factory.mktemp("socket-app")), e2e.stop)

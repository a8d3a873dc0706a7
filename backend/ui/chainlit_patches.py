"""Every place the product changes Chainlit (or the servers under it) instead of configuring it, with why, and a
check at start that the installed Chainlit is the one they were written for.

    check_chainlit()      # installation.install: refuses to start (ChainlitMismatch) on another Chainlit
    PATCHES               # the list: name, where it is applied, why, the upstream issue, the test that fails without it

The patch code stays beside what it serves (each ``where``); this module is the one list, and its check. A new patch
is one entry here, with a test that fails without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

#: The Chainlit every patch below was written against (requirements.txt pins it).
CHAINLIT_VERSION = "2.12.0"


@dataclass(frozen=True)
class Patch:
    name: str
    where: str  # the function that applies it
    reason: str
    upstream: str  # the issue, if there is one
    test: str  # tests/…::test that fails without it


PATCHES = (
    Patch(
        "no sleep in constructors",
        "backend/ui/server.py:patch",
        "cl.Message and cl.Step call time.sleep to order timestamps, blocking the event loop; their module globals "
        "get a time whose sleep only waits for the next microsecond",
        "",
        "tests/unit/test_app_streaming.py::test_chainlit_constructors_no_longer_sleep_on_the_event_loop",
    ),
    Patch(
        "socket message size and ping timeout",
        "backend/ui/server.py:patch",
        "a pasted document is over engine.io's 1 MB message cap; pongs are late on a loaded CPU box",
        "",
        "tests/unit/test_app_streaming.py::test_a_pasted_document_fits_one_socket_message",
    ),
    Patch(
        "socket guard",
        "backend/ui/socket_guard.py:install (sio.handlers)",
        "client_message and edit_message are checked (size, rate, an answer running) before Chainlit takes them",
        "",
        "tests/unit/test_app_handlers.py::test_an_edited_message_replaces_its_turn_and_drops_the_turns_after_it",
    ),
    Patch(
        "reconnect journal",
        "backend/ui/reconnect.py:install (ChainlitEmitter.emit, sio handlers)",
        "what was emitted while a tab was away is replayed when it reconnects, instead of lost",
        "",
        "tests/unit/test_app_reconnect.py::test_an_answer_that_ended_while_the_tab_was_away_is_shown_whole_with_its_"
        "footer",
    ),
    Patch(
        "Markdown without directives",
        "backend/ui/renderer.py:patched_bundles (the JS bundle served rewritten)",
        "Chainlit's Markdown always runs remark-directive: ':' in plain text (times, ratios) is eaten",
        "issue #22 (ours)",
        "tests/unit/test_renderer.py::test_the_installed_chainlit_bundle_is_patched_once",
    ),
    Patch(
        "nest_asyncio not applied",
        "backend/ui/launch.py:main",
        "chainlit.cli applies nest_asyncio at import, swapping asyncio's C Task and Future for slow Python ones",
        "",
        "tests/unit/test_ui_launch.py::test_chainlits_command_line_keeps_asyncios_c_tasks_and_futures",
    ),
    Patch(
        "no uvicorn websocket keepalive",
        "backend/ui/launch.py:without_websocket_keepalive (uvicorn.Config)",
        "engine.io's ping is the one heartbeat; uvicorn's closed busy sockets after 20 s",
        "",
        "tests/unit/test_ui_launch.py::test_the_ui_server_leaves_the_heartbeat_to_engine_io",
    ),
)


class ChainlitMismatch(RuntimeError):
    """The installed Chainlit is not the one the patches were written for."""


def check_chainlit(installed: str | None = None) -> None:
    """Refuse to start on a Chainlit other than ``CHAINLIT_VERSION``: the patches reach into its internals."""
    if installed is None:
        try:
            installed = version("chainlit")
        except PackageNotFoundError:
            installed = "none"
    if installed != CHAINLIT_VERSION:
        names = ", ".join(p.name for p in PATCHES)
        raise ChainlitMismatch(
            f"chainlit {installed} is installed, but this app patches chainlit {CHAINLIT_VERSION} ({names}; "
            f"backend/ui/chainlit_patches.py): install chainlit=={CHAINLIT_VERSION} (requirements.txt), or re-check "
            "each patch against the new version and raise CHAINLIT_VERSION"
        )

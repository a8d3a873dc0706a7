"""Every place the product changes Chainlit (or the servers under it) instead of configuring it: the one list, the
check at start that the installed Chainlit is the one they were written for, and the two calls that apply them.

    apply_at_launch()                    # launch.py, before chainlit.cli is imported: the server's patches
    apply_in_app(settings, ...)          # installation.install: checks, then the app process's patches
    check_chainlit()                     # raises ChainlitMismatch: another version, or a patched spot changed shape
    PATCHES                              # name, where the code is, why, the upstream issue, the test failing without it

The patch code stays beside what it serves (each ``where``); a new patch is one entry here, with its shape check
and a test that fails without it. Chainlit is imported inside the functions: launch.py imports this module before
Chainlit's command line may be imported.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.settings import Settings

#: The Chainlit every patch below was written against (requirements.txt pins it).
CHAINLIT_VERSION = "2.12.0"


@dataclass(frozen=True)
class Patch:
    name: str
    where: str  # the module and function that apply it
    reason: str
    upstream: str  # the issue, if there is one
    test: str  # tests/…::test that fails without it
    shape: Callable[[], bool]  # the patched spot still looks as the patch expects


def _time_globals() -> bool:
    import chainlit as cl

    return all("time" in cls.__init__.__globals__ for cls in (cl.Message, cl.Step))


def _engine_io() -> bool:
    from chainlit.server import sio

    return hasattr(sio.eio, "ping_timeout") and hasattr(sio.eio, "max_http_buffer_size")


def _handlers(*events: str) -> Callable[[], bool]:
    def shape() -> bool:
        from chainlit.server import sio

        return set(events) <= set(sio.handlers.get("/", {}))

    return shape


def _emitter() -> bool:
    from chainlit.emitter import ChainlitEmitter

    return hasattr(ChainlitEmitter, "_get_session_property") and _handlers("disconnect", "connection_successful")()


def _bundle() -> bool:
    from backend.ui import renderer

    return bool(renderer.patched_bundles(renderer.chainlit_assets()))


def _cli_applies_nest_asyncio() -> bool:
    spec = importlib.util.find_spec("chainlit.cli")
    return spec is not None and spec.origin is not None and "nest_asyncio.apply()" in Path(spec.origin).read_text()


def _uvicorn_keepalive() -> bool:
    from uvicorn.config import Config  # uvicorn's own: the patch replaces ``uvicorn.Config``, not this one

    return {"ws_ping_interval", "ws_ping_timeout"} <= set(inspect.signature(Config).parameters)


PATCHES = (
    Patch(
        "no sleep in constructors",
        "backend/ui/server.py:patch",
        "cl.Message and cl.Step call time.sleep to order timestamps, blocking the event loop; their module globals "
        "get a time whose sleep only waits for the next microsecond",
        "",
        "tests/unit/test_app_streaming.py::test_chainlit_constructors_no_longer_sleep_on_the_event_loop",
        _time_globals,
    ),
    Patch(
        "socket message size and ping timeout",
        "backend/ui/server.py:patch",
        "a pasted document is over engine.io's 1 MB message cap; pongs are late on a loaded CPU box",
        "",
        "tests/unit/test_app_streaming.py::test_a_pasted_document_fits_one_socket_message",
        _engine_io,
    ),
    Patch(
        "socket guard",
        "backend/ui/socket_guard.py:install (sio.handlers)",
        "client_message and edit_message are checked (size, rate, an answer running) before Chainlit takes them",
        "",
        "tests/unit/test_app_guards.py::test_only_the_chats_own_user_messages_can_be_edited_and_not_while_it_answers",
        _handlers("client_message", "edit_message"),
    ),
    Patch(
        "reconnect journal",
        "backend/ui/reconnect.py:install (ChainlitEmitter.emit, sio.handlers)",
        "what was emitted while a tab was away is replayed when it reconnects, instead of lost",
        "",
        "tests/unit/test_app_reconnect.py::test_an_answer_that_ended_while_the_tab_was_away_is_shown_whole_with_its_"
        "footer",
        _emitter,
    ),
    Patch(
        "Markdown without directives",
        "backend/ui/renderer.py:patched_bundles (the JS bundle served rewritten by routes.py)",
        "Chainlit's Markdown always runs remark-directive: ':' in plain text (times, ratios) is eaten",
        "issue #22 (ours)",
        "tests/unit/test_renderer.py::test_the_installed_chainlit_bundle_is_patched_once",
        _bundle,
    ),
    Patch(
        "nest_asyncio not applied",
        "backend/ui/launch.py:main",
        "chainlit.cli applies nest_asyncio at import, swapping asyncio's C Task and Future for slow Python ones",
        "",
        "tests/unit/test_ui_launch.py::test_chainlits_command_line_keeps_asyncios_c_tasks_and_futures",
        _cli_applies_nest_asyncio,
    ),
    Patch(
        "no uvicorn websocket keepalive",
        "backend/ui/launch.py:without_websocket_keepalive (uvicorn.Config)",
        "engine.io's ping is the one heartbeat; uvicorn's closed busy sockets after 20 s",
        "",
        "tests/unit/test_ui_launch.py::test_the_ui_server_leaves_the_heartbeat_to_engine_io",
        _uvicorn_keepalive,
    ),
)


class ChainlitMismatch(RuntimeError):
    """The installed Chainlit is not the one the patches were written for."""


def check_chainlit(installed: str | None = None) -> None:
    """Refuse to start on a Chainlit other than ``CHAINLIT_VERSION``, or one whose patched spots changed shape."""
    if installed is None:
        try:
            installed = version("chainlit")
        except PackageNotFoundError:
            installed = "none"
    fix = (
        f"install chainlit=={CHAINLIT_VERSION} (requirements.txt), or re-check each patch in "
        "backend/ui/chainlit_patches.py against the new version"
    )
    if installed != CHAINLIT_VERSION:
        names = ", ".join(p.name for p in PATCHES)
        raise ChainlitMismatch(
            f"chainlit {installed} is installed, but this app patches chainlit {CHAINLIT_VERSION} ({names}): {fix}"
        )
    changed = [p.name for p in PATCHES if not p.shape()]
    if changed:
        raise ChainlitMismatch(f"chainlit's code changed where this app patches it ({', '.join(changed)}): {fix}")


def apply_at_launch() -> None:
    """The UI server's patches, before ``chainlit.cli`` is imported (it applies nest_asyncio at import)."""
    import nest_asyncio

    from backend.ui import launch

    nest_asyncio.apply = launch.not_applied
    launch.without_websocket_keepalive()  # read by chainlit.cli at the server's start (``uvicorn.Config(...)``)


def apply_in_app(
    settings: Settings,
    chat_session: Callable[[], Any],
    lang: Callable[[], str],
    claim: Any,
    on_back: Callable[[], Awaitable[None]],
    backlog: Callable[[], Any] = lambda: None,
) -> None:
    """Check the installed Chainlit, then patch it in this process (once per installation; a later one replaces
    the guards and handlers of an earlier one). The bundle is patched where it is served (routes.py)."""
    from backend.ui import reconnect, server, socket_guard

    check_chainlit()
    server.patch(settings)  # the constructors' sleep; the socket's message size and ping timeout
    # the browser's messages, checked before Chainlit's handlers (backlog: the history's, past [history] pending_max)
    # and the account's chats, at most [login] max_chats_per_account (with login; 0: no cap)
    cap = settings.login.max_chats_per_account if settings.login.enable else 0
    socket_guard.install(chat_session, lang, claim, backlog, cap)
    reconnect.install(on_back)  # a browser back after a network cut gets what was emitted while it was away

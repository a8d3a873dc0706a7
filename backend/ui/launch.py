"""``python -m backend.ui.launch run app.py --headless …``: Chainlit's own command line (``chainlit run``), without
nest_asyncio.

Importing ``chainlit.cli`` calls ``nest_asyncio.apply()``, which swaps asyncio's C ``Task`` and ``Future`` for the
pure-Python ones and the event loop's step for a Python copy, for every await of the process. It exists for nested
``run_until_complete`` calls; the only one Chainlit 2.12 makes is for chat-profile overrides, and this product sets
no chat profiles. With 200 sessions answering at once, the UI without the swap spent about a seventh less CPU per
answer (bench/concurrency.py, docs/PERFORMANCE.md). Everything else is ``chainlit run``, unchanged: the same
options, the same server, but for one setting.

uvicorn's websocket keepalive is off (``ws_ping_interval=None``; Chainlit's command line takes no option for it).
Under engine.io's heartbeat (a ping every 25 s, ``backend/ui/server.py PING_TIMEOUT`` = 120 s for its pong),
uvicorn would also ping every 20 s and close the socket (code 1011) when a pong is not back within 20 s: a client
that does not read for that long (a saturated machine, a stalled link) would lose its socket and its answer,
whatever engine.io allows (tests/soak/test_long_answers.py stops its clients for 45 s to show it). The one
heartbeat left is engine.io's, which also finds the sockets of browsers that are gone. Both patches are applied
by ``chainlit_patches.apply_at_launch``.
"""

from __future__ import annotations

from typing import Any


def not_applied(*_args: Any, **_kwargs: Any) -> None:
    """What ``nest_asyncio.apply`` does here: nothing (see the module's docstring)."""


# uvicorn.Config's websocket keepalive as this process sets it (see the module's docstring)
WS_KEEPALIVE: dict[str, float | None] = {"ws_ping_interval": None, "ws_ping_timeout": None}


def without_websocket_keepalive() -> None:
    """uvicorn.Config, which Chainlit's command line builds, with WS_KEEPALIVE unless a caller passes its own."""
    import uvicorn

    base = uvicorn.Config
    if getattr(base, "_qwenchat_keepalive", False):
        return

    class Config(base):  # type: ignore[valid-type,misc]
        _qwenchat_keepalive = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **(WS_KEEPALIVE | kwargs))

    uvicorn.Config = Config  # type: ignore[misc]


def main(argv: list[str] | None = None) -> None:
    from backend.ui import chainlit_patches

    chainlit_patches.apply_at_launch()  # before chainlit.cli is imported: it applies nest_asyncio at import
    from chainlit.cli import cli

    cli(args=argv, prog_name="chainlit")


if __name__ == "__main__":
    main()

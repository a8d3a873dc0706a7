"""``python -m backend.ui.launch run app.py --headless …``: Chainlit's own command line (``chainlit run``), without
nest_asyncio.

Importing ``chainlit.cli`` calls ``nest_asyncio.apply()``, which swaps asyncio's C ``Task`` and ``Future`` for the
pure-Python ones and the event loop's step for a Python copy, for every await of the process. It exists for nested
``run_until_complete`` calls; the only one Chainlit 2.12 makes is for chat-profile overrides, and this product sets
no chat profiles. With 200 sessions answering at once, the UI without the swap spent about a seventh less CPU per
answer (bench/concurrency.py, docs/PERFORMANCE.md). Everything else is ``chainlit run``, unchanged: the same
options, the same server.
"""

from __future__ import annotations

from typing import Any


def _not_applied(*_args: Any, **_kwargs: Any) -> None:
    """What ``nest_asyncio.apply`` does here: nothing (see the module's docstring)."""


def main(argv: list[str] | None = None) -> None:
    import nest_asyncio

    nest_asyncio.apply = _not_applied  # before chainlit.cli is imported: it calls the attribute at import
    from chainlit.cli import cli

    cli(args=argv, prog_name="chainlit")


if __name__ == "__main__":
    main()

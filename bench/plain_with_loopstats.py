"""bench/plain_chainlit_app.py (the plain Chainlit streaming example) plus our opt-in event-loop sampler.

The example is imported unchanged; only an ``on_app_startup`` that starts backend/web/loopstats.py is added,
so bench/concurrency.py measures the plain app's event-loop lag and RSS the same way as the product's.
"""

import chainlit as cl

from backend.web import loopstats
from bench.plain_chainlit_app import on_message  # noqa: F401 - registers the example's handler


@cl.on_app_startup
async def start_loopstats() -> None:
    loopstats.start_from_environment()

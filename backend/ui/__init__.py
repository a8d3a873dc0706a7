"""The Chainlit side: every module that imports Chainlit. ``install(service)`` (installation.py) registers the
handlers against one Service; app.py, Chainlit's entry point, calls it once.

Modules: context (``Ui``, what each handler gets), chat (start, resume, end, settings, message, starters), panel
(settings panel, composer, remembered settings), answering (an answer, its buttons), commands (/adapters,
/unload, /export), compare_chat (compare mode), login (login, history data layer, shared views), routes (our
HTTP routes), server (process-wide changes to Chainlit's server), chainlit_settings (Chainlit's settings from
ours), socket_guard (checks before Chainlit takes a socket message), views and compare_view (the renderers),
markdown (footers, notes, the leaderboard), renderer (Chainlit's Markdown script without directives).
nothing else in backend/ imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.chat.service import Service
    from backend.ui.context import Ui


def install(service: Service) -> Ui:
    """The UI against ``service`` (installation.install); imported on call, so that ``backend.ui.markdown`` and
    the like can be used without Chainlit's server."""
    from backend.ui.installation import install as install_ui

    return install_ui(service)

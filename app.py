"""Chainlit's entry point (``chainlit run app.py``): the UI (backend/ui/) installed against this process's
Service. Handlers, views and routes live in backend/ui/; the chat logic in backend/chat/."""

from __future__ import annotations

import backend.ui
from backend.chat.service import Service

ui = backend.ui.install(Service.from_environment())

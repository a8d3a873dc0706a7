"""Chainlit's own settings that follow ours, set in this one place: its name, thread sharing, the stylesheet,
the origins its CORS answers, the composer's file upload ([uploads]). ``.chainlit/config.toml`` holds what these come to for the default settings
(tests/unit/test_chainlit_settings.py checks that the two never disagree); at start ``apply`` sets them from
config.toml's [ui] section, over what Chainlit read from its file."""

from __future__ import annotations

from typing import Any

from chainlit.config import config as chainlit_config

from backend.chat.documents import ACCEPT
from backend.hosts import canonical_origin
from backend.settings import Settings

SHIPPED_CSS = "/public/style.css"  # public/style.css as it is
THEME_CSS = "/qwenchat/style.css"  # the same plus the [branding].accent colours (routes.Routes.theme_css)


def cors_origins(settings: Settings) -> list[str]:
    """[network].allowed_origins as Chainlit's CORS compares them (the browser sends no default port)."""
    origins = [o for o in (canonical_origin(x) for x in settings.network.allowed_origins) if o]
    return [o.removesuffix(":443") if o.startswith("https:") else o.removesuffix(":80") for o in origins]


def chainlit_settings(settings: Settings, *, sharing: bool) -> dict[str, Any]:
    """Chainlit's settings, by section and key as .chainlit/config.toml names them, for ours. ``sharing``: the
    history is on ([login].enable with a database), so chats can be shared."""
    return {
        "UI.name": settings.branding.name,
        "UI.custom_css": THEME_CSS if settings.branding.accent else SHIPPED_CSS,
        "features.allow_thread_sharing": sharing,
        "project.allow_origins": cors_origins(settings),
        "project.user_session_timeout": int(settings.login.session_hours * 3600),  # a login token's lifetime, s
        # The upload button and drag-and-drop, by extension: Chainlit's upload route takes a file whose MIME type
        # matches a key and whose name ends with one of its extensions (browsers give code files odd types: .ts is
        # video/mp2t), and the browser (react-dropzone) skips the "*/*" key and offers the extensions. The content
        # decides in the end (backend/chat/documents.py).
        "features.spontaneous_file_upload.enabled": settings.uploads.enabled,
        "features.spontaneous_file_upload.accept": {"*/*": list(ACCEPT)},
        "features.spontaneous_file_upload.max_files": settings.uploads.max_files,
        "features.spontaneous_file_upload.max_size_mb": int(-(-settings.uploads.max_mb // 1)),
    }


def apply(settings: Settings, *, sharing: bool, http_app: Any) -> None:
    """Set them in Chainlit's config, and in its CORS middleware (added when Chainlit's server was imported)."""
    values = chainlit_settings(settings, sharing=sharing)
    chainlit_config.ui.name = values["UI.name"]
    chainlit_config.ui.custom_css = values["UI.custom_css"]
    chainlit_config.features.allow_thread_sharing = values["features.allow_thread_sharing"]
    chainlit_config.project.allow_origins = values["project.allow_origins"]
    chainlit_config.project.user_session_timeout = values["project.user_session_timeout"]
    upload = chainlit_config.features.spontaneous_file_upload
    if upload is not None:
        upload.enabled = values["features.spontaneous_file_upload.enabled"]
        upload.accept = values["features.spontaneous_file_upload.accept"]
        upload.max_files = values["features.spontaneous_file_upload.max_files"]
        upload.max_size_mb = values["features.spontaneous_file_upload.max_size_mb"]
    for middleware in http_app.user_middleware:
        if getattr(middleware.cls, "__name__", "") == "CORSMiddleware":
            middleware.kwargs["allow_origins"] = values["project.allow_origins"]

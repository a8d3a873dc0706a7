"""Moved: the catalog is ``backend/text.py`` (kept only until every import points there)."""

from .text import CATALOG as TEXTS, pick_language, t  # noqa: F401

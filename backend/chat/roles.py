"""Who may change what everyone is served: operators download from the hub, add adapters at run time, unload them
and see the engine's and the fleet's details (issue 29). Users chat, compare, vote, share and export.

    require_operator(settings, "bob", "unload")     # OperatorOnly: one line naming the operators, logged with "bob"

- With login on, the operators are ``[login] operators``, else ``[login] username`` (the first account).
- With login off there is no account: the one person at the UI is the operator (``who`` None). A hub download is
  refused all the same when the UI is public (``[network] public = true``): anyone could make the server download
  with the operator's ``HF_TOKEN``.
"""

from __future__ import annotations

import logging

from ..errors import QwenChatError
from ..settings import Settings
from ..text import Text

logger = logging.getLogger(__name__)


class OperatorOnly(QwenChatError):
    """Only an operator may do ``action`` (a catalog key: download from the hub, unload, see the engine); ``who``
    names the operators (login on), or says why nobody may (a public UI without login)."""

    code = "operator_only"
    text_key = "operator.only"
    retryable = False

    def __init__(self, action: Text, who: str) -> None:
        self.action, self.who = action, who
        super().__init__()


class PublicWithoutLogin(OperatorOnly):
    """A hub download asked of a UI open to others without login (``[network] public = true``): nobody there is
    known to be the operator."""

    code = "public_without_login"
    text_key = "operator.public"


def operators(settings: Settings) -> tuple[str, ...]:
    """The accounts that may change what everyone is served: ``[login] operators``, else ``[login] username``."""
    login = settings.login
    return tuple(login.operators) or (login.username,)


def is_operator(settings: Settings, who: str | None) -> bool:
    """With login on, an account of ``operators``; with login off, the one person at the UI (``who`` None)."""
    if not settings.login.enable:
        return True
    return who is not None and who in operators(settings)


def require_operator(settings: Settings, who: str | None, action: str, *, downloads: bool = False) -> None:
    """OperatorOnly (logged with the account name) unless ``who`` may; ``action``: an ``operator.action.*`` key.
    ``downloads``: a hub download, refused with login off too when the UI is public."""
    if downloads and not settings.login.enable and settings.network.public:
        logger.warning("refused to %s: the UI is public without login ([network] public = true)", action)
        raise PublicWithoutLogin(Text(f"operator.action.{action}"), "")
    if is_operator(settings, who):
        return
    names = ", ".join(operators(settings))
    logger.warning("refused to %s for %r: not an operator (operators: %s)", action, who, names)
    raise OperatorOnly(Text(f"operator.action.{action}"), names)

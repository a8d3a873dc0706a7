"""The welcome screen: starters per adapter, and the branding from ``[ui]`` (name, logo, favicon, accent).

    welcome.starters(settings, served, lang)   # [Starter(model, label, message)] for cl.set_starters
    welcome.starter_model(settings, text, cmd) # the model of a clicked starter (None for a typed message)
    welcome.unserved(settings, served)         # models named in [lora.starters] that are not served
    welcome.accent_hsl("#2563eb")              # "221 83% 53%": Chainlit's --primary variable

Starters come from ``[lora.starters]`` (name = ["question", ...]); the 'pirate' demo adapter, when it is in
[lora] modules, has built-in examples from the catalog (backend/catalog/, each language) unless its list is configured. A starter sends its question
with its model chosen for the chat: the button sends the model's name as the message's ``command`` (Chainlit's
Starter.command), so a typed message with the same words is never taken for a starter; ui/chat.py's on_message
asks ``starter_model`` for the first message.
A starter naming a model that is not served is still offered (the engine may be loading, or the adapter
in [lora].dir loads on first use); backend/ui/chat.py logs the unserved ones once the model list is known, and a click
on one says which model is missing instead of asking another model.
"""

from __future__ import annotations

import colorsys
from collections.abc import Iterable
from dataclasses import dataclass

from ..settings import EMBEDDED_ADAPTER_NAME, Settings
from ..text import languages, t

#: The built-in starters of the demo adapter (text keys; [lora.starters] pirate = [...] replaces them).
DEFAULT_STARTER_KEYS: dict[str, tuple[str, ...]] = {
    EMBEDDED_ADAPTER_NAME: ("starter.pirate.1", "starter.pirate.2", "starter.pirate.3"),
}
MAX_STARTERS = 8  # Chainlit lays them out in a row; more would not fit on a laptop


@dataclass(frozen=True)
class Starter:
    model: str
    label: str
    message: str


def configured(settings: Settings, lang: str) -> dict[str, tuple[str, ...]]:
    """Model name -> questions: the demo adapter's built-in ones in ``lang`` (when it is in [lora] modules),
    then [lora.starters], which replaces a model's list (``pirate = []`` removes the demo's)."""
    table = {
        name: tuple(t(key, lang) for key in keys)
        for name, keys in DEFAULT_STARTER_KEYS.items()
        if name in settings.lora.modules
    }
    table.update({name: tuple(texts) for name, texts in settings.lora.starters.items()})
    return {name: texts for name, texts in table.items() if texts}


def starters(settings: Settings, served: Iterable[str], lang: str) -> list[Starter]:
    """The welcome screen's buttons: served models' starters first, then the others (offered too: a click
    on one says it is not served), at most MAX_STARTERS."""
    served_set = set(served)
    table = configured(settings, lang)
    ordered = sorted(table.items(), key=lambda item: item[0] not in served_set)  # stable: config order kept
    out = [
        Starter(model, t("welcome.starter_label", lang, model=model, text=text), text)
        for model, texts in ordered
        for text in texts
    ]
    return out[:MAX_STARTERS]


def starter_model(settings: Settings, text: str, command: str | None) -> str | None:
    """The model of the starter that sent this message (its button sends the model as ``command``), or None
    for a typed message, even one with a starter's words."""
    wanted = text.strip()
    for lang in languages():  # the button's words were in the viewer's language: any catalog language
        texts = configured(settings, lang).get(command or "", ())
        if wanted in (x.strip() for x in texts):
            return command
    return None


def unserved(settings: Settings, served: Iterable[str], loadable: Iterable[str] = ()) -> list[str]:
    """Models named by starters that the engine does not list and [lora].dir does not offer."""
    known = set(served) | set(loadable)
    return [name for name in configured(settings, "en") if name not in known]


def accent_hsl(colour: str) -> str:
    """ "#rrggbb" as Chainlit's theme variables spell a colour: "H S% L%" (shadcn/ui convention)."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    h, lightness, s = colorsys.rgb_to_hls(r, g, b)
    return f"{round(h * 360)} {round(s * 100)}% {round(lightness * 100)}%"


def theme_css(colour: str) -> str:
    """CSS that sets the accent in both themes (appended to public/style.css by backend/ui/routes.py). ``html:root``
    and ``html.dark`` outrank Chainlit's own ``:root`` and ``.dark`` wherever the two stylesheets load."""
    hsl = accent_hsl(colour)
    return f"html:root, html.dark {{ --primary: {hsl}; --ring: {hsl}; --sidebar-primary: {hsl}; }}\n"

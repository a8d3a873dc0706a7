"""Chainlit's Markdown renderer as standard CommonMark + GFM: its browser bundle served without directives (#22).

Chainlit 2.12's ``Markdown`` component always runs remark-directive (its plugin list is fixed in the bundle; no
setting turns it off). That syntax takes ``:name`` after any character, so ``key:value``, ``C:Users`` or
``model:qwen3`` lose their tail: an unknown text directive renders as an empty element (a line break in a user
message). Its own alert plugin also turns a text ``:::info\n…\n:::`` into an "Info" box, the ``:::`` lines
gone. Everything that shows Markdown goes through that one component (streamed and finished answers, user
messages, resumed chats, shared views, steps), so the fix is there, once: the bundle is served with the
directive syntax's micromark extension emptied (``{text: {58: …}, flow: {58: […]}}`` becomes ``{}``; 58 is
``:``) and the alert's pattern replaced by one that never matches. The model's Markdown is left as it wrote it,
the stored text is untouched (``/export`` keeps it), and the server's emit path does no extra work. Nothing of
ours uses directives or alerts.

The edits are found by the shape of that extension and the alert's pattern, not by minified names; a bundle
without both (another Chainlit) is served as shipped, the start logs a warning, tests/e2e/test_fidelity.py fails.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# micromark-extension-directive's syntax: ``directive()`` returns {text: {58: directiveText},
# flow: {58: [directiveContainer, directiveLeaf]}}, minified as one small function.
DIRECTIVE_SYNTAX = re.compile(r"function ([\w$]+)\(\)\{return\{text:\{58:[\w$]+\},flow:\{58:\[[\w$]+,[\w$]+\]\}\}\}")
# Chainlit's MarkdownAlert plugin, its pattern as a regex literal in the bundle; (?!) never matches.
ALERT_PATTERN = r"/^:::\s*([\w-]+)\n([\s\S]*?)\n:::/i"
NEVER = "/(?!)/"


def without_directives(js: str) -> str | None:
    """The bundle with the directive syntax turned into an empty micromark extension and Chainlit's alert
    pattern into one that never matches; None: either is not found exactly once."""
    if js.count(ALERT_PATTERN) != 1:
        return None
    js = js.replace(ALERT_PATTERN, NEVER)
    anchor = "(){return{text:{58:"  # a plain search first: the regex over megabytes of script takes seconds
    spots = [m.start() for m in re.finditer(re.escape(anchor), js)]
    hits = [m for i in spots if (m := DIRECTIVE_SYNTAX.search(js, max(0, i - 80), i + 200))]
    if len(hits) != 1:
        return None
    m = hits[0]
    return js[: m.start()] + f"function {m.group(1)}(){{return{{}}}}" + js[m.end() :]


@dataclass(frozen=True)
class Bundle:
    """One patched script, served instead of Chainlit's file of the same name."""

    name: str
    body: bytes
    etag: str


@functools.cache
def patched_bundles(assets: Path) -> tuple[Bundle, ...]:
    """Chainlit's scripts in ``assets`` that carry the directive syntax, patched (read once per process)."""
    found = []
    for path in sorted(assets.glob("*.js")):
        text = path.read_text(encoding="utf-8")
        if "text:{58:" not in text:
            continue
        patched = without_directives(text)
        if patched is None:
            continue
        body = patched.encode("utf-8")
        found.append(Bundle(path.name, body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'))
    if not found:
        logger.warning(
            "Chainlit's renderer: no script in %s has the directive syntax this app removes (another Chainlit "
            "version?); text such as key:value may be shown cut. Pin chainlit as requirements-lock/app.txt does",
            assets,
        )
    return tuple(found)


def chainlit_assets() -> Path:
    """Where Chainlit's installed frontend keeps its scripts."""
    import chainlit

    return Path(chainlit.__file__).parent / "frontend" / "dist" / "assets"

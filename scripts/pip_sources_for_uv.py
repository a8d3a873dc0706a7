"""pip's configured package sources as uv arguments: one argument a line on stdout (read by scripts/env.sh).

    python -m pip config list | python scripts/pip_sources_for_uv.py

uv reads no pip configuration, but a machine may depend on it: here pip is configured with a local wheel folder and
local indexes that provide torch==2.13.0+cpu (not on PyPI). So what pip would use is passed to uv explicitly:

    index-url        --index-url URL                 (the first one pip lists wins, as for pip)
    extra-index-url  --extra-index-url URL           (each, in order, duplicates dropped)
    find-links       --find-links PATH|URL
    constraint       --constraint FILE
    no-index         --no-index
    trusted-host     --allow-insecure-host HOST
    cert             SSL_CERT_FILE=FILE              (an environment variable for uv, not an argument)

Any other key is pip's own business (timeouts, caches, version checks). pip lists each value as a Python literal
(``%r``), which may hold several entries separated by spaces or newlines. Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import ast
import re
import sys

_LINE = re.compile(r"^(?P<scope>[^.=]*)\.(?P<key>[a-z0-9_-]+)=(?P<value>.*)$")
_LIST_KEYS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}


def _values(raw: str) -> list[str]:
    """pip prints each value with ``%r``: a Python string literal, whose entries are separated by whitespace."""
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return str(value).split()


def uv_arguments(pip_config_list: str) -> list[str]:
    """``pip config list``'s output → uv arguments (and ``SSL_CERT_FILE=…``), in pip's order, without repeats."""
    index_url: str | None = None
    no_index = False
    cert: str | None = None
    seen: set[tuple[str, str]] = set()
    listed: list[str] = []
    for line in pip_config_list.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        key = m["key"].replace("_", "-")
        values = _values(m["value"])
        if key == "index-url" and values and index_url is None:
            index_url = values[0]
        elif key == "no-index":
            no_index = no_index or (values[:1] and values[0].lower() in ("1", "true", "yes", "on")) is True
        elif key == "cert" and values and cert is None:
            cert = values[0]
        elif key in _LIST_KEYS:
            for value in values:
                if (key, value) not in seen:
                    seen.add((key, value))
                    listed += [_LIST_KEYS[key], value]
    out = (["--index-url", index_url] if index_url else []) + (["--no-index"] if no_index else []) + listed
    return out + ([f"SSL_CERT_FILE={cert}"] if cert else [])


if __name__ == "__main__":
    sys.stdout.write("".join(arg + "\n" for arg in uv_arguments(sys.stdin.read())))

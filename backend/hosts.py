"""Hosts, origins and URLs as the settings and the web edge compare them: loopback or not, a browser origin, an
engine's base URL, the names the UI answers to.

    is_loopback("[::1]")                 # True; "0.0.0.0" and other names are not
    canonical_origin("HTTP://Chat.Example")   # "http://chat.example:80"
    host_name_of("Chat.Example.")        # "chat.example"; None for a URL, a port, a path
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings


def canonical_origin(value: str) -> str | None:
    """``scheme://host:port`` (lower case, default port made explicit) of a browser origin, or None.

    Only http/https with a host and nothing after it (no path, query, user or fragment) is an origin:
    "localhost:8080" (no scheme) or "http://x/app" are not.
    """
    try:
        parts = urllib.parse.urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or value.strip().endswith("?"):
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def http_base_url(value: str, *, bare: bool = False) -> bool:
    """An http(s) URL with a host and, if given, a port from 1 to 65535 (an engine's or a replica's base URL).
    ``bare``: no query, fragment or comma either (vllm-router takes the replicas as one comma-separated list)."""
    try:
        parts = urllib.parse.urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port that is not a number or out of range, a broken [IPv6] host
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return False
    return not bare or not (parts.query or parts.fragment or "," in value)


def without_password(url: str) -> str:
    """``url`` for a message: the password of a ``user:password@`` in it shown as ``***``."""
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost"; an empty host, 0.0.0.0, :: or any other name is not."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_HOST_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")  # one label of a host name


def host_name_of(value: str) -> str | None:
    """A host name or IP address the way the UI compares ``Host`` headers: lower case, an IPv6 address compressed
    and without brackets, no trailing dot ("Chat.Example." -> "chat.example"); None when ``value`` is not one (a
    URL, a port, a path, a space)."""
    v = value.strip().lower()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        pass
    v = v.removesuffix(".")
    if not v or len(v) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in v.split(".")):
        return None
    return v


def is_wildcard(host: str) -> bool:
    """0.0.0.0, :: or "": every address of this machine."""
    try:
        return not host.strip() or ipaddress.ip_address(host.strip().strip("[]")).is_unspecified
    except ValueError:
        return False


def is_address_or_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def served_host_names(settings: Settings) -> tuple[str, ...]:
    """The ``Host`` names the UI answers to besides loopback ones (DNS rebinding): ``[network] host_names``, the
    hosts of ``[network] allowed_origins`` and ``[network] ui_host`` when it is one address or name (not 0.0.0.0).

    Empty for a ``ui_host`` of 0.0.0.0 with neither set: the launcher then asks for ``[network] host_names``."""
    net = settings.network
    candidates = [*net.host_names]
    candidates += [urllib.parse.urlsplit(o.strip()).hostname or "" for o in net.allowed_origins]
    if not is_wildcard(net.ui_host) and not is_loopback(net.ui_host):
        candidates.append(net.ui_host)
    names = (host_name_of(c) for c in candidates)
    return tuple(dict.fromkeys(n for n in names if n))

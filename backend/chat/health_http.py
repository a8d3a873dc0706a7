"""The health poller's HTTP: one request, its answer as a value (``Http``), never an exception.

answer = await send(session, "GET", root + "/health", timeout)   # Http(ok, status, body, error, latency)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..engine_http import error_message


@dataclass
class Http:
    """One answer, or why there was none."""

    ok: bool = False  # a response arrived
    status: int = 0
    body: Any = None
    error: str = ""  # "refused", "timeout", or an exception text
    latency: float = 0.0


async def send(session: aiohttp.ClientSession, method: str, url: str, timeout: float, payload: Any = None) -> Http:
    """``method url`` with a JSON ``payload``; the body parsed as JSON when it is JSON, else text."""
    started = time.monotonic()
    try:
        async with session.request(method, url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            return Http(ok=True, status=resp.status, body=body, latency=time.monotonic() - started)
    except TimeoutError:
        return Http(error="timeout", latency=time.monotonic() - started)
    except aiohttp.ClientConnectorError:
        return Http(error="refused", latency=time.monotonic() - started)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        # a pooled keep-alive connection to a server that has gone away
        return Http(error="refused", latency=time.monotonic() - started)
    except aiohttp.ClientError as exc:
        return Http(error=f"{type(exc).__name__}: {exc}", latency=time.monotonic() - started)


def root_of(base_url: str) -> str:
    """An engine's root URL from its OpenAI base URL (``…/v1`` or not)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def error_detail(resp: Http) -> str:
    """``HTTP 500: the engine's message`` (160 characters at most, on one line)."""
    msg = " ".join(error_message(resp.body).split())[:160]
    return f"HTTP {resp.status}" + (f": {msg}" if msg else "")

"""The one way to read the engine's HTTP answers: the auth header, and one table from answers to our errors.

    headers = auth_headers(api_key)                                   # every call: chat, health, /tokenize, LoRA
    raise status_error(404, body, Route.CHAT, url=u, model="pirate")  # an answer that is not 2xx
    raise transport_error(exc, Route.TOKENIZE, url=u, limits=lim)     # no answer: refused, reset, timed out

Like openai-python's ``_make_status_error``: every caller (the chat client, the token counter's
``/tokenize``, the health poller's ``/v1/models`` and ``/health``, adapter load/unload) hands its
failure to these two functions, so the same answer always means the same thing to the user. The
table, most specific first (``route`` only refines the 404 and the catch-alls, where the same
status means different things on different routes):

    status / body                                   error
    any status with an HTML body (a web page)       WebPageResponse (a proxy or login page, not the API)
    400 with param input_tokens|max_tokens|input_text,
        code context_length_exceeded, or 413,       ContextOverflow, with the context length the message names
        or vLLM's sentence naming its length        (``server_limit``: the turn fits again to it)
    401, 403                                        AuthenticationFailed
    503 "No available workers ..." (vllm-router)     NoWorkerAvailable (its own words: it sends no param or code)
    429, 503                                        Overloaded
    404 on a route FastAPI does not have            chat/models/health/tokenize: RequestRejected (wrong URL)
        ({"detail": "Not Found"})                   load/unload: AdapterRuntimeDisabled
    404 about the model (param "model")             chat: ModelNotFound; unload: ModelNotFound
    404 other                                       load: AdapterRejected (path not visible to the engine)
    other 4xx                                       load: AdapterRejected; others: RequestRejected
    5xx, or an error with no status                 load: AdapterRejected; others: EngineError

vLLM's errors are ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status as
``code``; older vLLM sends a flat ``{"object": "error", "message", …}``, its ``--api-key``
middleware ``{"error": "Unauthorized"}``, FastAPI ``{"detail": "Not Found"}``: all are read here.
Key on ``param``, not on wording (vLLM's wording changes between versions).
"""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import (
    AdapterRejected,
    AdapterRuntimeDisabled,
    AuthenticationFailed,
    BackendError,
    ConnectionLost,
    ConnectTimeout,
    ContextOverflow,
    EngineError,
    IdleTimeout,
    MalformedResponse,
    ModelNotFound,
    NoWorkerAvailable,
    Overloaded,
    QwenChatError,
    RequestRejected,
    RequestTimeout,
    ServerUnreachable,
    WebPageResponse,
)
from .text import Text

#: vLLM's ``param`` on a 400 that means "the prompt or the reply does not fit the context"
#: (input_text: newer vLLM rejects over-long text before tokenising it).
CONTEXT_PARAMS = frozenset({"input_tokens", "max_tokens", "input_text"})
DETAIL_LIMIT = 300  # characters of a server message inside a user-facing error
#: vLLM's sentences naming its context length (vllm/renderers/params.py, vllm/v1/engine/input_processor.py; the
#: second comes without ``param``). Only a sentence with the number counts: "maximum context length exceeded" alone
#: may be anyone's.
_CONTEXT_LENGTH = re.compile(
    r"maximum context length is (\d+) tokens|longer than the maximum model length of (\d+)", re.IGNORECASE
)
#: vLLM's unknown-model text; older versions send it without ``param: "model"``.
_NO_SUCH_MODEL = re.compile(r"\bmodel `[^`]*` does not exist", re.IGNORECASE)
#: vllm-router 0.1.17's plain-text 503 when no worker may take the request ("No available workers (all circuits open
#: or unhealthy)"): it has no error fields, so its wording is the only key.
_NO_WORKER = re.compile(r"\bno available workers\b", re.IGNORECASE)


class Route(enum.Enum):
    """Which engine route answered: the same status means different things on different routes."""

    CHAT = "/v1/chat/completions"
    MODELS = "/v1/models"
    HEALTH = "/health"
    TOKENIZE = "/tokenize"
    LOAD_ADAPTER = "/v1/load_lora_adapter"
    UNLOAD_ADAPTER = "/v1/unload_lora_adapter"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The engine's bearer header, or none when no key is set (vLLM without --api-key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def short(text: Any, limit: int = DETAIL_LIMIT) -> str:
    """At most ``limit`` characters (then "…"), for messages that quote the server."""
    s = str(text)
    return s if len(s) <= limit else s[:limit] + "…"


def status_of(code: Any) -> int | None:
    """An HTTP status from an error body's ``code`` (int or digit string), else None."""
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return None


def error_fields(body: Any) -> dict[str, Any]:
    """The error object of any of the body shapes above (nested, flat, string, FastAPI's detail)."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict):
            return inner
        if isinstance(inner, str):  # {"error": "Unauthorized"} from vLLM's --api-key middleware
            return {"message": inner}
        return body
    if isinstance(body, str) and body.strip():
        return {"message": body}
    return {}


def error_message(body: Any, fallback: str = "") -> str:
    """The server's own message from an error body, or ``fallback``."""
    fields = error_fields(body)
    for key in ("message", "detail"):
        if isinstance(fields.get(key), str) and fields[key]:
            return str(fields[key])
    return fallback


_HTML_START = re.compile(rb"\s*(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body|title|meta|!--)", re.I | re.S)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.I | re.S)
TITLE_LIMIT = 120  # characters of a web page's <title> quoted in an error


def looks_like_html(body: Any, content_type: str = "") -> bool:
    """A web page rather than an API answer: ``text/html``, or a body that starts like HTML."""
    if "html" in content_type.lower():
        return True
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    return isinstance(raw, bytes) and bool(_HTML_START.match(raw[:4096].lstrip(b"\xef\xbb\xbf")))


def page_title(body: Any) -> str:
    """The <title> of a web page, whitespace collapsed and tags dropped ("" when there is none)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    found = _TITLE.search(text[:65536])
    if not found:
        return ""
    title = " ".join(re.sub(r"<[^>]*>", "", found.group(1)).split())
    return short(title, TITLE_LIMIT)


def public_url(url: str) -> str:
    """``url`` as it may be shown: without a user:password part or a query string."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "") if parts.username or parts.password else parts.netloc
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def replica_address(url: str) -> str:
    """``host:port`` of a fleet replica's URL: how the browser and the logs name it (no credentials, no path)."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "?"
    host = parts.hostname or "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _route_missing(body: Any) -> bool:
    """FastAPI's own 404 (``{"detail": "Not Found"}``): the route does not exist, no model was looked up."""
    return isinstance(body, dict) and "detail" in body and "error" not in body and "message" not in body


def status_error(
    status: int | None, body: Any, route: Route, *, url: str = "", model: str = "", path: str = "", message: str = ""
) -> QwenChatError:
    """Our error for an engine answer with HTTP ``status`` (None: an error event with no status).

    ``model`` is the model or adapter asked for; ``path`` the adapter folder (load only);
    ``message`` the caller's fallback text when the body has none (e.g. the SDK's own message).
    """
    if looks_like_html(body):  # vLLM never answers with a page: something else is in the way
        where = f"{public_url(url)}/chat/completions" if url and route is Route.CHAT else public_url(url) or route.value
        return WebPageResponse(where, status or 200, page_title(body))
    fields = error_fields(body)
    param, code = fields.get("param"), fields.get("code")
    status = status if status is not None else status_of(code)
    detail = short(error_message(body, message) or f"HTTP {status}")
    adapter = route in (Route.LOAD_ADAPTER, Route.UNLOAD_ADAPTER)

    named = _CONTEXT_LENGTH.search(str(error_message(body, message) or ""))
    server_limit = int(named.group(1) or named.group(2)) if named else None
    overflow = status == 400 and (param in CONTEXT_PARAMS or server_limit is not None)
    if overflow or code == "context_length_exceeded" or status == 413:
        return ContextOverflow(detail, server_limit=server_limit)
    if status in (401, 403):
        return AuthenticationFailed(status, detail)
    if status == 503 and _NO_WORKER.search(detail):
        return NoWorkerAvailable(detail)
    if status in (429, 503):
        return Overloaded(f"HTTP {status}: {detail}" if adapter else detail)
    if status == 404:
        if adapter and _route_missing(body):
            return AdapterRuntimeDisabled(model)
        about_model = param == "model" or bool(_NO_SUCH_MODEL.search(str(fields.get("message") or message)))
        if route is Route.UNLOAD_ADAPTER or (route is Route.CHAT and about_model):
            return ModelNotFound(model, detail)
        if route is Route.LOAD_ADAPTER:
            return AdapterRejected(
                model,
                f"the model server cannot find {path} ({detail}); if it runs in another "
                "container or host, the adapters folder must be mounted there at the same path",
            )
        if route is Route.CHAT:
            where = f"{url}/chat/completions" if url else "the chat completions route"
            return RequestRejected(
                404, f"{detail}; {where} was not found: check that OPENAI_BASE_URL (or the engine URL) ends in /v1"
            )
        return RequestRejected(404, f"{detail}; {url or route.value} was not found on the model server")
    if route is Route.LOAD_ADAPTER:
        if status is not None and status >= 500:
            return AdapterRejected(model, f"the model server could not load it (HTTP {status}): {detail}")
        return AdapterRejected(model, f"HTTP {status}: {detail}")
    if route is Route.UNLOAD_ADAPTER:
        detail = f"unloading {model!r} failed: HTTP {status}: {detail}"
    if status is not None and 400 <= status < 500:
        return RequestRejected(status, detail)
    if status is None or status < 500 or route is Route.UNLOAD_ADAPTER:
        return EngineError(detail)
    return EngineError(f"HTTP {status}: {detail}")


# ---------------------------------------------------------------- no answer at all


@dataclass(frozen=True)
class Limits:
    """The time limits of one call, with the setting that holds each (named in the error)."""

    connect: float
    read: float  # whole answer (health, /tokenize, LoRA) or the gap between chunks (chat)
    read_setting: str | Text  # "[client].idle_timeout"; a Text when no setting holds it
    what: Text  # what was waited for, e.g. Text("error.timeout.tokenize"): made in the reader's language


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes/contexts, outermost first, each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def transport_detail(exc: BaseException) -> str:
    """A short reason for a failed connection: "connection refused", an OS error, or the innermost text."""
    for cause in causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
    inner = list(causes(exc))[-1]
    return short(str(inner) or type(inner).__name__)


def transport_error(exc: BaseException, route: Route, *, url: str, limits: Limits) -> BackendError:
    """Our error for a call that got no (whole) answer, from the openai SDK (httpx) or aiohttp.

    Chat reads stream chunks, so a read timeout there is the idle timeout; elsewhere it is the
    call's whole limit, named with ``limits.read_setting`` and ``limits.what``.
    """
    if isinstance(exc, BackendError):
        return exc
    import httpx2
    import openai

    chain = list(causes(exc))

    def read_timeout() -> BackendError:
        if route is Route.CHAT:
            return IdleTimeout(limits.read)
        return RequestTimeout(limits.read, limits.read_setting, limits.what)

    try:
        import aiohttp
    except ImportError:  # the engine environment has no aiohttp; only the SDK path is used there
        aiohttp = None  # type: ignore[assignment]
    if aiohttp is not None and isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError)):
        # Most specific first: aiohttp's connect timeout is both a ClientError and a TimeoutError;
        # its total timeout is a bare TimeoutError (== asyncio.TimeoutError on 3.11).
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return ConnectTimeout(limits.connect)
        if isinstance(exc, asyncio.TimeoutError):
            return read_timeout()
        if isinstance(exc, aiohttp.ClientConnectorError):
            return ServerUnreachable(url, transport_detail(exc))
        if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
            return ConnectionLost(short(f"{url}: {type(exc).__name__}: {exc}"))  # reset, truncated body
        if isinstance(exc, aiohttp.ClientResponseError):  # not HTTP as aiohttp knows it
            return MalformedResponse(short(f"{url}: {exc}"))
        return ConnectionLost(short(f"{url}: {type(exc).__name__}: {exc}"))
    if isinstance(exc, openai.APITimeoutError):
        # write: the request body (a big prompt) stopped going out; nothing was answered yet, so
        # this is not the idle timeout of an answer that stalled.
        if any(isinstance(c, httpx2.WriteTimeout) for c in chain):
            return ConnectionLost(
                Text("error.detail.send_stalled", {"seconds": limits.read, "setting": limits.read_setting})
            )
        if any(isinstance(c, httpx2.ReadTimeout) for c in chain):
            return read_timeout()
        if route is not Route.CHAT and not any(
            isinstance(c, (httpx2.ConnectTimeout, httpx2.PoolTimeout)) for c in chain
        ):
            return read_timeout()
        return ConnectTimeout(limits.connect)
    if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError, OSError)):
        if any(isinstance(c, (httpx2.ConnectError, httpx2.UnsupportedProtocol, ConnectionRefusedError)) for c in chain):
            return ServerUnreachable(url, transport_detail(exc))
        if any(isinstance(c, (httpx2.ConnectTimeout, httpx2.PoolTimeout)) for c in chain):
            return ConnectTimeout(limits.connect)
        return ConnectionLost(transport_detail(exc))
    return EngineError(short(f"{type(exc).__name__}: {exc}"))

"""Runtime LoRA load/unload on a running vLLM (``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter``).

    await load_adapter(base_url, api_key, "pirate", path, loaded=[...], limit=4)
    await unload_adapter(base_url, api_key, "pirate")
    await load_adapter_from_folder(base_url, api_key, folder, name, base_dir, max_rank)

vLLM answers these routes only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (else 404
``{"detail": "Not Found"}``); success is a plain-text body; loading the same name twice is 400.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from ..engine_http import Limits, Route, error_message, status_error, transport_error
from ..errors import (
    AdapterLimitReached,
)
from .doctor import Diagnosis
from .folder import prepare_runtime_load

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- runtime load / unload (vLLM)


def _engine_client(client_or_base_url: Any, api_key: str | None, timeout: float) -> tuple[Any, bool]:
    """(client, owned): an AsyncOpenAI without retries (a failed load must not be repeated)."""
    from openai import AsyncOpenAI

    if isinstance(client_or_base_url, str):
        return AsyncOpenAI(
            base_url=client_or_base_url.rstrip("/"), api_key=api_key or "EMPTY", max_retries=0, timeout=timeout
        ), True
    options: dict[str, Any] = {"max_retries": 0, "timeout": timeout}
    if api_key:
        options["api_key"] = api_key
    return client_or_base_url.with_options(**options), False


async def _post(client_or_base_url: Any, api_key: str | None, route: str, body: dict[str, Any], timeout: float) -> str:
    client, owned = _engine_client(client_or_base_url, api_key, timeout)
    try:
        text: str = await client.post(route, body=body, cast_to=str)
        return text
    finally:
        if owned:
            await client.close()


def _map(exc: Exception, route: Route, name: str, path: str, url: str, timeout: float) -> Exception:
    """Our error for a failed load/unload: the engine's answer through the one table in ``engine_http``."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        return status_error(exc.status_code, exc.body, route, url=url, model=name, path=path, message=exc.message)
    what = f"{'loading' if route is Route.LOAD_ADAPTER else 'unloading'} adapter {name!r}"
    return transport_error(exc, route, url=url, limits=Limits(timeout, timeout, "a fixed limit of the app", what))


def _url_of(client_or_base_url: Any) -> str:
    return (
        client_or_base_url if isinstance(client_or_base_url, str) else str(getattr(client_or_base_url, "base_url", ""))
    )


async def load_adapter(
    client_or_base_url: Any,
    api_key: str | None,
    name: str,
    path: str | Path,
    *,
    loaded: Collection[str] = (),
    limit: int = 0,
    timeout: float = 120.0,
) -> str:
    """POST /v1/load_lora_adapter; returns vLLM's text. Already loaded under this name: a no-op.

    ``loaded``/``limit``: names the engine serves now (from /v1/models) and [lora].max_cpu_loras — vLLM
    itself never refuses for capacity (its CPU cache evicts silently), so the limit is enforced here.
    Raises AdapterRuntimeDisabled, AdapterLimitReached, AdapterRejected, or a BackendError subclass.
    """
    if limit and name not in loaded and len(loaded) >= limit:
        raise AdapterLimitReached(name=name, loaded=len(loaded), limit=limit, setting="[lora].max_cpu_loras")
    import openai

    url = _url_of(client_or_base_url)
    try:
        text = await _post(
            client_or_base_url, api_key, "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout
        )
    except openai.APIStatusError as exc:
        if exc.status_code == 400 and "already been loaded" in error_message(exc.body, exc.message):
            logger.info("adapter %s is already loaded", name)
            return error_message(exc.body, exc.message)
        raise _map(exc, Route.LOAD_ADAPTER, name, str(path), url, timeout) from exc
    except openai.OpenAIError as exc:
        raise _map(exc, Route.LOAD_ADAPTER, name, str(path), url, timeout) from exc
    logger.info("loaded adapter %s from %s", name, path)
    return text


async def unload_adapter(client_or_base_url: Any, api_key: str | None, name: str, *, timeout: float = 30.0) -> str:
    """POST /v1/unload_lora_adapter; ModelNotFound when the engine does not have it."""
    import openai

    url = _url_of(client_or_base_url)
    try:
        text = await _post(client_or_base_url, api_key, "/unload_lora_adapter", {"lora_name": name}, timeout)
    except openai.OpenAIError as exc:
        raise _map(exc, Route.UNLOAD_ADAPTER, name, "", url, timeout) from exc
    logger.info("unloaded adapter %s", name)
    return text


async def load_adapter_from_folder(
    client_or_base_url: Any,
    api_key: str | None,
    folder: str | Path,
    name: str,
    base_dir: str | Path | None,
    max_rank: int,
    *,
    loaded: Collection[str] = (),
    limit: int = 0,
    base_aliases: Iterable[str] = (),
) -> Diagnosis:
    """Allow-list + doctor (in a thread) + load: what the dropdown calls for an adapter not yet served."""
    import asyncio

    if limit and name not in loaded and len(loaded) >= limit:
        raise AdapterLimitReached(name=name, loaded=len(loaded), limit=limit, setting="[lora].max_cpu_loras")
    diagnosis = await asyncio.to_thread(
        prepare_runtime_load, folder, name, base_dir, max_rank, base_aliases=tuple(base_aliases)
    )
    await load_adapter(client_or_base_url, api_key, name, diagnosis.path, loaded=loaded, limit=limit)
    return diagnosis

"""Runtime LoRA load/unload on a running vLLM (``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter``).

    await load_adapter(base_url, api_key, "pirate", path, loaded=[...], limit=4)
    await unload_adapter(base_url, api_key, "pirate")
    await load_adapter_from_folder(base_url, api_key, folder, name, base_dir, max_rank)

vLLM answers these routes only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (else 404
``{"detail": "Not Found"}``); success is a plain-text body; loading the same name twice is 400.

A fleet (several replicas behind vLLM's router): a load or unload through the router reaches one replica
only, so ``load_on_replicas`` / ``unload_on_replicas`` send it to every replica directly, in parallel, with
the engine key. All ok: as with one engine. Some failed: the others are put back as they were, so the fleet
stays uniform and no request is routed to a replica lacking (or still holding) the adapter:

    load failed on some      unloaded again where it loaded (not where it was there before)
    unload failed on some    loaded back where it unloaded (from ``reload_path``; without one the fleet is
                             left uneven and the error says where it is gone)
    every replica failed     the replica's own error, as with one engine (nothing changed)

then ``AdapterFleetPartial`` names each failed replica (number, host:port) and why, and what was undone.
A replica that already had the adapter (load) or never had it (unload: 404) counts as done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..engine_http import Limits, Route, error_message, public_url, replica_address, status_error, transport_error
from ..errors import (
    AdapterFleetPartial,
    AdapterLimitReached,
    ModelNotFound,
    QwenChatError,
)
from ..text import Text
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
    what = Text("error.timeout.loading" if route is Route.LOAD_ADAPTER else "error.timeout.unloading", {"name": name})
    return transport_error(exc, route, url=url, limits=Limits(timeout, timeout, Text("error.timeout.fixed"), what))


def _url_of(client_or_base_url: Any) -> str:
    return (
        client_or_base_url if isinstance(client_or_base_url, str) else str(getattr(client_or_base_url, "base_url", ""))
    )


def _check_limit(name: str, loaded: Collection[str], limit: int) -> None:
    """[lora].max_cpu_loras: vLLM never refuses for capacity (its CPU cache evicts silently), so we do."""
    if limit and name not in loaded and len(loaded) >= limit:
        raise AdapterLimitReached(name=name, loaded=len(loaded), limit=limit, setting="[lora].max_cpu_loras")


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
    _check_limit(name, loaded, limit)
    text, _ = await _load(client_or_base_url, api_key, name, path, timeout)
    return text


async def _load(
    client_or_base_url: Any, api_key: str | None, name: str, path: str | Path, timeout: float
) -> tuple[str, bool]:
    """(vLLM's text, whether it was there already)."""
    import openai

    url = _url_of(client_or_base_url)
    try:
        text = await _post(
            client_or_base_url, api_key, "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout
        )
    except openai.APIStatusError as exc:
        if exc.status_code == 400 and "already been loaded" in error_message(exc.body, exc.message):
            logger.info("adapter %s is already loaded at %s", name, public_url(url))
            return error_message(exc.body, exc.message), True
        raise _map(exc, Route.LOAD_ADAPTER, name, str(path), url, timeout) from exc
    except openai.OpenAIError as exc:
        raise _map(exc, Route.LOAD_ADAPTER, name, str(path), url, timeout) from exc
    logger.info("loaded adapter %s from %s at %s", name, path, public_url(url))
    return text, False


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


# ---------------------------------------------------------------- a fleet: every replica, or none


async def _each(indexes: Iterable[int], call: Callable[[int], Awaitable[None]]) -> list[QwenChatError | None]:
    """``call(index)`` for every replica index at once; per index None (done) or its error. Others propagate."""
    results = await asyncio.gather(*(call(i) for i in indexes), return_exceptions=True)
    out: list[QwenChatError | None] = []
    for r in results:
        if isinstance(r, QwenChatError):
            out.append(r)
        elif isinstance(r, BaseException):
            raise r
        else:
            out.append(None)
    return out


def _listing(urls: Sequence[str], errors: Sequence[tuple[int, QwenChatError]]) -> Text:
    return Text.join(
        "; ",
        (
            Text(
                "error.adapter_fleet.replica",
                {"number": i + 1, "address": replica_address(urls[i]), "reason": Text.trimmed(e.as_text(), ".\u3002 ")},
            )
            for i, e in errors
        ),
    )


def _numbers(indexes: Iterable[int]) -> str:
    return ", ".join(str(i + 1) for i in indexes)


def _partial(
    name: str,
    action: str,
    urls: Sequence[str],
    failed: list[tuple[int, QwenChatError]],
    after: tuple[str, dict[str, Any]] | None,
    undo_failed: list[tuple[int, QwenChatError]],
) -> AdapterFleetPartial:
    parts = [Text(after[0], after[1])] if after else []
    if undo_failed:
        parts.append(Text("error.adapter_fleet.undo_failed", {"failures": _listing(urls, undo_failed)}))
    then = Text("sentences", {"first": parts[0], "then": parts[1]}) if len(parts) == 2 else next(iter(parts), None)

    for i, e in failed:
        logger.warning("%s of adapter %s failed on replica %d (%s): %s", action, name, i + 1, public_url(urls[i]), e)
    for i, e in undo_failed:
        logger.error("undoing the %s of %s failed on replica %d (%s): %s", action, name, i + 1, public_url(urls[i]), e)
    return AdapterFleetPartial(
        name,
        action,
        tuple(i + 1 for i, _ in failed),
        _listing(urls, failed),
        then,
    )


def _all_alike(errors: Sequence[QwenChatError]) -> bool:
    return len({(type(e), e.user_text("en")) for e in errors}) == 1


async def load_on_replicas(
    urls: Sequence[str],
    api_key: str | None,
    name: str,
    path: str | Path,
    *,
    loaded: Collection[str] = (),
    limit: int = 0,
    timeout: float = 120.0,
) -> None:
    """Load ``name`` on every replica (their OpenAI base URLs), or on none: see the module docstring."""
    _check_limit(name, loaded, limit)
    fresh: set[int] = set()

    async def one(index: int) -> None:
        _, already = await _load(urls[index], api_key, name, path, timeout)
        if not already:
            fresh.add(index)

    results = await _each(range(len(urls)), one)
    failed = [(i, e) for i, e in enumerate(results) if e is not None]
    if not failed:
        return
    if len(failed) == len(urls) and _all_alike([e for _, e in failed]):
        raise failed[0][1]
    undo = sorted(fresh)

    async def unload_one(index: int) -> None:
        await _unload_or_absent(urls[index], api_key, name)

    undo_results = await _each(undo, unload_one)
    undo_failed = [(i, e) for i, e in zip(undo, undo_results, strict=True) if e is not None]
    undone = [i for i, e in zip(undo, undo_results, strict=True) if e is None]
    after = ("error.adapter_fleet.load_undone", {"replicas": _numbers(undone)}) if undone else None
    raise _partial(name, "load", urls, failed, after, undo_failed)


async def _unload_or_absent(url: str, api_key: str | None, name: str) -> None:
    try:
        await unload_adapter(url, api_key, name)
    except ModelNotFound:
        logger.info("adapter %s was not on %s: nothing to unload there", name, public_url(url))


async def unload_on_replicas(
    urls: Sequence[str], api_key: str | None, name: str, *, reload_path: str | Path | None = None
) -> None:
    """Unload ``name`` from every replica, or from none (loaded back from ``reload_path``): see the module docstring."""

    async def one(index: int) -> None:
        await _unload_or_absent(urls[index], api_key, name)

    results = await _each(range(len(urls)), one)
    failed = [(i, e) for i, e in enumerate(results) if e is not None]
    if not failed:
        return
    if len(failed) == len(urls) and _all_alike([e for _, e in failed]):
        raise failed[0][1]
    gone = [i for i, e in enumerate(results) if e is None]
    undo_failed: list[tuple[int, QwenChatError]] = []
    if reload_path is None:
        after: tuple[str, dict[str, Any]] | None = ("error.adapter_fleet.unload_uneven", {"replicas": _numbers(gone)})
    else:
        path = reload_path

        async def reload_one(index: int) -> None:
            await _load(urls[index], api_key, name, path, 120.0)

        undo_results = await _each(gone, reload_one)
        undo_failed = [(i, e) for i, e in zip(gone, undo_results, strict=True) if e is not None]
        back = [i for i, e in zip(gone, undo_results, strict=True) if e is None]
        after = ("error.adapter_fleet.unload_undone", {"replicas": _numbers(back)}) if back else None
    raise _partial(name, "unload", urls, failed, after, undo_failed)


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

    _check_limit(name, loaded, limit)
    diagnosis = await asyncio.to_thread(
        prepare_runtime_load, folder, name, base_dir, max_rank, base_aliases=tuple(base_aliases)
    )
    await load_adapter(client_or_base_url, api_key, name, diagnosis.path, loaded=loaded, limit=limit)
    return diagnosis

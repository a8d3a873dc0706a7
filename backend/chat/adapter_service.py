"""The adapters of one UI process, beside the chat service (``Service.adapters``): which are offered, loading one
at run time (from [lora].dir or the hub, doctor first, evicting the least recently used when the slots are full),
unloading, and the /adapters list. The service's settings, poller and engine URLs are read through it, as they are
at the moment of each call.

No Chainlit here: backend/ui/ asks, this answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import contract, hub
from ..errors import (
    AdapterAnswering,
    AdapterDownloadFailed,
    AdapterSlotsBusy,
    AdapterStatic,
    ModelNotFound,
    QwenChatError,
)
from ..settings import ROOT
from ..text import Text, t

if TYPE_CHECKING:
    from ..adapters.doctor import Diagnosis
    from ..adapters.hub_runtime import Progress
    from .download_queue import Queued
    from .health import HealthStatus
    from .service import Service

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalAdapter:
    """An adapter folder inside [lora].dir that the engine has not loaded yet."""

    name: str
    rank: int | None


@dataclass(frozen=True)
class Loaded:
    """A runtime load that happened: ``evicted`` is the adapter unloaded to make room, if any."""

    name: str
    evicted: str | None = None


class AdapterService:
    """The adapter entry points of a ``Service`` (which offers them under the same names)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._load_lock = asyncio.Lock()
        # Adapters added at run time by hub id (/adapters owner/name): name -> (repo, snapshot folder); loaded again
        # after an eviction or an engine restart like a folder of [lora].dir.
        self._hub_adapters: dict[str, tuple[hub.HubModel, Path]] = {}

    def excluded_adapters(self) -> dict[str, Text]:
        """The launcher's left-out static adapters and why (the doctor's findings; an older launcher's English
        words as they are), server paths replaced by labels."""
        folder = os.environ.get(contract.ENV_LOG_DIR)
        if not folder:
            return {}
        try:
            found = json.loads((Path(folder) / contract.EXCLUDED_ADAPTERS_FILE_NAME).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(found, dict):
            return {}
        from ..adapters.folder import hide_paths

        places = self.path_labels()  # the launcher's reasons name folders: the browser is shown labels
        reasons = {str(k): Text.from_json(v) or Text.verbatim(str(v)) for k, v in found.items()}
        return {name: reason.map_strings(lambda s: hide_paths(s, places)) for name, reason in reasons.items()}

    async def local_adapters(self, status: HealthStatus) -> list[LocalAdapter]:
        """Adapters in [lora].dir that the engine does not list: offered, loaded on first use."""
        if self.service.settings.external or not self.service.settings.lora.runtime_loading:
            return []
        from ..adapters import folder

        served = {m.id for m in status.models}
        found = await asyncio.to_thread(folder.discover_adapters, self.service.settings.lora.resolved_dir)
        local = [LocalAdapter(a.name, a.rank) for a in found if a.name not in served and not a.problem]
        known = {a.name for a in local}
        for name, (_, snapshot) in self._hub_adapters.items():  # added from the hub, evicted or lost in a restart
            if name not in served and name not in known:
                local.append(LocalAdapter(name, self.adapter_rank(str(snapshot))))
        return local

    @staticmethod
    def adapter_rank(root: str | None) -> int | None:
        """The rank of a served adapter, when its folder is readable from here (dropdown label)."""
        if not root:
            return None
        from ..adapters.folder import read_rank

        try:
            return read_rank(Path(root))
        except Exception:  # noqa: BLE001 - a label detail; never worth failing the dropdown
            return None

    async def needs_runtime_load(self, model: str) -> bool:
        """True for an adapter in [lora].dir that the engine does not serve (e.g. chosen before a restart)."""
        status = self.service.poller.status
        if any(m.id == model for m in status.models):
            return False
        if model in self._hub_adapters and not self.service.settings.external:
            return True
        return any(a.name == model for a in await self.service.local_adapters(status))

    def static_adapters(self) -> frozenset[str]:
        """Adapters passed with --lora-modules at launch: never unloaded from the UI (no way back but a restart)."""
        return frozenset() if self.service.settings.external else frozenset(self.service.settings.lora.modules)

    def path_labels(self) -> dict[str, str]:
        """Server paths an adapter message may contain -> what the browser is shown instead."""
        lora = self.service.settings.lora
        places: dict[str, str] = {}

        def add(path: Path, label: str) -> None:
            for form in {str(path), str(path.expanduser().resolve())}:
                places.setdefault(form, label)

        add(lora.resolved_dir, "[lora].dir")
        add(hub.hub_cache_dir(), "<huggingface_hub's cache>")
        for name in lora.modules:
            add(lora.adapter_path(name), f"[lora].modules.{name}")
        if not self.service.settings.external:
            add(self.service.settings.model.resolved_path, "[model].path")
        add(ROOT, "<app>")
        add(Path.home(), "~")
        return places

    def _shown(self, exc: QwenChatError) -> None:
        """Replace the server paths in an error about to reach the browser (the doctor's and vLLM's texts name them)."""
        from ..adapters.folder import hide_error_paths

        hide_error_paths(exc, self.path_labels())

    async def ensure_loaded(self, name: str, status: HealthStatus | None = None) -> Loaded | None:
        """Load an adapter from [lora].dir at runtime (allow-list, file rules, doctor first) if not served.

        Returns what happened, or None when it was served already; raises an AdapterError naming the
        problem otherwise (with no server path in it). When the [lora].max_cpu_loras slots are full,
        the least recently used runtime adapter that no answer streams from is unloaded first
        (``Loaded.evicted``); if every one is answering, AdapterSlotsBusy. ``status`` is only a hint:
        inside the lock the poller's current view decides, else two sessions loading at once would
        both pass the limit check.
        """
        if status is not None and any(m.id == name for m in status.models):
            return None
        from ..adapters import runtime

        async with self._load_lock:
            status = self.service.poller.status
            if any(m.id == name for m in status.models):
                return None  # another session loaded it while this one waited
            lora = self.service.settings.lora
            try:
                diagnosis = await asyncio.to_thread(self._checked_for_load, name, status)
                loaded = [m.id for m in status.adapters]
                evicted = None
                if lora.max_cpu_loras and len(loaded) >= lora.max_cpu_loras:
                    evicted = await self._evict_for(name, loaded)
                    loaded.remove(evicted)
                if self.service.replica_urls:
                    await runtime.load_on_replicas(
                        self.service.replica_urls,
                        self.service.api_key,
                        name,
                        diagnosis.path,
                        loaded=loaded,
                        limit=lora.max_cpu_loras,
                    )
                else:
                    await runtime.load_adapter(
                        self.service.base_url,
                        self.service.api_key,
                        name,
                        diagnosis.path,
                        loaded=loaded,
                        limit=lora.max_cpu_loras,
                    )
            except QwenChatError as exc:
                self._shown(exc)
                raise
            self.service.adapter_usage.touch(name)  # just loaded: not the next one to go
            await self.service.poller.refresh()
            return Loaded(name, evicted)

    def _checked_for_load(self, name: str, status: HealthStatus) -> Diagnosis:
        """Before a runtime load (in a thread): an adapter added from the hub, its snapshot checked by the doctor;
        else the folder of [lora].dir (allow-list, file rules, doctor)."""
        from ..adapters import folder, hub_runtime

        lora = self.service.settings.lora
        base = None if self.service.settings.external else self.service.settings.model.resolved_path
        aliases = (self.service.default_model(status),)
        added = self._hub_adapters.get(name)
        if added is not None:
            return hub_runtime.check_snapshot(added[1], name, base, lora.max_lora_rank, base_aliases=aliases)
        return folder.prepare_runtime_load(lora.resolved_dir, name, base, lora.max_lora_rank, base_aliases=aliases)

    async def add_hub_adapter(
        self,
        text: str,
        on_progress: Progress | None = None,
        on_queued: Queued | None = None,
        *,
        who: str | None = None,
    ) -> tuple[str, Loaded | None]:
        """/adapters owner/name[@revision] (operators only: ``who``): downloaded into huggingface_hub's cache (one
        at a time, ``on_queued`` told the place), checked by the doctor, loaded as ``ensure_loaded`` loads one, served
        as owner/name. Returns that name and what the load did (None: served already); raises an AdapterError
        (no server path in it) or OperatorOnly."""
        from ..adapters import hub_runtime

        self.service.require_operator(who, "hub", downloads=True)
        try:
            model = hub_runtime.parse_adapter_id(text)
            if self.service.settings.external:
                raise AdapterDownloadFailed(str(model), Text("adapter_hub.external"))
            if not self.service.settings.lora.runtime_loading:
                raise AdapterDownloadFailed(str(model), Text("adapter_hub.runtime_off"))
            served = {m.id for m in self.service.poller.status.adapters} | self.static_adapters()
            hub_runtime.refuse_taken_name(model, self._hub_adapters.get(model.repo_id), served)
            async with self.service.downloads.turn(str(model), on_queued):
                max_bytes = self.service.settings.hub.max_download_bytes
                snapshot = await hub_runtime.fetch_adapter(model, on_progress, max_bytes=max_bytes)
        except QwenChatError as exc:
            logger.warning("adapter %s from the hub not added: %s", text.strip(), exc)  # the log keeps the paths
            self._shown(exc)
            raise
        name = model.repo_id
        if name in self._hub_adapters:  # the same repo at the same revision: served already, or loaded again
            return name, await self.ensure_loaded(name)
        self._hub_adapters[name] = (model, snapshot)
        try:
            return name, await self.ensure_loaded(name)
        except QwenChatError:
            del self._hub_adapters[name]  # refused (the doctor, the engine): not offered again
            raise

    async def _evict_for(self, name: str, loaded: list[str]) -> str:
        """Unload the least recently used runtime adapter nothing streams from; its name (under the load lock)."""
        from ..errors import AdapterLimitReached

        lora = self.service.settings.lora
        runtime_loaded = [a for a in loaded if a not in self.static_adapters()]
        if not runtime_loaded:  # every slot holds a static adapter: only the config can make room
            raise AdapterLimitReached(
                name=name, loaded=len(loaded), limit=lora.max_cpu_loras, setting="[lora].max_cpu_loras"
            )
        victim = self.service.adapter_usage.victim(runtime_loaded)
        if victim is None:
            raise AdapterSlotsBusy(name=name, slots=len(runtime_loaded), setting="[lora].max_cpu_loras")
        logger.info("adapter slots full (%d): unloading %s, the least recently used, for %s", len(loaded), victim, name)
        try:
            await self._unload_everywhere(victim)
        except ModelNotFound:
            pass  # gone already (unloaded elsewhere): the slot is free all the same
        self.service.adapter_usage.forget(victim)
        return victim

    async def unload(self, name: str, status: HealthStatus, *, who: str | None = None) -> None:
        """Unload a runtime adapter: not the base model, not a static adapter, not one answering right now; only
        an operator (``who``: the account; None with login off)."""
        self.service.require_operator(who, "unload")
        if not any(m.id == name for m in status.adapters):
            raise ModelNotFound(name, "not a served adapter")
        if name in self.static_adapters():
            raise AdapterStatic(name)
        answers = self.service.adapter_usage.answering(name)
        if answers:
            raise AdapterAnswering(name, answers)
        async with self._load_lock:  # not while a load is choosing which adapter to evict
            try:
                await self._unload_everywhere(name)
            except QwenChatError as exc:
                self._shown(exc)
                raise
            finally:
                # the list as the unload left it, also after a refusal loaded it back: a poll taken during the
                # rollback saw it missing on a replica, and a retry was told the adapter is not served
                await self.service.poller.refresh()
            self.service.adapter_usage.forget(name)

    async def _unload_everywhere(self, name: str) -> None:
        """Unload from the engine; in a fleet from every replica (loaded back on all if some refuse)."""
        from ..adapters import folder, runtime

        if not self.service.replica_urls:
            await runtime.unload_adapter(self.service.base_url, self.service.api_key, name)
            return
        try:  # where a partial unload loads it back from: the folder it was loaded from at runtime
            reload_path: Path | None = folder.resolve_adapter(self.service.settings.lora.resolved_dir, name)
        except QwenChatError:
            reload_path = None
        if reload_path is not None and not reload_path.is_dir():
            reload_path = None
        await runtime.unload_on_replicas(self.service.replica_urls, self.service.api_key, name, reload_path=reload_path)

    def adapters_overview(self, status: HealthStatus, local: list[LocalAdapter], lang: str) -> str:
        """Markdown list for the /adapters command: served adapters, then loadable ones."""
        lines = []
        if any(m.is_base for m in status.models) or not status.models:  # else no model is known to be the base
            lines.append(f"**{t('base', lang)}**: `{self.service.default_model(status)}`")
        lines += [f"- `{m.id}` ({t('lineage_unknown', lang)})" for m in status.models if m.lineage_unknown]
        for m in status.adapters:
            rank = self.adapter_rank(m.root)
            lines.append(f"- `{m.id}` (LoRA{f' r{rank}' if rank else ''})")
        lines += [f"- `{a.name}` (LoRA{f' r{a.rank}' if a.rank else ''}; {t('not_loaded', lang)})" for a in local]
        for name, reason in self.excluded_adapters().items():
            lines.append(f"- ~~`{name}`~~ — {reason.in_(lang)}")  # (excluded_adapters hides the server paths)
        for name, numbers in status.partial_models:  # a fleet: not on every ready replica, so not offered
            why = t("health.partial_model", lang, model=name, replicas=status.replicas_named(numbers, lang))
            lines.append(f"- ~~`{name}`~~ — {why}")
        return "\n".join(lines)

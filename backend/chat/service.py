"""What the Chainlit app holds once per process: settings, the shared poller, the client, the
token counter — and the small pure helpers that turn their state into UI values.

No Chainlit here: backend/ui/ asks, this answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.chat import budget as budget_mod
from backend.chat import counters, roles, vision
from backend.storage.votes import VoteStore

from .. import contract, hub, logsafe
from ..engine_http import public_url
from ..errors import (
    AdapterAnswering,
    AdapterDownloadFailed,
    AdapterSlotsBusy,
    AdapterStatic,
    BackendError,
    MessageTooLong,
    ModelNotFound,
    ModelPartial,
    PromptTooLong,
    QwenChatError,
)
from ..settings import ROOT, HealthSettings, Settings, load_settings
from ..text import Text, pick_language, t
from .adapters_in_use import AdapterUsage
from .client import ChatClient, anomaly_counts
from .conversation import Conversation
from .documents import Document
from .download_queue import DownloadQueue, Queued
from .health import EngineState, HealthPoller, HealthStatus, get_poller

if TYPE_CHECKING:
    from ..adapters.doctor import Diagnosis
    from ..adapters.hub_runtime import Progress

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


class Service:
    def __init__(
        self, settings: Settings, *, status_file: str | None = None, health: HealthSettings | None = None
    ) -> None:
        self.settings = settings
        self.base_url = settings.engine_base_url
        self.api_key = settings.api_key
        # A fleet: each replica's base URL (no user:password: the engine key goes as a bearer token). A runtime
        # adapter load or unload goes to every one of them; through the router it would reach one replica only.
        self.replica_urls = tuple(public_url(u) for u in settings.replica_urls)
        self.status_file = status_file
        self.health_settings = health or settings.health
        self.client = ChatClient(self.base_url, self.api_key, settings.client)
        self._poller: HealthPoller | None = None
        self._counter: counters.TokenCounter | None = None
        self._counter_lock = asyncio.Lock()
        # when the counter was chosen with the engine answering: that state's start (HealthStatus.since), else None
        self._counter_ready_since: float | None = None
        self._counter_had_files = False  # whether the tokenizer folder had its files then
        self._load_lock = asyncio.Lock()
        self._warm: asyncio.Task[None] | None = None
        # Shared by every chat of this process: last use and answers streaming per adapter (LRU eviction).
        self.adapter_usage = AdapterUsage()
        # Adapters added at run time by hub id (/adapters owner/name): name -> (repo, snapshot folder); loaded again
        # after an eviction or an engine restart like a folder of [lora].dir.
        self._hub_adapters: dict[str, tuple[hub.HubModel, Path]] = {}
        self.downloads = DownloadQueue()  # one hub download at a time per server
        self._votes: VoteStore | None = None
        # (context length the engine named in a 400, HealthStatus.since then): holds while the state lasts
        self._server_limit: tuple[int, float] | None = None

    @classmethod
    def from_environment(cls) -> Service:
        settings = load_settings()
        logging.basicConfig(level=settings.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logsafe.install()  # every record: control characters escaped, URL passwords masked
        return cls(settings, status_file=os.environ.get(contract.ENV_STATUS_FILE) or None)

    @property
    def votes(self) -> VoteStore:
        """Blind-compare votes, in the remembered-settings file (preferences.db_path); opened on first use."""
        if self._votes is None:
            from backend.storage.preferences import app_store

            self._votes = VoteStore(app_store(self.settings))
        return self._votes

    # ------------------------------------------------------------ health

    @property
    def poller(self) -> HealthPoller:
        if self._poller is None:
            self._poller = get_poller(
                self.base_url,
                self.api_key,
                self.health_settings,
                status_file=self.status_file,
                replicas=self.settings.replica_urls,
                parents=self.settings.lora.parents,
                base_name=self.settings.model.name,
                local_replicas=0 if self.settings.external else self.settings.fleet.local,
            )
        return self._poller

    async def start(self) -> None:
        await self.poller.start()
        if self._warm is None:  # once per process, in the background: see warm_up
            self._warm = asyncio.create_task(self.warm_up(), name="qwenchat-warm-up")

    async def warm_up(self) -> None:
        """Load what the first message would otherwise wait for, before anyone sends it: the token
        counter (tokenizer files, or the server's /tokenize and the estimate's Qwen vocabulary: 1.5-2 s),
        the chat template, and the SDK client's first request (its lazy imports and the connection).
        A failure is logged; the first message then loads what it needs itself, as before."""
        try:
            if self.tokenizer_source()[0] is not None:  # a local tokenizer needs no server: load it while vLLM loads
                await self.counter()
            status = await self.poller.wait_until_ready(self.health_settings.startup_limit)
            if not status.answering:
                return
            await self.fit([{"role": "user", "content": "warm-up"}])
            await self.client.warm_up()
            logger.info("warm-up done: token counter, chat template and client are ready for the first message")
        except Exception:  # an optimisation; never worth a failure
            logger.warning("warm-up failed; the first message loads what it needs", exc_info=True)

    def status_json(self, lang: str | None = "en") -> dict[str, Any]:
        """For the always-visible status line (public/status.js polls it), in the viewer's language: [ui].language
        when it forces one, else ``lang`` (the browser's tag). Every word is made here, from the catalog."""
        st = self.poller.status
        forced = self.settings.ui.language
        lang = pick_language(forced if forced != "auto" else lang)
        word = "status.preparing" if st.phase else f"status.{st.state.value}"  # the state's word on the line
        note = self.ui_restart_note()
        return {
            "state": st.state.value,
            "reason": st.text(lang),
            "elapsed": round(st.starting_elapsed),
            "elapsed_text": t("status.elapsed", lang, seconds=round(st.starting_elapsed)),
            "attempt": st.attempt,
            "max_attempts": st.max_attempts,
            "model": st.base_model or self.settings.model.name,
            "adapters": [m.id for m in st.adapters],
            "stale": st.models_stale,
            # While the launcher prepares (contract.PHASE_*: "install_engine", "convert_model"), else null.
            "phase": st.phase,
            # Off-spec chunks tolerated since start, by kind (e.g. {"empty_choices": 3}): whose backend misbehaves.
            "anomalies": anomaly_counts(),
            # The catalog language the words are in ("en", "zh-CN", …): [ui].language, else the browser's.
            "lang": lang,
            # The line's state word, and the one the page shows by itself when this server stops answering (it keeps
            # the last it was sent).
            "label": t(word, lang),
            "offline_label": t("status.offline", lang),
            # A fleet ([fleet]): replicas answering their own /health, of how many (0 and 0 without a fleet), each
            # replica by number and host:port (never its URL's credentials), and the count as the line shows it.
            "replicas_ready": st.replicas_ready,
            "replicas_total": st.replicas_total,
            "replicas": [r.to_json(lang) for r in st.replicas],
            "replicas_text": st.replicas_text(lang),
            # A fleet: models some ready replicas serve but not all (so not offered), with the replicas lacking each,
            # and the line's note on them ("" when there are none).
            "partial_models": [{"model": name, "replicas": list(numbers)} for name, numbers in st.partial_models],
            "partial_text": st.partial_text(lang),
            # The UI process itself was restarted by the launcher lately (it died: killed, out of memory, a crash):
            # why, and that the model kept running ("" when it was not, or long ago).
            "ui_note": note.in_(lang) if note else "",
            # vLLM's own load (its /metrics, every replica's): requests generating and queued (null: unknown), and
            # the line's "busy · 8 running, 3 waiting" while some wait ("" otherwise).
            "running": st.load.running if st.load else None,
            "waiting": st.load.waiting if st.load else None,
            "load_text": st.load_text(lang),
        }

    def ui_restart_note(self, *, now: float | None = None, shown_for: float = 600.0) -> Text | None:
        """ "the UI restarted 12 s ago (the UI was killed (SIGKILL) …); the model kept running", for ``shown_for``
        seconds after the launcher restarted this very process (logs/ui-status.json, read once); else None."""
        folder = os.environ.get(contract.ENV_LOG_DIR)
        status = contract.EngineStatus.read(Path(folder) / contract.UI_STATUS_FILE_NAME) if folder else None
        if status is None or status.since is None or status.pid != os.getpid():
            return None  # no restart, or the file describes another process (an older one, a test's)
        ago = max(0, int((time.time() if now is None else now) - status.since))
        if ago > shown_for:
            return None
        when = (
            Text("ui_keeper.ago_seconds", {"n": ago}) if ago < 120 else Text("ui_keeper.ago_minutes", {"n": ago // 60})
        )
        return Text("ui_keeper.restarted", {"ago": when, "reason": status.reason or Text.verbatim("?")})

    async def status_after_failure(self) -> HealthStatus:
        """The poller's fresh view after a connection failure (the supervisor needs a moment to notice)."""
        status = await self.poller.refresh()
        for _ in range(3):
            if status.state is not EngineState.DOWN or status.attempt is None:
                break
            await asyncio.sleep(0.7)
            status = await self.poller.refresh()
        return status

    # ------------------------------------------------------------ models and adapters

    def default_model(self, status: HealthStatus) -> str:
        return status.base_model or self.settings.model.name

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
        if self.settings.external or not self.settings.lora.runtime_loading:
            return []
        from ..adapters import folder

        served = {m.id for m in status.models}
        found = await asyncio.to_thread(folder.discover_adapters, self.settings.lora.resolved_dir)
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
        status = self.poller.status
        if any(m.id == model for m in status.models):
            return False
        if model in self._hub_adapters and not self.settings.external:
            return True
        return any(a.name == model for a in await self.local_adapters(status))

    def static_adapters(self) -> frozenset[str]:
        """Adapters passed with --lora-modules at launch: never unloaded from the UI (no way back but a restart)."""
        return frozenset() if self.settings.external else frozenset(self.settings.lora.modules)

    def path_labels(self) -> dict[str, str]:
        """Server paths an adapter message may contain -> what the browser is shown instead."""
        lora = self.settings.lora
        places: dict[str, str] = {}

        def add(path: Path, label: str) -> None:
            for form in {str(path), str(path.expanduser().resolve())}:
                places.setdefault(form, label)

        add(lora.resolved_dir, "[lora].dir")
        add(hub.hub_cache_dir(), "<huggingface_hub's cache>")
        for name in lora.modules:
            add(lora.adapter_path(name), f"[lora].modules.{name}")
        if not self.settings.external:
            add(self.settings.model.resolved_path, "[model].path")
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
            status = self.poller.status
            if any(m.id == name for m in status.models):
                return None  # another session loaded it while this one waited
            lora = self.settings.lora
            try:
                diagnosis = await asyncio.to_thread(self._checked_for_load, name, status)
                loaded = [m.id for m in status.adapters]
                evicted = None
                if lora.max_cpu_loras and len(loaded) >= lora.max_cpu_loras:
                    evicted = await self._evict_for(name, loaded)
                    loaded.remove(evicted)
                if self.replica_urls:
                    await runtime.load_on_replicas(
                        self.replica_urls, self.api_key, name, diagnosis.path, loaded=loaded, limit=lora.max_cpu_loras
                    )
                else:
                    await runtime.load_adapter(
                        self.base_url, self.api_key, name, diagnosis.path, loaded=loaded, limit=lora.max_cpu_loras
                    )
            except QwenChatError as exc:
                self._shown(exc)
                raise
            self.adapter_usage.touch(name)  # just loaded: not the next one to go
            await self.poller.refresh()
            return Loaded(name, evicted)

    def _checked_for_load(self, name: str, status: HealthStatus) -> Diagnosis:
        """Before a runtime load (in a thread): an adapter added from the hub, its snapshot checked by the doctor;
        else the folder of [lora].dir (allow-list, file rules, doctor)."""
        from ..adapters import folder, hub_runtime

        lora = self.settings.lora
        base = None if self.settings.external else self.settings.model.resolved_path
        aliases = (self.default_model(status),)
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

        self.require_operator(who, "hub", downloads=True)
        try:
            model = hub_runtime.parse_adapter_id(text)
            if self.settings.external:
                raise AdapterDownloadFailed(str(model), Text("adapter_hub.external"))
            if not self.settings.lora.runtime_loading:
                raise AdapterDownloadFailed(str(model), Text("adapter_hub.runtime_off"))
            served = {m.id for m in self.poller.status.adapters} | self.static_adapters()
            hub_runtime.refuse_taken_name(model, self._hub_adapters.get(model.repo_id), served)
            async with self.downloads.turn(str(model), on_queued):
                max_bytes = self.settings.hub.max_download_bytes
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

        lora = self.settings.lora
        runtime_loaded = [a for a in loaded if a not in self.static_adapters()]
        if not runtime_loaded:  # every slot holds a static adapter: only the config can make room
            raise AdapterLimitReached(
                name=name, loaded=len(loaded), limit=lora.max_cpu_loras, setting="[lora].max_cpu_loras"
            )
        victim = self.adapter_usage.victim(runtime_loaded)
        if victim is None:
            raise AdapterSlotsBusy(name=name, slots=len(runtime_loaded), setting="[lora].max_cpu_loras")
        logger.info("adapter slots full (%d): unloading %s, the least recently used, for %s", len(loaded), victim, name)
        try:
            await self._unload_everywhere(victim)
        except ModelNotFound:
            pass  # gone already (unloaded elsewhere): the slot is free all the same
        self.adapter_usage.forget(victim)
        return victim

    def is_operator(self, who: str | None) -> bool:  # roles.py: who may change what everyone is served
        return roles.is_operator(self.settings, who)

    def require_operator(self, who: str | None, action: str, *, downloads: bool = False) -> None:
        roles.require_operator(self.settings, who, action, downloads=downloads)

    async def operator_report(self, *, who: str | None, answering: Mapping[str, int], lang: str | None) -> str:
        """The operator's /status (operator_status.gather); OperatorOnly for anyone else."""
        from .operator_status import gather

        self.require_operator(who, "engine")
        return await gather(self, answering, lang)

    async def unload(self, name: str, status: HealthStatus, *, who: str | None = None) -> None:
        """Unload a runtime adapter: not the base model, not a static adapter, not one answering right now; only
        an operator (``who``: the account; None with login off)."""
        self.require_operator(who, "unload")
        if not any(m.id == name for m in status.adapters):
            raise ModelNotFound(name, "not a served adapter")
        if name in self.static_adapters():
            raise AdapterStatic(name)
        answers = self.adapter_usage.answering(name)
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
                await self.poller.refresh()
            self.adapter_usage.forget(name)

    async def _unload_everywhere(self, name: str) -> None:
        """Unload from the engine; in a fleet from every replica (loaded back on all if some refuse)."""
        from ..adapters import folder, runtime

        if not self.replica_urls:
            await runtime.unload_adapter(self.base_url, self.api_key, name)
            return
        try:  # where a partial unload loads it back from: the folder it was loaded from at runtime
            reload_path: Path | None = folder.resolve_adapter(self.settings.lora.resolved_dir, name)
        except QwenChatError:
            reload_path = None
        if reload_path is not None and not reload_path.is_dir():
            reload_path = None
        await runtime.unload_on_replicas(self.replica_urls, self.api_key, name, reload_path=reload_path)

    def adapters_overview(self, status: HealthStatus, local: list[LocalAdapter], lang: str) -> str:
        """Markdown list for the /adapters command: served adapters, then loadable ones."""
        lines = []
        if any(m.is_base for m in status.models) or not status.models:  # else no model is known to be the base
            lines.append(f"**{t('base', lang)}**: `{self.default_model(status)}`")
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

    def partial_adapters(self, lang: str, skip: str = "") -> list[str]:
        """A fleet: one note per model that some ready replicas lack (not offered), for the start of a chat
        (``skip``: one the chat was already told about)."""
        status = self.poller.status
        return [
            t("partial_adapter", lang, name=name, replicas=status.replicas_named(numbers, lang))
            for name, numbers in status.partial_models
            if name != skip
        ]

    def partial_reset_text(self, model: str, default: str, lang: str) -> str:
        """A chat's model that some ready replicas lack (so no longer offered): why, and what the chat uses now."""
        status = self.poller.status
        why = ModelPartial(model, status.replicas_named(status.lacking(model), lang)).user_text(lang)
        return f"{why}\n\n{t('model_reset', lang, model=default)}"

    # ------------------------------------------------------------ sampling and budget

    def default_sampling(self) -> dict[str, float]:
        m = self.settings.model
        return {"temperature": m.temperature, "top_p": m.top_p, "top_k": m.top_k, "min_p": m.min_p}

    def reply_tokens(self) -> int:
        return self.settings.budget.reply_reserve

    def max_model_len(self) -> int:
        known = self.poller.status.max_model_len or self.settings.model.max_model_len
        learned = self._server_limit
        if learned is not None and learned[1] == self.poller.status.since:
            return min(known, learned[0])
        return known

    def learn_context_limit(self, tokens: int) -> bool:
        """Fit to the context length the engine named in a 400 from now on (while it stays in this state); False
        when it is no smaller than ours (asking again cannot help)."""
        if tokens >= self.max_model_len():
            return False
        self._server_limit = (tokens, self.poller.status.since)
        return True

    def tokenizer_source(self) -> tuple[Path | None, str]:
        """(tokenizer folder, server for /tokenize) the counter is chosen from.

        Launched engine: the model folder it serves, else the engine's /tokenize. A launched fleet: the folder
        only (its replicas serve that folder), never /tokenize through the router, which reaches whichever
        replica it picks. External mode: the server's /tokenize; behind a router ([fleet] remote listed) a
        [model] path holding a tokenizer is preferred, its /tokenize still the fallback.
        """
        s = self.settings
        if not s.external and s.model.hub is not None:  # a hub id: its snapshot once the download has finished
            return hub.complete_snapshot(s.model.hub), "" if s.fleet.enabled else self.base_url
        if not s.external:
            return s.model.resolved_path, "" if s.fleet.enabled else self.base_url
        if s.fleet.enabled and not s.model.is_embedded and counters.has_tokenizer(s.model.resolved_path):
            return s.model.resolved_path, self.base_url
        return None, self.base_url

    async def counter(self) -> counters.TokenCounter:
        """The token counter, chosen again while it is an estimate and something better has appeared since."""
        async with self._counter_lock:
            if self._counter is not None and not self._counter.exact and self._better_counter_possible():
                logger.info("token counter: choosing again (the model's tokenizer or the engine is there now)")
                self._counter = None
            elif self._counter_outdated():
                logger.info("token counter: choosing again (the engine serves another model now)")
                self._counter = None
            if self._counter is None:
                s = self.settings
                folder, server = self.tokenizer_source()
                status = self.poller.status
                self._counter_ready_since = status.since if status.answering else None
                self._counter_had_files = bool(folder and counters.has_tokenizer(folder))
                self._counter = await counters.open_counter(
                    tokenizer_dir=folder,
                    base_url=server,
                    model=self.default_model(self.poller.status),
                    api_key=self.api_key,
                    client=s.client,
                )
            return self._counter

    def counter_may_change(self) -> bool:
        """The next ``counter()`` would choose again: none chosen yet, or an estimate that something better may
        replace now (the wait step recounts the waiting message then, so its meter loses its "≈" before the answer)."""
        counter = self._counter
        return counter is None or (not counter.exact and self._better_counter_possible())

    def _better_counter_possible(self) -> bool:
        """An estimate was chosen (at a cold start: no model folder yet, the engine still down); since then the
        tokenizer files have appeared (the model was converted or downloaded) or the engine has become ready (its
        /tokenize may answer now): ready again after a restart counts as appearing again, as does another state
        while it answers (ready, degraded). Each is tried once per appearance, so a server whose /tokenize stays
        broken costs one more try each time it comes up, not one per message."""
        folder, server = self.tokenizer_source()
        if folder and not self._counter_had_files and counters.has_tokenizer(folder):
            return True
        status = self.poller.status
        return bool(server) and status.answering and status.since != self._counter_ready_since

    def _counter_outdated(self) -> bool:
        """The engine's /tokenize counts for a model the engine no longer serves as its base (an external
        server that changed models): choose again, for the model it serves now."""
        counter, status = self._counter, self.poller.status
        if not isinstance(counter, counters.RemoteCounter) or not status.answering or not status.base_model:
            return False
        return counter.model != status.base_model

    async def check_message_length(self, text: str) -> None:
        """MessageTooLong for a message above ``[ui] max_message_tokens`` (counted only when it may be)."""
        await budget_mod.check_message_length(text, self.settings.ui.max_message_tokens, self.counter)

    async def fit(self, messages: list[dict[str, str]]) -> budget_mod.FitResult:
        try:
            return await budget_mod.fit_history(
                messages, await self.counter(), max_model_len=self.max_model_len(), reply_reserve=self.reply_tokens()
            )
        except BackendError as exc:
            # A counter that talks to the server (/tokenize) stopped answering: choose again
            # (the estimate, if the server still fails) instead of failing every message from now on.
            logger.warning("token counting failed (%s); choosing the counter again", exc.code)
            self._counter = None
            return await budget_mod.fit_history(
                messages, await self.counter(), max_model_len=self.max_model_len(), reply_reserve=self.reply_tokens()
            )

    async def fit_conversation(self, conversation: Conversation, system_prompt: str) -> budget_mod.FitResult:
        """``fit`` of the conversation's messages, with each document's share for the meter and the kept messages'
        images as image parts (``vision.with_fitted_images``)."""
        fitted = await self.fit(conversation.messages(system_prompt))
        per_message = conversation.documents(system_prompt)
        fitted = await budget_mod.with_documents(fitted, per_message, await self.counter())
        return vision.with_fitted_images(fitted, per_message)

    def takes_images(self, model: str) -> bool:
        """Whether ``model`` (the base, or an adapter on it) reads images (``vision.served_folders``)."""
        return vision.takes_images(vision.served_folders(self.poller.status, self.settings.model.resolved_path))

    async def document_cut(self, question: str, documents: tuple[Document, ...], exc: PromptTooLong) -> tuple[int, int]:
        """Which document to cut and to how many pages (or lines), so the message fits (``budget.fitting_part``)."""
        room = exc.limit or max(1, exc.budget - exc.system - 16)
        return await budget_mod.fitting_part(question, documents, int(room), await self.counter())

    async def trimmed(self, text: str, exc: PromptTooLong | MessageTooLong) -> str:
        """The user's message with its middle replaced by a marker, sized to fit the budget (and, for a message
        above ``[ui] max_message_tokens``, that limit too; the system prompt may still trim it once more)."""
        if isinstance(exc, MessageTooLong):
            budget = budget_mod.token_budget(self.max_model_len(), self.reply_tokens())
            room = max(1, min(exc.limit, budget - 64))
        else:
            room = exc.limit or max(1, exc.budget - exc.system - 16)
        return await budget_mod.trim_middle(text, int(room), await self.counter())


# ---------------------------------------------------------------- pure helpers for the UI


def model_options(
    status: HealthStatus,
    local: list[LocalAdapter],
    lang: str,
    rank_of: Callable[[str | None], int | None] = lambda root: None,
) -> dict[str, str]:
    """Dropdown items, label → model id: the base first, then served adapters, then loadable ones."""
    items: dict[str, str] = {}
    for m in status.models:
        if m.is_base:
            items[f"{m.id} ({t('base', lang)})"] = m.id
    for m in status.models:  # the server hides lineage and [lora] parents does not say: no claim either way
        if m.lineage_unknown:
            items[m.id] = m.id
    for m in status.adapters:
        rank = rank_of(m.root)
        items[f"{m.id} (LoRA{f' r{rank}' if rank else ''})"] = m.id
    for a in local:
        items[f"{a.name} (LoRA{f' r{a.rank}' if a.rank else ''}; {t('not_loaded', lang)})"] = a.name
    return items


def sampling_from(values: Mapping[str, Any], defaults: Mapping[str, float]) -> dict[str, float]:
    out = dict(defaults)
    for key in ("temperature", "top_p", "min_p"):
        if isinstance(values.get(key), (int, float)):
            out[key] = float(values[key])
    if isinstance(values.get("top_k"), (int, float)):
        out["top_k"] = int(values["top_k"])
    return out


def sampling_body(sampling: Mapping[str, float]) -> dict[str, Any]:
    """Request fields; top_k/min_p are vLLM extensions (the openai SDK's extra_body)."""
    body: dict[str, Any] = {"temperature": sampling["temperature"], "top_p": sampling["top_p"]}
    if int(sampling.get("top_k", -1)) > 0:
        body["top_k"] = int(sampling["top_k"])
    if sampling.get("min_p"):
        body["min_p"] = float(sampling["min_p"])
    return body

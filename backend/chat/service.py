"""What the Chainlit app holds once per process: settings, the shared poller, the client, the
token counter — and the small pure helpers that turn their state into UI values.

No Chainlit here: backend/ui/ asks, this answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.chat import budget as budget_mod
from backend.chat import counters, roles, vision
from backend.storage.votes import VoteStore

from .. import contract, hub, logsafe
from ..engine_http import public_url
from ..errors import (
    BackendError,
    MessageTooLong,
    ModelPartial,
    PromptTooLong,
)
from ..settings import HealthSettings, Settings, load_settings
from ..text import Text, t
from . import status_line
from .adapter_service import AdapterService
from .adapter_service import Loaded as Loaded
from .adapter_service import LocalAdapter as LocalAdapter
from .adapters_in_use import AdapterUsage
from .client import ChatClient
from .conversation import Conversation
from .documents import Document
from .download_queue import DownloadQueue, Queued
from .health import EngineState, HealthPoller, HealthStatus, get_poller

if TYPE_CHECKING:
    from ..adapters.hub_runtime import Progress

logger = logging.getLogger(__name__)


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
        self._warm: asyncio.Task[None] | None = None
        # Shared by every chat of this process: last use and answers streaming per adapter (LRU eviction).
        self.adapter_usage = AdapterUsage()
        self.downloads = DownloadQueue()  # one hub download at a time per server
        self._votes: VoteStore | None = None
        self.adapters = AdapterService(self)  # loading, unloading and listing adapters
        self._server_limit: tuple[int, float] | None = None  # (N an engine's 400 named, that state's since)

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
        """For the always-visible status line, in the viewer's language (status_line.py)."""
        return status_line.status_json(self.poller.status, self.settings, lang)

    def ui_restart_note(self, *, now: float | None = None, shown_for: float = 600.0) -> Text | None:
        return status_line.ui_restart_note(now=now, shown_for=shown_for)

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

    # ------------------------------------------------------------ adapters (adapter_service.py)

    def excluded_adapters(self) -> dict[str, Text]:
        return self.adapters.excluded_adapters()

    async def local_adapters(self, status: HealthStatus) -> list[LocalAdapter]:
        return await self.adapters.local_adapters(status)

    @staticmethod
    def adapter_rank(root: str | None) -> int | None:
        return AdapterService.adapter_rank(root)

    async def needs_runtime_load(self, model: str) -> bool:
        return await self.adapters.needs_runtime_load(model)

    def static_adapters(self) -> frozenset[str]:
        return self.adapters.static_adapters()

    async def ensure_loaded(self, name: str, status: HealthStatus | None = None) -> Loaded | None:
        return await self.adapters.ensure_loaded(name, status)

    async def add_hub_adapter(
        self, text: str, on_progress: Progress | None = None, on_queued: Queued | None = None, *, who: str | None = None
    ) -> tuple[str, Loaded | None]:
        return await self.adapters.add_hub_adapter(text, on_progress, on_queued, who=who)

    async def unload(self, name: str, status: HealthStatus, *, who: str | None = None) -> None:
        await self.adapters.unload(name, status, who=who)

    def adapters_overview(self, status: HealthStatus, local: list[LocalAdapter], lang: str) -> str:
        return self.adapters.adapters_overview(status, local, lang)

    def is_operator(self, who: str | None) -> bool:  # roles.py: who may change what everyone is served
        return roles.is_operator(self.settings, who)

    def require_operator(self, who: str | None, action: str, *, downloads: bool = False) -> None:
        roles.require_operator(self.settings, who, action, downloads=downloads)

    async def operator_report(self, *, who: str | None, answering: Mapping[str, int], lang: str | None) -> str:
        """The operator's /status (operator_status.gather); OperatorOnly for anyone else."""
        from .operator_status import gather

        self.require_operator(who, "engine")
        return await gather(self, answering, lang)

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

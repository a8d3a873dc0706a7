"""One chat turn: wait for the engine, load the chosen adapter, fit the history, stream the answer,
and say what went wrong, all shown through a ``Renderer`` (backend/ui/views.py ``ChatView`` draws it with Chainlit).

    outcome = await turn.answer(session, service, view)   # ANSWERED or FAILED; Stop raises CancelledError
    await turn.load_adapter(session, service, view, name)  # the user picked an adapter that is not served
    outcome = await turn.answer(session, service, view, model="pirate", record=keep)  # one side of a compare

The policy, in order:

- Wait while the model loads, with a live step; a DOWN engine or a wait that runs out is an error
  with Retry.
- An adapter chosen from [lora].dir but not served (chosen before a restart, restored on reload,
  evicted for another chat's load) is loaded first; if that fails the chat goes back to the default
  model. In a fleet the same goes for one that some ready replicas lack (loaded on those); one that cannot be
  loaded from there (``ModelPartial``) is handled like an adapter the engine no longer serves. A load
  into full slots evicts the least recently used runtime adapter; the step names it.
- While the answer streams, its adapter is marked in use (``Service.adapter_usage``): never evicted.
- The history is fitted into the token budget; the earlier turns left out are listed afterwards. When the engine
  refuses the prompt naming a smaller context (vLLM's 400 "This model's maximum context length is N tokens"), the
  history is fitted again to N and sent once more before any token, with a step saying so.
- The answer streams; the footer says who answered, how much, how long (the answer's own time, from the request
  sent, or from its first token when it queued in the engine; apart, the wait before it when a wait step was
  shown: the model loading, an adapter load, the queue), and the context meter, and
  in one line how it ended unless it was a plain stop (reply limit, content filter, a tool call, an
  unknown or missing finish reason). An answer with no text is never shown as a bare footer: it is
  an error bubble saying why, with Retry. A stream cut short (``StreamCut``) is an interrupted answer.
- Failures: a message too long for the model offers a trimmed version; Stop keeps what was shown,
  marked, and lets ``CancelledError`` through; an engine that vanished before any text is waited
  for and asked once more; a fleet whose router answered with a 5xx or 429 is waited for (with the live step) and
  asked again for as long as the health poller says it is coming back (a probe through it fails too: restarted, its
  workers not in yet; or its supervisor says starting/restarting), and one whose router said it has no worker
  (``NoWorkerAvailable``: nothing was generated) is asked again as soon as a probe through it answers; all of it
  within ``[ui] wait_for_ready`` seconds from the router's first refusal, never a fixed number of tries (a router
  that was down, then back but not routing yet, then flapping while its workers come in: issue #28); an adapter
  the engine no longer serves switches the chat back to the default model; any other error of ours says what
  happened (Retry when resending may help); a bug in the app says so, with the request id the log has.

What was shown is what the history holds: an answer cut by an error or Stop is kept, marked
interrupted; one that never showed any text is removed and not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from backend.web import metrics

from ..errors import (
    ConnectionLost,
    ContextOverflow,
    EngineError,
    MessageTooLong,
    ModelNotFound,
    ModelPartial,
    NoWorkerAvailable,
    Overloaded,
    PromptTooLong,
    QwenChatError,
    ServerStarting,
    ServerUnreachable,
)
from ..text import t
from .budget import FitResult
from .client import Finish, ReasoningDelta, TextDelta, Usage, new_request_id
from .documents import Document
from .endings import no_text_message
from .health import EngineState, HealthStatus
from .service import Service, sampling_body
from .session import ChatSession

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How a turn (or one attempt at it) ended. Stop is not an outcome: ``CancelledError`` propagates."""

    ANSWERED = "answered"  # the answer was shown and recorded
    FAILED = "failed"  # an error was shown, with Retry or "Send trimmed" where they can help
    ENGINE_GONE = "engine_gone"  # attempt() only: the engine vanished before any text; worth waiting for it


@dataclass(frozen=True)
class Reply:
    """A finished answer and what its footer reports."""

    text: str  # as streamed; the history keeps this, without the footer
    model: str  # the model that served it
    usage: Usage | None
    finish: Finish | None
    fitted: FitResult  # the context meter
    seconds: float  # the answer's own time: from the request sent (from the first token if it queued) to the last
    waited: float | None = None  # the wait before that (model load, adapter load, queue); None: no wait was shown


class StepView(Protocol):
    """A progress line on screen (``chainlit.Step`` is one): set its title and detail, then update it."""

    name: str
    output: str

    async def update(self) -> Any: ...


class Renderer(Protocol):
    """What a turn shows, and how; backend/ui/views.py draws it with Chainlit messages, steps and buttons.

    One per turn. Each attempt starts a bubble with ``new_answer``, which is then shown
    (``show_answer``), kept cut (``keep_partial``) or removed (``drop_answer``); a turn that fails
    before any token may leave it unshown. Texts come ready to show, in ``lang``; the buttons are
    the renderer's, bound to the latest user turn.
    """

    lang: str  # the language every text of the turn is in

    def step(self, title: str) -> AbstractAsyncContextManager[StepView]:
        """A progress line (the wait for the engine, an adapter load), final when the block ends."""
        ...

    async def new_answer(self, model: str) -> None:
        """A fresh answer bubble by ``model``, not shown before its first token."""

    async def stream_token(self, token: str) -> None:
        """Stream answer text into the bubble."""

    async def stream_reasoning(self, token: str) -> None:
        """Stream the model's reasoning, apart from the answer."""

    async def reasoning_done(self) -> None:
        """The reasoning (if any was shown) streams no more: the answer ended, failed or was stopped."""

    async def show_answer(self, reply: Reply) -> str:
        """Show the finished answer with its footer; returns the bubble's id (the history's turn id)."""
        ...

    async def keep_partial(self, text: str, model: str, why: str) -> str:
        """Show the cut answer marked with ``why``; returns the bubble's id."""
        ...

    async def drop_answer(self) -> None:
        """Remove the answer bubble: no text reached it."""

    async def show_error(self, text: str, *, retry: bool = False, trimmed: str | None = None) -> None:
        """An error bubble; with Retry, or with "Send trimmed" that sends ``trimmed`` in place of the message."""

    async def offer_cut(self, text: str, *, document: int, part: int, label: str) -> None:
        """An error bubble saying a document does not fit, with a button that sends only its first ``part`` pages
        (or lines) of the latest user turn's ``document`` (by index), labelled ``label``."""

    async def model_changed(self) -> None:
        """The chat's model changed (an adapter loaded, or back to the default): show the choice again."""

    async def left_out(self, fitted: FitResult) -> None:
        """After an answer: the earlier turns that were not sent (often none)."""


class Recorder(Protocol):
    """Where an answer goes once shown: ``(turn_id, text, model, interrupted)``; the conversation by default."""

    def __call__(self, turn_id: str, text: str, model: str, interrupted: bool) -> Any: ...


async def answer(
    session: ChatSession,
    service: Service,
    view: Renderer,
    *,
    model: str | None = None,
    record: Recorder | None = None,
) -> Outcome:
    """Answer the last user turn; if the engine vanished before any text, wait for it and try once more.

    By default the chat's chosen model answers and the answer joins the conversation. With ``model`` that
    model answers (a compare side: a failure never changes the chat's choice) and ``record`` receives the
    answer (shown or cut) instead of the conversation.
    """
    turn = _Turn(session, service, view, model=model, record=record)
    outcome = await turn.attempt(may_wait_again=True)
    while outcome is Outcome.ENGINE_GONE:  # once for an engine gone; a router coming back: until its deadline
        outcome = await turn.attempt(may_wait_again=False)
    return outcome


async def load_adapter(session: ChatSession, service: Service, view: Renderer, model: str) -> None:
    """Load an adapter from [lora].dir now, with a step; if that fails the chat goes back to the default model."""
    await _Turn(session, service, view).load_adapter(model)


@dataclass
class _Attempt:
    """One attempt's state so far: what its error handling and its count in /metrics need."""

    rid: str
    model: str  # the model that answers (after a runtime adapter load, the one loaded)
    t0: float = field(default_factory=time.monotonic)
    sent: float | None = None  # when the request went to the engine
    first: float | None = None  # when its first token came
    waits: bool = False  # the turn showed a wait step: the model loading, an adapter load, the engine's queue
    queued: bool = False  # the request waited in the engine's queue (its wait step was shown)
    text: str = ""
    usage: Usage | None = None
    finish: Finish | None = None
    ended: str | None = None  # how it ended, for /metrics: "ok" or an error code; None: not counted (retried)


class _Turn:
    """One turn's parts, shared by its attempts."""

    def __init__(
        self,
        session: ChatSession,
        service: Service,
        view: Renderer,
        *,
        model: str | None = None,
        record: Recorder | None = None,
    ) -> None:
        self.session, self.service, self.view = session, service, view
        self.fixed_model = model  # a compare side: this model answers, whatever the chat's choice
        # a fleet's router that refused the message: asked again until then (monotonic; [ui] wait_for_ready from
        # its first refusal), for as long as the poller says it is coming back
        self.router_deadline: float | None = None

        def add(turn_id: str, text: str, model: str, interrupted: bool) -> None:
            session.conversation.add_assistant(turn_id, text, model, interrupted=interrupted)

        self.record: Recorder = record or add

    def model(self) -> str:
        return self.fixed_model or self.session.model or self.service.default_model(self.service.poller.status)

    async def attempt(self, *, may_wait_again: bool) -> Outcome:
        """One attempt; ENGINE_GONE when the engine died before any text and it is worth waiting."""
        model, rid = self.model(), new_request_id()
        await self.view.new_answer(model)
        a = _Attempt(rid, model)
        try:
            if not await self._ready_for(a):
                return Outcome.FAILED
            fitted = await self._stream(a)
            if not await self._show(a, fitted):
                return Outcome.FAILED
        except asyncio.CancelledError:
            # Stop button: Chainlit cancels this task; the client closes the upstream request.
            a.ended = metrics.STOPPED
            await self.keep_partial(a.text, a.model, t("stopped", self.view.lang))
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is said there, a bug in the app included
            return await _failed(self, a, exc, may_wait_again=may_wait_again)
        else:
            # The answer is recorded: a failure or Stop from here on must not record it again as interrupted.
            try:
                await self.view.left_out(fitted)
            except Exception:  # the answer stands; the left-out note is extra
                logger.exception("[%s] could not show the left-out turns", rid)
            return Outcome.ANSWERED
        finally:
            if a.ended is not None:
                metrics.METRICS.outcome(a.ended, a.model)
            with contextlib.suppress(Exception):  # never left streaming after an error or Stop
                await self.view.reasoning_done()

    async def _ready_for(self, a: _Attempt) -> bool:
        """The engine answering and the model served (a runtime adapter loaded first); False (said) when not."""
        service = self.service
        a.waits = not service.poller.status.answering  # a wait step while the model loads
        if not await self.wait_for_engine():
            down = service.poller.status.state is EngineState.DOWN
            a.ended = metrics.ENGINE_DOWN if down else ServerStarting.code
            return False
        status = service.poller.status
        lacking = status.lacking(a.model)  # a fleet: some ready replicas serve it, some not (not offered)
        if lacking and not await service.needs_runtime_load(a.model):
            # the router could send it to a replica lacking it: say so now rather than "model not found" later
            raise ModelPartial(a.model, status.replicas_named(lacking, self.view.lang))
        if await service.needs_runtime_load(a.model):  # e.g. chosen before a restart, restored on reload
            a.waits = True
            if not await self.load_adapter(a.model) and self.fixed_model:
                a.ended = metrics.ADAPTER
                return False  # a compare side: its error is shown, the chat's choice unchanged
            a.model = self.model()
            await self.view.new_answer(a.model)  # nothing shown yet: the bubble is by the model that answers
        return True

    async def _stream(self, a: _Attempt) -> FitResult:
        """Fit the history and stream the answer into the view (``a`` keeps its text, usage and finish)."""
        last = self.session.conversation.last_user()
        if last is not None:
            await self.service.check_message_length(last.content)
        fitted = await self.service.fit_conversation(self.session.conversation, self.session.system_prompt)
        try:
            await self._stream_fitted(a, fitted)
        except ContextOverflow as exc:
            # The engine's context is smaller than it said (a proxy, a router, a wrong [model].max_model_len):
            # fit again to the length it named and ask once more, before any token; a second refusal is said.
            limit = exc.server_limit
            if a.first is not None or limit is None or not self.service.learn_context_limit(limit):
                raise
            logger.info(
                "[%s] the engine's context is %d tokens, not %d: fitting again", a.rid, limit, fitted.max_model_len
            )
            fitted = await self._refit(limit)
            await self._stream_fitted(a, fitted)
        return fitted

    async def _refit(self, limit: int) -> FitResult:
        """The conversation fitted again to the engine's ``limit`` (earlier turns first; a message or document that
        does not fit raises PromptTooLong, said like any other: a document is never cut silently), with a step."""
        fitted = await self.service.fit_conversation(self.session.conversation, self.session.system_prompt)
        lang, n = self.view.lang, fitted.left_out
        key = "context_refit." + ("fits" if n == 0 else "left_out.one" if n == 1 else "left_out.many")
        async with self.view.step(t(key, lang, limit=limit, n=n)) as step:
            step.output = fitted.meter_text(lang)
        return fitted

    async def _stream_fitted(self, a: _Attempt, fitted: FitResult) -> None:
        """Stream ``fitted`` with the queued note running until the first token."""
        queued = asyncio.create_task(self._queued_note(a), name="qwenchat-queued-note")  # until the first token
        try:
            await self._stream_events(a, fitted, queued)
        finally:
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)  # a Stop meanwhile still cancels this turn

    async def _queued_note(self, a: _Attempt) -> None:
        """Until cancelled (the first token, the end): while requests wait in the engine (vLLM's /metrics, read
        by the shared poller), a wait step "queued: 3 answers ahead · engine busy", updated at each poll."""
        async with contextlib.AsyncExitStack() as stack:
            sub = self.service.poller.subscribe()
            stack.push_async_callback(sub.aclose)
            step: StepView | None = None
            async for status in sub:
                load = status.load
                if load is None or not load.busy:
                    continue
                title = t("queued.one" if load.waiting == 1 else "queued.many", self.view.lang, ahead=load.waiting)
                if step is None:
                    a.waits = a.queued = True
                    step = await stack.enter_async_context(self.view.step(title))
                elif step.name != title:
                    step.name = title
                    await step.update()

    async def _stream_events(self, a: _Attempt, fitted: FitResult, queued: asyncio.Task[None]) -> None:
        """Stream the answer into the view; ``queued`` (the wait step) is cancelled at the first token."""
        service, view, model = self.service, self.view, a.model
        first = True
        # While it streams, the adapter is in use: never the one evicted to make room for another load.
        with service.adapter_usage.streaming(model), metrics.METRICS.streaming():
            a.sent = time.monotonic()
            async with contextlib.aclosing(
                service.client.stream(
                    fitted.messages,
                    model,
                    max_tokens=service.reply_tokens(),
                    sampling=sampling_body(self.session.sampling),
                    request_id=a.rid,
                    # a user with answers already streaming yields to one with none (issue #20)
                    priority=self.session.ahead if service.settings.priority_scheduling else 0,
                )
            ) as events:
                async for ev in events:
                    if first and isinstance(ev, (TextDelta, ReasoningDelta)):
                        first = False
                        queued.cancel()  # the wait step, if any, ends with the first token
                        a.first = time.monotonic()
                        metrics.METRICS.first_token(model, a.first - a.t0)
                    if isinstance(ev, TextDelta):
                        a.text += ev.text
                        await view.stream_token(ev.text)
                    elif isinstance(ev, ReasoningDelta) and service.settings.ui.show_reasoning:
                        await view.stream_reasoning(ev.text)
                    elif isinstance(ev, Usage):
                        a.usage = ev
                    elif isinstance(ev, Finish):
                        a.finish = ev

    async def _show(self, a: _Attempt, fitted: FitResult) -> bool:
        """The answer shown with its footer and recorded; False (said why) when it carried no text."""
        view, finish = self.view, a.finish
        if not a.text.strip():
            # No answer text (a tool call, a content filter, reasoning only): say why; a footer never stands alone.
            logger.info("[%s] the answer carried no text (finish %s)", a.rid, finish.reason if finish else None)
            with contextlib.suppress(Exception):
                await view.drop_answer()
            await view.show_error(no_text_message(finish, view.lang), retry=True)
            a.ended = metrics.NO_TEXT
            return False
        served = finish.model if finish and finish.model else a.model
        end = time.monotonic()
        # The answer's own time apart from the wait before it: a cold start's first answer is not "158.3 s".
        began = (a.first if a.queued else a.sent) or a.t0
        reply = Reply(a.text, served, a.usage, finish, fitted, end - began, began - a.t0 if a.waits else None)
        turn_id = await view.show_answer(reply)
        self.record(turn_id, a.text, served, False)
        a.ended = metrics.OK
        metrics.METRICS.answered(served, end - a.t0)  # from the message, wait included (see its help)
        return True

    async def wait_for_engine(self) -> bool:
        """Wait (with a live step) while the model loads; False when the user must retry later."""
        poller, view, lang = self.service.poller, self.view, self.view.lang
        status = poller.status
        if status.answering:
            return True
        if status.state is EngineState.DOWN:
            await view.show_error(t("engine_down", lang, reason=status.text(lang) or "?"), retry=True)
            return False
        t0 = time.monotonic()
        meter = await self._waiting_meter()
        async with view.step(t("loading", lang, elapsed=0)) as step:

            async def progress(elapsed: float, st: HealthStatus) -> None:
                nonlocal meter
                if self.service.counter_may_change():  # the model's tokenizer has come: count exactly now
                    meter = await self._waiting_meter()
                step.name = t("loading", lang, elapsed=time.monotonic() - t0)
                step.output = "\n\n".join(part for part in (st.text(lang), meter) if part)
                await step.update()

            status = await poller.wait_until_ready(self._wait_limit(), on_progress=progress)
            # Never "ready" on a wait that ran out or ended with the engine down.
            step.name = t(
                "loading_done" if status.answering else "loading_gave_up", lang, elapsed=time.monotonic() - t0
            )
        if status.answering:
            return True
        if status.state is EngineState.DOWN:
            await view.show_error(t("engine_down", lang, reason=status.text(lang) or "?"), retry=True)
        else:
            await view.show_error(ServerStarting(time.monotonic() - t0).user_text(lang), retry=True)
        return False

    def _wait_limit(self) -> float:
        """Seconds a wait for the engine may last: [ui] wait_for_ready, or what is left of the router's deadline."""
        limit = self.service.settings.ui.wait_for_ready
        if self.router_deadline is not None:
            limit = min(limit, max(0.0, self.router_deadline - time.monotonic()))
        return limit

    async def _waiting_meter(self) -> str:
        """The waiting message's context meter, as the counter has it now: "context: ≈31 / 7,168 tokens" while the
        model's tokenizer is not there yet (a cold start), exact once it is; "" when it cannot be said (too long:
        the answer's attempt says so)."""
        try:
            fitted = await self.service.fit_conversation(self.session.conversation, self.session.system_prompt)
        except Exception as exc:  # noqa: BLE001 - a detail of the wait; the attempt fits again and says what fails
            logger.debug("no context meter while waiting: %s", exc)
            return ""
        return fitted.meter_text(self.view.lang)

    async def load_adapter(self, model: str) -> bool:
        """See ``load_adapter``; the choice is shown again either way. False when the load failed.

        For a compare side (``fixed_model``) the chat's own choice stays as it was."""
        service, view, lang = self.service, self.view, self.view.lang
        try:
            async with view.step(t("loading_adapter", lang, name=model)) as step:
                loaded = await service.ensure_loaded(model)
                if loaded is not None and loaded.evicted:  # the title says it: the user sees which one went
                    step.name = step.output = t("adapter_evicted", lang, name=model, evicted=loaded.evicted)
                elif loaded is not None:
                    step.output = t("adapter_loaded", lang, name=model)
        except QwenChatError as exc:
            if not self.fixed_model:
                self.session.model = service.default_model(service.poller.status)
            await view.show_error(exc.user_text(lang))
            await view.model_changed()
            return False
        except asyncio.CancelledError:  # Stop during the load: the adapter is not there, do not keep it chosen
            if not self.fixed_model:
                self.session.model = service.default_model(service.poller.status)
            with contextlib.suppress(Exception):
                await view.model_changed()
            raise
        await view.model_changed()
        return True

    async def keep_partial(self, text: str, model: str, why: str) -> None:
        """What was shown stays, visibly marked; the history holds it as interrupted."""
        if not text:
            with contextlib.suppress(Exception):
                await self.view.drop_answer()
            return
        turn_id = None
        with contextlib.suppress(Exception):  # the bubble may be gone (websocket); the history still holds it
            turn_id = await self.view.keep_partial(text, model, why)
        self.record(turn_id or str(uuid.uuid4()), text, model, True)


# ---------------------------------------------------------------- the failure stage of an attempt


async def _failed(turn: _Turn, a: _Attempt, exc: Exception, *, may_wait_again: bool) -> Outcome:
    """Say why the attempt failed and keep what was shown, marked; ENGINE_GONE: worth waiting for the engine."""
    service, view, lang, rid, model = turn.service, turn.view, turn.view.lang, a.rid, a.model
    if not a.text and await _router_coming_back(turn, exc):
        logger.info("[%s] the fleet's router did not route it (%s): waiting for it", rid, type(exc).__name__)
        return Outcome.ENGINE_GONE  # not counted: the next attempt is
    if isinstance(exc, (PromptTooLong, MessageTooLong)):
        a.ended = exc.code
        await _offer_trimmed(turn, a, exc)
    elif isinstance(exc, (ServerUnreachable, ConnectionLost)):
        # The engine went away (crash, kill, restart): say why, and if nothing was shown yet,
        # wait for the supervisor to bring it back like during start-up, then try once more.
        logger.info("[%s] engine connection failed: %s", rid, exc.code)
        status = await service.status_after_failure()
        if not a.text and may_wait_again and not status.answering and status.state is not EngineState.DOWN:
            return Outcome.ENGINE_GONE  # not counted: the next attempt is
        a.ended = exc.code
        await turn.keep_partial(a.text, model, t("interrupted", lang))
        why = status.text(lang) if not status.answering else ""
        await view.show_error(
            exc.user_text(lang) + (f"\n\n{t('engine_state', lang, reason=why)}" if why else ""), retry=True
        )
    elif isinstance(exc, ModelNotFound):
        # The adapter is gone (unloaded elsewhere, engine restarted): left selected, every later message fails.
        logger.info("[%s] model %r is not served", rid, model)
        a.ended = exc.code
        await turn.keep_partial(a.text, model, t("interrupted", lang))
        default = service.default_model(service.poller.status)
        if model == default or turn.fixed_model:
            await view.show_error(exc.user_text(lang))
        else:
            turn.session.model = default
            await view.model_changed()
            await view.show_error(f"{exc.user_text(lang)}\n\n{t('model_reset', lang, model=default)}", retry=True)
    elif isinstance(exc, QwenChatError):
        logger.info("[%s] answer failed: %s", rid, exc.code)
        a.ended = exc.code
        await turn.keep_partial(a.text, model, t("interrupted", lang))
        await view.show_error(exc.user_text(lang), retry=getattr(exc, "retryable", True))
    else:  # a bug in the app, not the engine's fault: say so; the log has the id
        logger.error("[%s] unexpected failure", rid, exc_info=exc)
        a.ended = metrics.APP_ERROR
        await turn.keep_partial(a.text, model, t("interrupted", lang))
        await view.show_error(t("app_error", lang, rid=rid), retry=True)
    return Outcome.FAILED


async def _router_coming_back(turn: _Turn, exc: Exception) -> bool:
    """A fleet's router refused the message before any text (a 5xx or 429): True when it is worth asking again,
    until ``router_deadline``: a probe through it now fails too or its supervisor says it (re)starts (the poller
    says STARTING: the next attempt waits with the live step), or it said it had no worker (``NoWorkerAvailable``,
    nothing generated) and a probe through it answers now (its workers came in meanwhile)."""
    poller = turn.service.poller
    no_worker = isinstance(exc, NoWorkerAvailable)
    if not no_worker and not (isinstance(exc, (Overloaded, EngineError)) and poller.status.replicas):
        return False
    now = time.monotonic()
    if turn.router_deadline is None:
        turn.router_deadline = now + turn.service.settings.ui.wait_for_ready
    if now >= turn.router_deadline:
        return False
    status = await poller.refresh(probe=True)
    if status.state is EngineState.STARTING:
        return True
    return no_worker and status.answering


async def _offer_trimmed(turn: _Turn, a: _Attempt, exc: PromptTooLong | MessageTooLong) -> None:
    """A message too long for the model: say so, with a trimmed version to send instead when one can be made."""
    view, lang = turn.view, turn.view.lang
    last = turn.session.conversation.last_user()
    if last is not None and last.documents and isinstance(exc, PromptTooLong):
        await _offer_cut(turn, a, exc, last.content, last.documents)
        return
    try:
        assert last is not None  # the message too long is the newest user turn
        trimmed = await turn.service.trimmed(last.content, exc)
    except Exception:  # without a trimmed version the numbers still help
        logger.exception("[%s] could not build a trimmed version", a.rid)
        await view.show_error(exc.user_text(lang))
    else:
        await view.show_error(exc.user_text(lang), trimmed=trimmed)


async def _offer_cut(turn: _Turn, a: _Attempt, exc: PromptTooLong, question: str, docs: tuple[Document, ...]) -> None:
    """A message with documents too long: never cut silently. Say how much of the largest document fits and
    offer to send that part (the user's choice), or that not even its first page fits."""
    view, lang = turn.view, turn.view.lang
    try:
        index, part = await turn.service.document_cut(question, docs, exc)
    except Exception:  # without the cut the numbers still help
        logger.exception("[%s] could not find the part of the document that fits", a.rid)
        await view.show_error(exc.user_text(lang))
        return
    doc = docs[index]
    unit = t(f"document.unit.{doc.unit}", lang)
    numbers = {"name": doc.name, "tokens": exc.tokens, "limit": exc.limit or exc.budget, "unit": unit}
    if part == 0:
        await view.show_error(t("document.too_long_none", lang, total=doc.units, **numbers))
        return
    text = t("document.too_long", lang, part=part, total=doc.units, **numbers)
    label = t("document.send_cut", lang, unit=unit, part=part, total=doc.units)
    await view.offer_cut(text, document=index, part=part, label=label)

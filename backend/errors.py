"""One exception family for everything the user can be told about.

Every class names its user-facing text in the catalog (``text.py``, key ``error.<code>``): what
happened and what the user can do, in English and Chinese. Its parameters are typed attributes
(``exc.seconds``, ``exc.setting``, ``exc.model`` …). The engine's HTTP answers are translated into
these in one table, ``engine_http.status_error``, and transport failures in
``engine_http.transport_error``, most specific first, keeping the cause (``raise X(...) from exc``):
chat, ``/tokenize``, ``/v1/models``, health and adapter load/unload all go through them. The families
of one feature live beside it (marked below: ``module.Class``, see the module).

    QwenChatError                  base: ``user_text(lang)``, ``code``
    ├── ConfigError                a config.toml / environment value is wrong
    ├── PreflightError             found before vLLM is launched
    │   ├── ModelPathError         model folder missing or without config.json
    │   ├── PortInUse              a port we must bind is taken
    │   ├── ExposureRefused        the UI would be reachable from other machines without login
    │   ├── EngineUnavailable      the requested engine cannot run here (e.g. GPU forced, no GPU)
    │   ├── ReplicaNotOpenAI       a [fleet] remote replica is not an OpenAI server (HTML, 404, not JSON)
    │   ├── ReplicaKeyRefused      a [fleet] remote replica refused the engine key
    │   ├── FleetModelsDiffer      the fleet's replicas serve different base models
    │   └── EngineStartFailed      vLLM exited or never became healthy
    ├── AdapterError               a LoRA adapter cannot be used
    │   ├── AdapterRejected        the adapter doctor found errors
    │   ├── AdapterPathRefused     name escapes the adapters folder
    │   ├── AdapterLimitReached    --max-loras / --max-cpu-loras reached
    │   ├── AdapterRuntimeDisabled the engine has no /v1/load_lora_adapter route
    │   ├── AdapterFileRefused     a runtime load with a symlink or a pickled weights file
    │   ├── AdapterStatic          /unload of an adapter served from the start ([lora].modules)
    │   ├── AdapterAnswering       /unload of an adapter an answer streams from
    │   ├── AdapterSlotsBusy       every runtime adapter slot is answering: nothing can be evicted
    │   ├── AdapterFleetPartial    a runtime load/unload sent to every fleet replica failed on some of them
    │   ├── AdapterDownloadFailed  an adapter added by hub id (/adapters owner/name) could not be downloaded
    │   └── AdapterNameTaken       /adapters owner/name when that name is served already, from another source
    ├── merge.MergeError           (see backend/tools/merge.py) merging a LoRA into its base was refused or failed
    ├── roles.OperatorOnly         (see backend/chat/roles.py) what only an operator may do ([login] operators)
    │   └── PublicWithoutLogin     a hub download on a UI open to others without login ([network] public)
    ├── PromptTooLong              the newest user message alone exceeds the budget
    ├── SystemPromptTooLong        the system prompt leaves no room for any message
    ├── MessageTooLong             a message above [ui] max_message_tokens (its text quoted back)
    ├── preferences.SystemPromptRefused  (see backend/storage/preferences.py) a system prompt past the 32 KB cap
    ├── document_errors.DocumentError  (see backend/chat/document_errors.py) an attached file cannot be read as text
    │   ├── DocumentTooLarge       over [uploads] max_mb
    │   ├── TooManyDocuments       more files than [uploads] max_files in one message
    │   ├── DocumentTypeMismatch   the name's extension says one type, the content another
    │   ├── DocumentUnsupported    a type the chat does not read (an archive, an unknown binary)
    │   ├── DocumentBomb           a zip (DOCX, PPTX) declaring more than [uploads] max_unzipped_mb inflated
    │   ├── DocumentEncrypted      a PDF that needs a password
    │   ├── DocumentNoText         a PDF with no text layer (scanned): no OCR is done
    │   ├── DocumentUnreadable     a damaged file the converter could not read
    │   └── ImageNotSupported      an image, sent to a model that reads text only
    └── BackendError               talking to the engine failed
        ├── ServerUnreachable      connection refused / DNS: no connection could be made
        ├── ConnectionLost         the connection broke after it was made (reset, dropped mid-answer,
        │   │                      or the request body stopped going out)
        │   └── StreamCut          the answer's stream ended with neither a finish reason nor [DONE]
        ├── ServerStarting         the engine is still loading the model (raised by the health layer)
        ├── RequestTimeout         a time limit was hit (names the setting; e.g. /tokenize, adapter load)
        │   ├── ConnectTimeout
        │   ├── FirstTokenTimeout
        │   ├── IdleTimeout
        │   └── TotalTimeout
        ├── ContextOverflow        400 with param input_tokens / max_tokens
        ├── ModelNotFound          404 about the model (param "model"): unknown model or adapter
        │   └── ModelPartial       a fleet: served by some ready replicas, not all (so not offered)
        ├── AuthenticationFailed   401 / 403: the API key was refused
        ├── RequestRejected        any other 4xx (incl. a 404 for a wrong route): refused as sent
        ├── Overloaded             429 / 503
        │   └── NoWorkerAvailable  a fleet's router: 503 "No available workers" (restarted, its workers not in yet)
        ├── EngineError            other 5xx, or an error event inside a stream
        ├── EmptyAnswer            stream ended with no text and no finish reason
        ├── MalformedResponse      the server sent something that is not the API
        └── WebPageResponse        the server answered with a web page (HTML): a proxy or a login page
"""

from __future__ import annotations

from typing import Any, ClassVar

from .text import Text, t


class QwenChatError(Exception):
    """Base class: typed parameters, user text in en/zh from the catalog."""

    code: ClassVar[str] = "error"
    text_key: ClassVar[str] = "error.error"

    def __init__(self, detail: str | Text = "") -> None:
        self.detail = detail
        super().__init__(self.user_text("en"))

    @property
    def params(self) -> dict[str, Any]:
        """The placeholders of this error's text: its public attributes."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def as_text(self) -> Text:
        """This error's words to make later, in the reader's language (the status line, the status file)."""
        return Text(self.text_key, self.params)

    def user_text(self, lang: str | None = "en") -> str:
        try:
            return self.as_text().in_(lang)
        except (KeyError, IndexError, ValueError, TypeError):
            return f"{t(self.text_key, lang)} {self.params}"


# ---------------------------------------------------------------- configuration


class ConfigError(QwenChatError):
    """A configuration value is wrong; names the key, the value and what was expected."""

    code = "config"
    text_key = "error.config"

    def __init__(self, key: str, value: Any, expected: str) -> None:
        self.key, self.value, self.expected = key, value, expected
        super().__init__()


# ---------------------------------------------------------------- preflight


class PreflightError(QwenChatError):
    """Something checked before launching vLLM is wrong."""

    code = "preflight"


class ModelPathError(PreflightError):
    """The model folder is missing or is not a Hugging Face model folder."""

    code = "model_path"
    text_key = "error.model_path"

    def __init__(self, path: str, problem: str | Text) -> None:
        self.path, self.problem = path, problem
        super().__init__()


class PortInUse(PreflightError):
    """A port we must listen on is already taken."""

    code = "port_in_use"
    text_key = "error.port_in_use"

    def __init__(self, host: str, port: int, setting: str) -> None:
        self.host, self.port, self.setting = host, port, setting
        super().__init__()


class ExposureRefused(PreflightError):
    """``[network] ui_host`` is not loopback while login is off and ``[network] public`` is not set."""

    code = "exposure"
    text_key = "error.exposure"

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        super().__init__()


class EngineUnavailable(PreflightError):
    """The requested engine cannot run on this machine."""

    code = "engine_unavailable"
    text_key = "error.engine_unavailable"

    def __init__(self, engine: str, detail: str) -> None:
        self.engine = engine
        super().__init__(detail)


class EngineStartFailed(PreflightError):
    """vLLM exited during start-up or never became healthy."""

    code = "engine_start_failed"
    text_key = "error.engine_start_failed"

    def __init__(self, reason: str, log_path: str = "", tail: str = "") -> None:
        self.reason, self.log_path, self.tail = reason, log_path, tail
        super().__init__()


class ReplicaNotOpenAI(PreflightError):
    """A ``[fleet] remote`` replica answered GET /v1/models with something that is not an OpenAI model list."""

    code = "replica_not_openai"
    text_key = "error.replica_not_openai"

    def __init__(self, url: str, problem: str) -> None:
        self.url, self.problem = url, problem
        super().__init__()


class ReplicaKeyRefused(PreflightError):
    """A ``[fleet] remote`` replica refused the engine key (401/403)."""

    code = "replica_key_refused"
    text_key = "error.replica_key_refused"

    def __init__(self, url: str, status: int) -> None:
        self.url, self.status = url, status
        super().__init__()


class FleetModelsDiffer(PreflightError):
    """The fleet's replicas serve different base models (``replicas``: who serves what)."""

    code = "fleet_models_differ"
    text_key = "error.fleet_models_differ"

    def __init__(self, replicas: str) -> None:
        self.replicas = replicas
        super().__init__()


# ---------------------------------------------------------------- adapters


class AdapterError(QwenChatError):
    """A LoRA adapter cannot be used."""

    code = "adapter"


class AdapterRejected(AdapterError):
    """The adapter doctor found at least one error, or the engine refused to load the adapter."""

    code = "adapter_rejected"
    text_key = "error.adapter_rejected"

    def __init__(self, name: str, detail: str | Text) -> None:  # a Text: the doctor's findings, in the reader's words
        self.name = name
        super().__init__(detail)


class AdapterPathRefused(AdapterError):
    """An adapter name points outside the allowed adapters folder."""

    code = "adapter_path_refused"
    text_key = "error.adapter_path_refused"

    def __init__(self, name: str, folder: str) -> None:
        self.name, self.folder = name, folder
        super().__init__()


class AdapterLimitReached(AdapterError):
    """Loading another adapter would exceed the engine's LoRA slots."""

    code = "adapter_limit"
    text_key = "error.adapter_limit"

    def __init__(self, name: str, loaded: int, limit: int, setting: str) -> None:
        self.name, self.loaded, self.limit, self.setting = name, loaded, limit, setting
        super().__init__()


class AdapterRuntimeDisabled(AdapterError):
    """The engine answers 404 Not Found for /v1/load_lora_adapter: runtime LoRA updating is off."""

    code = "adapter_runtime_disabled"
    text_key = "error.adapter_runtime_disabled"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__()


class AdapterFileRefused(AdapterError):
    """A runtime load refused for its files: a symlinked folder or file, or pickled weights (only .safetensors).

    ``file`` is relative to the adapter's folder ("." for the folder itself): never a server path.
    """

    code = "adapter_file_refused"
    text_key = "error.adapter_file_refused"
    #: reason -> the catalog key of its text
    REASONS: ClassVar[dict[str, str]] = {
        "symlink_folder": "error.adapter_file.symlink_folder",
        "symlink": "error.adapter_file.symlink",
        "pickle": "error.adapter_file.pickle",
        "not_regular": "error.adapter_file.not_regular",
    }

    def __init__(self, name: str, file: str, reason: str) -> None:
        self.name, self.file, self.reason = name, file, reason
        super().__init__()

    def as_text(self) -> Text:
        return Text(self.REASONS.get(self.reason, self.text_key), {"name": self.name, "file": self.file})


class AdapterStatic(AdapterError):
    """/unload of an adapter passed with --lora-modules at launch: it could not come back without a restart."""

    code = "adapter_static"
    text_key = "error.adapter_static"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__()


class AdapterAnswering(AdapterError):
    """/unload of a runtime adapter that an answer (in any chat) is streaming from."""

    code = "adapter_answering"
    text_key = "error.adapter_answering"

    def __init__(self, name: str, answers: int) -> None:
        self.name, self.answers = name, answers
        super().__init__()


class AdapterSlotsBusy(AdapterError):
    """The adapter slots are full and every runtime adapter in them is answering: none can be evicted."""

    code = "adapter_slots_busy"
    text_key = "error.adapter_slots_busy"

    def __init__(self, name: str, slots: int, setting: str) -> None:
        self.name, self.slots, self.setting = name, slots, setting
        super().__init__()


class AdapterFleetPartial(AdapterError):
    """A runtime load or unload, sent to every fleet replica, failed on some of them (``adapters/runtime.py``).

    ``failures`` names each failed replica (number, host:port) and why; ``after`` says what was done about the
    others (the load undone, the unload undone, or what is left uneven; None when nothing). Catalog Texts:
    ``hide_error_paths`` takes server paths out of their plain-string parameters like any other error's.
    """

    code = "adapter_fleet_partial"
    text_key = "error.adapter_fleet_load"
    TEXTS: ClassVar[dict[str, str]] = {"load": "error.adapter_fleet_load", "unload": "error.adapter_fleet_unload"}

    def __init__(
        self,
        name: str,
        action: str,
        failed: tuple[int, ...],
        failures: Text,
        after: Text | None = None,
    ) -> None:
        self.name, self.action, self.failed, self.failures, self.after = name, action, failed, failures, after
        super().__init__()

    def as_text(self) -> Text:
        said = Text(self.TEXTS.get(self.action, self.text_key), {"name": self.name, "failures": self.failures})
        return Text("sentences", {"first": said, "then": self.after}) if self.after else said


class AdapterDownloadFailed(AdapterError):
    """An adapter added at run time by hub id (``/adapters owner/name[@revision]``) was not added: not a hub id, or
    its download failed (``detail``: the downloader's own text, e.g. 404, 401 naming HF_TOKEN, offline without a
    copy in the cache)."""

    code = "adapter_download"
    text_key = "error.adapter_download"

    def __init__(self, id: str, detail: Text) -> None:
        self.id = id
        super().__init__(detail)


class AdapterNameTaken(AdapterError):
    """``/adapters owner/name`` when ``owner/name`` is served already from another source (another revision, a
    ``[lora] modules`` entry): refused, the existing one named; nothing is replaced."""

    code = "adapter_name_taken"
    text_key = "names.taken"
    retryable = False

    def __init__(self, name: str, existing: str) -> None:
        self.name, self.existing = name, existing
        super().__init__()


# ---------------------------------------------------------------- budget


class PromptTooLong(QwenChatError):
    """The newest user message alone does not fit the token budget.

    ``limit`` is the most the message may have (for a trimmed version), when the budget knows it.
    """

    code = "prompt_too_long"
    text_key = "error.prompt_too_long"

    def __init__(self, tokens: int, system: int, budget: int, limit: int | None = None) -> None:
        self.tokens, self.system, self.budget, self.limit = tokens, system, budget, limit
        super().__init__()


class SystemPromptTooLong(QwenChatError):
    """The system prompt and the template leave (almost) no room for any message."""

    code = "system_prompt_too_long"
    text_key = "error.system_prompt_too_long"

    def __init__(self, system: int, budget: int) -> None:
        self.system, self.budget = system, budget
        super().__init__()


class MessageTooLong(QwenChatError):
    """A message above ``[ui] max_message_tokens``: refused before any fitting; ``text`` is the message, quoted."""

    code = "message_too_long"
    text_key = "limits.message_too_long"
    retryable = False

    def __init__(self, tokens: int, limit: int, text: str) -> None:
        self.tokens, self.limit, self.text = tokens, limit, text
        super().__init__()


# ---------------------------------------------------------------- backend


class BackendError(QwenChatError):
    """Talking to the engine failed. ``retryable`` says whether resending may help."""

    code = "backend"
    text_key = "error.backend"
    retryable: ClassVar[bool] = True


class ServerUnreachable(BackendError):
    """No connection could be made to the engine."""

    code = "unreachable"
    text_key = "error.unreachable"

    def __init__(self, url: str = "", detail: str = "") -> None:
        self.url = url
        super().__init__(detail)


class ConnectionLost(BackendError):
    """The connection to the engine broke after it was made (reset, closed mid-answer)."""

    code = "connection_lost"
    text_key = "error.connection_lost"


class StreamCut(ConnectionLost):
    """The answer's stream ended cleanly but early: no finish reason and no ``data: [DONE]``.

    What arrived may be only part of the answer (a proxy or the engine closed the response), so it
    is kept marked as interrupted, never shown as complete.
    """

    code = "stream_cut"
    text_key = "error.stream_cut"


class ServerStarting(BackendError):
    """The engine is up but still loading the model."""

    code = "starting"
    text_key = "error.starting"

    def __init__(self, elapsed: float = 0.0) -> None:
        self.elapsed = elapsed
        super().__init__()


class RequestTimeout(BackendError):
    """A time limit was hit; ``setting`` names it and ``what`` says what was being waited for."""

    code = "timeout"
    text_key = "error.timeout"
    default_setting: ClassVar[str] = "[client]"

    def __init__(self, seconds: float, setting: str | Text = "", what: Text | None = None) -> None:
        self.seconds = seconds
        self.setting = setting or self.default_setting
        self.what = what or Text("error.timeout.model_server")
        super().__init__()


class ConnectTimeout(RequestTimeout):
    """Connecting to the engine took longer than [client].connect_timeout."""

    code = "connect_timeout"
    text_key = "error.connect_timeout"
    default_setting = "[client].connect_timeout"


class FirstTokenTimeout(RequestTimeout):
    """No text arrived within [client].first_token_timeout."""

    code = "first_token_timeout"
    text_key = "error.first_token_timeout"
    default_setting = "[client].first_token_timeout"


class IdleTimeout(RequestTimeout):
    """The stream went silent for longer than [client].idle_timeout."""

    code = "idle_timeout"
    text_key = "error.idle_timeout"
    default_setting = "[client].idle_timeout"


class TotalTimeout(RequestTimeout):
    """The whole answer took longer than [client].total_timeout."""

    code = "total_timeout"
    text_key = "error.total_timeout"
    default_setting = "[client].total_timeout"


class ContextOverflow(BackendError):
    """The engine refused the request as too long (HTTP 400, param input_tokens/max_tokens).

    ``server_limit``: the context length the engine named ("This model's maximum context length is N tokens"),
    when it did: the turn fits the prompt again to it and asks once more."""

    code = "context_overflow"
    text_key = "error.context_overflow"
    retryable = False

    def __init__(self, detail: str | Text = "", server_limit: int | None = None) -> None:
        self.server_limit = server_limit
        super().__init__(detail)


class ModelNotFound(BackendError):
    """The engine does not serve the requested model or adapter (HTTP 404 with param "model")."""

    code = "model_not_found"
    text_key = "error.model_not_found"
    retryable = False

    def __init__(self, model: str = "", detail: str = "") -> None:
        self.model = model
        super().__init__(detail)


class ModelPartial(ModelNotFound):
    """A fleet: some ready replicas serve this model and some do not, so it is not offered (the router could send
    the request to one lacking it). ``replicas`` names those (number and host:port)."""

    code = "model_partial"
    text_key = "error.model_partial"

    def __init__(self, model: str = "", replicas: str = "") -> None:
        self.replicas = replicas
        super().__init__(model)


class AuthenticationFailed(BackendError):
    """The engine refused our API key (HTTP 401/403)."""

    code = "auth_failed"
    text_key = "error.auth_failed"
    retryable = False

    def __init__(self, status: int = 401, detail: str = "") -> None:
        self.status = status
        super().__init__(detail)


class RequestRejected(BackendError):
    """The engine refused the request as sent (a 4xx not covered by a more specific class)."""

    code = "rejected"
    text_key = "error.rejected"
    retryable = False

    def __init__(self, status: int = 400, detail: str = "") -> None:
        self.status = status
        super().__init__(detail)


class Overloaded(BackendError):
    """The engine is busy (HTTP 429/503)."""

    code = "overloaded"
    text_key = "error.overloaded"


class NoWorkerAvailable(Overloaded):
    """A fleet's router has no worker it may route to (vllm-router's 503 "No available workers"): it was restarted
    and has not admitted its workers yet, or their circuits are open. Nothing was generated: resending is safe."""

    code = "no_worker"
    text_key = "error.no_worker"


class EngineError(BackendError):
    """The engine failed while answering (5xx, or an error event inside the stream)."""

    code = "engine_error"
    text_key = "error.engine_error"


class EmptyAnswer(BackendError):
    """The stream ended with no text and no finish reason."""

    code = "empty_answer"
    text_key = "error.empty_answer"


class MalformedResponse(BackendError):
    """The server sent something that is not the OpenAI chat API."""

    code = "malformed"
    text_key = "error.malformed"


class WebPageResponse(BackendError):
    """The server answered with a web page (HTML, any status): a proxy, a login page, a wrong URL.

    ``url`` is where the request went (without any user:password), ``status`` the HTTP status,
    ``title`` the page's <title> ("" when it has none); ``page`` is the title as the text shows it.
    """

    code = "web_page"
    text_key = "error.web_page"

    def __init__(self, url: str, status: int, title: str = "") -> None:
        self.url, self.status, self.title = url, status, title
        self.page = f' "{title}"' if title else ""
        super().__init__()

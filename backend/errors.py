"""One exception family for everything the user can be told about.

Every class knows its user-facing text in English and Chinese: what happened,
and what the user can do. Lower-layer errors (openai SDK, aiohttp, OS) are
translated into these in one place each (``client.map_error`` for the chat API,
``template.RemoteCounter._post`` for vLLM's /tokenize), most specific first,
keeping the cause (``raise X(...) from exc``). One class lives outside this
module, next to the only code that raises it (marked below).

    QwenChatError                  base: ``user_text(lang)``, ``code``
    ├── ConfigError                a config.toml / environment value is wrong
    ├── PreflightError             found before vLLM is launched
    │   ├── ModelPathError         model folder missing or without config.json
    │   ├── PortInUse              a port we must bind is taken
    │   ├── EngineUnavailable      the requested engine cannot run here (e.g. GPU forced, no GPU)
    │   └── EngineStartFailed      vLLM exited or never became healthy
    ├── AdapterError               a LoRA adapter cannot be used
    │   ├── AdapterRejected        the adapter doctor found errors
    │   ├── AdapterPathRefused     name escapes the adapters folder
    │   ├── AdapterLimitReached    --max-loras / --max-cpu-loras reached
    │   └── AdapterRuntimeDisabled the engine has no /v1/load_lora_adapter route
    ├── merge.MergeError           (see backend/merge.py) merging a LoRA into its base was refused or failed
    ├── PromptTooLong              the newest user message alone exceeds the budget
    ├── SystemPromptTooLong        the system prompt leaves no room for any message
    └── BackendError               talking to the engine failed
        ├── ServerUnreachable      connection refused / DNS: no connection could be made
        ├── ConnectionLost         the connection broke after it was made (reset, dropped mid-answer,
        │                          or the request body stopped going out)
        ├── ServerStarting         the engine is still loading the model (raised by the health layer)
        ├── RequestTimeout         one of the four [client] limits was hit
        │   ├── ConnectTimeout
        │   ├── FirstTokenTimeout
        │   ├── IdleTimeout
        │   └── TotalTimeout
        ├── ContextOverflow        400 with param input_tokens / max_tokens
        ├── ModelNotFound          404 about the model (param "model"): unknown model or adapter
        ├── AuthenticationFailed   401 / 403: the API key was refused
        ├── RequestRejected        any other 4xx (incl. a 404 for a wrong route): refused as sent
        ├── Overloaded             429 / 503
        ├── EngineError            other 5xx, or an error event inside a stream
        ├── EmptyAnswer            stream ended with no text and no finish reason
        └── MalformedResponse      the server sent something that is not the API
"""

from __future__ import annotations

from typing import Any, ClassVar


def pick_language(lang: str | None) -> str:
    """Map a browser/Chainlit language tag ("zh-CN", "en-US", None) to "zh" or "en"."""
    return "zh" if (lang or "").lower().startswith("zh") else "en"


class QwenChatError(Exception):
    """Base class: carries parameters and renders user text in en/zh."""

    code: ClassVar[str] = "error"
    text_en: ClassVar[str] = "Something went wrong: {detail}"
    text_zh: ClassVar[str] = "出错了：{detail}"

    def __init__(self, detail: str = "", **params: Any) -> None:
        self.params: dict[str, Any] = {"detail": detail, **params}
        super().__init__(self.user_text("en"))

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(name)

    def user_text(self, lang: str | None = "en") -> str:
        template = self.text_zh if pick_language(lang) == "zh" else self.text_en
        try:
            return template.format(**self.params)
        except (KeyError, IndexError, ValueError, TypeError):
            return f"{template} {self.params}"


# ---------------------------------------------------------------- configuration


class ConfigError(QwenChatError):
    """A configuration value is wrong; names the key, the value and what was expected."""

    code = "config"
    text_en = "config error: {key} = {value!r}: expected {expected}"
    text_zh = "配置错误：{key} = {value!r}：应为 {expected}"

    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(key=key, value=value, expected=expected)


# ---------------------------------------------------------------- preflight


class PreflightError(QwenChatError):
    """Something checked before launching vLLM is wrong."""

    code = "preflight"


class ModelPathError(PreflightError):
    """The model folder is missing or is not a Hugging Face model folder."""

    code = "model_path"
    text_en = "model path {path}: {problem}. Set [model].path (or QWENCHAT_MODEL_PATH) to a folder with config.json and weights; leave it empty for the embedded default."
    text_zh = "模型路径 {path}：{problem}。请把 [model].path（或 QWENCHAT_MODEL_PATH）设为包含 config.json 和权重的文件夹；留空则使用内置默认模型。"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path=path, problem=problem)


class PortInUse(PreflightError):
    """A port we must listen on is already taken."""

    code = "port_in_use"
    text_en = "port {port} on {host} is already in use; change {setting} (or stop the program using it)."
    text_zh = "{host} 上的端口 {port} 已被占用；请修改 {setting}（或停止占用它的程序）。"

    def __init__(self, host: str, port: int, setting: str) -> None:
        super().__init__(host=host, port=port, setting=setting)


class EngineUnavailable(PreflightError):
    """The requested engine cannot run on this machine."""

    code = "engine_unavailable"
    text_en = "engine {engine!r} cannot run here: {detail}"
    text_zh = "引擎 {engine!r} 无法在此运行：{detail}"

    def __init__(self, engine: str, detail: str) -> None:
        super().__init__(detail, engine=engine)


class EngineStartFailed(PreflightError):
    """vLLM exited during start-up or never became healthy."""

    code = "engine_start_failed"
    text_en = "the engine failed to start: {reason}. Log: {log_path}\n{tail}"
    text_zh = "引擎启动失败：{reason}。日志：{log_path}\n{tail}"

    def __init__(self, reason: str, log_path: str = "", tail: str = "") -> None:
        super().__init__(reason=reason, log_path=log_path, tail=tail)


# ---------------------------------------------------------------- adapters


class AdapterError(QwenChatError):
    """A LoRA adapter cannot be used."""

    code = "adapter"


class AdapterRejected(AdapterError):
    """The adapter doctor found at least one error."""

    code = "adapter_rejected"
    text_en = "adapter {name!r} was not loaded: {detail}"
    text_zh = "适配器 {name!r} 未加载：{detail}"

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(detail, name=name)


class AdapterPathRefused(AdapterError):
    """An adapter name points outside the allowed adapters folder."""

    code = "adapter_path_refused"
    text_en = "adapter {name!r} refused: only folders directly inside {folder} can be loaded."
    text_zh = "拒绝加载适配器 {name!r}：只能加载 {folder} 目录下的文件夹。"

    def __init__(self, name: str, folder: str) -> None:
        super().__init__(name=name, folder=folder)


class AdapterLimitReached(AdapterError):
    """Loading another adapter would exceed the engine's LoRA slots."""

    code = "adapter_limit"
    text_en = "cannot load {name!r}: {loaded} adapters are loaded and the limit is {limit} ({setting}); unload one first or raise {setting}."
    text_zh = "无法加载 {name!r}：已加载 {loaded} 个适配器，上限为 {limit}（{setting}）；请先卸载一个或调高 {setting}。"

    def __init__(self, name: str, loaded: int, limit: int, setting: str) -> None:
        super().__init__(name=name, loaded=loaded, limit=limit, setting=setting)


class AdapterRuntimeDisabled(AdapterError):
    """The engine answers 404 Not Found for /v1/load_lora_adapter: runtime LoRA updating is off."""

    code = "adapter_runtime_disabled"
    text_en = "cannot load {name!r}: runtime adapter loading is disabled on the model server; set [lora].runtime_loading = true and restart (an external vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)."
    text_zh = "无法加载 {name!r}：模型服务器未启用运行时加载适配器；请设置 [lora].runtime_loading = true 并重启（外部 vLLM 需设置 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True）。"

    def __init__(self, name: str) -> None:
        super().__init__(name=name)


# ---------------------------------------------------------------- budget


class PromptTooLong(QwenChatError):
    """The newest user message alone does not fit the token budget."""

    code = "prompt_too_long"
    text_en = "your message is {tokens} tokens; with the system prompt ({system} tokens) and the reply reserve it must fit in {budget}. Nothing was sent. Shorten it, or send a trimmed version (start and end kept)."
    text_zh = "您的消息有 {tokens} 个词元；加上系统提示（{system} 个词元）和回复预留，必须在 {budget} 以内。消息未发送。请缩短，或发送保留开头和结尾的精简版本。"

    def __init__(self, tokens: int, system: int, budget: int) -> None:
        super().__init__(tokens=tokens, system=system, budget=budget)


class SystemPromptTooLong(QwenChatError):
    """The system prompt and the template leave (almost) no room for any message."""

    code = "system_prompt_too_long"
    text_en = "the system prompt and the chat template take {system} of the {budget} prompt tokens, leaving no room for your message. Nothing was sent. Shorten the system prompt (settings panel or [model].system_prompt), or lower [budget].reply_reserve."
    text_zh = "系统提示和对话模板占用了 {budget} 个提示词元中的 {system} 个，没有留给您消息的空间。消息未发送。请缩短系统提示（设置面板或 [model].system_prompt），或调低 [budget].reply_reserve。"

    def __init__(self, system: int, budget: int) -> None:
        super().__init__(system=system, budget=budget)


# ---------------------------------------------------------------- backend


class BackendError(QwenChatError):
    """Talking to the engine failed. ``retryable`` says whether resending may help."""

    code = "backend"
    retryable: ClassVar[bool] = True
    text_en = "the model server returned an error: {detail}"
    text_zh = "模型服务器返回错误：{detail}"


class ServerUnreachable(BackendError):
    """No connection could be made to the engine."""

    code = "unreachable"
    text_en = "cannot reach the model server at {url} ({detail}). If it is restarting, wait a moment and press Retry."
    text_zh = "无法连接模型服务器 {url}（{detail}）。如果它正在重启，请稍候再点“重试”。"

    def __init__(self, url: str = "", detail: str = "") -> None:
        super().__init__(detail, url=url)


class ConnectionLost(BackendError):
    """The connection to the engine broke after it was made (reset, closed mid-answer)."""

    code = "connection_lost"
    text_en = "the connection to the model server broke off ({detail}). What arrived is kept; press Retry."
    text_zh = "与模型服务器的连接中断（{detail}）。已收到的内容已保留；请点“重试”。"


class ServerStarting(BackendError):
    """The engine is up but still loading the model."""

    code = "starting"
    text_en = "the model is still loading after {elapsed:.0f} s ([ui].wait_for_ready); your message is kept — press Retry when the status line says ready."
    text_zh = "模型在 {elapsed:.0f} 秒后仍在加载（[ui].wait_for_ready）；您的消息已保留，状态行显示就绪后请点“重试”。"

    def __init__(self, elapsed: float = 0.0) -> None:
        super().__init__(elapsed=elapsed)


class RequestTimeout(BackendError):
    """One of the [client] time limits was hit."""

    code = "timeout"
    setting: ClassVar[str] = "[client]"
    text_en = "timed out after {seconds:g} s ({setting}); press Retry, or raise the limit."
    text_zh = "超时：{seconds:g} 秒（{setting}）；请点“重试”，或调高该限制。"

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds=seconds, setting=self.setting)


class ConnectTimeout(RequestTimeout):
    """Connecting to the engine took longer than [client].connect_timeout."""

    code = "connect_timeout"
    setting = "[client].connect_timeout"
    text_en = "could not connect to the model server within {seconds:g} s ({setting}); press Retry."
    text_zh = "在 {seconds:g} 秒内无法连接模型服务器（{setting}）；请点“重试”。"


class FirstTokenTimeout(RequestTimeout):
    """No text arrived within [client].first_token_timeout."""

    code = "first_token_timeout"
    setting = "[client].first_token_timeout"
    text_en = "the model did not start answering within {seconds:g} s ({setting}); it may be busy. Press Retry."
    text_zh = "模型在 {seconds:g} 秒内没有开始回答（{setting}），可能正忙。请点“重试”。"


class IdleTimeout(RequestTimeout):
    """The stream went silent for longer than [client].idle_timeout."""

    code = "idle_timeout"
    setting = "[client].idle_timeout"
    text_en = "the answer stalled: nothing arrived for {seconds:g} s ({setting}). What arrived is kept; press Retry for a full answer."
    text_zh = "回答中断：{seconds:g} 秒内没有新内容（{setting}）。已收到的内容已保留；点“重试”获取完整回答。"


class TotalTimeout(RequestTimeout):
    """The whole answer took longer than [client].total_timeout."""

    code = "total_timeout"
    setting = "[client].total_timeout"
    text_en = "the answer took longer than {seconds:g} s ({setting}) and was stopped. What arrived is kept."
    text_zh = "回答超过 {seconds:g} 秒（{setting}），已停止。已收到的内容已保留。"


class ContextOverflow(BackendError):
    """The engine refused the request as too long (HTTP 400, param input_tokens/max_tokens)."""

    code = "context_overflow"
    retryable = False
    text_en = "the conversation is too long for the model ({detail}). Start a new chat or shorten your message."
    text_zh = "对话超出模型的上下文长度（{detail}）。请新建对话或缩短消息。"


class ModelNotFound(BackendError):
    """The engine does not serve the requested model or adapter (HTTP 404 with param "model")."""

    code = "model_not_found"
    retryable = False
    text_en = "the model server does not serve {model!r}; pick another model or adapter from the list."
    text_zh = "模型服务器没有提供 {model!r}；请从列表中选择其他模型或适配器。"

    def __init__(self, model: str = "", detail: str = "") -> None:
        super().__init__(detail, model=model)


class AuthenticationFailed(BackendError):
    """The engine refused our API key (HTTP 401/403)."""

    code = "auth_failed"
    retryable = False
    text_en = "the model server refused the API key (HTTP {status}); check OPENAI_API_KEY or [server].api_key."
    text_zh = "模型服务器拒绝了 API 密钥（HTTP {status}）；请检查 OPENAI_API_KEY 或 [server].api_key。"

    def __init__(self, status: int = 401, detail: str = "") -> None:
        super().__init__(detail, status=status)


class RequestRejected(BackendError):
    """The engine refused the request as sent (a 4xx not covered by a more specific class)."""

    code = "rejected"
    retryable = False
    text_en = "the model server rejected the request (HTTP {status}): {detail}"
    text_zh = "模型服务器拒绝了该请求（HTTP {status}）：{detail}"

    def __init__(self, status: int = 400, detail: str = "") -> None:
        super().__init__(detail, status=status)


class Overloaded(BackendError):
    """The engine is busy (HTTP 429/503)."""

    code = "overloaded"
    text_en = "the model server is busy ({detail}); press Retry in a moment."
    text_zh = "模型服务器繁忙（{detail}）；请稍后点“重试”。"


class EngineError(BackendError):
    """The engine failed while answering (5xx, or an error event inside the stream)."""

    code = "engine_error"
    text_en = "the model server failed while answering: {detail}. Press Retry."
    text_zh = "模型服务器在回答时出错：{detail}。请点“重试”。"


class EmptyAnswer(BackendError):
    """The stream ended with no text and no finish reason."""

    code = "empty_answer"
    text_en = "the model server ended the answer without sending any text; press Retry."
    text_zh = "模型服务器没有返回任何文字就结束了回答；请点“重试”。"


class MalformedResponse(BackendError):
    """The server sent something that is not the OpenAI chat API."""

    code = "malformed"
    text_en = "the model server sent a response that could not be read ({detail}); press Retry."
    text_zh = "无法解析模型服务器的响应（{detail}）；请点“重试”。"

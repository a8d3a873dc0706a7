"""Every user-facing string, in English and Chinese: one catalog, one lookup.

    t("retry", "zh")                           # "重试"
    t("error.unreachable", "en", url=u, detail=d)
    both("health.ready")                       # ("the model is ready", "模型已就绪"): the status file and the
                                               # poller keep both, the browser picks one

Keys are grouped by prefix: ``error.<code>`` (one per exception class, see ``errors.py``),
``health.*`` (the status line), ``cause.*`` (why the engine stopped, from its log), ``supervisor.*``,
and plain keys for the chat UI. A test fails when a key lacks a language or a placeholder differs
between the two. Chainlit's own UI is translated in ``.chainlit/translations``.
"""

from __future__ import annotations

from typing import Any


def pick_language(lang: str | None) -> str:
    """Map a browser/Chainlit language tag ("zh-CN", "en-US", None) to "zh" or "en"."""
    return "zh" if (lang or "").lower().startswith("zh") else "en"


#: key -> (English, Chinese). Placeholders are str.format fields, the same in both.
CATALOG: dict[str, tuple[str, str]] = {
    # ------------------------------------------------------------ chat UI
    'model': ('Model / adapter',
              '模型 / 适配器'),
    'model_desc': ('The base model or a LoRA adapter; applies to the next answer.',
                   '基础模型或 LoRA 适配器；对下一条回答生效。'),
    'base': ('base model',
             '基础模型'),
    'not_loaded': ('not loaded: loads on first use',
                   '未加载：首次使用时加载'),
    'stale': ('last known list; the engine is not answering',
              '上次已知的列表；引擎当前无响应'),
    'system_prompt': ('System prompt',
                      '系统提示'),
    'temperature': ('Temperature',
                    '温度'),
    'top_p': ('Top-p',
              'Top-p'),
    'top_k': ('Top-k (-1 = off)',
              'Top-k（-1 = 关闭）'),
    'min_p': ('Min-p',
              'Min-p'),
    'empty_message': ('Your message is empty; nothing was sent.',
                      '消息为空，未发送。'),
    'loading': ('The model is loading… {elapsed:.0f} s',
                '模型加载中… {elapsed:.0f} 秒'),
    'loading_done': ('The model is ready (waited {elapsed:.0f} s).',
                     '模型已就绪（等待了 {elapsed:.0f} 秒）。'),
    'engine_down': ('The engine is not answering: {reason}. Your message is kept — press Retry when it is back.',
                    '引擎无响应：{reason}。您的消息已保留，恢复后请点“重试”。'),
    'retry': ('Retry',
              '重试'),
    'cmd_adapters': ('List the base model and the adapters',
                     '列出基础模型和适配器'),
    'cmd_unload': ('Unload an adapter: type its name',
                   '卸载适配器：输入其名称'),
    'unloaded': ('Adapter {name} unloaded; answers now come from {model}.',
                 '适配器 {name} 已卸载；现在由 {model} 回答。'),
    'engine_state': ('Engine: {reason}',
                     '引擎：{reason}'),
    'send_trimmed': ('Send trimmed version',
                     '发送精简版本'),
    'interrupted': ('answer interrupted',
                    '回答中断'),
    'stopped': ('stopped',
                '已停止'),
    'tokens': ('{n} tokens',
               '{n} 个词元'),
    'reply_limit': ('cut at the reply limit ([budget].reply_reserve)',
                    '达到回复长度上限（[budget].reply_reserve）'),
    'context': ('context {used} / {budget}',
                '上下文 {used} / {budget}'),
    'left_out': ('{n} earlier turns left out',
                 '省略了 {n} 轮较早的对话'),
    'left_out_title': ("Left out of the model's context",
                       '未放入模型上下文的内容'),
    'reasoning': ('Reasoning',
                  '推理过程'),
    'loading_adapter': ('Loading adapter {name}…',
                        '正在加载适配器 {name}…'),
    'adapter_loaded': ('Adapter {name} loaded.',
                       '适配器 {name} 已加载。'),
    'nothing_to_retry': ('There is no message to retry.',
                         '没有可重试的消息。'),
    'old_button': ('This button belongs to an earlier message; only the latest message can be retried or trimmed.',
                   '此按钮属于较早的消息；只能重试或精简最新的消息。'),
    'app_error': ('Something went wrong in the chat app (request {rid}); it is logged. Your message is kept.',
                  '聊天应用内部出错（请求 {rid}），已记录日志。您的消息已保留。'),
    'model_reset': ('Switched back to {model}; pick another model or adapter in the settings if you like.',
                    '已切换回 {model}；如有需要，可在设置中选择其他模型或适配器。'),
    'excluded_adapter': ('Adapter {name} was left out at start: {reason}',
                         '适配器 {name} 在启动时被排除：{reason}'),
    # ------------------------------------------------------------ errors (errors.py, one per class)
    'error.error': ('Something went wrong: {detail}',
                    '出错了：{detail}'),
    'error.config': ('config error: {key} = {value!r}: expected {expected}',
                     '配置错误：{key} = {value!r}：应为 {expected}'),
    'error.model_path': ('model path {path}: {problem}. Set [model].path (or QWENCHAT_MODEL_PATH) to a folder with config.json and weights; leave it empty for the embedded default.',
                         '模型路径 {path}：{problem}。请把 [model].path（或 QWENCHAT_MODEL_PATH）设为包含 config.json 和权重的文件夹；留空则使用内置默认模型。'),
    'error.port_in_use': ('port {port} on {host} is already in use; change {setting} (or stop the program using it).',
                          '{host} 上的端口 {port} 已被占用；请修改 {setting}（或停止占用它的程序）。'),
    'error.engine_unavailable': ('engine {engine!r} cannot run here: {detail}',
                                 '引擎 {engine!r} 无法在此运行：{detail}'),
    'error.engine_start_failed': ('the engine failed to start: {reason}. Log: {log_path}\n{tail}',
                                  '引擎启动失败：{reason}。日志：{log_path}\n{tail}'),
    'error.adapter_rejected': ('adapter {name!r} was not loaded: {detail}',
                               '适配器 {name!r} 未加载：{detail}'),
    'error.adapter_path_refused': ('adapter {name!r} refused: only folders directly inside {folder} can be loaded.',
                                   '拒绝加载适配器 {name!r}：只能加载 {folder} 目录下的文件夹。'),
    'error.adapter_limit': ('cannot load {name!r}: {loaded} adapters are loaded and the limit is {limit} ({setting}); unload one first or raise {setting}.',
                            '无法加载 {name!r}：已加载 {loaded} 个适配器，上限为 {limit}（{setting}）；请先卸载一个或调高 {setting}。'),
    'error.adapter_runtime_disabled': ('cannot load {name!r}: runtime adapter loading is disabled on the model server; set [lora].runtime_loading = true and restart (an external vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).',
                                       '无法加载 {name!r}：模型服务器未启用运行时加载适配器；请设置 [lora].runtime_loading = true 并重启（外部 vLLM 需设置 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True）。'),
    'error.prompt_too_long': ('your message is {tokens} tokens; with the system prompt ({system} tokens) and the reply reserve it must fit in {budget}. Nothing was sent. Shorten it, or send a trimmed version (start and end kept).',
                              '您的消息有 {tokens} 个词元；加上系统提示（{system} 个词元）和回复预留，必须在 {budget} 以内。消息未发送。请缩短，或发送保留开头和结尾的精简版本。'),
    'error.system_prompt_too_long': ('the system prompt and the chat template take {system} of the {budget} prompt tokens, leaving no room for your message. Nothing was sent. Shorten the system prompt (settings panel or [model].system_prompt), or lower [budget].reply_reserve.',
                                     '系统提示和对话模板占用了 {budget} 个提示词元中的 {system} 个，没有留给您消息的空间。消息未发送。请缩短系统提示（设置面板或 [model].system_prompt），或调低 [budget].reply_reserve。'),
    'error.backend': ('the model server returned an error: {detail}',
                      '模型服务器返回错误：{detail}'),
    'error.unreachable': ('cannot reach the model server at {url} ({detail}). If it is restarting, wait a moment and press Retry.',
                          '无法连接模型服务器 {url}（{detail}）。如果它正在重启，请稍候再点“重试”。'),
    'error.connection_lost': ('the connection to the model server broke off ({detail}). What arrived is kept; press Retry.',
                              '与模型服务器的连接中断（{detail}）。已收到的内容已保留；请点“重试”。'),
    'error.starting': ('the model is still loading after {elapsed:.0f} s ([ui].wait_for_ready); your message is kept — press Retry when the status line says ready.',
                       '模型在 {elapsed:.0f} 秒后仍在加载（[ui].wait_for_ready）；您的消息已保留，状态行显示就绪后请点“重试”。'),
    'error.timeout': ('{what} did not answer within {seconds:g} s ({setting}); press Retry, or raise the limit.',
                      '{what} 在 {seconds:g} 秒内没有响应（{setting}）；请点“重试”，或调高该限制。'),
    'error.connect_timeout': ('could not connect to the model server within {seconds:g} s ({setting}); press Retry.',
                              '在 {seconds:g} 秒内无法连接模型服务器（{setting}）；请点“重试”。'),
    'error.first_token_timeout': ('the model did not start answering within {seconds:g} s ({setting}); it may be busy. Press Retry.',
                                  '模型在 {seconds:g} 秒内没有开始回答（{setting}），可能正忙。请点“重试”。'),
    'error.idle_timeout': ('the answer stalled: nothing arrived for {seconds:g} s ({setting}). What arrived is kept; press Retry for a full answer.',
                           '回答中断：{seconds:g} 秒内没有新内容（{setting}）。已收到的内容已保留；点“重试”获取完整回答。'),
    'error.total_timeout': ('the answer took longer than {seconds:g} s ({setting}) and was stopped. What arrived is kept.',
                            '回答超过 {seconds:g} 秒（{setting}），已停止。已收到的内容已保留。'),
    'error.context_overflow': ('the conversation is too long for the model ({detail}). Start a new chat or shorten your message.',
                               '对话超出模型的上下文长度（{detail}）。请新建对话或缩短消息。'),
    'error.model_not_found': ('the model server does not serve {model!r}; pick another model or adapter from the list.',
                              '模型服务器没有提供 {model!r}；请从列表中选择其他模型或适配器。'),
    'error.auth_failed': ('the model server refused the API key (HTTP {status}); check OPENAI_API_KEY or [server].api_key.',
                          '模型服务器拒绝了 API 密钥（HTTP {status}）；请检查 OPENAI_API_KEY 或 [server].api_key。'),
    'error.rejected': ('the model server rejected the request (HTTP {status}): {detail}',
                       '模型服务器拒绝了该请求（HTTP {status}）：{detail}'),
    'error.overloaded': ('the model server is busy ({detail}); press Retry in a moment.',
                         '模型服务器繁忙（{detail}）；请稍后点“重试”。'),
    'error.engine_error': ('the model server failed while answering: {detail}. Press Retry.',
                           '模型服务器在回答时出错：{detail}。请点“重试”。'),
    'error.empty_answer': ('the model server ended the answer without sending any text; press Retry.',
                           '模型服务器没有返回任何文字就结束了回答；请点“重试”。'),
    'error.malformed': ('the model server sent a response that could not be read ({detail}); press Retry.',
                        '无法解析模型服务器的响应（{detail}）；请点“重试”。'),
    'error.merge': ('{detail}', '合并失败：{detail}'),
}


def t(key: str, lang: str | None = "en", **params: Any) -> str:
    """The text of ``key`` in ``lang`` ("zh…" → Chinese, anything else → English), formatted with ``params``."""
    en, zh = CATALOG[key]
    text = zh if pick_language(lang) == "zh" else en
    return text.format(**params) if params else text


def both(key: str, **params: Any) -> tuple[str, str]:
    """(English, Chinese) of ``key``: for places that keep both and let the reader's language decide later."""
    return t(key, "en", **params), t(key, "zh", **params)

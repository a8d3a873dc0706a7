"""UI strings in English and Chinese (Chainlit's own UI is translated in .chainlit/translations)."""

from __future__ import annotations

from .errors import pick_language

TEXTS: dict[str, tuple[str, str]] = {
    "model": ("Model / adapter", "模型 / 适配器"),
    "model_desc": ("The base model or a LoRA adapter; applies to the next answer.",
                   "基础模型或 LoRA 适配器；对下一条回答生效。"),
    "base": ("base model", "基础模型"),
    "not_loaded": ("not loaded: loads on first use", "未加载：首次使用时加载"),
    "stale": ("last known list; the engine is not answering", "上次已知的列表；引擎当前无响应"),
    "system_prompt": ("System prompt", "系统提示"),
    "temperature": ("Temperature", "温度"),
    "top_p": ("Top-p", "Top-p"),
    "top_k": ("Top-k (-1 = off)", "Top-k（-1 = 关闭）"),
    "min_p": ("Min-p", "Min-p"),
    "empty_message": ("Your message is empty; nothing was sent.", "消息为空，未发送。"),
    "loading": ("The model is loading… {elapsed:.0f} s", "模型加载中… {elapsed:.0f} 秒"),
    "loading_done": ("The model is ready (waited {elapsed:.0f} s).", "模型已就绪（等待了 {elapsed:.0f} 秒）。"),
    "engine_down": ("The engine is not answering: {reason}. Your message is kept — press Retry when it is back.",
                    "引擎无响应：{reason}。您的消息已保留，恢复后请点“重试”。"),
    "retry": ("Retry", "重试"),
    "cmd_adapters": ("List the base model and the adapters", "列出基础模型和适配器"),
    "cmd_unload": ("Unload an adapter: type its name", "卸载适配器：输入其名称"),
    "unloaded": ("Adapter {name} unloaded; answers now come from {model}.", "适配器 {name} 已卸载；现在由 {model} 回答。"),
    "engine_state": ("Engine: {reason}", "引擎：{reason}"),
    "send_trimmed": ("Send trimmed version", "发送精简版本"),
    "interrupted": ("answer interrupted", "回答中断"),
    "stopped": ("stopped", "已停止"),
    "tokens": ("{n} tokens", "{n} 个词元"),
    "reply_limit": ("cut at the reply limit ([budget].reply_reserve)", "达到回复长度上限（[budget].reply_reserve）"),
    "context": ("context {used} / {budget}", "上下文 {used} / {budget}"),
    "left_out": ("{n} earlier turns left out", "省略了 {n} 轮较早的对话"),
    "left_out_title": ("Left out of the model's context", "未放入模型上下文的内容"),
    "reasoning": ("Reasoning", "推理过程"),
    "loading_adapter": ("Loading adapter {name}…", "正在加载适配器 {name}…"),
    "adapter_loaded": ("Adapter {name} loaded.", "适配器 {name} 已加载。"),
    "nothing_to_retry": ("There is no message to retry.", "没有可重试的消息。"),
    "old_button": ("This button belongs to an earlier message; only the latest message can be retried or trimmed.",
                   "此按钮属于较早的消息；只能重试或精简最新的消息。"),
    "app_error": ("Something went wrong in the chat app (request {rid}); it is logged. Your message is kept.",
                  "聊天应用内部出错（请求 {rid}），已记录日志。您的消息已保留。"),
    "model_reset": ("Switched back to {model}; pick another model or adapter in the settings if you like.",
                    "已切换回 {model}；如有需要，可在设置中选择其他模型或适配器。"),
    "excluded_adapter": ("Adapter {name} was left out at start: {reason}", "适配器 {name} 在启动时被排除：{reason}"),
}


def t(key: str, lang: str | None = "en", **params: object) -> str:
    en, zh = TEXTS[key]
    text = zh if pick_language(lang) == "zh" else en
    return text.format(**params) if params else text

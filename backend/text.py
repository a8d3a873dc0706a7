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
    "model": ("Model / adapter", "模型 / 适配器"),
    "model_desc": (
        "The base model or a LoRA adapter; applies to the next answer.",
        "基础模型或 LoRA 适配器；对下一条回答生效。",
    ),
    "base": ("base model", "基础模型"),
    "lineage_unknown": (
        "base model or adapter: the server does not say; declare it in [lora] parents",
        "基础模型还是适配器：服务器未说明；请在 [lora] parents 中声明",
    ),
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
    "loading_gave_up": (
        "Stopped waiting for the model after {elapsed:.0f} s.",
        "等待模型 {elapsed:.0f} 秒后停止等待。",
    ),
    "engine_down": (
        "The engine is not answering: {reason}. Your message is kept — press Retry when it is back.",
        "引擎无响应：{reason}。您的消息已保留，恢复后请点“重试”。",
    ),
    "retry": ("Retry", "重试"),
    "cmd_adapters": ("List the base model and the adapters", "列出基础模型和适配器"),
    "cmd_unload": ("Unload an adapter: type its name", "卸载适配器：输入其名称"),
    "unloaded": (
        "Adapter {name} unloaded; answers now come from {model}.",
        "适配器 {name} 已卸载；现在由 {model} 回答。",
    ),
    # ------------------------------------------------------------ /export (backend/chat/export.py)
    "cmd_export": ("Export this chat as Markdown", "将此对话导出为 Markdown"),
    "export.title": ("Chat", "对话"),
    "export.exported": ("exported {when}", "导出于 {when}"),
    "export.you": ("You", "你"),
    "export.answer": ("Answer", "回答"),
    "export.side": ("Answer {side}", "回答 {side}"),
    "export.hidden": ("model hidden until the vote", "投票前隐藏模型"),
    "export.picked": ("the chat continued from this one", "对话从此回答继续"),
    "export.vote": ("vote: {winner}", "投票：{winner}"),
    "export.tie": ("tie", "平局"),
    "export.interrupted": ("answer interrupted", "回答被中断"),
    "export.no_text": ("(no text)", "（无文本）"),
    "export.empty": (
        "Nothing to export yet: this chat has no messages.",
        "暂无可导出的内容：此对话还没有消息。",
    ),
    "export.done": (
        "This chat as Markdown ({turns} messages), with the model of each answer:",
        "此对话的 Markdown 文件（{turns} 条消息），包含每条回答的模型：",
    ),
    "engine_state": ("Engine: {reason}", "引擎：{reason}"),
    "send_trimmed": ("Send trimmed version", "发送精简版本"),
    "interrupted": ("answer interrupted", "回答中断"),
    "stopped": ("stopped", "已停止"),
    # compare mode (backend/chat/compare.py)
    "cmd_compare": (
        "Compare two models side by side: /compare [blind] [A] [B], /compare off",
        "并排比较两个模型：/compare [blind] [A] [B]，/compare off",
    ),
    "cmd_leaderboard": ("Wins, losses and ties per model from blind votes", "盲评投票中各模型的胜、负、平"),
    "cmd_vote": (
        "Vote on the last blind comparison: /vote A|B|tie [comment]",
        "对最近一次盲评投票：/vote A|B|tie [评论]",
    ),
    "compare.on": (
        "Compare mode on: each message is answered by **A** `{a}` and **B** `{b}` at once, side by side. "
        "The conversation continues from A unless you pick B. `/compare off` ends it.",
        "比较模式已开启：每条消息由 **A** `{a}` 和 **B** `{b}` 同时并排回答。"
        "除非你选择 B，对话从 A 的回答继续。输入 `/compare off` 结束。",
    ),
    "compare.on_blind": (
        "Blind compare on: each message is answered by two models, shown as **A** and **B** in random order. "
        "Their names stay hidden until you vote. `/compare off` ends it.",
        "盲评模式已开启：每条消息由两个模型回答，以 **A** 和 **B** 随机顺序显示。"
        "投票之前不显示模型名称。输入 `/compare off` 结束。",
    ),
    "compare.off": (
        "Compare mode off: answers come from `{model}` again.",
        "比较模式已关闭：回答重新来自 `{model}`。",
    ),
    "compare.same": (
        "Same model on both sides (`{model}`): the answers differ only by sampling.",
        "两侧是同一个模型（`{model}`）：回答只因采样而不同。",
    ),
    "compare.same_short": ("same model on both sides", "两侧同一模型"),
    "compare.panel": ("Compare mode", "比较模式"),
    "compare.panel_desc": (
        "Two models answer each message side by side: A is the base model, B the model chosen above "
        "(or the first adapter). Blind hides the names until you vote. Also /compare A B.",
        "两个模型并排回答每条消息：A 是基础模型，B 是上方选择的模型（或第一个适配器）。"
        "盲评在投票前隐藏名称。也可输入 /compare A B。",
    ),
    "compare.panel_off": ("off", "关闭"),
    "compare.panel_on": ("side by side", "并排"),
    "compare.panel_blind": ("blind (vote, then names)", "盲评（先投票，后显示名称）"),
    "compare.one_model": (
        "Compare needs two models, but only `{model}` is served. Serve an adapter ([lora] modules, or put one "
        "in [lora].dir), or name the same model twice to compare it with itself: `/compare {model} {model}`.",
        "比较需要两个模型，但只提供了 `{model}`。请提供一个适配器（[lora] modules，或放入 [lora].dir），"
        "或者将同一模型写两次与自身比较：`/compare {model} {model}`。",
    ),
    "compare.unknown": (
        "`{name}` is not a served model or adapter; choose from {models}.",
        "`{name}` 不是已提供的模型或适配器；可选：{models}。",
    ),
    "compare.usage": (
        "Use `/compare [A] [B]`, `/compare blind [A] [B]` or `/compare off` (got `{text}`).",
        "用法：`/compare [A] [B]`、`/compare blind [A] [B]` 或 `/compare off`（收到 `{text}`）。",
    ),
    "compare.hidden": ("hidden", "已隐藏"),
    "compare.vote_prompt": (
        "Which answer is better? The model names are revealed after your vote. "
        "To add a comment, type `/vote A`, `/vote B` or `/vote tie` followed by it.",
        "哪个回答更好？投票后显示模型名称。如需附加评论，请输入 `/vote A`、`/vote B` 或 `/vote tie`，后接评论。",
    ),
    "compare.picked": (
        "Both answers are kept; the conversation continues from **{side}** (`{model}`).",
        "两个回答都已保留；对话从 **{side}**（`{model}`）继续。",
    ),
    "compare.continue": ("Continue with {side}", "从 {side} 继续"),
    "compare.vote_a": ("A is better", "A 更好"),
    "compare.vote_b": ("B is better", "B 更好"),
    "compare.vote_tie": ("Tie", "平局"),
    "compare.winner": ("{side} is better", "{side} 更好"),
    "compare.tie": ("a tie", "平局"),
    "compare.voted": (
        "Vote stored: {winner}. **A** was `{model_a}`, **B** was `{model_b}`.",
        "投票已保存：{winner}。**A** 是 `{model_a}`，**B** 是 `{model_b}`。",
    ),
    "compare.vote_replaced": (
        "This turn already had a vote: the last vote counts, the earlier one was replaced.",
        "此轮已经投过票：以最后一次投票为准，之前的投票已被替换。",
    ),
    "compare.vote_none": (
        "There is no blind comparison to vote on: turn on `/compare blind` and send a message first.",
        "没有可投票的盲评：请先输入 `/compare blind` 开启并发送一条消息。",
    ),
    "compare.vote_usage": (
        "Use `/vote A`, `/vote B` or `/vote tie`, optionally followed by a comment (got `{text}`).",
        "用法：`/vote A`、`/vote B` 或 `/vote tie`，可后接评论（收到 `{text}`）。",
    ),
    "compare.vote_failed": (
        "The vote could not be stored ({detail}); the names stay hidden. Try again.",
        "投票未能保存（{detail}）；名称仍保持隐藏。请重试。",
    ),
    "compare.voted_no_retry": (
        "This comparison has a vote already: its answers stay as voted on. Send the message again to compare anew.",
        "此次比较已投票：答案保持投票时的样子。重新发送消息以再次比较。",
    ),
    "compare.moved_on": (
        "The chat has moved on since this comparison: it can no longer continue from it.",
        "此次比较之后对话已继续：无法再从它继续。",
    ),
    "leaderboard.title": ("Blind-vote leaderboard", "盲评排行榜"),
    "leaderboard.head": ("| model | wins | losses | ties |", "| 模型 | 胜 | 负 | 平 |"),
    "leaderboard.empty": (
        "No blind votes yet: `/compare blind`, send a message, and vote.",
        "还没有盲评投票：输入 `/compare blind`，发送一条消息，然后投票。",
    ),
    "tokens": ("{n} tokens", "{n} 个词元"),
    "reply_limit": ("cut at the reply limit ([budget].reply_reserve)", "达到回复长度上限（[budget].reply_reserve）"),
    # ending.*: one line for every way an answer ends other than a plain "stop" (chat/service.py ending_note)
    "ending.content_filter": ("stopped by the server's content filter", "被服务器的内容过滤器截断"),
    # {tools}: " (get_weather, search)" or "" (built by the code)
    "ending.tool_calls": (
        "the model asked to call a tool{tools}; this chat does not run tools",
        "模型请求调用工具{tools}；本聊天不执行工具",
    ),
    "ending.unknown": (
        "ended for a reason this chat does not know ({reason}); it may be incomplete",
        "因本聊天不认识的原因结束（{reason}），可能不完整",
    ),
    "ending.none": (
        "the server did not say why the answer ended (no finish reason)",
        "服务器没有说明回答结束的原因（无 finish reason）",
    ),
    "ending.stop": ("the model ended it at once (finish reason stop)", "模型立即结束了回答（finish reason 为 stop）"),
    "no_text": (
        "The model's answer carried no text: {why}. Press Retry, or rephrase your message.",
        "模型的回答没有任何文字：{why}。请点“重试”，或换个说法。",
    ),
    "context": ("context {used} / {budget}", "上下文 {used} / {budget}"),
    "left_out": ("{n} earlier turns left out", "省略了 {n} 轮较早的对话"),
    "left_out_title": ("Left out of the model's context", "未放入模型上下文的内容"),
    "reasoning": ("Reasoning", "推理过程"),
    "loading_adapter": ("Loading adapter {name}…", "正在加载适配器 {name}…"),
    "adapter_loaded": ("Adapter {name} loaded.", "适配器 {name} 已加载。"),
    "adapter_evicted": (
        "Adapter {name} loaded; {evicted} (the least recently used adapter) was unloaded to make room.",
        "适配器 {name} 已加载；为腾出槽位，已卸载最久未使用的适配器 {evicted}。",
    ),
    "nothing_to_retry": ("There is no message to retry.", "没有可重试的消息。"),
    "old_button": (
        "This button belongs to an earlier message; only the latest message can be retried or trimmed.",
        "此按钮属于较早的消息；只能重试或精简最新的消息。",
    ),
    # One answer at a time per chat, and the browser only sends new user messages (issue #18).
    "busy": (
        "The previous message is still being answered: this one was not sent. Wait for the answer (or press "
        "Stop), then send it again. Your message:\n\n{text}",
        "上一条消息仍在回答中：这一条未发送。请等待回答结束（或点“停止”）后再发送。你的消息：\n\n{text}",
    ),
    "busy_action": (
        "The previous message is still being answered: wait for the answer (or press Stop), then press the button "
        "again.",
        "上一条消息仍在回答中：请等待回答结束（或点“停止”）后再点此按钮。",
    ),
    "message.id_taken": (
        "This message was not sent: its id `{id}` already belongs to another message. Reload the page and send "
        "it again.",
        "此消息未发送：它的 id `{id}` 已属于另一条消息。请刷新页面后重新发送。",
    ),
    "message.type_refused": (
        "This message was not sent: the browser may only send user messages, not `{kind}`. Reload the page and "
        "send it again.",
        "此消息未发送：浏览器只能发送用户消息，不能发送 `{kind}`。请刷新页面后重新发送。",
    ),
    "message.edit_refused": (
        "This edit was not applied: only your own messages in this chat can be edited (`{id}` is not one). "
        "Reload the page and edit it again.",
        "此修改未生效：只能修改本对话中你自己的消息（`{id}` 不是）。请刷新页面后再修改。",
    ),
    "compare.vote_not_blind": (
        "Votes are for blind comparisons: this pair showed its model names from the start. Turn on "
        "`/compare blind` and vote on the next pair.",
        "投票只用于盲评：这一对从一开始就显示了模型名称。请开启 `/compare blind`，对下一对投票。",
    ),
    "security.origin_refused": (
        "Refused: a page from another site may not use this chat (only its own page may; an administrator can "
        "add origins in [ui] allowed_origins).",
        "已拒绝：其他网站的页面不能使用此聊天（只允许其自身页面；管理员可在 [ui] allowed_origins 中添加来源）。",
    ),
    "security.host_refused": (
        "Refused: this chat is not served under the name in the address bar. Open it at the address you were given "
        "(an administrator can add names in [ui] hosts).",
        "已拒绝：此聊天不以地址栏中的这个名称提供服务。请使用您得到的地址打开（管理员可在 [ui] hosts 中添加名称）。",
    ),
    "security.login_throttled": (
        "Too many failed sign-ins from your address. Wait {seconds} s and try again; the wait grows with each failure.",
        "您的地址登录失败次数过多。请等待 {seconds} 秒后重试；每次失败后等待时间都会增加。",
    ),
    "security.login_throttled_account": (
        "Too many failed sign-ins with this user name. Wait {seconds} s and try again; the wait grows with each "
        "failure.",
        "此用户名登录失败次数过多。请等待 {seconds} 秒后重试；每次失败后等待时间都会增加。",
    ),
    "security.engine_exposed": (
        "WARNING: [server] host = {host!r} exposes the vLLM engine on port {port} to other machines. Every route "
        "but GET /health needs the API key, but the key and every prompt and answer cross the network as plain "
        "HTTP (no TLS): anyone who can watch that traffic can read them and use the key. Keep it on 127.0.0.1 "
        "unless the network is trusted or a firewall limits who can reach the port.",
        "警告：[server] host = {host!r} 使 vLLM 引擎的端口 {port} 对其他机器开放。除 GET /health 外，所有路由"
        "都需要 API 密钥，但密钥以及每条提示和回答都以明文 HTTP（无 TLS）在网络上传输：能监听这些流量的人可以"
        "读取它们并使用该密钥。除非网络可信或有防火墙限制访问，否则请保持为 127.0.0.1。",
    ),
    "security.ui_hosts": (
        "the UI answers on port {port} to {names} and loopback names ([ui] hosts, [server] ui_host, "
        "[ui] allowed_origins); a request for any other Host name gets 403",
        "界面在端口 {port} 上只响应 {names} 和回环名称（[ui] hosts、[server] ui_host、[ui] allowed_origins）；"
        "其他 Host 名称的请求一律返回 403",
    ),
    "security.ui_public": (
        "WARNING: [ui] public = true and login is off: anyone who can reach {host}:{port} can chat with the "
        "engine and load or unload adapters.",
        "警告：[ui] public = true 且未开启登录：任何能访问 {host}:{port} 的人都可以与引擎聊天并加载或卸载适配器。",
    ),
    "app_error": (
        "Something went wrong in the chat app (request {rid}); it is logged. Your message is kept.",
        "聊天应用内部出错（请求 {rid}），已记录日志。您的消息已保留。",
    ),
    "model_reset": (
        "Switched back to {model}; pick another model or adapter in the settings if you like.",
        "已切换回 {model}；如有需要，可在设置中选择其他模型或适配器。",
    ),
    "excluded_adapter": ("Adapter {name} was left out at start: {reason}", "适配器 {name} 在启动时被排除：{reason}"),
    "history_off": (
        "History is off: the history database could not be reached at start, so this chat is not saved.",
        "历史记录已关闭：启动时无法连接历史数据库，本次对话不会被保存。",
    ),
    # ------------------------------------------------------------ welcome screen and sharing (issue 12)
    "welcome.starter_label": ("{text} · {model}", "{text} · {model}"),
    "starter.pirate.1": ("What is the capital of France?", "法国的首都是哪里？"),
    "starter.pirate.2": ("Tell me about the sea.", "给我讲讲大海。"),
    "starter.pirate.3": ("How do I make a cup of tea?", "怎样泡一杯茶？"),
    "welcome.starter_unserved": (
        "This starter is for the model '{name}', which is not served right now (served: {served}). Nothing was "
        "sent: pick a model in the picker, or serve '{name}' under [lora] modules in config.toml.",
        "这个开场问题属于模型“{name}”，但它当前没有在服务（正在服务：{served}）。未发送任何内容：请在选择器中"
        "选一个模型，或在 config.toml 的 [lora] modules 中加入“{name}”。",
    ),
    "welcome.starter_model": (
        "Starter for {model}: the chat now uses {model}.",
        "{model} 的开场问题：本对话现在使用 {model}。",
    ),
    "share.login": ("Log in to open a shared chat.", "请先登录，再打开分享的对话。"),
    "share.gone": (
        "This chat no longer exists: its owner deleted it, or the link is incomplete.",
        "这个对话已不存在：所有者已将其删除，或链接不完整。",
    ),
    "share.not_shared": (
        "This chat is not shared: its owner has not shared it or stopped sharing it. Ask them for a new link.",
        "这个对话未被分享：所有者尚未分享或已取消分享。请向所有者索取新的链接。",
    ),
    "share.not_owner": (
        "Only the owner of this chat can share it or stop sharing it.",
        "只有该对话的所有者才能分享或取消分享它。",
    ),
    "share.not_owner_feedback": (
        "Only the owner of this chat can rate its answers; a shared chat is read-only.",
        "只有该对话的所有者才能评价其中的回答；分享的对话是只读的。",
    ),
    # ------------------------------------------------------------ errors (errors.py, one per class)
    "error.error": ("Something went wrong: {detail}", "出错了：{detail}"),
    "error.config": (
        "config error: {key} = {value!r}: expected {expected}",
        "配置错误：{key} = {value!r}：应为 {expected}",
    ),
    "error.model_path": (
        "model path {path}: {problem}. Set [model].path (or QWENCHAT_MODEL_PATH) to a folder with config.json and weights; leave it empty for the embedded default.",
        "模型路径 {path}：{problem}。请把 [model].path（或 QWENCHAT_MODEL_PATH）设为包含 config.json 和权重的文件夹；留空则使用内置默认模型。",
    ),
    "error.exposure": (
        "[server] ui_host = {host!r} lets other machines reach the chat on port {port} while login is off "
        "([ui] auth = false): anyone who can reach this port could use the engine. Turn on [ui] auth with a "
        'password, set [server] ui_host = "127.0.0.1", or set [ui] public = true if that is what you want.',
        "[server] ui_host = {host!r} 使其他机器可以通过端口 {port} 访问聊天界面，而登录未开启"
        "（[ui] auth = false）：任何能访问此端口的人都能使用引擎。请开启 [ui] auth 并设置密码，"
        '或设置 [server] ui_host = "127.0.0.1"；如确实需要公开，请设置 [ui] public = true。',
    ),
    "error.port_in_use": (
        "port {port} on {host} is already in use; change {setting} (or stop the program using it).",
        "{host} 上的端口 {port} 已被占用；请修改 {setting}（或停止占用它的程序）。",
    ),
    "error.engine_unavailable": (
        "engine {engine!r} cannot run here: {detail}",
        "引擎 {engine!r} 无法在此运行：{detail}",
    ),
    "error.engine_start_failed": (
        "the engine failed to start: {reason}. Log: {log_path}\n{tail}",
        "引擎启动失败：{reason}。日志：{log_path}\n{tail}",
    ),
    "error.replica_not_openai": (
        "fleet.remote: the replica {url} is not an OpenAI-compatible server: {problem}. List replicas by their "
        'OpenAI base URL, e.g. "http://gpu-b:8000/v1" (vLLM\'s, ending in /v1).',
        "fleet.remote：副本 {url} 不是 OpenAI 兼容服务器：{problem}。请用副本的 OpenAI 基础地址列出副本，"
        '例如 "http://gpu-b:8000/v1"（vLLM 的地址，以 /v1 结尾）。',
    ),
    "error.replica_key_refused": (
        "fleet.remote: the replica {url} refused the engine key (HTTP {status}); every replica takes the same key: "
        "set [server] api_key (or QWENCHAT_SERVER_API_KEY) to the key the remote replicas were started with.",
        "fleet.remote：副本 {url} 拒绝了引擎密钥（HTTP {status}）；所有副本使用同一个密钥："
        "请把 [server] api_key（或 QWENCHAT_SERVER_API_KEY）设为远程副本启动时使用的密钥。",
    ),
    "error.fleet_models_differ": (
        "the fleet's replicas serve different base models: {replicas}. A router sends each message to any "
        "replica, so they must all serve the same model: fix fleet.remote or [model].",
        "集群中的副本提供不同的基础模型：{replicas}。路由器会把每条消息发往任意副本，因此它们必须提供同一个模型："
        "请修改 fleet.remote 或 [model]。",
    ),
    "fleet.replica_unreachable": (
        "fleet.remote: the replica {url} does not answer now; starting without it (the router sends it "
        "requests once it answers, and the status line counts it as not ready until then)",
        "fleet.remote：副本 {url} 当前无响应；先在没有它的情况下启动（它恢复响应后路由器会向它转发请求，"
        "在此之前状态栏将其计为未就绪）",
    ),
    "fleet.replica_password_unused": (
        "fleet.remote: the user:password in the URL of the replica {url} is not used (nor shown): every replica "
        "takes the engine key ([server] api_key) as a bearer token; remove it from fleet.remote",
        "fleet.remote：副本 {url} 地址中的 user:password 不会被使用（也不会显示）：所有副本都以引擎密钥"
        "（[server] api_key）作为 bearer token；请从 fleet.remote 中删除它",
    ),
    "fleet.replica_lacks_adapters": (
        "fleet.remote: the replica {url} does not serve the adapter(s) {names} of [lora] modules: a message for "
        "one of them routed there fails with 'model not found'; serve the same --lora-modules on every replica",
        "fleet.remote：副本 {url} 未提供 [lora] modules 中的适配器 {names}：发往这些适配器的消息若被路由到该副本，"
        "将因“找不到模型”而失败；请在每个副本上使用相同的 --lora-modules",
    ),
    "fleet.model_setting": (
        "[model] (the model this UI expects and counts tokens with)",
        "[model]（此界面预期并用于计算令牌的模型）",
    ),
    "fleet.local_replicas": (
        "the {n} local replica(s) ({first} …)",
        "{n} 个本地副本（{first} …）",
    ),
    "error.adapter_rejected": ("adapter {name!r} was not loaded: {detail}", "适配器 {name!r} 未加载：{detail}"),
    "error.adapter_path_refused": (
        "adapter {name!r} refused: only folders directly inside {folder} can be loaded.",
        "拒绝加载适配器 {name!r}：只能加载 {folder} 目录下的文件夹。",
    ),
    "error.adapter_limit": (
        "cannot load {name!r}: {loaded} adapters are loaded and the limit is {limit} ({setting}); unload one loaded at runtime, or raise {setting} and restart.",
        "无法加载 {name!r}：已加载 {loaded} 个适配器，上限为 {limit}（{setting}）；请卸载一个运行时加载的适配器，或调高 {setting} 并重启。",
    ),
    "error.adapter_file_refused": (
        "adapter {name!r} refused: {file} is not a regular .safetensors or config file; runtime loads accept only those.",
        "拒绝加载适配器 {name!r}：{file} 不是普通的 .safetensors 或配置文件；运行时加载只接受这些文件。",
    ),
    "error.adapter_file.symlink_folder": (
        "adapter {name!r} refused: its folder in [lora].dir is a symbolic link; runtime loads accept only real folders — copy the adapter into [lora].dir.",
        "拒绝加载适配器 {name!r}：它在 [lora].dir 中的文件夹是符号链接；运行时加载只接受真实的文件夹——请把适配器复制到 [lora].dir 中。",
    ),
    "error.adapter_file.symlink": (
        "adapter {name!r} refused: {file} in its folder is a symbolic link; runtime loads accept only regular files — copy the real file in place of the link.",
        "拒绝加载适配器 {name!r}：其文件夹中的 {file} 是符号链接；运行时加载只接受普通文件——请用真实文件替换该链接。",
    ),
    "error.adapter_file.pickle": (
        "adapter {name!r} refused: {file} is a pickled PyTorch file, which can run code when loaded; runtime loads accept only .safetensors weights — re-save the adapter with safe_serialization=True and remove {file}.",
        "拒绝加载适配器 {name!r}：{file} 是 pickle 格式的 PyTorch 文件，加载时可能执行代码；运行时加载只接受 .safetensors 权重——请用 safe_serialization=True 重新保存适配器并删除 {file}。",
    ),
    "error.adapter_file.not_regular": (
        "adapter {name!r} refused: {file} in its folder is not a regular file (a device, pipe or socket); remove it.",
        "拒绝加载适配器 {name!r}：其文件夹中的 {file} 不是普通文件（设备、管道或套接字）；请删除它。",
    ),
    "error.adapter_static": (
        "adapter {name!r} cannot be unloaded: it is served from the start ([lora].modules) and could only come back with a restart. Remove it from [lora].modules and restart to drop it.",
        "无法卸载适配器 {name!r}：它在启动时加载（[lora].modules），卸载后只有重启才能恢复。如需移除，请将其从 [lora].modules 中删除并重启。",
    ),
    "error.adapter_answering": (
        "adapter {name!r} is answering right now ({answers} answer(s) streaming, maybe in another chat); try /unload again when they have finished.",
        "适配器 {name!r} 正在回答（{answers} 个回答正在生成，可能在其他对话中）；请等它们结束后再次 /unload。",
    ),
    # a fleet: a runtime load/unload goes to every replica (adapters/runtime.py); {failures} lists
    # error.adapter_fleet.replica items joined by "; ", {replicas} is "1, 3"
    "error.adapter_fleet_load": (
        "could not load adapter {name!r} on every replica of the fleet: {failures}.",
        "无法在集群的每个副本上加载适配器 {name!r}：{failures}。",
    ),
    "error.adapter_fleet_unload": (
        "could not unload adapter {name!r} from every replica of the fleet: {failures}.",
        "无法从集群的每个副本上卸载适配器 {name!r}：{failures}。",
    ),
    "error.adapter_fleet.replica": ("replica {number} ({address}): {reason}", "副本 {number}（{address}）：{reason}"),
    "error.adapter_fleet.load_undone": (
        "It was unloaded again from replicas {replicas}, where it had loaded, so every replica serves the same "
        "models; fix the cause and choose it again.",
        "已在加载成功的副本 {replicas} 上重新卸载，所有副本提供的模型保持一致；请排除原因后再次选择。",
    ),
    "error.adapter_fleet.unload_undone": (
        "It was loaded back on replicas {replicas}, where it had unloaded, so every replica still serves it; "
        "try /unload again later.",
        "已在卸载成功的副本 {replicas} 上重新加载，所有副本仍提供该适配器；请稍后再次 /unload。",
    ),
    "error.adapter_fleet.unload_uneven": (
        "It is gone from replicas {replicas} only (it cannot be loaded back from here): answers with it may fail "
        "until /unload succeeds on every replica.",
        "它仅从副本 {replicas} 上移除（无法从此处重新加载）：在每个副本都卸载成功之前，使用它的回答可能失败。",
    ),
    "error.adapter_fleet.undo_failed": (
        "Undoing it failed on {failures}: those replicas differ from the others until you retry or restart the fleet.",
        "在 {failures} 上撤销失败：在重试或重启集群之前，这些副本与其他副本不一致。",
    ),
    "error.adapter_slots_busy": (
        "cannot load {name!r} now: all {slots} adapter slots are answering right now ({setting}); try again in a moment.",
        "暂时无法加载 {name!r}：全部 {slots} 个适配器槽位正在回答（{setting}）；请稍后再试。",
    ),
    "error.adapter_runtime_disabled": (
        "cannot load {name!r}: runtime adapter loading is disabled on the model server; set [lora].runtime_loading = true and restart (an external vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).",
        "无法加载 {name!r}：模型服务器未启用运行时加载适配器；请设置 [lora].runtime_loading = true 并重启（外部 vLLM 需设置 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True）。",
    ),
    "error.prompt_too_long": (
        "your message is {tokens} tokens; with the system prompt ({system} tokens) and the reply reserve it must fit in {budget}. Nothing was sent. Shorten it, or send a trimmed version (start and end kept).",
        "您的消息有 {tokens} 个词元；加上系统提示（{system} 个词元）和回复预留，必须在 {budget} 以内。消息未发送。请缩短，或发送保留开头和结尾的精简版本。",
    ),
    "error.system_prompt_refused": (
        "the system prompt is {size:,} bytes; the limit is {limit:,} bytes. It was not applied: the previous system prompt is kept. Shorten it and confirm the settings again.",
        "系统提示有 {size:,} 字节，上限为 {limit:,} 字节。未生效：保留之前的系统提示。请缩短后再次确认设置。",
    ),
    "error.system_prompt_too_long": (
        "the system prompt and the chat template take {system} of the {budget} prompt tokens, leaving no room for your message. Nothing was sent. Shorten the system prompt (settings panel or [model].system_prompt), or lower [budget].reply_reserve.",
        "系统提示和对话模板占用了 {budget} 个提示词元中的 {system} 个，没有留给您消息的空间。消息未发送。请缩短系统提示（设置面板或 [model].system_prompt），或调低 [budget].reply_reserve。",
    ),
    "error.backend": ("the model server returned an error: {detail}", "模型服务器返回错误：{detail}"),
    "error.unreachable": (
        "cannot reach the model server at {url} ({detail}). If it is restarting, wait a moment and press Retry.",
        "无法连接模型服务器 {url}（{detail}）。如果它正在重启，请稍候再点“重试”。",
    ),
    "error.connection_lost": (
        "the connection to the model server broke off ({detail}). What arrived is kept; press Retry.",
        "与模型服务器的连接中断（{detail}）。已收到的内容已保留；请点“重试”。",
    ),
    "error.starting": (
        "the model is still loading after {elapsed:.0f} s ([ui].wait_for_ready); your message is kept — press Retry when the status line says ready.",
        "模型在 {elapsed:.0f} 秒后仍在加载（[ui].wait_for_ready）；您的消息已保留，状态行显示就绪后请点“重试”。",
    ),
    "error.timeout": (
        "{what} did not answer within {seconds:g} s ({setting}); press Retry, or raise the limit.",
        "{what} 在 {seconds:g} 秒内没有响应（{setting}）；请点“重试”，或调高该限制。",
    ),
    "error.connect_timeout": (
        "could not connect to the model server within {seconds:g} s ({setting}); press Retry.",
        "在 {seconds:g} 秒内无法连接模型服务器（{setting}）；请点“重试”。",
    ),
    "error.first_token_timeout": (
        "the model did not start answering within {seconds:g} s ({setting}); it may be busy. Press Retry.",
        "模型在 {seconds:g} 秒内没有开始回答（{setting}），可能正忙。请点“重试”。",
    ),
    "error.idle_timeout": (
        "the answer stalled: nothing arrived for {seconds:g} s ({setting}). What arrived is kept; press Retry for a full answer.",
        "回答中断：{seconds:g} 秒内没有新内容（{setting}）。已收到的内容已保留；点“重试”获取完整回答。",
    ),
    "error.total_timeout": (
        "the answer took longer than {seconds:g} s ({setting}) and was stopped. What arrived is kept.",
        "回答超过 {seconds:g} 秒（{setting}），已停止。已收到的内容已保留。",
    ),
    "error.context_overflow": (
        "the conversation is too long for the model ({detail}). Start a new chat or shorten your message.",
        "对话超出模型的上下文长度（{detail}）。请新建对话或缩短消息。",
    ),
    "error.model_not_found": (
        "the model server does not serve {model!r}; pick another model or adapter from the list.",
        "模型服务器没有提供 {model!r}；请从列表中选择其他模型或适配器。",
    ),
    "error.model_partial": (
        "{model!r} is not served by every replica of the fleet (missing on {replicas}), so it is not offered until "
        "it is; pick another model or adapter from the list.",
        "{model!r} 并非由集群中的每个副本提供（{replicas}上缺少），在此之前不提供；请从列表中选择其他模型或适配器。",
    ),
    "error.auth_failed": (
        "the model server refused the API key (HTTP {status}); check OPENAI_API_KEY or [server].api_key.",
        "模型服务器拒绝了 API 密钥（HTTP {status}）；请检查 OPENAI_API_KEY 或 [server].api_key。",
    ),
    "error.rejected": (
        "the model server rejected the request (HTTP {status}): {detail}",
        "模型服务器拒绝了该请求（HTTP {status}）：{detail}",
    ),
    "error.overloaded": (
        "the model server is busy ({detail}); press Retry in a moment.",
        "模型服务器繁忙（{detail}）；请稍后点“重试”。",
    ),
    "error.engine_error": (
        "the model server failed while answering: {detail}. Press Retry.",
        "模型服务器在回答时出错：{detail}。请点“重试”。",
    ),
    "error.empty_answer": (
        "the model server ended the answer without sending any text; press Retry.",
        "模型服务器没有返回任何文字就结束了回答；请点“重试”。",
    ),
    "error.malformed": (
        "the model server sent a response that could not be read ({detail}); press Retry.",
        "无法解析模型服务器的响应（{detail}）；请点“重试”。",
    ),
    "error.stream_cut": (
        "the model server ended the answer before it finished (neither a finish reason nor [DONE] arrived): what arrived may be incomplete, so it is kept and marked. Press Retry for a full answer.",
        "模型服务器在回答完成前结束了响应（既没有 finish reason 也没有 [DONE]）：已收到的内容可能不完整，已保留并标记。点“重试”获取完整回答。",
    ),
    "error.web_page": (
        "{url} answered with a web page{page} (HTTP {status}), not the OpenAI API: is a proxy or a login page in the way? Check OPENAI_BASE_URL (or [server] host and port) and the proxy settings (HTTP_PROXY, NO_PROXY), then press Retry.",
        "{url} 返回了一个网页{page}（HTTP {status}），而不是 OpenAI API：是否有代理或登录页挡在中间？请检查 OPENAI_BASE_URL（或 [server] 的 host 和 port）以及代理设置（HTTP_PROXY、NO_PROXY），然后点“重试”。",
    ),
    "error.merge": ("{detail}", "合并失败：{detail}"),
    # ------------------------------------------------------------ cause.*: why the engine stopped (engine/log_diagnosis.py)
    "cause.unrecognized_flag": (
        "this vLLM does not know the flag(s) {flags}; remove them from [server].extra_args or use a vLLM version that has them",
        "当前 vLLM 不认识参数 {flags}；请从 [server].extra_args 中删除，或换用支持它们的 vLLM 版本",
    ),
    "cause.flag_choice": (
        "vLLM refused {flag} {value}: it accepts only {choices}; change {where}",
        "vLLM 拒绝了 {flag} {value}：只接受 {choices}；请修改 {where}",
    ),
    "cause.flag_refused": (
        "vLLM refused its command line: {detail}; check [server].extra_args and the other [server] settings",
        "vLLM 拒绝了启动参数：{detail}；请检查 [server].extra_args 及其他 [server] 设置",
    ),
    "cause.max_model_len_above_limit": (
        "--max-model-len {asked} is above the model's limit {limit} (config.json); set [model].max_model_len to {limit} or less",
        "--max-model-len {asked} 超过模型上限 {limit}（config.json）；请把 [model].max_model_len 设为不超过 {limit}",
    ),
    "cause.kvcache_space_not_integer": (
        "VLLM_CPU_KVCACHE_SPACE must be a whole number of GiB, got '{value}'; set [server].cpu_kvcache_gib to an integer",
        "VLLM_CPU_KVCACHE_SPACE 必须是整数（GiB），实际为 '{value}'；请把 [server].cpu_kvcache_gib 设为整数",
    ),
    # {what}: cause.port_in_use.port or .no_port
    "cause.port_in_use": (
        "{what} is already in use, so vLLM could not listen; stop the program using it or change [server].port",
        "{what} 已被占用，vLLM 无法监听；请停止占用它的程序或修改 [server].port",
    ),
    "cause.port_in_use.port": ("port {port}", "端口 {port}"),
    "cause.port_in_use.no_port": ("the engine's port", "引擎端口"),
    "cause.cpu_kvcache_above_free_ram": (
        "the CPU KV cache needs {requested} GiB but only {avail} of {total} GiB RAM is free; lower [server].cpu_kvcache_gib (VLLM_CPU_KVCACHE_SPACE) or free memory",
        "CPU KV 缓存需要 {requested} GiB，但内存只剩 {avail} / {total} GiB；请调低 [server].cpu_kvcache_gib（VLLM_CPU_KVCACHE_SPACE）或释放内存",
    ),
    "cause.cpu_reserve_above_free_ram": (
        "vLLM-CPU wanted to reserve {frac} of RAM ({requested} GiB) but only {avail} of {total} GiB is free; set [server].cpu_kvcache_gib (VLLM_CPU_KVCACHE_SPACE) so it reserves a fixed amount",
        "vLLM-CPU 想预留 {frac} 的内存（{requested} GiB），但只剩 {avail} / {total} GiB；请设置 [server].cpu_kvcache_gib（VLLM_CPU_KVCACHE_SPACE）以固定预留大小",
    ),
    # .estimate: vLLM printed the longest max_model_len that would fit
    "cause.kv_cache_too_small_cpu": (
        "the KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); raise [server].cpu_kvcache_gib or lower [model].max_model_len",
        "KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；请调高 [server].cpu_kvcache_gib 或把 [model].max_model_len 调低",
    ),
    "cause.kv_cache_too_small_cpu.estimate": (
        "the KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); raise [server].cpu_kvcache_gib or lower [model].max_model_len to {estimate} or less",
        "KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；请调高 [server].cpu_kvcache_gib 或把 [model].max_model_len 降到 {estimate} 以下",
    ),
    "cause.kv_cache_too_small_gpu": (
        "the GPU KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); lower [model].max_model_len, or raise [server].gpu_memory_utilization",
        "GPU 上的 KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；请把 [model].max_model_len 调低，或调高 [server].gpu_memory_utilization",
    ),
    "cause.kv_cache_too_small_gpu.estimate": (
        "the GPU KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); lower [model].max_model_len to {estimate} or less, or raise [server].gpu_memory_utilization",
        "GPU 上的 KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；请把 [model].max_model_len 降到 {estimate} 以下，或调高 [server].gpu_memory_utilization",
    ),
    "cause.no_cache_blocks_cpu": (
        "no memory was left for the KV cache after loading the model; raise [server].cpu_kvcache_gib or free RAM",
        "加载模型后没有剩余内存给 KV 缓存；请调高 [server].cpu_kvcache_gib 或释放内存",
    ),
    "cause.no_cache_blocks_gpu": (
        "no GPU memory was left for the KV cache after loading the model; raise [server].gpu_memory_utilization, use a smaller model or more GPUs ([server].tensor_parallel_size)",
        "加载模型后 GPU 上没有剩余显存给 KV 缓存；请调高 [server].gpu_memory_utilization、换用更小的模型或更多 GPU（[server].tensor_parallel_size）",
    ),
    # {size}: " (1.50 GiB)" or ""; {detail}: " (tried to allocate …, … free)" or "" (both built in English by the code)
    "cause.cpu_out_of_memory": (
        "the machine ran out of RAM{size}; lower [server].max_num_seqs, [model].max_model_len or [server].cpu_kvcache_gib",
        "机器内存不足{size}；请调低 [server].max_num_seqs、[model].max_model_len 或 [server].cpu_kvcache_gib",
    ),
    "cause.gpu_out_of_memory": (
        "the GPU ran out of memory{detail}; lower [server].max_num_seqs, [model].max_model_len or [server].gpu_memory_utilization, or stop other programs on the GPU",
        "GPU 显存不足{detail}；请调低 [server].max_num_seqs、[model].max_model_len 或 [server].gpu_memory_utilization，或停止占用 GPU 的其他程序",
    ),
    # LoRA: {who} is cause.lora.adapter or .some_adapter; most are followed by cause.lora.advice ({reason}: the sentence).
    # {path} is the adapter's folder ("its folder" when unknown), {g1}… the regex groups of the matched log line.
    "cause.lora.adapter": ("adapter '{name}'", "适配器 '{name}'"),
    "cause.lora.some_adapter": ("a LoRA adapter", "某个 LoRA 适配器"),
    "cause.lora.advice": (
        "{reason}; fix it or remove it from [lora].modules (the adapter doctor shows details)",
        "{reason}；请修正它或将其从 [lora].modules 中移除（适配器检查可显示详情）",
    ),
    "cause.lora_not_found": (
        "{who} was not found at {path} (no adapter_config.json)",
        "{who} 在 {path} 找不到（没有 adapter_config.json）",
    ),
    "cause.lora_rank_too_big": (
        "{who} has rank {g1}, above --max-lora-rank {g2}; raise [lora].max_lora_rank (vLLM accepts 1, 8, 16, 32, 64, 128, 256, 320, 512) or retrain with r<={g2}",
        "{who} 的秩为 {g1}，超过 --max-lora-rank {g2}；请调高 [lora].max_lora_rank（vLLM 只接受 1, 8, 16, 32, 64, 128, 256, 320, 512）或以 r<={g2} 重新训练",
    ),
    "cause.lora_unexpected_modules": (
        "{who} has weights for modules the base model does not have: {g3}",
        "{who} 包含基础模型没有的模块权重：{g3}",
    ),
    "cause.lora_no_weights": (
        "{who} has no weights in {path} (adapter_model.safetensors or .bin)",
        "{who} 在 {path} 中没有权重文件（adapter_model.safetensors 或 .bin）",
    ),
    "cause.lora_config_incomplete": (
        "{who} has an incomplete adapter_config.json (missing {g1})",
        "{who} 的 adapter_config.json 不完整（缺少 {g1}）",
    ),
    "cause.lora_bias": (
        '{who} trains biases (bias is not "none"), which vLLM cannot serve',
        '{who} 训练了偏置（bias 不是 "none"），vLLM 不支持',
    ),
    "cause.lora_vocab_mismatch": (
        "{who} was trained for a vocabulary of {g1} tokens, the base model has {g2}",
        "{who} 按 {g1} 个词元的词表训练，而基础模型有 {g2} 个",
    ),
    "cause.lora_mismatch": ("{who} does not match the base model ({g1})", "{who} 与基础模型不匹配（{g1}）"),
    "cause.lora_add_failed": ("{who} failed to load: {detail}", "{who} 加载失败：{detail}"),
    # model_missing: followed by cause.model_missing.advice ({reason}: the sentence); {g2} is a file name
    "cause.model_missing.advice": (
        "{reason}; set [model].path to a folder with config.json and weights (leave it empty for the embedded default)",
        "{reason}；请把 [model].path 设为包含 config.json 和权重的文件夹（留空则使用内置默认模型）",
    ),
    "cause.model_path_invalid": (
        "model path {path} does not exist or has no config.json",
        "模型路径 {path} 不存在或没有 config.json",
    ),
    "cause.model_path_missing": ("model path {path} does not exist", "模型路径 {path} 不存在"),
    "cause.model_file_missing": ("model folder {path} has no {g2}", "模型文件夹 {path} 中没有 {g2}"),
    "cause.model_weights_missing": (
        "model folder {path} has no weights (*.safetensors or *.bin)",
        "模型文件夹 {path} 中没有权重（*.safetensors 或 *.bin）",
    ),
    "cause.model_hub_unreachable": (
        "the model is not on disk and the model hub ({path}) cannot be reached",
        "模型不在本地，且无法连接模型仓库（{path}）",
    ),
    # vLLM-CPU quirks and the rest (kind "unknown")
    "cause.cpu_head_dim_unsupported": (
        "vLLM's CPU attention does not support head_dim {g1}; this model cannot run on vLLM-CPU (use a model with head_dim 64 or 128)",
        "vLLM 的 CPU 注意力内核不支持 head_dim {g1}；该模型无法在 vLLM-CPU 上运行（请用 head_dim 为 64 或 128 的模型）",
    ),
    "cause.torchvision_cuda_build": (
        "the engine environment has a CUDA build of torchvision, which breaks every vLLM import; uninstall torchvision, torchaudio and torchcodec from it",
        "引擎环境中装有 CUDA 版 torchvision，导致 vLLM 无法导入；请从该环境卸载 torchvision、torchaudio 和 torchcodec",
    ),
    "cause.vllm_command_broken": (
        "the `vllm` command is broken in vllm-cpu; start the engine with python -m vllm.entrypoints.openai.api_server",
        "vllm-cpu 的 `vllm` 命令不可用；请用 python -m vllm.entrypoints.openai.api_server 启动引擎",
    ),
    # {how}: " (exit code -9)" or "" (built in English by the code)
    "cause.engine_died": (
        "the engine process died unexpectedly{how}; if nobody killed it, the system may have run out of memory",
        "引擎进程意外退出{how}；如果不是人为终止，可能是系统内存不足",
    ),
    "cause.unknown": ("the engine stopped with an error: {detail}", "引擎因错误停止：{detail}"),
    # the supervisor's hang watchdog (engine/supervisor.py), not the log: the process lives but does not generate
    "cause.engine_hung": (
        "the engine stopped answering (no reply to a one-token probe for {seconds:.0f} s)",
        "引擎停止响应（单个词元的探测请求 {seconds:.0f} 秒无回复）",
    ),
    # ------------------------------------------------------------ meter.*: the context meter (chat/budget.py FitResult.meter_text)
    # {approx}: "≈" when the count is an estimate, else ""; .left_out.* follow the context after " · "
    "meter.context": ("context: {approx}{used:,} / {budget:,} tokens", "上下文：{approx}{used:,} / {budget:,} 词元"),
    "meter.left_out.one": ("{n} earlier turn left out", "{n} 轮较早的对话未发送"),
    "meter.left_out.many": ("{n} earlier turns left out", "{n} 轮较早的对话未发送"),
    # ------------------------------------------------------------ the status line (chat/health.py) and the supervisor
    "health.waiting": ("waiting for the model server to start", "正在等待模型服务器启动"),
    "health.health_slow": ("/health did not answer within {seconds:g} s", "/health 在 {seconds:g} 秒内没有响应"),
    "health.stopped_answering": (
        "the model server stopped answering ({how} at {url})",
        "模型服务器已停止响应（{url}：{how}）",
    ),
    "health.not_listening": ("the model server is starting (not listening yet)", "模型服务器正在启动（尚未监听端口）"),
    "health.unhealthy": (
        "the model server reports it is unhealthy (health HTTP {status})",
        "模型服务器报告自身不健康（health HTTP {status}）",
    ),
    "health.loading": ("the model is loading", "模型正在加载"),
    "health.no_model_list": ("the model list is unavailable ({detail})", "模型列表不可用（{detail}）"),
    "health.waiting_models": (
        "the model server is up; waiting for the model list",
        "模型服务器已启动；正在等待模型列表",
    ),
    "health.slow": (
        "the engine answers slowly: the test generation took over {seconds:g} s",
        "引擎响应缓慢：测试生成超过 {seconds:g} 秒",
    ),
    "health.ready": ("the model is ready", "模型已就绪"),
    # a fleet (several engine replicas behind a router): {which} lists health.replica_down items joined by "; "
    # the status line's state words (public/status.js shows them; status_json sends both languages)
    "status.preparing": ("preparing", "准备中"),
    "status.starting": ("model loading", "模型加载中"),
    "status.ready": ("ready", "就绪"),
    "status.degraded": ("degraded", "服务降级"),
    "status.down": ("engine down", "引擎不可用"),
    "status.offline": ("UI offline", "界面未连接"),  # shown by the page itself when this server does not answer
    "health.replicas_count": ("{ready} of {total} replicas ready", "{total} 个副本中 {ready} 个就绪"),
    "health.replica_down": ("replica {number} ({address}): {detail}", "副本 {number}（{address}）：{detail}"),
    "health.replica_refused": ("connection refused", "连接被拒绝"),
    "health.replica_timeout": ("no answer within {seconds:g} s", "{seconds:g} 秒内无响应"),
    "health.replicas_some": (
        "{ready} of {total} replicas ready; {which}",
        "{total} 个副本中 {ready} 个就绪；{which}",
    ),
    "health.replicas_none": (
        "no replica is ready ({ready} of {total}); {which}",
        "没有可用的副本（{total} 个中 {ready} 个就绪）；{which}",
    ),
    "health.replicas_unreachable": (
        "the router answers, but this app reaches none of its {total} replicas directly ({ready} of {total} "
        "replicas ready here); {which}",
        "路由器有响应，但本应用无法直接连接其 {total} 个副本中的任何一个（此处 {total} 个中 {ready} 个就绪）；{which}",
    ),
    # a fleet: models some ready replicas serve but not all (not offered); {replicas} joins health.replica_named
    "health.replica_named": ("replica {number} ({address})", "副本 {number}（{address}）"),
    "health.list_sep": (", ", "、"),
    "health.item_sep": ("; ", "；"),
    "health.partial_model": (
        "{model} not offered: not served by {replicas}",
        "{model} 未提供：{replicas}未加载它",
    ),
    "partial_adapter": (
        "Adapter {name} is not offered for now: not every replica of the fleet serves it (missing on {replicas}). "
        "It is offered again once every ready replica serves it.",
        "适配器 {name} 暂不提供：集群中并非每个副本都加载了它（{replicas}上缺少）。待所有就绪副本都加载后会重新提供。",
    ),
    "health.probe_timeout": (
        "health 200 but the test generation timed out after {seconds:g} s (the engine may be hung or overloaded)",
        "健康检查为 200，但测试生成在 {seconds:g} 秒内未完成（引擎可能卡住或过载）",
    ),
    "health.probe_dropped": (
        "the model server closed the connection during the test generation",
        "测试生成期间模型服务器断开了连接",
    ),
    "health.probe_failed": (
        "health 200 but the test generation failed ({detail})",
        "健康检查为 200，但测试生成失败（{detail}）",
    ),
    "health.never_ready": (
        "the model server did not become ready within {seconds:g} s",
        "模型服务器在 {seconds:g} 秒内未就绪",
    ),
    "health.engine_stopped": ("the engine stopped", "引擎已停止"),
    "health.restarting_attempt": (
        "{reason}; it is restarting — attempt {attempt} of {attempts}",
        "{reason}；正在重启——第 {attempt}/{attempts} 次尝试",
    ),
    "health.restarting": ("{reason}; it is restarting", "{reason}；正在重启"),
    "health.starting": ("the model server is starting (loading the model)", "模型服务器正在启动（加载模型）"),
    # the launcher prepares before the engine can start (contract SupervisorState.PREPARING, engine/prepare_bg.py)
    "health.installing_pct": ("installing the engine {percent} %", "正在安装引擎 {percent}%"),
    "health.installing": ("installing the engine", "正在安装引擎"),
    "health.converting": ("converting the model", "正在转换模型"),
    "health.preparing": ("preparing the engine", "正在准备引擎"),
    # {detail}: the last lines of the step's output (no absolute paths); {log}: the log's file name in [logging] dir
    "prepare.install_failed": (
        "installing the engine failed: {detail}; the full log is {log} in the log folder ([logging] dir)",
        "安装引擎失败：{detail}；完整日志见日志文件夹（[logging] dir）中的 {log}",
    ),
    "prepare.convert_failed": (
        "converting the model failed: {detail}; the full log is {log} in the log folder ([logging] dir)",
        "转换模型失败：{detail}；完整日志见日志文件夹（[logging] dir）中的 {log}",
    ),
    # a hub id in [model] path (engine/download.py): {done} and {total} from hub.bytes_of, {rate} hub.human_bytes
    "health.downloading_pct": (
        "downloading the model {percent} % · {done} of {total} · {rate}/s",
        "正在下载模型 {percent}% · {done} / {total} · {rate}/s",
    ),
    "health.downloading": ("downloading the model", "正在下载模型"),
    "prepare.download_failed": (
        "downloading the model failed: {detail}; the full log is {log} in the log folder ([logging] dir)",
        "下载模型失败：{detail}；完整日志见日志文件夹（[logging] dir）中的 {log}",
    ),
    "download.needs_token": (
        "the hub refused {id} (HTTP {status}): it is gated or private; set HF_TOKEN to a token that may read it "
        "(and accept the model's terms on its page at {endpoint})",
        "模型库拒绝了 {id}（HTTP {status}）：该模型受限或私有；请将 HF_TOKEN 设为有读取权限的令牌"
        "（并在 {endpoint} 的模型页面上同意其条款）",
    ),
    "download.token_refused": (
        "the hub refused {id} (HTTP {status}) with the token in HF_TOKEN: that token may not read it; accept the "
        "model's terms on its page at {endpoint}, or set HF_TOKEN to a token with access",
        "模型库以 HF_TOKEN 中的令牌访问 {id} 时被拒绝（HTTP {status}）：该令牌无权读取；请在 {endpoint} 的模型页面上"
        "同意其条款，或将 HF_TOKEN 设为有权限的令牌",
    ),
    "download.no_repo_or_private": (
        "{endpoint} has no model {id} that it shows without a token (HTTP 401): check [model] path (owner/name, as on "
        "the model's page), or, if the repo is private, set HF_TOKEN to a token that may read it",
        "{endpoint} 上没有无需令牌即可访问的模型 {id}（HTTP 401）：请检查 [model] path（owner/name，与模型页面一致）；"
        "若该模型为私有，请将 HF_TOKEN 设为有读取权限的令牌",
    ),
    "download.no_repo": (
        "there is no model {id} on {endpoint} (HTTP 404): check [model] path (owner/name, as on the model's page)",
        "{endpoint} 上没有模型 {id}（HTTP 404）：请检查 [model] path（owner/name，与模型页面一致）",
    ),
    "download.no_revision": (
        "{id} has no revision {revision} on {endpoint} (HTTP 404): check the @revision in [model] path "
        "(a branch, a tag or a commit)",
        "{endpoint} 上的 {id} 没有版本 {revision}（HTTP 404）：请检查 [model] path 中的 @revision（分支、标签或提交）",
    ),
    "download.offline": (
        "cannot reach {endpoint} to download {id} ({detail}), and the cache folder {cache} holds no complete copy: "
        "connect this machine and start again, or copy the weights in: run `hf download {id}` on a machine with "
        "network and copy its {folder} folder into {cache} (or copy the model folder anywhere and set [model] path "
        "to that folder)",
        "无法连接 {endpoint} 下载 {id}（{detail}），缓存文件夹 {cache} 中也没有完整副本：请联网后重新启动，或手动拷入权重："
        "在能联网的机器上运行 `hf download {id}`，把其 {folder} 文件夹拷到 {cache}（或把模型文件夹拷到任意位置，"
        "并将 [model] path 设为该文件夹）",
    ),
    "download.not_a_hub": (
        "HF_ENDPOINT={endpoint} does not answer like a Hugging Face hub ({detail}): unset HF_ENDPOINT, or set it to "
        "a hub mirror's address",
        "HF_ENDPOINT={endpoint} 的应答不像 Hugging Face 模型库（{detail}）：请取消 HF_ENDPOINT，或将其设为模型库镜像的地址",
    ),
    "download.not_a_model": (
        "{id} has no config.json (its files: {files}): it is not a model vLLM can serve; check [model] path",
        "{id} 没有 config.json（其文件：{files}）：不是 vLLM 能加载的模型；请检查 [model] path",
    ),
    "download.dropped": (
        "the connection dropped while downloading {file} of {id}, and retrying did not help ({detail}); what was "
        "fetched is kept: start again to resume",
        "下载 {id} 的 {file} 时连接中断，重试无效（{detail}）；已下载的部分会保留：重新启动即可继续",
    ),
    "download.disk": (
        "{id} needs {need} more in {cache}, but only {free} is free there: free some space, or set HF_HOME to a "
        "folder on a disk with room",
        "{id} 还需要 {need} 的空间（{cache}），但那里只剩 {free}：请清理空间，或将 HF_HOME 设为空间充足的磁盘上的文件夹",
    ),
    "download.disk_full": (
        "the disk filled up while downloading {file} of {id} into {cache}: free some space, or set HF_HOME to a "
        "folder on a disk with room, and start again; what was fetched is kept",
        "下载 {id} 的 {file} 到 {cache} 时磁盘已满：请清理空间，或将 HF_HOME 设为空间充足的磁盘上的文件夹，然后重新启动；"
        "已下载的部分会保留",
    ),
    "download.http": (
        "the hub answered HTTP {status} for {id} ({detail}); try again later",
        "模型库对 {id} 的应答为 HTTP {status}（{detail}）；请稍后再试",
    ),
    "download.incomplete": (
        "the download of {id} ended, but files vLLM needs are still missing; start again",
        "{id} 的下载已结束，但仍缺少 vLLM 需要的文件；请重新启动",
    ),
    "health.stopped": ("the engine was stopped", "引擎已停止运行"),
    "health.down_after": ("{reason}; it is down after {attempt} attempts", "{reason}；尝试 {attempt} 次后已停止"),
    "health.down": ("{reason}; it is down", "{reason}；引擎已停止"),
    "supervisor.killed": (
        "the engine was killed ({signal}); if nobody killed it, the system may have run out of memory",
        "引擎被终止（{signal}）；如果不是人为终止，可能是系统内存不足",
    ),
    "supervisor.exited": ("the engine exited with code {rc}", "引擎退出，退出码 {rc}"),
    "ui_keeper.killed": (
        "the UI was killed ({signal}); if nobody killed it, the system may have run out of memory",
        "界面进程被终止（{signal}）；如果不是人为终止，可能是系统内存不足",
    ),
    "ui_keeper.exited": ("the UI exited with code {rc}", "界面进程退出，退出码 {rc}"),
    "ui_keeper.ago_seconds": ("{n} s", "{n} 秒"),
    "ui_keeper.ago_minutes": ("{n} min", "{n} 分钟"),
    "ui_keeper.restarted": (
        "the UI restarted {ago} ago ({reason}); the model kept running",
        "界面进程在 {ago} 前重启（{reason}）；模型一直在运行",
    ),
    "supervisor.startup_timeout": (
        "the engine did not become healthy within {seconds:.0f} s ([server].startup_timeout)",
        "引擎在 {seconds:.0f} 秒内未就绪（[server].startup_timeout）",
    ),
}


def t(key: str, lang: str | None = "en", /, **params: Any) -> str:  # positional: ConfigError has a `key` param
    """The text of ``key`` in ``lang`` ("zh…" → Chinese, anything else → English), formatted with ``params``."""
    en, zh = CATALOG[key]
    text = zh if pick_language(lang) == "zh" else en
    return text.format(**params) if params else text


def both(key: str, /, **params: Any) -> tuple[str, str]:
    """(English, Chinese) of ``key``: for places that keep both and let the reader's language decide later."""
    return t(key, "en", **params), t(key, "zh", **params)

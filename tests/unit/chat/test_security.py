"""backend/chat/security.py: origin check (HTTP + websocket), security headers, login throttle; the
exposure rules (backend/engine/preflight.py), sessions bound to the password, owner-only files."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from typing import Any

import pytest

from backend.chat import history, login, security
from backend.engine import launch
from backend.engine.preflight import check_exposure
from backend.errors import ConfigError, ExposureRefused
from backend.settings import (
    LoggingSettings,
    ServerSettings,
    Settings,
    UISettings,
    canonical_origin,
    is_loopback,
    load_settings,
)

# ---------------------------------------------------------------- a tiny ASGI harness


class Inner:
    """The wrapped app: records that it was reached, answers 200 (HTTP) or accepts (websocket)."""

    def __init__(self, status: int = 200) -> None:
        self.calls: list[dict[str, Any]] = []
        self.status = status

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls.append(scope)
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            return
        await send({"type": "http.response.start", "status": self.status, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"ok"})


def scope_of(
    kind: str = "http",
    *,
    origin: str | None = None,
    host: str = "127.0.0.1:8080",
    path: str = "/",
    method: str = "GET",
    client: str = "127.0.0.1",
    scheme: str | None = None,
) -> dict[str, Any]:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    scope: dict[str, Any] = {
        "type": kind,
        "path": path,
        "headers": headers,
        "client": (client, 50000),
        "scheme": scheme or ("ws" if kind == "websocket" else "http"),
    }
    if kind == "http":
        scope["method"] = method
    return scope


async def call(mw: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    first = {"type": "websocket.connect"} if scope["type"] == "websocket" else {"type": "http.request", "body": b""}

    async def receive() -> dict[str, Any]:
        return first

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await mw(scope, receive, send)
    return sent


def headers_of(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in sent[0].get("headers", [])}


# ---------------------------------------------------------------- origin


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["http", "websocket"])
async def test_a_foreign_origin_is_refused_before_the_app_sees_it(kind):
    inner = Inner()
    sent = await call(security.WebSecurityMiddleware(inner), scope_of(kind, origin="http://127.0.0.1:9999"))
    assert inner.calls == []
    if kind == "http":
        assert sent[0]["status"] == 403 and b"http://127.0.0.1:9999" in sent[1]["body"]
    else:  # closed before accept: the server answers the upgrade with 403
        assert sent == [{"type": "websocket.close", "code": 1008}]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["http", "websocket"])
@pytest.mark.parametrize(
    "origin,host",
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080"),
        ("http://LOCALHOST:8080", "localhost:8080"),
        ("http://chat.example:80", "chat.example"),  # default port written out or not: the same origin
        ("http://[::1]:8080", "[::1]:8080"),
    ],
)
async def test_the_uis_own_origin_passes_on_any_host_and_port(kind, origin, host):
    inner = Inner()
    sent = await call(security.WebSecurityMiddleware(inner), scope_of(kind, origin=origin, host=host))
    assert len(inner.calls) == 1
    assert sent[0]["type"] == ("websocket.accept" if kind == "websocket" else "http.response.start")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "origin",
    [
        "https://127.0.0.1:8080",  # another scheme
        "http://127.0.0.1:8081",  # another port
        "http://127.0.0.2:8080",  # another host
        "null",  # a sandboxed frame or a file: page
        "http://127.0.0.1:8080.evil.example",
    ],
)
async def test_scheme_host_and_port_must_all_match(origin):
    inner = Inner()
    sent = await call(security.WebSecurityMiddleware(inner), scope_of(origin=origin))
    assert inner.calls == [] and sent[0]["status"] == 403


@pytest.mark.asyncio
async def test_forwarded_headers_are_not_trusted():
    inner = Inner()
    scope = scope_of(origin="https://evil.example")
    scope["headers"] += [(b"x-forwarded-host", b"evil.example"), (b"x-forwarded-proto", b"https")]
    sent = await call(security.WebSecurityMiddleware(inner), scope)
    assert inner.calls == [] and sent[0]["status"] == 403


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["http", "websocket"])
async def test_requests_without_an_origin_pass_to_the_normal_rules(kind):
    inner = Inner()
    await call(security.WebSecurityMiddleware(inner), scope_of(kind))
    assert len(inner.calls) == 1


@pytest.mark.asyncio
async def test_allowed_origins_replace_the_host_rule():
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, allowed_origins=["https://chat.example.com"])
    ok = await call(mw, scope_of(origin="https://chat.example.com:443", host="127.0.0.1:8080"))
    assert ok[0]["status"] == 200
    # once the list is set, a Host that names the attacker's page (DNS rebinding) no longer makes it "own"
    refused = await call(mw, scope_of(origin="http://evil.example:8080", host="evil.example:8080"))
    assert refused[0]["status"] == 403 and len(inner.calls) == 1


@pytest.mark.asyncio
async def test_each_refused_origin_is_logged_once_with_the_origin(caplog):
    mw = security.WebSecurityMiddleware(Inner())
    with caplog.at_level(logging.WARNING, logger=security.logger.name):
        for _ in range(3):
            await call(mw, scope_of(origin="http://127.0.0.1:9999"))
            await call(mw, scope_of("websocket", origin="http://127.0.0.1:9999"))
        await call(mw, scope_of(origin="http://other.example"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "'http://127.0.0.1:9999'" in lines[0] and "'http://other.example'" in lines[1]


@pytest.mark.asyncio
async def test_the_refusal_text_follows_the_browser_language():
    scope = scope_of(origin="http://x.example")
    scope["headers"].append((b"accept-language", b"zh-CN,zh;q=0.9"))
    sent = await call(security.WebSecurityMiddleware(Inner()), scope)
    assert "已拒绝" in sent[1]["body"].decode()


@pytest.mark.parametrize(
    "value,canonical",
    [
        ("http://localhost:8080", "http://localhost:8080"),
        ("HTTPS://Chat.Example.com", "https://chat.example.com:443"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("localhost:8080", None),  # no scheme
        ("http://x.example/app", None),  # a path
        ("ftp://x.example", None),
        ("http://user@x.example", None),
        ("http://x.example:99999", None),
        ("null", None),
    ],
)
def test_canonical_origin(value, canonical):
    assert canonical_origin(value) == canonical


def test_a_bad_allowed_origin_is_a_config_error_naming_the_value_and_the_form(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "none.toml", env={"QWENCHAT_UI_ALLOWED_ORIGINS": "localhost:8080"})
    text = err.value.user_text("en")
    assert "ui.allowed_origins" in text and "'localhost:8080'" in text and "http://localhost:8080" in text
    ok = load_settings(tmp_path / "none.toml", env={"QWENCHAT_UI_ALLOWED_ORIGINS": "http://a:1 https://b"})
    assert ok.ui.allowed_origins == ("http://a:1", "https://b")


# ---------------------------------------------------------------- headers


@pytest.mark.asyncio
async def test_every_http_answer_carries_the_security_headers():
    sent = await call(security.WebSecurityMiddleware(Inner()), scope_of(origin="http://127.0.0.1:8080"))
    h = headers_of(sent)
    csp = h[b"content-security-policy"].decode()
    assert "img-src 'self' data: blob:" in csp and "frame-ancestors 'none'" in csp
    assert "http:" not in csp.replace("https:", "")  # no scheme-wide source: remote images stay out
    assert h[b"x-content-type-options"] == b"nosniff" and h[b"x-frame-options"] == b"DENY"


class Page:
    """An ASGI app answering one HTML page (gzipped, in chunks, as Chainlit sends its index.html)."""

    def __init__(self, html: bytes, *, gzipped: bool = True, chunk: int = 40) -> None:
        import gzip

        self.body = gzip.compress(html) if gzipped else html
        self.gzipped, self.chunk = gzipped, chunk

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/html; charset=utf-8")]
        if self.gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        parts = [self.body[i : i + self.chunk] for i in range(0, len(self.body), self.chunk)] or [b""]
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


@pytest.mark.asyncio
@pytest.mark.parametrize("gzipped", [True, False])
async def test_a_page_runs_only_its_own_inline_scripts_by_their_hashes(gzipped):
    import base64
    import hashlib

    html = (
        b"<html><head><script>\n  const global = globalThis;\n</script>"
        b'<script type="module" crossorigin src="/assets/index.js"></script>'
        b"<SCRIPT>window.theme = {};</SCRIPT></head><body></body></html>"
    )
    page = Page(html, gzipped=gzipped)
    sent = await call(security.WebSecurityMiddleware(page), scope_of(origin="http://127.0.0.1:8080"))
    csp = headers_of(sent)[b"content-security-policy"].decode()
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src"))
    expected = sorted(
        "'sha256-" + base64.b64encode(hashlib.sha256(s).digest()).decode() + "'"
        for s in (b"\n  const global = globalThis;\n", b"window.theme = {};")
    )
    assert script_src == " ".join(["script-src 'self'", *expected])  # no 'unsafe-inline': nothing else inline runs
    assert b"".join(m.get("body", b"") for m in sent[1:]) == page.body  # the page itself goes out unchanged


@pytest.mark.asyncio
async def test_answers_that_are_not_pages_allow_no_inline_script():
    sent = await call(security.WebSecurityMiddleware(Inner()), scope_of(origin="http://127.0.0.1:8080"))
    assert "script-src 'self';" in headers_of(sent)[b"content-security-policy"].decode()  # "ok" has no script
    assert "unsafe-inline" not in next(
        d for d in headers_of(sent)[b"content-security-policy"].decode().split("; ") if d.startswith("script-src")
    )


def test_install_adds_one_middleware_and_narrows_chainlits_cors():
    from starlette.applications import Starlette
    from starlette.middleware.cors import CORSMiddleware

    app = Starlette()
    app.add_middleware(CORSMiddleware, allow_origins=["*"])
    settings = Settings(ui=UISettings(allowed_origins=("https://chat.example.com", "http://h:8080")))
    security.install(app, settings)
    security.install(app, settings)
    assert [m.cls for m in app.user_middleware].count(security.WebSecurityMiddleware) == 1
    cors = next(m for m in app.user_middleware if m.cls is CORSMiddleware)
    assert cors.kwargs["allow_origins"] == ["https://chat.example.com", "http://h:8080"]  # as browsers send them
    security.install(Starlette(), Settings())  # no CORS middleware: nothing to narrow, no error


# ---------------------------------------------------------------- login throttle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_lets_five_failures_through_then_waits_longer_each_time():
    clock = Clock()
    th = security.LoginThrottle(clock=clock, base_delay=1.0, max_delay=60.0)
    assert [th.begin("1.2.3.4") for _ in range(4)] == [0.0] * 4
    assert th.begin("1.2.3.4") == 0.0  # the 5th attempt goes through, then a wait starts
    waits = []
    for _ in range(8):
        wait = th.begin("1.2.3.4")
        assert wait > 0  # too early: refused
        waits.append(wait)
        clock.now += wait
        assert th.begin("1.2.3.4") == 0.0  # after the wait: one more attempt
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]  # doubling, capped
    assert th.begin("5.6.7.8") == 0.0  # per address: another client is not affected


def test_a_successful_login_clears_the_address():
    clock = Clock()
    th = security.LoginThrottle(clock=clock)
    for _ in range(5):
        th.begin("a")
    assert th.begin("a") > 0
    clock.now += 10
    th.begin("a")
    th.succeeded("a")
    assert th.failures("a") == 0 and [th.begin("a") for _ in range(5)] == [0.0] * 5


def test_the_throttle_forgets_old_addresses_and_stays_bounded():
    clock = Clock()
    th = security.LoginThrottle(clock=clock, forget_after=60, max_clients=100)
    for _ in range(5):
        th.begin("a")
    clock.now += 3600
    assert th.begin("a") == 0.0 and th.failures("a") == 1
    for i in range(1000):
        th.begin(f"10.0.{i // 256}.{i % 256}")
    assert len(th._clients) == 100


@pytest.mark.asyncio
async def test_login_posts_are_throttled_per_address_without_blocking_the_loop(monkeypatch):
    import time

    def no_blocking_sleep(seconds: float) -> None:
        raise AssertionError("time.sleep in the event loop")

    monkeypatch.setattr(time, "sleep", no_blocking_sleep)
    inner = Inner(status=401)
    mw = security.WebSecurityMiddleware(inner, throttle=security.LoginThrottle(base_delay=30))
    streaming = asyncio.Event()
    chat = asyncio.create_task(streaming.wait())  # an answer streaming meanwhile
    sent_all = await asyncio.gather(
        *(call(mw, scope_of(path="/login", method="POST", client="9.9.9.9")) for _ in range(50))
    )
    statuses = [sent[0]["status"] for sent in sent_all]
    assert not chat.done()  # 50 attempts answered while the chat still runs: none waited on anything
    streaming.set()
    await chat
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}
    assert len(inner.calls) == 5  # the password check ran 5 times, not 50
    refused = await call(mw, scope_of(path="/login", method="POST", client="9.9.9.9"))
    h = headers_of(refused)
    assert 1 <= int(h[b"retry-after"]) <= 30
    detail = json.loads(refused[1]["body"])["detail"]
    assert "Too many failed sign-ins" in detail and f"{int(h[b'retry-after'])} s" in detail
    other = await call(mw, scope_of(path="/login", method="POST", client="8.8.8.8"))
    assert other[0]["status"] == 401  # another address is judged on its own
    page = await call(mw, scope_of(path="/login", method="GET", client="9.9.9.9"))
    assert page[0]["status"] == 401 and len(inner.calls) == 7  # only POST /login is counted and refused


def test_a_refused_login_is_logged_without_the_typed_name():
    settings = Settings(ui=UISettings(auth=True, username="demo", password="pw"))
    typed = "hunter2-my-password"
    note = security.login_refused_note(settings, typed)
    assert typed not in note and "unknown user name" in note and str(len(typed)) in note
    assert "configured user name" in security.login_refused_note(settings, "demo")


# ---------------------------------------------------------------- exposure rules


def exposure(ui_host: str, *, auth: bool = False, public: bool = False, host: str = "127.0.0.1") -> list[str]:
    ui = UISettings(auth=auth, password="pw" if auth else "", public=public)
    return check_exposure(Settings(server=ServerSettings(ui_host=ui_host, host=host), ui=ui))


@pytest.mark.parametrize("ui_host", ["0.0.0.0", "192.168.1.5", "::", "chat.example", ""])
def test_a_ui_open_to_others_without_login_is_refused_naming_both_settings(ui_host):
    with pytest.raises(ExposureRefused) as err:
        exposure(ui_host)
    text = err.value.user_text("en")
    assert "[server] ui_host" in text and "[ui] auth" in text and "[ui] public = true" in text
    assert "[ui] auth" in err.value.user_text("zh") and "[server] ui_host" in err.value.user_text("zh")


def test_the_launcher_refuses_it_before_starting_anything_and_exits_non_zero(tmp_path, capsys):
    settings = Settings(server=ServerSettings(ui_host="0.0.0.0"), logging=LoggingSettings(dir=str(tmp_path / "logs")))
    umask = os.umask(0o022)
    try:
        assert launch.run_serve(settings) != 0
    finally:
        os.umask(umask)  # serve() sets 077 for the process it runs in
    assert "[ui] public = true" in capsys.readouterr().out
    assert not (tmp_path / "logs" / "engine.log").exists()  # nothing was launched


@pytest.mark.parametrize("ui_host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_a_loopback_ui_is_fine_without_login(ui_host):
    assert exposure(ui_host) == []


def test_public_or_login_allows_an_open_ui_public_warns():
    assert exposure("0.0.0.0", auth=True) == []
    [warning] = exposure("0.0.0.0", public=True)
    assert warning.startswith("WARNING") and "anyone who can reach 0.0.0.0:8080" in warning


def test_an_engine_open_to_others_gets_a_loud_warning_naming_tokenize_and_metrics():
    [warning] = exposure("127.0.0.1", host="0.0.0.0")
    assert warning.startswith("WARNING") and "/tokenize" in warning and "/metrics" in warning
    external = Settings(server=ServerSettings(host="0.0.0.0"), base_url="http://gpu:8000/v1")
    assert check_exposure(external) == []  # nothing is launched in external mode


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("localhost.evil")


# ---------------------------------------------------------------- sessions bound to the password


def test_changing_the_password_invalidates_tokens_signed_before(tmp_path, monkeypatch):
    import chainlit as cl
    import jwt
    from chainlit.auth.jwt import create_jwt, decode_jwt

    logs = LoggingSettings(dir=str(tmp_path / "logs"))
    env: dict[str, str] = {}

    def start(password: str) -> None:
        history.prepare(Settings(ui=UISettings(auth=True, password=password), logging=logs), env)
        monkeypatch.setenv("CHAINLIT_AUTH_SECRET", env["CHAINLIT_AUTH_SECRET"])

    start("old password")
    token = create_jwt(cl.User(identifier="admin"))
    start("old password")  # a restart with the same password: the session survives
    assert decode_jwt(token).identifier == "admin"
    start("new password")
    with pytest.raises(jwt.InvalidSignatureError):
        decode_jwt(token)
    assert "new password" not in env["CHAINLIT_AUTH_SECRET"]


def test_a_user_supplied_chainlit_secret_is_still_bound_to_the_password(tmp_path):
    logs = LoggingSettings(dir=str(tmp_path / "logs"))
    env_a = {"CHAINLIT_AUTH_SECRET": "mine" * 16}
    env_b = dict(env_a)
    history.prepare(Settings(ui=UISettings(auth=True, password="a"), logging=logs), env_a)
    history.prepare(Settings(ui=UISettings(auth=True, password="b"), logging=logs), env_b)
    assert env_a["CHAINLIT_AUTH_SECRET"] != env_b["CHAINLIT_AUTH_SECRET"]
    assert login.session_secret("mine" * 16, "admin", "a") == env_a["CHAINLIT_AUTH_SECRET"]


# ---------------------------------------------------------------- owner-only files


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_history_database_and_its_folder_are_owner_only(tmp_path):
    old = os.umask(0o022)  # what a default shell gives: new files 0644
    try:
        logs = tmp_path / "logs"
        settings = Settings(ui=UISettings(auth=True, password="pw"), logging=LoggingSettings(dir=str(logs)))
        history.prepare(settings, {})
    finally:
        os.umask(old)
    assert mode(logs) == 0o700
    assert mode(logs / "history.sqlite3") == 0o600
    assert mode(logs / login.SECRET_FILE) == 0o600


def test_a_history_database_elsewhere_is_owner_only_its_folder_left_alone(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    ui = UISettings(auth=True, password="pw", history_db=str(folder / "h.sqlite3"))
    history.prepare(Settings(ui=ui, logging=LoggingSettings(dir=str(tmp_path / "logs"))), {})
    assert mode(folder / "h.sqlite3") == 0o600 and mode(folder) == 0o755


def test_the_launchers_log_folder_is_owner_only_with_its_files(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    os.chmod(logs, 0o755)
    (logs / "ui.log").write_text("old run")
    os.chmod(logs / "ui.log", 0o644)
    launch.private_log_dir(logs)
    assert mode(logs) == 0o700 and mode(logs / "ui.log") == 0o600
    fresh = tmp_path / "fresh" / "logs"
    launch.private_log_dir(fresh)
    assert mode(fresh) == 0o700


# ---------------------------------------------------------------- Host names (DNS rebinding)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["http", "websocket"])
@pytest.mark.parametrize("host", ["evil.example:8080", "192.168.1.20:8080", "evil.example", "localhost.evil.example"])
async def test_a_loopback_ui_refuses_other_host_names_even_without_origin(kind, host, caplog):
    """A rebinding page is same-origin with itself: a plain GET carries no Origin, only its Host."""
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, loopback_only=True)
    with caplog.at_level(logging.WARNING):
        sent = await call(mw, scope_of(kind, host=host))
        await call(mw, scope_of(kind, host=host))
    assert inner.calls == []
    if kind == "http":
        assert sent[0]["status"] == 403 and b"127.0.0.1" in sent[1]["body"]
    else:
        assert sent == [{"type": "websocket.close", "code": 1008}]
    assert caplog.text.count("DNS-rebinding") == 1  # logged once per Host


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "app.localhost:8080", "[::1]:8080", "127.0.0.5"])
async def test_a_loopback_ui_serves_loopback_names(host):
    inner = Inner()
    await call(security.WebSecurityMiddleware(inner, loopback_only=True), scope_of(host=host))
    assert len(inner.calls) == 1


@pytest.mark.asyncio
async def test_allowed_origins_add_their_host_names_and_a_public_ui_serves_any_name():
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, loopback_only=True, allowed_origins=["https://chat.example:8443"])
    await call(mw, scope_of(host="chat.example:8443"))
    await call(security.WebSecurityMiddleware(inner), scope_of(host="anything.example:8080"))
    assert len(inner.calls) == 2


def test_install_turns_the_host_check_on_for_a_loopback_ui_only():
    from starlette.applications import Starlette

    for ui_host, expected in [("127.0.0.1", True), ("0.0.0.0", False)]:
        app = Starlette()
        security.install(app, Settings(server=ServerSettings(ui_host=ui_host)))
        mw = next(m for m in app.user_middleware if m.cls is security.WebSecurityMiddleware)
        assert mw.kwargs["loopback_only"] is expected

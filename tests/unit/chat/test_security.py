"""backend/web/security.py: origin check (HTTP + websocket), security headers, login throttle; the
exposure rules (backend/launcher/preflight.py), sessions bound to the password, owner-only files."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import stat
from typing import Any

import pytest

from backend.errors import ConfigError, ExposureRefused
from backend.launcher import launch
from backend.launcher.preflight import check_exposure
from backend.settings import (
    HistorySettings,
    LoggingSettings,
    LoginSettings,
    NetworkSettings,
    Settings,
    canonical_origin,
    is_loopback,
    load_settings,
)
from backend.storage import history
from backend.web import login, security

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
        assert sent[0]["status"] == 403 and b"9999" not in sent[1]["body"]  # the refused origin is not echoed
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
async def test_the_uis_own_origin_passes_under_each_name_it_answers_to(kind, origin, host):
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, hosts=["chat.example"])
    sent = await call(mw, scope_of(kind, origin=origin, host=host))
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
        load_settings(tmp_path / "none.toml", env={"QWENCHAT_NETWORK_ALLOWED_ORIGINS": "localhost:8080"})
    text = err.value.user_text("en")
    assert "network.allowed_origins" in text and "'localhost:8080'" in text and "http://localhost:8080" in text
    ok = load_settings(tmp_path / "none.toml", env={"QWENCHAT_NETWORK_ALLOWED_ORIGINS": "http://a:1 https://b"})
    assert ok.network.allowed_origins == ("http://a:1", "https://b")


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


def test_install_adds_one_middleware():
    """(Chainlit's CORS answers the same origins: backend/ui/chainlit_settings.py, its test narrows it.)"""
    from starlette.applications import Starlette

    app = Starlette()
    settings = Settings(network=NetworkSettings(allowed_origins=("https://chat.example.com", "http://h:8080")))
    security.install(app, settings)
    security.install(app, settings)
    assert [m.cls for m in app.user_middleware].count(security.WebSecurityMiddleware) == 1


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
    settings = Settings(login=LoginSettings(enable=True, username="demo", password="pw"))
    typed = "hunter2-my-password"
    note = security.login_refused_note(settings, typed)
    assert typed not in note and "unknown user name" in note and str(len(typed)) in note
    assert "configured user name" in security.login_refused_note(settings, "demo")


# ---------------------------------------------------------------- exposure rules


def exposure(
    ui_host: str, *, auth: bool = False, public: bool = False, host: str = "127.0.0.1", hosts: tuple[str, ...] = ()
) -> list[str]:
    login = LoginSettings(enable=auth, password="pw" if auth else "")
    network = NetworkSettings(ui_host=ui_host, engine_host=host, public=public, host_names=hosts)
    return check_exposure(Settings(network=network, login=login))


@pytest.mark.parametrize("ui_host", ["0.0.0.0", "192.168.1.5", "::", "chat.example", ""])
def test_a_ui_open_to_others_without_login_is_refused_naming_both_settings(ui_host):
    with pytest.raises(ExposureRefused) as err:
        exposure(ui_host)
    text = err.value.user_text("en")
    assert "[network] ui_host" in text and "[login] enable" in text and "[network] public = true" in text
    assert "[login] enable" in err.value.user_text("zh") and "[network] ui_host" in err.value.user_text("zh")


def test_the_launcher_refuses_it_before_starting_anything_and_exits_non_zero(tmp_path, capsys):
    settings = Settings(network=NetworkSettings(ui_host="0.0.0.0"), logging=LoggingSettings(dir=str(tmp_path / "logs")))
    umask = os.umask(0o022)
    try:
        assert launch.run_serve(settings) != 0
    finally:
        os.umask(umask)  # serve() sets 077 for the process it runs in
    assert "[network] public = true" in capsys.readouterr().out
    assert not (tmp_path / "logs" / "engine.log").exists()  # nothing was launched


@pytest.mark.parametrize("ui_host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_a_loopback_ui_is_fine_without_login(ui_host):
    assert exposure(ui_host) == []


def test_public_or_login_allows_an_open_ui_public_warns():
    assert exposure("0.0.0.0", auth=True, hosts=("chat.example",))[0].startswith("the UI answers on port 8080")
    warning, _ = exposure("0.0.0.0", public=True, hosts=("chat.example",))
    assert warning.startswith("WARNING") and "anyone who can reach 0.0.0.0:8080" in warning


def test_an_engine_open_to_others_warns_only_of_what_its_key_leaves_open():
    """With the key on every route but GET /health (the engine's middleware), what remains is plain HTTP."""
    [warning] = exposure("127.0.0.1", host="0.0.0.0")
    assert warning.startswith("WARNING") and "GET /health" in warning and "plain HTTP" in warning
    assert "/tokenize" not in warning and "/metrics" not in warning  # they take the key now
    external = Settings(network=NetworkSettings(engine_host="0.0.0.0"), base_url="http://gpu:8000/v1")
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
        history.prepare(Settings(login=LoginSettings(enable=True, password=password), logging=logs), env)
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
    history.prepare(Settings(login=LoginSettings(enable=True, password="a"), logging=logs), env_a)
    history.prepare(Settings(login=LoginSettings(enable=True, password="b"), logging=logs), env_b)
    assert env_a["CHAINLIT_AUTH_SECRET"] != env_b["CHAINLIT_AUTH_SECRET"]
    assert login.session_secret("mine" * 16, "admin", "a") == env_a["CHAINLIT_AUTH_SECRET"]


# ---------------------------------------------------------------- owner-only files


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_history_database_and_its_folder_are_owner_only(tmp_path):
    old = os.umask(0o022)  # what a default shell gives: new files 0644
    try:
        logs = tmp_path / "logs"
        settings = Settings(login=LoginSettings(enable=True, password="pw"), logging=LoggingSettings(dir=str(logs)))
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
    login_on = LoginSettings(enable=True, password="pw")
    elsewhere = HistorySettings(db=str(folder / "h.sqlite3"))
    history.prepare(
        Settings(login=login_on, history=elsewhere, logging=LoggingSettings(dir=str(tmp_path / "logs"))), {}
    )
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
    mw = security.WebSecurityMiddleware(inner)
    with caplog.at_level(logging.WARNING):
        sent = await call(mw, scope_of(kind, host=host))
        await call(mw, scope_of(kind, host=host))
    assert inner.calls == []
    if kind == "http":
        assert (
            sent[0]["status"] == 403 and b"[network] host_names" in sent[1]["body"] and b"evil" not in sent[1]["body"]
        )
    else:
        assert sent == [{"type": "websocket.close", "code": 1008}]
    assert caplog.text.count("DNS-rebinding") == 1  # logged once per Host


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "app.localhost:8080", "[::1]:8080", "127.0.0.5"])
async def test_a_loopback_ui_serves_loopback_names(host):
    inner = Inner()
    await call(security.WebSecurityMiddleware(inner), scope_of(host=host))
    assert len(inner.calls) == 1


@pytest.mark.asyncio
async def test_allowed_origins_and_hosts_add_their_host_names():
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, allowed_origins=["https://chat.example:8443"], hosts=["Gpu-Box."])
    await call(mw, scope_of(host="chat.example:8443"))
    await call(mw, scope_of(host="gpu-box:8080"))
    await call(mw, scope_of(host="gpu-box.:8080"))  # a trailing dot names the same host
    refused = await call(mw, scope_of(host="anything.example:8080"))
    assert len(inner.calls) == 3 and refused[0]["status"] == 403


# ---------------------------------------------------------------- a UI off loopback: [network] host_names (issue 18)


def asgi_app(settings: Settings):
    """A Starlette app with a page, a login route that refuses (401) and a websocket, behind ``install``."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    async def page(request):
        return PlainTextResponse("page")

    async def refuse_login(request):  # takes the admin's password "pw", refuses any other
        async with request.form() as form:
            if form.get("username") == "admin" and form.get("password") == "pw":
                return PlainTextResponse("in")
        return PlainTextResponse("wrong", status_code=401)

    async def socket(ws):
        await ws.accept()
        await ws.close()

    app = Starlette(
        routes=[Route("/", page), Route("/login", refuse_login, methods=["POST"]), WebSocketRoute("/ws", socket)]
    )
    with pytest.MonkeyPatch.context() as mp:  # the throttles' time stands still: no lock ends during a test
        mp.setattr(security, "LoginThrottle", functools.partial(security.LoginThrottle, clock=Clock()))
        security.install(app, settings)
    return app


def open_ui(*hosts: str, ui_host: str = "0.0.0.0", **network: Any) -> Settings:
    login_on = LoginSettings(enable=True, password="pw")
    return Settings(network=NetworkSettings(ui_host=ui_host, host_names=hosts, **network), login=login_on)


async def get_with(app, host: str, origin: str | None = None, client: str = "127.0.0.1"):
    import httpx

    headers = {"host": host, **({"origin": origin} if origin else {})}
    transport = httpx.ASGITransport(app=app, client=(client, 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://ui") as http:
        return await http.get("/", headers=headers)


@pytest.mark.asyncio
async def test_a_ui_off_loopback_serves_only_the_names_in_ui_hosts():
    """Measured on main: with ui_host 0.0.0.0 every Host was served, so a rebinding page could use the UI."""
    app = asgi_app(open_ui("chat.example", "10.0.0.5"))
    for host in ("chat.example:8080", "CHAT.example.:8080", "10.0.0.5:8080", "localhost:8080", "127.0.0.1:8080"):
        assert (await get_with(app, host)).status_code == 200, host
    for host in ("evil.example:8080", "10.0.0.6:8080", "chat.example.evil.example:8080", ""):
        answer = await get_with(app, host)
        assert answer.status_code == 403 and "evil" not in answer.text, host
    refused = await call(app, scope_of("websocket", host="evil.example:8080", path="/ws"))
    assert refused == [{"type": "websocket.close", "code": 1008}]  # the upgrade is answered 403
    served = await call(app, scope_of("websocket", host="chat.example:8080", path="/ws"))
    assert served[0] == {"type": "websocket.accept", "subprotocol": None, "headers": []}


@pytest.mark.asyncio
async def test_a_single_address_ui_host_and_allowed_origins_are_served_without_ui_hosts():
    app = asgi_app(open_ui(ui_host="10.0.0.10", allowed_origins=("https://chat.example.com",)))
    assert (await get_with(app, "10.0.0.10:8080")).status_code == 200
    assert (await get_with(app, "chat.example.com")).status_code == 200
    assert (await get_with(app, "evil.example:8080")).status_code == 403


@pytest.mark.asyncio
async def test_a_ui_on_every_address_without_hosts_serves_loopback_names_only_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger=security.logger.name):
        app = asgi_app(open_ui())
    assert "[network] host_names is empty" in caplog.text and "'0.0.0.0'" in caplog.text
    assert (await get_with(app, "10.0.0.5:8080")).status_code == 403
    assert (await get_with(app, "localhost:8080")).status_code == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["http", "websocket"])
async def test_the_origin_check_uses_the_configured_names_not_the_requests_host(kind):
    """A forged Host no longer makes its own origin the UI's: the Host check refuses it, and so does the origin
    check by itself (it never takes a name from the request)."""
    inner = Inner()
    mw = security.WebSecurityMiddleware(inner, hosts=["chat.example"])
    forged = scope_of(kind, origin="http://evil.example:8080", host="evil.example:8080")
    assert not mw.origin_allowed("http://evil.example:8080", forged)
    assert mw.origin_allowed("http://chat.example:8080", scope_of(kind, host="chat.example:8080"))
    # a served name, but another page than the one the request was sent to (another port, another name)
    assert not mw.origin_allowed("http://chat.example:3000", scope_of(kind, host="chat.example:8080"))
    assert not mw.origin_allowed("http://localhost:8080", scope_of(kind, host="chat.example:8080"))
    app = asgi_app(open_ui("chat.example"))
    answer = await get_with(app, "evil.example:8080", origin="http://evil.example:8080")
    assert answer.status_code == 403


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "host, origin",
    [
        ("evil.example:8080", None),  # a forged Host (a DNS-rebinding page's plain GET)
        ("evil<b>x</b>.example", None),
        ("127.0.0.1:8080", "null"),  # a sandboxed frame or a file: page
        ("127.0.0.1:8080", "http://evil.example:8080"),
    ],
)
async def test_a_refusal_answers_403_without_echoing_the_input(host, origin, caplog):
    inner = Inner()
    scope = scope_of(origin=origin, host=host)
    scope["headers"] += [(b"authorization", b"Bearer sk-the-engine-key"), (b"cookie", b"access_token=tok3n")]
    with caplog.at_level(logging.WARNING, logger=security.logger.name):
        sent = await call(security.WebSecurityMiddleware(inner), scope)
    body = sent[1]["body"].decode()
    assert inner.calls == [] and sent[0]["status"] == 403 and body
    assert "evil" not in body and "null" not in body and "<b>" not in body
    assert headers_of(sent)[b"x-content-type-options"] == b"nosniff"
    assert len(caplog.records) == 1  # logged, once, with what was refused, never a key or a cookie
    assert "sk-the-engine-key" not in caplog.text and "tok3n" not in caplog.text


@pytest.mark.asyncio
async def test_refusals_are_logged_once_each_and_a_flood_of_one_kind_does_not_silence_another(caplog):
    mw = security.WebSecurityMiddleware(Inner())
    with caplog.at_level(logging.WARNING, logger=security.logger.name):
        for i in range(security.MAX_LOGGED + 50):
            await call(mw, scope_of(host=f"evil-{i}.example:8080"))
            await call(mw, scope_of(host=f"evil-{i}.example:8080"))
        await call(mw, scope_of(origin="http://127.0.0.1:9999"))
    hosts = [r.getMessage() for r in caplog.records if "for Host" in r.getMessage()]
    assert len(hosts) == security.MAX_LOGGED  # each once, then bounded …
    assert sum("further ones are refused" in r.getMessage() for r in caplog.records) == 1  # … and says so once
    assert "origin 'http://127.0.0.1:9999'" in caplog.text  # another kind is still logged


def test_a_ui_on_every_address_without_hosts_is_refused_at_start_naming_ui_hosts():
    with pytest.raises(ConfigError) as err:
        exposure("0.0.0.0", auth=True)
    text = err.value.user_text("en")
    assert (
        "network.host_names" in text and "[network] host_names = [" in text and "QWENCHAT_NETWORK_HOST_NAMES=" in text
    )
    assert "DNS rebinding" in text and "[network] ui_host" in text


def test_the_start_says_which_names_a_ui_off_loopback_answers_to():
    [line] = exposure("10.0.0.10", auth=True)
    assert "10.0.0.10" in line and "[network] host_names" in line and "403" in line
    [line] = exposure("0.0.0.0", auth=True, hosts=("chat.example", "gpu-box"))
    assert "chat.example, gpu-box" in line


@pytest.mark.parametrize("auth, refusal", [(False, "[network] public = true"), (True, "network.host_names")])
def test_serve_prepare_refuses_before_the_ui_starts(tmp_path, monkeypatch, capsys, auth, refusal):
    """`serve --prepare` starts the UI before the engine is built: the exposure rules come first there too (on
    main the UI was started, open to other machines without login, and only refused after the build)."""
    login_settings = LoginSettings(enable=auth, password="long enough" if auth else "")
    logs = LoggingSettings(dir=str(tmp_path / "logs"))
    settings = Settings(network=NetworkSettings(ui_host="0.0.0.0"), login=login_settings, logging=logs)
    monkeypatch.setattr(launch.prepare_bg, "needs_preparing", lambda s: True)
    started: list[Any] = []

    def start_process(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise RuntimeError("the UI was started")

    monkeypatch.setattr(launch, "start_process", start_process)
    umask = os.umask(0o022)
    try:
        assert launch.run_serve(settings, prepare=True) == 2
    finally:
        os.umask(umask)
    assert started == [] and refusal in capsys.readouterr().out


# ---------------------------------------------------------------- login details (issue 18)


VIEWER_PASSWORD = "viewer-password"


@pytest.fixture(scope="module")
def viewer_hash() -> str:
    from backend.passwords import hash_password

    return hash_password(VIEWER_PASSWORD)  # the iterations hash-password uses, as the dummy has


@pytest.fixture
def pbkdf2_calls(monkeypatch):
    """Every PBKDF2 computed: (iterations, thread name)."""
    import hashlib
    import threading

    calls: list[tuple[int, str]] = []
    real = hashlib.pbkdf2_hmac

    def counted(name, password, salt, iterations, *args):
        calls.append((iterations, threading.current_thread().name))
        return real(name, password, salt, iterations, *args)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    return calls


@pytest.mark.parametrize("with_users", [False, True])
def test_every_name_costs_exactly_one_pbkdf2_of_the_same_strength(pbkdf2_calls, viewer_hash, with_users):
    """The admin name, a [login] users name and an unknown name: one hash each, right or wrong password, so the
    answer's timing does not tell which names exist (on main: the admin name and, without users, an unknown name
    cost none)."""
    users = {"viewer": viewer_hash} if with_users else {}
    settings = Settings(login=LoginSettings(enable=True, username="demo", password="demo-pass", users=users))
    attempts = [("demo", "demo-pass", True), ("demo", "wrong", False), ("nobody", "demo-pass", False)]
    if with_users:
        attempts += [("viewer", VIEWER_PASSWORD, True), ("viewer", "wrong", False)]
    for name, password, ok in attempts:
        before = len(pbkdf2_calls)
        assert login.check_password(settings, name, password) is ok
        assert len(pbkdf2_calls) == before + 1, (name, password)
    assert {iterations for iterations, _ in pbkdf2_calls} == {passwords_iterations()}


def passwords_iterations() -> int:
    from backend.passwords import ITERATIONS

    return ITERATIONS


@pytest.mark.asyncio
async def test_login_hashing_runs_on_its_own_threads_not_the_default_pool(pbkdf2_calls, viewer_hash, tmp_path):
    """Token counting runs in the event loop's default pool (asyncio.to_thread): a burst of sign-ins must not
    queue in front of it. Checked through the UI's own password callback (backend/ui/login.py)."""
    from chainlit.config import config

    from tests.fakes.openai_server import FakeServer
    from tests.unit.test_app_routes import installed_ui

    settings = Settings(login=LoginSettings(enable=True, password="pw", users={"viewer": viewer_hash}))
    assert await login.verify_login(settings, "viewer", VIEWER_PASSWORD)
    async with FakeServer() as fake, installed_ui(fake, tmp_path, auth="true", password="pw"):
        assert await config.code.password_auth_callback("admin", "pw") is not None
        assert await config.code.password_auth_callback("admin", "wrong") is None
    threads = [thread for _, thread in pbkdf2_calls]
    assert len(threads) == 3 and all(name.startswith("qwenchat-login") for name in threads), threads


@pytest.mark.parametrize(
    "address, key",
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("fe80::1%eth0", "fe80::/64"),
        ("unknown", "unknown"),
    ],
)
def test_the_throttle_counts_an_ipv6_client_by_its_64(address, key):
    assert security.client_key(address) == key


async def post_login(app, name: str, client: str, *, multipart: bool = False, password: str = "guess"):
    import httpx

    transport = httpx.ASGITransport(app=app, client=(client, 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as http:
        form = {"username": name, "password": password}
        if multipart:  # what Chainlit's login page sends (a FormData)
            return await http.post("/login", files={k: (None, v) for k, v in form.items()})
        return await http.post("/login", data=form)


@pytest.mark.asyncio
async def test_an_ipv6_client_cannot_escape_the_throttle_by_changing_its_address():
    app = asgi_app(Settings(login=LoginSettings(enable=True, password="pw")))
    statuses = [(await post_login(app, f"user-{i}", f"2001:db8:0:7::{i + 1:x}")).status_code for i in range(8)]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}, statuses
    assert (await post_login(app, "user-x", "2001:db8:0:8::1")).status_code == 401  # another /64


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["admin", "nobody-at-all"])
async def test_a_guess_spread_over_many_addresses_at_one_name_is_throttled(name, caplog):
    """Attempts from many addresses, all at one name: after ACCOUNT_FREE failures the name waits, for every address
    that has failed (a fresh one gets its one try: see the next test). An unknown name is counted the same way (else
    a 429 would say which names exist)."""
    app = asgi_app(Settings(login=LoginSettings(enable=True, password="pw")))
    statuses = []
    with caplog.at_level(logging.WARNING, logger=security.logger.name):
        for i in range(security.ACCOUNT_FREE + 3):
            answer = await post_login(app, name, f"198.51.100.{i % 4 + 1}", multipart=i % 2 == 0)
            statuses.append(answer.status_code)
    free = security.ACCOUNT_FREE
    assert statuses[:free] == [401] * free and set(statuses[free:]) == {429}, statuses
    assert "this user name" in answer.json()["detail"] and int(answer.headers["retry-after"]) >= 1
    assert (await post_login(app, "someone-else", "198.51.100.200")).status_code == 401
    assert "at the user name with fingerprint" in caplog.text and name not in caplog.text


@pytest.mark.asyncio
async def test_a_correct_password_from_a_client_that_has_not_failed_is_let_in_while_the_name_is_locked():
    """The name's lock slows the guessers (each failed address waits), not the owner signing in from elsewhere."""
    app = asgi_app(Settings(login=LoginSettings(enable=True, password="pw")))
    for i in range(security.ACCOUNT_FREE + 2):
        await post_login(app, "admin", f"198.51.100.{i % 3 + 1}")
    assert (await post_login(app, "admin", "198.51.100.1")).status_code == 429  # a guesser: locked out
    assert (await post_login(app, "admin", "203.0.113.10")).status_code == 401  # a fresh address: one try ...
    assert (await post_login(app, "admin", "203.0.113.10", password="pw")).status_code == 429  # ... then it waits
    assert (await post_login(app, "admin", "203.0.113.9", password="pw")).status_code == 200  # the owner: in


def test_a_failure_let_through_a_locked_name_still_lengthens_its_wait():
    """A guess spread over fresh addresses: each clean client's failure at the locked name is counted there, so
    the wait every failed client sees keeps doubling (counted only when the lock had lapsed, it stayed at 1-2 s)."""
    clock = Clock()
    th = security.LoginThrottle(clock=clock, free=3)
    for _ in range(3):
        th.begin("name")
    first = th.wait("name")
    for _ in range(5):
        assert th.begin("name", waived=True) == 0.0  # the clean client goes ahead ...
    assert th.failures("name") == 8 and th.wait("name") >= 16 * first  # ... and the name's wait grew with it


def test_a_flood_of_made_up_names_does_not_wipe_the_count_of_a_real_one():
    clock = Clock()
    th = security.LoginThrottle(clock=clock, free=3, max_clients=10, keep={"real"})
    for _ in range(3):
        th.begin("real")
    for i in range(100):
        th.begin(f"made-up-{i}")
    assert th.begin("real") > 0 and th.failures("real") == 3


def test_the_refused_login_fingerprint_is_an_hmac_keyed_with_the_servers_secret(monkeypatch):
    """On main it was sha256(typed)[:10]: a log reader could test password guesses typed into the name field."""
    import hashlib
    import hmac

    settings = Settings(login=LoginSettings(enable=True, username="demo", password="pw"))
    typed = "hunter2-my-password"
    notes = {}
    for secret in ("secret-one", "secret-two"):
        monkeypatch.setenv("CHAINLIT_AUTH_SECRET", secret)
        notes[secret] = security.login_refused_note(settings, typed)
        message = b"qwenchat-login-name\0" + typed.encode()
        expected = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:12]
        assert f"fingerprint {expected}" in notes[secret]
    assert notes["secret-one"] != notes["secret-two"] and typed not in notes["secret-one"]
    assert hashlib.sha256(typed.encode()).hexdigest()[:10] not in notes["secret-one"]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_login_password_shorter_than_the_minimum_stops_the_start_naming_its_length_not_itself(
    tmp_path, monkeypatch, capsys, prepare
):
    from backend.passwords import MIN_PASSWORD_LENGTH

    settings = Settings(
        login=LoginSettings(enable=True, password="s3cret"), logging=LoggingSettings(dir=str(tmp_path / "logs"))
    )
    monkeypatch.setattr(launch.prepare_bg, "needs_preparing", lambda s: True)
    monkeypatch.setattr(launch, "start_process", lambda *a, **k: pytest.fail("something was started"))
    assert launch.run_serve(settings, prepare=prepare) != 0
    said = capsys.readouterr().out
    assert "login.password" in said and "<6 characters>" in said and f"at least {MIN_PASSWORD_LENGTH}" in said, said
    assert "s3cret" not in said

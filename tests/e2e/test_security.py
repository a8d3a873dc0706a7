"""End to end: the UI's web security in real Chromium, against the real app (`python -m backend serve`) in
external mode on the fake OpenAI server.

- a page from another local origin (a second port) cannot open the chat socket (socket.io polling or a
  websocket) nor read /qwenchat/status; the app's own page still chats;
- a model answer with a remote markdown image makes the browser request nothing (the CSP's img-src);
- 2,000 failed logins from a script are throttled while a chat already open keeps streaming, and the
  typed user names never reach the log;
- a UI on every address (ui_host 0.0.0.0, login on) answers only to its [network] host_names: another Host name gets 403 on
  every route and on the websocket upgrade (by hand and in Chromium resolving a hostile name to this machine), the
  configured name logs in and chats; without [network] host_names the start is refused naming the setting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from backend.launcher import supervisor
from tests.e2e import support as e2e
from tests.e2e.test_history import LOGIN, PASSWORD, USER, launch, wait_ready  # the app on the fake server, ready
from tests.fakes.openai_server import expected_text

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]


class Listener:
    """A tiny local HTTP server on its own port: the foreign page's origin, and the image sink."""

    def __init__(self, page_html: str = "<!doctype html><title>elsewhere</title><p>another site</p>") -> None:
        from tests.conftest import free_port

        self.hits: list[str] = []
        hits, html = self.hits, page_html.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                if self.path.startswith("/leak.png"):
                    self.send_header("Content-Type", "image/png")
                    body = b"\x89PNG\r\n\x1a\n"
                else:
                    self.send_header("Content-Type", "text/html")
                    body = html
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@contextlib.contextmanager
def new_page(browser, url: str) -> Iterator:
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(url)
        yield page
    finally:
        context.close()


# ---------------------------------------------------------------- login off: origin, CSP


@pytest.fixture(scope="module")
def open_app(fake, external_app):
    """Login off: the shared external-mode product on the fake server (tests/e2e/conftest.py), ready."""
    return wait_ready(external_app, fake)


PROBE_JS = """async ([app]) => {
    const out = {};
    // 1. the socket.io handshake over polling, as the Chainlit client starts it
    try {
        const r = await fetch(app + "/ws/socket.io/?EIO=4&transport=polling", {credentials: "include"});
        out.polling = "status " + r.status + ": " + (await r.text()).slice(0, 80);
    } catch (e) { out.polling = "refused: " + e; }
    // 2. a websocket straight away
    out.websocket = await new Promise((resolve) => {
        const ws = new WebSocket(app.replace("http", "ws") + "/ws/socket.io/?EIO=4&transport=websocket");
        ws.onopen = () => { resolve("opened"); ws.close(); };
        ws.onerror = () => resolve("error");
        ws.onclose = (ev) => resolve("closed " + ev.code);
        setTimeout(() => resolve("timeout"), 30000);  // a refusal comes at once; 30 s only bounds a loaded machine
    });
    // 3. the status (models, adapters, failure reasons)
    try {
        const r = await fetch(app + "/qwenchat/status", {credentials: "include"});
        out.status = "status " + r.status + ": " + (await r.text()).slice(0, 80);
    } catch (e) { out.status = "refused: " + e; }
    // 4. a no-cors request still reaches the server but is refused there (seen in the log)
    try { await fetch(app + "/qwenchat/status", {mode: "no-cors"}); } catch (e) {}
    return out;
}"""


def test_a_page_from_another_origin_cannot_use_the_socket_or_read_the_status(open_app, browser):
    with Listener() as elsewhere, new_page(browser, elsewhere.url + "/") as page:
        result = page.evaluate(PROBE_JS, [open_app.url])
        assert result["websocket"] != "opened", result
        assert result["polling"].startswith("refused"), result
        assert result["status"].startswith("refused"), result
        expected = f"refused a http request from origin '{elsewhere.url}' (GET /ws/socket.io/)"
        log = open_app.log_with(expected, "ui")
        assert expected in log, log[-3000:]
        assert log.count(f"origin '{elsewhere.url}'") == 1  # logged once per origin, whatever was tried
        assert result["websocket"] in ("error", "closed 1006"), result  # the upgrade was answered 403
    # the same requests from a script (no Origin) are answered: no login is on
    assert e2e.status(open_app)["state"] == "ready"
    with urllib.request.urlopen(open_app.url + "/ws/socket.io/?EIO=4&transport=polling", timeout=5) as resp:
        assert resp.status == 200 and b"sid" in resp.read()


def test_the_apps_own_page_chats_and_loads_no_remote_image_from_an_answer(open_app, browser):
    with Listener() as sink, new_page(browser, open_app.url) as page:
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        answer = e2e.send(page, f"[[normal:image={sink.port}]] show me a picture")
        assert expected_text(8).strip() in answer  # the page works: the answer streamed in
        img = page.locator(f'.step[data-step-type="assistant_message"] img[src*="127.0.0.1:{sink.port}/leak.png"]')
        assert img.count() >= 1  # the markdown became an <img>: only the CSP stands between it and the request
        # the browser either blocks the image (a CSP report on the console) or fetches it (a hit on the sink):
        # wait for one of the two, not a fixed time that a loaded machine can outlast
        deadline = time.monotonic() + 30
        while not (sink.hits or any("img-src" in v for v in violations)) and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert sink.hits == [], sink.hits
        assert any("img-src" in v for v in violations), violations
        # Chainlit's own scripts, styles and socket are not blocked: only the image was
        assert all("img-src" in v or "fonts.g" in v or "jsdelivr" in v for v in violations), violations
        headers = page.request.get(open_app.url + "/").headers
        assert "img-src 'self' data: blob:" in headers["content-security-policy"]
        script_src = next(d for d in headers["content-security-policy"].split("; ") if d.startswith("script-src"))
        assert "'sha256-" in script_src and "unsafe-inline" not in script_src  # Chainlit's own inline scripts only
        assert (
            headers["x-content-type-options"] == "nosniff"
            and "frame-ancestors 'none'" in (headers["content-security-policy"])
        )


# ---------------------------------------------------------------- login on: the throttle


@pytest.fixture(scope="module")
def auth_app(fake, tmp_path_factory):
    app = launch(
        fake,
        tmp_path_factory.mktemp("e2e-security-auth"),
        **LOGIN,
    )
    yield app
    e2e.stop(app)


async def flood_logins(url: str, attempts: int, concurrency: int = 20) -> list[tuple[int, str | None]]:
    import httpx

    results: list[tuple[int, str | None]] = []
    queue = iter(range(attempts))

    async def worker(client: httpx.AsyncClient) -> None:
        for i in queue:
            r = await client.post("/login", data={"username": f"guess-user-{i}", "password": f"guess-{i}"})
            results.append((r.status_code, r.headers.get("retry-after")))

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(concurrency))), 240)
    return results


def test_two_thousand_failed_logins_are_throttled_while_an_open_chat_keeps_streaming(auth_app, browser):
    with new_page(browser, auth_app.url) as page:
        page.wait_for_selector("#email", timeout=60_000)
        page.fill("#email", USER)
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        tokens = 400
        e2e.submit(page, f"[[normal:tokens={tokens}:rate=20]] a long answer please")
        page.wait_for_function(
            """() => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                       return m.length && m[m.length - 1].innerText.includes("w3 "); }""",
            timeout=60_000,
        )
        before = len(e2e.assistant_messages(page)[-1])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # sync Playwright owns this thread's loop
            results = pool.submit(asyncio.run, flood_logins(auth_app.url, 2000)).result()
        during = len(e2e.assistant_messages(page)[-1])
        # the address is throttled now: even the right password waits, with a clear message. The wait doubles
        # from 1 s, so the lock the flood left may be about to end (a fast flood ends in the first seconds): make
        # sure of a lock of 3 s or more first (shorter ones are waited out)
        assert lock_for_at_least(auth_app.url, 3) >= 3
        status, headers, body = login_attempt(auth_app.url, PASSWORD)
        assert status == 429 and int(headers["Retry-After"]) >= 1, status
        assert "Too many failed sign-ins" in json.loads(body)["detail"]
        statuses = [s for s, _ in results]
        assert len(statuses) == 2000
        assert set(statuses) <= {401, 429}, set(statuses)
        checked = statuses.count(401)
        assert 5 <= checked <= 30, checked  # the password was checked a handful of times, not 2,000
        assert all(r and int(r) >= 1 for s, r in results if s == 429)  # each refusal says how long to wait
        # the chat opened before the flood kept streaming during it, and finished whole
        assert during > before, (before, during)
        page.wait_for_selector("#stop-button", state="detached", timeout=120_000)
        assert expected_text(tokens).strip() in e2e.assistant_messages(page)[-1]
    log = auth_app.log_with("login refused: an unknown user name", "ui")
    assert "login refused: an unknown user name" in log
    assert "guess-user-" not in log and "guess-" not in log  # what was typed is never logged


def login_attempt(
    url: str, password: str, forwarded_for: str | None = None, user: str = USER
) -> tuple[int, Any, bytes]:
    """POST /login as ``user``: the status, the headers and the body."""
    form = urllib.parse.urlencode({"username": user, "password": password}).encode()
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    try:
        request = urllib.request.Request(url + "/login", data=form, headers=headers)
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def login_status(url: str, password: str, forwarded_for: str | None = None) -> int:
    return login_attempt(url, password, forwarded_for)[0]


def lock_for_at_least(url: str, seconds: int) -> int:
    """Fail logins (waiting out each shorter lock) until this address is locked for ``seconds`` or more; the
    Retry-After then (0 if never refused). Bounded: the wait doubles from 1 s, so this takes a few locks at most."""
    retry_after = 0
    for _ in range(20):
        status, headers, _ = login_attempt(url, "wrong")
        if status == 429:
            retry_after = int(headers["Retry-After"])
            if retry_after >= seconds:
                return retry_after
            time.sleep(retry_after + 0.2)
    return retry_after


def test_a_forwarded_for_header_from_an_untrusted_peer_does_not_escape_the_throttle(auth_app):
    """Once this address waits, naming another client in X-Forwarded-For changes nothing (uvicorn would believe it
    from loopback by default; [network] trusted_proxies is empty, so from nobody)."""
    # throttled already after the flood above. The checks below must fall inside one lock: make it a long one first
    # (the wait doubles with each failure after an expired lock), so that no slow request can outlast it (the lock
    # the flood left may be about to end; alone, this test starts from none)
    locked_for = lock_for_at_least(auth_app.url, 8)
    assert locked_for >= 8, locked_for
    assert login_status(auth_app.url, "wrong", forwarded_for="203.0.113.7") == 429
    assert login_status(auth_app.url, PASSWORD, forwarded_for="198.51.100.9") == 429


@pytest.fixture(scope="module")
def proxy_app(named_app):
    """Login on, behind a trusted proxy (the tests play it, from 127.0.0.1): the product of the host-name tests
    below (one launch, issue #28), for the two proxy tests. They share its throttle without touching each other's
    keys: each uses its own forwarded addresses, and the first ends with a successful login, which clears the user
    name the second then guesses at; the host-name tests between them fail no login at that name (a hostile Host
    is refused before the login is read) and end with a successful one."""
    return named_app


def test_behind_a_trusted_proxy_each_forwarded_client_is_throttled_on_its_own(proxy_app):
    app = proxy_app
    first = [login_status(app.url, "wrong", forwarded_for="203.0.113.1") for _ in range(8)]
    assert first[:5] == [401] * 5 and 429 in first[5:], first  # this client waits now …
    assert login_status(app.url, "wrong", forwarded_for="203.0.113.2") == 401  # … another one does not
    assert login_status(app.url, PASSWORD, forwarded_for="203.0.113.3") == 200


# ---------------------------------------------------------------- a UI on every address: [network] host_names (issue 18)

HOSTS_LOGIN = {**LOGIN, "QWENCHAT_NETWORK_UI_HOST": "0.0.0.0"}


@pytest.fixture(scope="module")
def named_app(fake, tmp_path_factory):
    """Login on, listening on every address, answering to the name chat.test (and loopback names), behind a trusted
    proxy at 127.0.0.1 (for ``proxy_app``: no test here sends a forwarded header)."""
    app = launch(
        fake,
        tmp_path_factory.mktemp("e2e-security-hosts"),
        **HOSTS_LOGIN,
        QWENCHAT_NETWORK_HOST_NAMES="chat.test",
        QWENCHAT_NETWORK_TRUSTED_PROXIES="127.0.0.1",
    )
    yield app
    e2e.stop(app)


def raw_request(port: int, head: str) -> tuple[int, str]:
    """One HTTP/1.1 request written by hand (the Host header exactly as given), read to the end: status, text."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if head.startswith("GET /ws/") and b"\r\n\r\n" in data:
                break  # an upgrade's answer: its head is all there is to read
    return int(data.split(b" ", 2)[1]), data.decode("latin-1")


def port_of(app: e2e.LiveApp) -> int:
    return int(app.url.rsplit(":", 1)[1])


def test_a_ui_on_every_address_refuses_other_host_names_on_every_route_and_the_socket(named_app):
    """Measured on main: with ui_host 0.0.0.0 (login on) every Host was served and the UI's own origin was rebuilt
    from it, so a DNS-rebinding page was 'same-origin' and could open the socket."""
    port = port_of(named_app)
    upgrade = (
        "GET /ws/socket.io/?EIO=4&transport=websocket HTTP/1.1\nHost: {host}\nOrigin: http://{host}\n"
        "Upgrade: websocket\nConnection: Upgrade\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\n"
        "Sec-WebSocket-Version: 13\n"
    )
    evil, ours = f"evil.test:{port}", f"chat.test:{port}"
    for head in (
        f"GET / HTTP/1.1\nHost: {evil}\nConnection: close\n",
        f"GET /qwenchat/status HTTP/1.1\nHost: {evil}\nConnection: close\n",
        f"POST /login HTTP/1.1\nHost: {evil}\nContent-Type: application/x-www-form-urlencoded\n"
        f"Content-Length: 27\nConnection: close\n\nusername=demo&password=test",
        upgrade.format(host=evil),
    ):
        status, text = raw_request(port, head)
        assert status == 403, text[:300]
        assert "evil" not in text  # the refusal never repeats the name sent
    status, text = raw_request(port, f"GET / HTTP/1.1\nHost: {ours}\nConnection: close\n")
    assert status == 200 and "<html" in text.lower()
    status, text = raw_request(port, upgrade.format(host=ours))
    assert status == 101, text[:300]  # the configured name opens the socket
    # Origin: null (a sandboxed frame, a file: page) under the right name: refused, without echoing it
    status, text = raw_request(
        port, f"GET /ws/socket.io/?EIO=4&transport=polling HTTP/1.1\nHost: {ours}\nOrigin: null\nConnection: close\n"
    )
    assert status == 403 and "null" not in text.split("\r\n\r\n", 1)[1]
    named_app.log_with("for Host 'evil.test", "ui")
    log = named_app.log_with("origin 'null'", "ui")  # each line reaches the file a moment after it is written
    assert log.count(f"for Host '{evil}'") == 1, log[-3000:]  # four refusals, one line
    assert "origin 'null'" in log and PASSWORD not in log
    said = named_app.log()
    assert f"the UI answers on port {port} to chat.test and loopback names" in said, said[-3000:]


def test_in_chromium_a_rebinding_name_gets_403_and_the_configured_name_chats(named_app, browser):
    """Real Chromium resolving both names to this machine (--host-resolver-rules): the hostile name's page and its
    own same-origin fetches are refused; under chat.test the login page, the socket and a chat work."""
    port = port_of(named_app)
    rules = "--host-resolver-rules=MAP chat.test 127.0.0.1, MAP evil.test 127.0.0.1"
    resolving = browser.browser_type.launch(
        executable_path=e2e.chromium_path(), args=[*e2e.CHROMIUM_ARGS, rules], headless=True
    )
    try:
        context = resolving.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(60_000)
        answer = page.goto(f"http://evil.test:{port}/")
        assert answer is not None and answer.status == 403
        assert "evil" not in page.content()
        probe = page.evaluate(
            """async () => {
                const r = await fetch("/qwenchat/status");
                const login = await fetch("/login", {method: "POST", body: new URLSearchParams({username: "x", password: "y"})});
                return [r.status, login.status];
            }"""
        )
        assert probe == [403, 403], probe
        answer = page.goto(f"http://chat.test:{port}/")
        assert answer is not None and answer.status == 200
        page.wait_for_selector("#email", timeout=60_000)
        page.fill("#email", USER)
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")
        e2e.wait_ready_ui(page, timeout_ms=60_000)
        assert expected_text(8).strip() in e2e.send(page, "hello under the configured name")
    finally:
        resolving.close()


def test_a_ui_on_every_address_without_hosts_is_refused_at_start_naming_the_setting(fake, tmp_path):
    """Nothing to derive the names from: the start stops before anything listens, naming network.host_names and an example."""
    import os
    import subprocess
    import sys

    from backend.settings import ROOT
    from tests.conftest import free_port

    env = {
        **os.environ,
        **HOSTS_LOGIN,
        "OPENAI_BASE_URL": fake + "/v1",
        "OPENAI_API_KEY": "test",
        "QWENCHAT_NETWORK_UI_PORT": str(free_port()),
        "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"),
    }
    env.pop("QWENCHAT_NETWORK_HOST_NAMES", None)
    output = tmp_path / "serve.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend", "serve"],
        cwd=ROOT,
        env=env,
        stdout=output.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve was not refused, it started:\n{output.read_text()[-3000:]}")
    finally:
        supervisor.stop_process_group(proc, grace=5)  # whatever it started, if it did
    said = output.read_text()
    assert proc.returncode == 2, said
    assert (
        "network.host_names" in said and "[network] host_names = [" in said and "QWENCHAT_NETWORK_HOST_NAMES=" in said
    ), said
    assert not (tmp_path / "logs" / "ui.log").exists()  # no UI was started


def fail_until_locked(attempt: Any, seconds: int) -> int:
    """Call ``attempt(i)`` (a failing login; i counts up) until it is refused for ``seconds`` or more: that
    Retry-After (0 if never refused). Shorter locks are waited out (the wait doubles from 1 s, and a PBKDF2 per
    attempt on a loaded machine can outlast a short one); bounded: a few locks at most after the free failures."""
    retry_after = 0
    for i in range(40):
        status, headers, _ = attempt(i)
        if status == 429:
            retry_after = int(headers["Retry-After"])
            if retry_after >= seconds:
                return retry_after
            time.sleep(retry_after + 0.2)
    return retry_after


GUESS = "guessed-Pa55word"  # what the guesses type: it must never reach the log


def test_behind_a_proxy_a_guess_spread_over_many_clients_is_throttled_per_name_and_an_ipv6_client_per_64(proxy_app):
    """On the code before: each forwarded address was counted alone, so fresh addresses (one /64 holds 2^64)
    guessed at one name without ever waiting. The name's lock slows the guesser, not the owner (issue #29): past
    the name's free failures every client that has failed there waits, while a clean client still gets its one
    try, so the owner signing in from a fresh address gets in."""
    app = proxy_app  # after the trusted-proxy test, whose successful login cleared the name
    # one name, a fresh address for every guess: 10 free failures, then 5 more, each doubling the name's wait
    guesses = [login_attempt(app.url, GUESS, f"198.51.100.{i + 1}")[0] for i in range(15)]
    assert guesses == [401] * 15, guesses  # each a clean client: each gets its try (and fails)
    status, headers, body = login_attempt(app.url, GUESS, "198.51.100.1")  # a client that failed there: waits
    assert status == 429 and "with this user name" in json.loads(body)["detail"], (status, body)
    assert int(headers["Retry-After"]) >= 8, dict(headers)  # 15 failures at the name, each counted there
    assert login_attempt(app.url, PASSWORD, forwarded_for="203.0.113.250")[0] == 200  # the owner, from a clean client
    assert login_attempt(app.url, GUESS, "203.0.113.251", user="someone-else")[0] == 401
    # one /64, a fresh address and a fresh name for every attempt: the /64 waits, the next /64 does not
    locked = fail_until_locked(
        lambda i: login_attempt(app.url, GUESS, f"2001:db8:0:7::{i + 1:x}", user=f"guess-{i}"), 8
    )
    assert locked >= 8, locked
    assert login_attempt(app.url, GUESS, "2001:db8:0:7:ffff::1", user="guess-new")[0] == 429
    assert login_attempt(app.url, GUESS, "2001:db8:0:8::1", user="guess-other")[0] == 401
    log = app.log_with("at the user name with fingerprint", "ui")
    assert "failed attempts at the user name with fingerprint" in log, log[-3000:]
    assert "failed attempts from 2001:db8:0:7::/64" in log
    assert GUESS not in log and PASSWORD not in log

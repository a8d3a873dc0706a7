"""Helpers for the end-to-end tests: launch the real product, drive it in real Chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from backend.launcher import supervisor
from backend.settings import ROOT

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

ENGINE_KEY = "e2e-engine-key"  # a fixed key, so tests can also talk to the launched vLLM directly
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@dataclass
class LiveApp:
    """`python -m backend serve` running in its own process group."""

    proc: subprocess.Popen[bytes]
    url: str
    log_dir: Path
    output: Path
    engine_url: str = ""  # the launched vLLM's /v1 URL (tests call it directly with ENGINE_KEY)

    def log_path(self, name: str = "serve") -> Path:
        return self.output if name == "serve" else self.log_dir / f"{name}.log"

    def mark(self, name: str = "serve") -> int:
        """Where the log ``name`` stands now: pass it as ``since`` to read only what is written after (a shared
        product's log holds the earlier modules' lines too)."""
        path = self.log_path(name)
        return path.stat().st_size if path.exists() else 0

    def log(self, name: str = "serve", *, since: int | None = None) -> str:
        """The log's last 20,000 characters; with ``since`` (0, or a ``mark``), everything written after it."""
        path = self.log_path(name)
        if since is None:
            return supervisor.read_tail(path, 20000)
        if not path.exists():
            return ""
        with path.open("rb") as f:
            if since <= f.seek(0, os.SEEK_END):  # else the log was rotated since: all of the new file
                f.seek(since)
            else:
                f.seek(0)
            return f.read().decode(errors="replace")

    def log_with(self, text: str, name: str = "serve", timeout: float = 15, *, since: int | None = None) -> str:
        """The log once it contains ``text`` (the launcher copies each child's output through a pipe, so a
        line reaches the file a moment after it is written), or as it is after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while text not in (log := self.log(name, since=since)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return log


#: The shared login-on product (tests/e2e/conftest.py ``login_app``): its accounts, a starter and a logo.
OWNER, OWNER_PW = "owner", "owner password 1"
VIEWER, VIEWER_PW = "viewer", "viewer password 2"
STARTER = "Tell me a fake story"
LOGO = "<svg xmlns='http://www.w3.org/2000/svg' width='8' height='8'><!-- qwenchat e2e logo --></svg>"


def login_app_env(tmp: Path, fake: str) -> dict[str, str]:
    """External mode on the fake server at ``fake``, login on for OWNER and VIEWER (a real PBKDF2 hash), branding
    (its logo written to ``tmp``), a starter for the fake server's adapter, and attached files' originals kept."""
    from backend import passwords

    (tmp / "logo.svg").write_text(LOGO)
    viewer_hash = passwords.hash_password(VIEWER_PW, iterations=passwords.MIN_ITERATIONS)
    return {
        "OPENAI_BASE_URL": fake + "/v1",
        "OPENAI_API_KEY": "test",
        "QWENCHAT_LOGIN_ENABLE": "true",
        "QWENCHAT_LOGIN_USERNAME": OWNER,
        "QWENCHAT_LOGIN_PASSWORD": OWNER_PW,
        "QWENCHAT_LOGIN_USERS": f"{VIEWER}={viewer_hash}",
        "QWENCHAT_BRANDING_NAME": "Pirate Demo",
        "QWENCHAT_BRANDING_ACCENT": "#2563eb",
        "QWENCHAT_BRANDING_LOGO": str(tmp / "logo.svg"),
        "QWENCHAT_BRANDING_FAVICON": str(tmp / "logo.svg"),
        "QWENCHAT_LORA_STARTERS": f"fake-adapter={STARTER}",
        "QWENCHAT_UPLOADS_KEEP_ORIGINALS": "true",  # the originals of attached files (test_share's download)
        "QWENCHAT_UPLOADS_ORIGINALS_DIR": str(tmp / "originals"),
    }


PORT_TAKEN = "already in use"  # what the launcher's preflight, vLLM's diagnosis and uvicorn say of a taken port


def launch(tmp: Path, env_overrides: dict[str, str], *, wait_engine: bool = True, timeout: float = 300) -> LiveApp:
    """Start the product the way start.sh does (after bootstrap), on free ports, logs in ``tmp``.

    A port found free is only free until it is bound: another process (a parallel test run on the same machine)
    may take it in between. When the launch fails for that reason alone, it is tried again on other ports."""
    ours = "QWENCHAT_NETWORK_ENGINE_PORT" not in env_overrides and "QWENCHAT_NETWORK_UI_PORT" not in env_overrides
    said = ""
    for _ in range(3 if ours else 1):
        try:
            return _launch(tmp, env_overrides, wait_engine=wait_engine, timeout=timeout)
        except PortTaken as exc:
            said = str(exc)
    pytest.fail(said)


class PortTaken(Exception):
    """The launch failed because a port it was given was taken meanwhile."""


def _launch(tmp: Path, env_overrides: dict[str, str], *, wait_engine: bool, timeout: float) -> LiveApp:
    from tests.conftest import free_port, need_env

    ui_port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        "QWENCHAT_ENGINE_PYTHON": need_env("QWENCHAT_ENGINE_PYTHON"),
        "QWENCHAT_NETWORK_ENGINE_PORT": str(engine_port),
        "QWENCHAT_NETWORK_UI_PORT": str(ui_port),
        "QWENCHAT_VLLM_API_KEY": ENGINE_KEY,
        "QWENCHAT_LOGGING_DIR": str(tmp / "logs"),
        "QWENCHAT_LORA_DIR": str(tmp / "adapters"),
        "QWENCHAT_VLLM_CPU_KVCACHE_GIB": "1",
        "QWENCHAT_VLLM_DEVICE": "cpu",  # the engine test.sh installs, also on a machine with a GPU
        **env_overrides,
    }
    (tmp / "adapters").mkdir(exist_ok=True)
    app = _start_serve(tmp, env, engine_port, ui_port)
    proc = app.proc
    deadline = time.monotonic() + timeout
    marker = "engine ready" if wait_engine else "UI ready"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = f"serve exited with {proc.returncode}:\n{app.log()}\n{app.log('engine')[-4000:]}"
            if PORT_TAKEN in app.log() + app.log("ui") + app.log("engine"):
                stop(app)  # whatever of it is left
                raise PortTaken(said)
            pytest.fail(said)
        if marker in app.log():
            return app
        time.sleep(0.5)
    stop(app)
    pytest.fail(f"no '{marker}' after {timeout:.0f} s:\n{app.log()}")


def launch_prepare(tmp: Path, env: dict[str, str], engine_port: int, ui_port: int) -> LiveApp:
    """`python -m backend serve --prepare` as start.sh runs it on a first run, with exactly ``env`` (the caller's
    environment, fakes included), output to ``tmp``/serve.out; returned once its UI answers (2 minutes at most)."""
    app = _start_serve(tmp, env, engine_port, ui_port, "--prepare")
    wait_page(app, 120)
    return app


def _start_serve(tmp: Path, env: dict[str, str], engine_port: int, ui_port: int, *args: str) -> LiveApp:
    """`python -m backend serve *args` in its own session, with exactly ``env``, output to ``tmp``/serve.out."""
    output = tmp / "serve.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend", "serve", *args],
        cwd=str(ROOT),
        env=env,
        stdout=output.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return LiveApp(proc, f"http://127.0.0.1:{ui_port}", tmp / "logs", output, f"http://127.0.0.1:{engine_port}/v1")


def stop(app: LiveApp) -> None:
    supervisor.stop_process_group(app.proc, grace=20)


def status(app: LiveApp) -> dict[str, Any]:
    import json

    with urllib.request.urlopen(app.url + "/qwenchat/status", timeout=5) as resp:
        body: dict[str, Any] = json.loads(resp.read())
        return body


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian chromium is not installed: run the tests through ./test.sh (it installs it)")
    return path


def start_browser() -> tuple[Playwright, Browser]:
    """Playwright (sync API) and a real headless Debian Chromium in it (no `playwright install`): (pw, browser)."""
    from playwright.sync_api import sync_playwright

    from tests.support import marks

    marks.note("browser")
    pw = sync_playwright().start()
    try:
        return pw, pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
    except BaseException:
        pw.stop()
        raise


def stop_browser(started: tuple[Playwright, Browser]) -> None:
    pw, browser = started
    try:
        browser.close()
    finally:
        pw.stop()


@contextlib.contextmanager
def browser_page(url: str, *, locale: str = "en-US", browser: Browser | None = None) -> Iterator[Page]:
    """A page open at ``url`` in a new context of ``browser`` (the shared ``browser`` fixture), closed after; with
    no browser given, in a Chromium of its own for this one use."""
    started = None if browser is not None else start_browser()
    try:
        if browser is None:
            assert started is not None  # started above when no browser was given
            browser = started[1]
        context = browser.new_context(locale=locale, viewport={"width": 1280, "height": 900})
        try:
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(url)
            yield page
        finally:
            context.close()
    finally:
        if started is not None:
            stop_browser(started)


def wait_page(app: LiveApp, timeout: float = 120) -> None:
    """Poll the UI's page until it answers 200; fail with the launcher's output if it never does or serve exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(app.url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if app.proc.poll() is not None or time.monotonic() > deadline:
                stop(app)
                pytest.fail(f"the UI did not answer at {app.url}:\n{app.log()}")
            time.sleep(0.2)


def interrupt(app: LiveApp) -> None:
    """Ctrl-C to the launcher (as a person stops it), then stop whatever is left after a minute."""
    if app.proc.poll() is None:
        os.killpg(app.proc.pid, signal.SIGINT)
        try:
            app.proc.wait(60)
        except subprocess.TimeoutExpired:
            stop(app)


def ui_pid(app: LiveApp) -> int:
    """The Chainlit process serving ``app`` (its command line names its port)."""
    port = app.url.rsplit(":", 1)[1].encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"backend.ui.launch" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port:
            return int(entry)
    raise LookupError(f"no Chainlit process on port {port.decode()}")


def assistant_messages(page: Page) -> list[str]:
    return page.locator('.step[data-step-type="assistant_message"] .message-content').all_inner_texts()


# The chat is open: the settings button is there (on_chat_start sent the panel) and enabled. Chainlit's composer takes
# no message while a task runs, on_chat_start's included: Enter does nothing and the text stays in the box, and the
# button carries the same `disabled` (useChatData's: not connected, or a task running). On a loaded machine
# on_chat_start's task outlives the panel's arrival by seconds; a message typed in between was not sent.
CHAT_OPEN = "#chat-settings-open-modal:not([disabled])"


def pages_now(browser: Browser | None) -> str:
    """Each open page of ``browser``: its address, whether its composer takes messages, what the composer holds and
    the last 1,500 characters of its text. For a failed test's report."""
    if browser is None:
        return "no browser running"
    lines = []
    try:
        for context in browser.contexts:
            for page in context.pages:
                box = page.locator("#chat-input")
                held = box.input_value(timeout=2_000) if box.count() else "<no composer>"
                open_ = bool(page.locator(CHAT_OPEN).count())
                text = str(page.evaluate("() => document.body ? document.body.innerText : ''"))[-1500:]
                lines.append(f"--- {page.url}  composer open: {open_}, holds {held!r}\n{text}")
    except Exception as exc:  # noqa: BLE001 - a report must not fail on a browser that went away
        lines.append(f"(the pages could not be read: {exc!r})")
    return "\n".join(lines) or "no page open"


def wait_chat_open(page: Page, timeout_ms: int = 60_000) -> None:
    page.wait_for_selector(CHAT_OPEN, timeout=timeout_ms)


def wait_ready_ui(page: Page, timeout_ms: int = 240_000) -> None:
    page.wait_for_selector('#qwenchat-status[data-state="ready"]', timeout=timeout_ms)
    wait_chat_open(page)


def submit(page: Page, text: str, timeout_ms: int = 60_000) -> None:
    """Type ``text`` in the composer and send it. The product's composer ignores Enter while a task of the chat runs
    (on_chat_start, a settings update: ``CHAT_OPEN``), and the text stays in the box: so on the product's page Enter
    is pressed once the composer takes messages, and again while the text is still there once it takes them again
    (a settings update that began after the check). An empty box is the message sent. Another Chainlit app's page
    (no settings button) gets one Enter."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.fill("#chat-input", text)
    if not page.locator("#chat-settings-open-modal").count():
        page.press("#chat-input", "Enter")
        return
    deadline = time.monotonic() + timeout_ms / 1000
    while page.input_value("#chat-input") != "":
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            pytest.fail(f"the composer kept {text[:80]!r} for {timeout_ms / 1000:.0f} s: Enter did not send it")
        wait_chat_open(page, int(left_ms))
        page.press("#chat-input", "Enter")
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function(
                "() => document.querySelector('#chat-input')?.value === ''", timeout=min(5_000, max(1, int(left_ms)))
            )


def send(page: Page, text: str, timeout_ms: int = 180_000) -> str:
    """Type a message, wait for the answer to finish, return the newest assistant message text."""
    before = len(assistant_messages(page))
    submit(page, text)
    page.wait_for_function(
        """([n]) => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > n""",
        arg=[before],
        timeout=timeout_ms,
    )
    page.wait_for_selector("#stop-button", state="detached", timeout=timeout_ms)
    return assistant_messages(page)[-1]


def whole_answer(page: Page, timeout_ms: int = 120_000) -> str:
    """The newest answer once its footer ("model · N tokens · …") is there. ``send`` can return while an answer is
    still streaming: on a loaded machine the first words can show before the Stop button does, and waiting for a
    Stop button that is not there yet returns at once."""
    page.wait_for_function(
        """() => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                   return m.length > 0 && / tokens · /.test(m[m.length - 1].innerText); }""",
        timeout=timeout_ms,
    )
    return assistant_messages(page)[-1]


def choose_model(page: Page, label_prefix: str) -> None:
    page.click("#chat-settings-open-modal")
    page.click("[role=dialog] button#model")
    page.locator("[role=option]", has_text=label_prefix).first.click()
    page.click("#confirm")


def choose_in_composer(page: Page, label_prefix: str) -> None:
    """Pick a model in the composer's picker (Chainlit Modes) instead of the settings panel."""
    page.click("#mode-picker-trigger-model")
    page.locator("[role=option]", has_text=label_prefix).first.click()


@contextlib.contextmanager
def fake_server(tmp: Path) -> Iterator[str]:
    """`python -m tests.fakes.openai_server` in its own process on a free port; yields its root URL."""
    from tests.conftest import free_port

    out = tmp / "fake.out"
    for _ in range(3):  # a port found free may be taken before the server binds it: then another port
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port)],
            cwd=str(ROOT),
            stdout=out.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        if _answers(url + "/health", proc, 60):
            break
        supervisor.stop_process_group(proc, grace=5)
        # the port was taken before the server bound it (the other worker's fake server took the same free port:
        # it answered /health while this one failed to bind, and this worker's tests went to it until it stopped)
        if PORT_TAKEN not in out.read_text():
            pytest.fail(f"the fake server did not start:\n{out.read_text()}")
    else:
        pytest.fail(f"the fake server found no free port in 3 tries:\n{out.read_text()}")
    try:
        yield url
    finally:
        supervisor.stop_process_group(proc, grace=5)


def _answers(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``proc`` answers at ``url`` (the fake server's /health names its pid; polled until ``timeout`` s have
    passed or ``proc`` has exited)."""
    from tests.fakes.openai_server import PID_HEADER

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.headers.get(PID_HEADER) == str(proc.pid):
                    return True
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)

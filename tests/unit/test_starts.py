"""tests/support/starts.py: what it counts as a vLLM start, a product launch and a browser, and its line."""

from __future__ import annotations

import collections
import os
import signal
import sys

import pytest

from tests.support import starts


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["/e/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], starts.VLLM),
        (["/a/bin/python", "-m", "backend", "serve"], starts.PRODUCT),
        (["/a/bin/python", "-m", "backend", "serve", "--prepare"], starts.PRODUCT),
        (["/a/bin/python", "-m", "chainlit", "run", "bench/plain_chainlit_app.py"], starts.PRODUCT),
        (["/a/bin/python", "-m", "backend", "serve", "--dry-run"], None),  # prints the plan, starts nothing
        (["/a/bin/python", "-m", "backend.ui.launch", "run", "app.py"], None),  # the product's own UI child
        (["/usr/lib/chromium/chromium", "--headless", "--no-sandbox"], starts.CHROMIUM),
        (["/usr/lib/chromium/chromium", "--type=renderer"], None),  # one of its helpers, not another browser
        (["sleep", "300"], None),
    ],
)
def test_a_process_is_counted_by_what_it_is(argv, kind):
    assert starts.kind([a.encode() for a in argv] + [b""]) == kind  # /proc's cmdline ends with a NUL


def test_the_line_names_each_count():
    counts = collections.Counter({starts.VLLM: 3, starts.PRODUCT: 2, starts.CHROMIUM: 1})
    assert starts.summary(counts) == "vLLM starts: 3 · product launches: 2 · browsers: 1"


def test_a_started_process_of_ours_is_counted_for_the_test_running_then():
    counter = starts.Counter()
    counter.start()
    counter.current = "tests/e2e/test_x.py::test_a"
    # A sleeping Python whose command line reads as a launch (its -c ends the options: the rest is its argv).
    # Spawned past subprocess.Popen, which tests/support/marks.py watches: this unit module launches nothing.
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "-m", "backend", "serve"]
    pid = os.posix_spawn(sys.executable, argv, dict(os.environ))  # returns once it has exec'd
    try:
        counter.stop()  # the thread's last scan
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert counter.per_module() == {"tests/e2e/test_x.py": collections.Counter({starts.PRODUCT: 1})}

"""Bad input under the load paths: a 10 MB paste over the socket, a 1M-token history through bench.budget.

Both must end with a clear result without exhausting memory; the peak RSS is printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from backend.settings import ROOT
from tests.support import live_app
from tests.support.socket_client import Session

pytestmark = [pytest.mark.soak, pytest.mark.product]

PASTE_BYTES = 10 * 1024 * 1024
PEAK_LIMIT_MIB = 2048  # "without exhausting memory": far below the machine's RAM, far above a sane app


@pytest.mark.asyncio
async def test_a_10_mb_paste_over_the_socket_gets_a_clear_answer_on_the_same_connection(external_app):
    app = external_app  # the shared external-mode product on the fake server (tests/conftest.py)
    async with Session(app.url) as s:
        sid = s.sid
        big = await s.send("x" * PASTE_BYTES, 120)
        after = await s.send("still there? [[normal:tokens=4]]", 60) if s.connected else None
        disconnects = s.disconnects
        same_socket = s.sid == sid
    peak = live_app.snapshot(app)["peak_rss_kb"] / 1024  # the app's peak so far, this paste included
    print(f"\n[bad input] 10 MB paste: {big.outcome}, disconnects {disconnects}; app peak RSS {peak:.0f} MiB")
    assert disconnects == 0 and not big.disconnected, "the 10 MB message closed the connection"
    assert big.finished and big.errors, f"no clear message for the 10 MB paste: {big.summary()}"
    assert after is not None and after.answered and same_socket
    assert peak < PEAK_LIMIT_MIB


def test_a_1m_token_history_through_bench_budget(tmp_path):
    """`python -m bench.budget` (a 1,000,000-token chat fitted into 262,144 tokens) in a child process; its peak RSS
    is that child's own (os.wait4), not RUSAGE_CHILDREN's largest child of the whole pytest session."""
    cmd = [sys.executable, "-m", "bench.budget", "--tokens", "1000000", "--turns", "2", "--naive", "0"]
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=out, stderr=err)
        deadline = time.monotonic() + 600
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    peak = usage.ru_maxrss / 1024  # KiB -> MiB
    print(f"\n[bad input] 1M-token history through bench.budget: exit {proc.returncode}, peak RSS {peak:.0f} MiB")
    said = out_path.read_text(errors="replace")[-3000:] + err_path.read_text(errors="replace")[-3000:]
    assert proc.returncode == 0, said
    assert peak < PEAK_LIMIT_MIB, f"peak RSS {peak:.0f} MiB"

"""Every benchmark of docs/PERFORMANCE.md, one after the other, each with its documented command. Not a test.

    python -m bench                 # all of them (about an hour on a 2-core machine)
    python -m bench --list          # the commands, without running them
    python -m bench engine budget   # some of them, by name

Run it in the app test environment after one ``./test.sh`` (``$(bash -c 'source scripts/env.sh && qc_test_dir')/bin/python
-m bench``; another python is told that command); each benchmark finds the engine environment and the test models
itself (``bench/environment.py``). Each
prints its own table; a failing one is reported and the others still run. The cold-start benchmark (``bench.start
--fresh``) builds everything in a temporary HOME and is only run when named (``python -m bench start``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.environment import ROOT

#: name -> the documented command's arguments (docs/PERFORMANCE.md), in the order the document shows them.
BENCHES: dict[str, list[str]] = {
    "ui_streaming": ["-m", "bench.ui_streaming", "--runs", "3", "--cold", "3"],
    "client_overhead": ["-m", "bench.client_overhead", "--runs", "200", "--vllm", "--vllm-runs", "40"],
    "budget": ["-m", "bench.budget"],
    "concurrency": ["-m", "bench.concurrency"],
    "document_sessions": ["-m", "bench.document_sessions", "--runs", "5", "--tokens", "60"],
    "engine": ["-m", "bench.engine", "--tokens", "128", "--runs", "3"],
    "fleet": ["-m", "bench.fleet"],
    "priority": ["-m", "bench.priority", "--runs", "5", "--max-num-seqs", "8", "4", "--tokens", "128"],
    "start": ["-m", "bench.start", "--home", "/tmp/qc-bench-cold", "--fresh", "--runs", "1", "--phases"],
}
ONLY_WHEN_NAMED = {"start"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"benchmarks to run: {', '.join(BENCHES)} (default: all but start)")
    ap.add_argument("--list", action="store_true", help="print the commands and stop")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in BENCHES]
    if unknown:
        ap.error(f"no benchmark named {', '.join(unknown)}; the names are {', '.join(BENCHES)}")
    names = args.names or [n for n in BENCHES if n not in ONLY_WHEN_NAMED]
    if args.list:
        for n in names:
            print("python " + " ".join(BENCHES[n]))
        return 0
    failed: list[str] = []
    for n in names:
        print(f"\n=== {n}: python {' '.join(BENCHES[n])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, *BENCHES[n]], cwd=str(ROOT), check=False).returncode
        print(f"=== {n}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc:
            failed.append(n)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

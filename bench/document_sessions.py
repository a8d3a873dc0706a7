"""The UI's event-loop lag with 50 real chat sessions while a 300-page PDF is attached and read (issue 30). Not a test.

    python -m bench.document_sessions [--sessions 50] [--pages 300] [--runs 3] [--tokens 200] [--rate 20]

The product runs as bench.concurrency runs it (external mode, against the fake OpenAI server in this process, its
loop sampler on: backend/web/loopstats.py). ``--sessions`` sessions connect over Chainlit's real socket protocol.
Each run has two windows of the same chat load, their order alternating from run to run:

- **chat only**: every session sends a message and streams its answer (``--tokens`` at ``--rate`` tokens/s);
- **chat + PDF**: the same, while one more session uploads a ``--pages``-page PDF through Chainlit's upload route
  (``POST /project/file``) and sends a message with it, as the browser does: the product reads it in its child
  process with a live step, then answers (or offers the part that fits).

Printed per window: the loop lag p50/p99/max of each run, their medians and spread, and the PDF's time from send to
the end of its turn. The windows are side by side in one run of the product, so the machine's noise hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from backend.web import loopstats
from bench.concurrency import connect_all, fresh_snapshot, warm_up
from tests.e2e import support as e2e
from tests.fakes.openai_server import FakeServer
from tests.support import live_app
from tests.support.documents_build import make_pdf
from tests.support.socket_client import Session


def upload(url: str, session_id: str, path: Path) -> str:
    """Chainlit's upload route, as the composer's upload button calls it; the file's id for ``fileReferences``."""
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
        f"Content-Type: application/pdf\r\n\r\n".encode()
        + path.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        f"{url}/project/file?session_id={session_id}",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return str(json.loads(resp.read())["id"])


async def send_with_file(session: Session, url: str, path: Path, timeout: float) -> tuple[float, str]:
    """Upload ``path`` and send a message with it: (seconds from the upload to the end of its turn, what the turn
    showed: its outcome and whether a step named the file, so a file the product never read is not timed as read)."""
    t0 = time.monotonic()
    file_id = await asyncio.to_thread(upload, url, session.session_id, path)
    await session.start("what is on the last page?", files=[file_id])
    turn = await session.wait(timeout)
    read = any(path.name in str(step.get("output") or "") for step in turn.steps.values())
    why = f" ({turn.errors[0][:80]})" if turn.errors else ""
    return time.monotonic() - t0, f"{turn.outcome}{why}, {'read' if read else 'NOT READ'}"


async def window(
    url: str, stats: Path, sessions: list[Session], spec: str, pdf: Path | None, args: Any
) -> dict[str, Any]:
    before = await fresh_snapshot(stats)
    reader: Session | None = None
    if pdf is not None:
        reader = Session(url)
        await reader.__aenter__()
    try:
        started = await asyncio.gather(*(s.start(f"bench [[{spec}]]") for s in sessions))
        reading = asyncio.create_task(send_with_file(reader, url, pdf, args.timeout)) if reader and pdf else None
        await asyncio.gather(*(s.wait(args.timeout) for s in sessions))
        pdf_s, pdf_turn = await reading if reading is not None else (None, "")
    finally:
        if reader is not None:
            await reader.close()
    after = await fresh_snapshot(stats)
    lag = loopstats.percentiles(loopstats.window(before, after), (50, 99, 100))
    answered = sum(1 for t in started if t.answered)
    return {"lag": lag, "answered": answered, "pdf_s": pdf_s, "pdf_turn": pdf_turn}


async def main_async(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-document-sessions-"))
    lines = "\n".join(f"Line {j} of the page, some ordinary text to read." for j in range(40))
    pdf = tmp / "report.pdf"
    pdf.write_bytes(make_pdf([f"Page {i + 1}\n{lines}" for i in range(args.pages)]))
    spec = f"normal:tokens={args.tokens}:rate={args.rate}"
    results: dict[str, list[dict[str, Any]]] = {"chat only": [], "chat + PDF": []}
    async with FakeServer(max_model_len=262_144) as srv:  # the 256K model the product is built for
        (tmp / "qwenchat").mkdir()
        env = {"QWENCHAT_UI_MAX_ANSWERS_PER_USER": "0", "QWENCHAT_UPLOADS_MAX_MB": "100"}
        app = await asyncio.to_thread(live_app.launch_external, tmp / "qwenchat", srv.base_url, env)
        try:
            await warm_up(app.url, True)
            stats = live_app.loop_file(app)
            sessions, refused = await connect_all(app.url, args.sessions, True)
            if refused:
                print(f"({refused} sessions could not connect)")
            for run in range(args.runs):
                order = ["chat only", "chat + PDF"] if run % 2 == 0 else ["chat + PDF", "chat only"]
                for name in order:
                    results[name].append(
                        await window(app.url, stats, sessions, spec, pdf if name == "chat + PDF" else None, args)
                    )
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        finally:
            await asyncio.to_thread(e2e.stop, app)
    print(
        f"\n{args.sessions} real chat sessions ({args.tokens} tokens at {args.rate} tok/s each), "
        f"{args.pages}-page PDF ({pdf.stat().st_size / 2**20:.1f} MB), {args.runs} runs; "
        f"loop lag sampled every {loopstats.INTERVAL * 1000:.0f} ms inside the UI (ms)"
    )
    print(f"{'window':<12} {'p50 median':>11} {'p99 median':>11} {'p99 range':>15} {'max median':>11} {'PDF s':>13}")
    for name, rows in results.items():
        p50 = statistics.median(r["lag"]["p50"] for r in rows)
        p99s = [r["lag"]["p99"] for r in rows]
        top = statistics.median(r["lag"]["p100"] for r in rows)
        pdf_times = [r["pdf_s"] for r in rows if r["pdf_s"] is not None]
        took = f"{statistics.median(pdf_times):.2f} ({min(pdf_times):.2f}-{max(pdf_times):.2f})" if pdf_times else ""
        spread = f"{min(p99s):.1f}-{max(p99s):.1f}"
        print(f"{name:<12} {p50:11.1f} {statistics.median(p99s):11.1f} {spread:>15} {top:11.1f} {took:>13}")
        turns = [r["pdf_turn"] for r in rows if r["pdf_turn"]]
        print(
            f"{'':<12} answered: {[r['answered'] for r in rows]} of {args.sessions}"
            + (f"; PDF turns: {turns}" if turns else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args()
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up (the launcher wants the engine's python)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

"""The event loop's lag while a 300-page PDF is converted (docs/DOCUMENTS.md). Not a test.

    python -m bench.document_loop_lag --pages 300 --sessions 50

In one process, as in the UI's: ``--sessions`` fake chat streams (each a task that "streams" a token every 20 ms and
does a little string work per token, like the coalescer), and a sampler waking every 5 ms that records how late it
woke (``loopstats``' measure). Three windows side by side: the streams alone; the streams while ``Reader.read``
converts the PDF in its child process (the product's way); the streams while the same conversion runs on the loop
(what a handler calling the converter directly would do). Prints p50/p99/max lag and the conversion time.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from backend.chat.documents import convert_file
from backend.chat.reading import Reader, Upload
from backend.settings import UploadsSettings
from backend.web.loopstats import bucket, percentiles
from tests.support.documents_build import make_pdf


async def _stream(stop: asyncio.Event) -> None:
    text = ""
    while not stop.is_set():
        await asyncio.sleep(0.02)
        text = (text + "token ")[-4000:]


async def _sample(stop: asyncio.Event, hist: dict[int, int]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.005)
        b = bucket(time.perf_counter() - t0 - 0.005)
        hist[b] = hist.get(b, 0) + 1


async def _window(sessions: int, work: object, seconds: float) -> tuple[dict[str, float], float]:
    stop, hist = asyncio.Event(), dict[int, int]()
    tasks = [asyncio.create_task(_stream(stop)) for _ in range(sessions)]
    sampler = asyncio.create_task(_sample(stop, hist))
    await asyncio.sleep(0.5)  # settle
    hist.clear()
    t0 = time.perf_counter()
    if work is None:
        await asyncio.sleep(seconds)
    else:
        await work()  # type: ignore[operator]
    took = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*tasks, sampler)
    return percentiles(hist), took


async def main_async(pages: int, sessions: int) -> None:
    lines = "\n".join(f"Line {j} of the page, some ordinary text to read." for j in range(40))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "big.pdf")
        path.write_bytes(make_pdf([f"Page {i + 1}\n{lines}" for i in range(pages)]))
        reader = Reader(UploadsSettings())

        async def progress(name: str, page: int, total: int) -> None:
            return None

        async def in_child() -> None:
            await reader.read(Upload(path.name, path), progress)

        async def on_loop() -> None:
            convert_file(path, path.name)

        base, _ = await _window(sessions, None, 1.0)
        child, child_s = await _window(sessions, in_child, 0)
        loop, loop_s = await _window(sessions, on_loop, 0)
    print(f"{pages}-page PDF, {sessions} streaming sessions in the same loop; lag of a 5 ms sampler (ms)")
    print(f"{'window':<34} {'p50':>6} {'p99':>7} {'max':>7} {'conversion s':>13}")
    for name, stats, secs in (
        ("streams alone", base, None),
        ("+ conversion in a child (product)", child, child_s),
        ("+ conversion on the loop", loop, loop_s),
    ):
        took = f"{secs:13.2f}" if secs is not None else f"{'':13}"
        print(f"{name:<34} {stats['p50']:6.1f} {stats['p99']:7.1f} {stats['max']:7.1f} {took}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=50)
    args = ap.parse_args()
    asyncio.run(main_async(args.pages, args.sessions))


if __name__ == "__main__":
    main()

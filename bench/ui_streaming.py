"""Benchmark: streaming an answer into real Chromium, ours against Chainlit's plain example. Not a test.

    python -m bench.ui_streaming [--cases abcde] [--runs 3] [--flush-ms 40] [--cold 1]

Starts, side by side and against the same fast fault server (tests/fakes/openai_server.py,
max_model_len 262,144): the plain streaming example from Chainlit's docs (bench/plain_chainlit_app.py:
one ``stream_token`` per chunk), our app in external mode with ``[ui] stream_flush_ms = 0`` (every
token at once: "before") and with ``--flush-ms`` ("after"). Real headless Chromium (Debian's, via
playwright, as tests/e2e) sends each case's message to each app in turn, a fresh page each time,
the apps' order rotated per run. Time is measured inside the page: from the Enter keydown to the
first token, and to the last token being in the answer's DOM. The server's own emit time for the
same request (from its request log) is the floor.

Cases: (a) 4,000 tokens as fast as the server can; (b) 1,500 at 100 tokens/s; (c) 3,000 at
200 tokens/s; (d) a pasted ~25K-token message, then 600 at 60 tokens/s; (e) a pasted ~100K-token
message, then 600 at 60 tokens/s. Target for each: ours ≤ 1.3 × emit + 1 s and ≤ the plain example.
Issue #22: (f) a ~200 KB answer of 10,000 ``wordN:valueN`` pairs (the fake server's scripted answer, one pair a
chunk) as fast as the server can, text Chainlit's renderer used to eat; (g) case (c) with compare mode on (our
apps only: ``/compare`` first, both sides in columns; the last token is seen when both sides show it); (h) case
(f) without the colons ("wordN valueN "), its control.
``--apps`` picks the apps (default all three).
``--cold N`` also restarts all apps N times and times the first message after start (first token).
Prints a table per measure (median, min–max over the runs) and a one-line summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.launcher import supervisor
from backend.settings import ROOT
from tests.e2e.support import CHROMIUM_ARGS

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

SERVER_MAX_MODEL_LEN = 262_144
REPLY_RESERVE = 4096  # our app sends max_tokens = [budget].reply_reserve: room for case (a)'s 4,000 tokens
ANSWER = '.step[data-step-type="assistant_message"] .message-content'


@dataclass(frozen=True)
class Case:
    key: str
    tokens: int
    rate: float  # tokens/s; 0 = as fast as the server can
    paste: int  # approximate tokens of pasted text in the message (0: none)
    pairs: bool = False  # the answer is a scripted one of ``tokens`` "wordN:valueN " pairs (#22)
    sep: str = ":"  # what joins a pair's two words (case h: a space, the same text without colons)
    compare: bool = False  # our apps answer in compare mode, both sides at once (#22)

    def first_last(self) -> tuple[str, str]:
        """The texts whose appearance in the page times the first and the last token."""
        if self.pairs:  # the word before the colon: in the plain example the rest is eaten
            return "word0", f"word{self.tokens - 1}"
        return "w0", f"w{self.tokens - 1}"

    def script(self) -> list[str] | None:
        return [f"word{i}{self.sep}value{i} " for i in range(self.tokens)] if self.pairs else None

    @property
    def spec(self) -> str:
        return f"normal:tokens={self.tokens}:rate={self.rate:g}"

    def title(self) -> str:
        speed = "max speed" if not self.rate else f"{self.rate:g} tok/s"
        paste = f"{self.paste // 1000}K pasted, " if self.paste else ""
        what = f"word{self.sep}word pairs" if self.pairs else "tok"
        return f"({self.key}) {paste}{self.tokens:,} {what} at {speed}" + (", compare" if self.compare else "")


CASES = {
    "a": Case("a", 4000, 0, 0),
    "b": Case("b", 1500, 100, 0),
    "c": Case("c", 3000, 200, 0),
    "d": Case("d", 600, 60, 25_000),
    "e": Case("e", 600, 60, 100_000),
    "f": Case("f", 10_000, 0, 0, pairs=True),
    "g": Case("g", 3000, 200, 0, compare=True),
    "h": Case("h", 10_000, 0, 0, pairs=True, sep=" "),
}


@dataclass
class App:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    ready_selector: str


@dataclass
class Sample:
    first: float  # s from Enter to the first token in the page
    last: float  # s from Enter to the last token in the page
    emit: float | None  # s the server took to send the stream


@dataclass
class Results:
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # (case, app) -> samples
    cold: dict[str, list[float]] = field(default_factory=dict)  # app -> first-token times of first messages

    def add(self, case: str, app: str, s: Sample) -> None:
        self.samples.setdefault((case, app), []).append(s)


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=str(ROOT), env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def start_fake(tmp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port)]
    proc = spawn(argv + ["--max-model-len", str(SERVER_MAX_MODEL_LEN)], dict(os.environ), tmp / "fake.out")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, tmp / "fake.out")
    return url, proc


def start_apps(tmp: Path, fake: str, flush_ms: float) -> list[App]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("QWENCHAT_", "OPENAI_"))}
    base |= {"OPENAI_BASE_URL": fake + "/v1", "OPENAI_API_KEY": "bench"}
    if "QWENCHAT_CONFIG" in os.environ:
        base["QWENCHAT_CONFIG"] = os.environ["QWENCHAT_CONFIG"]
    apps = []
    port = free_port()
    plain_root = tmp / "plain-root"
    plain_root.mkdir(exist_ok=True)
    proc = spawn(
        [sys.executable, "-m", "chainlit", "run", str(ROOT / "bench" / "plain_chainlit_app.py"), "--headless"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        base | {"CHAINLIT_APP_ROOT": str(plain_root)},
        tmp / "plain.out",
    )
    apps.append(App("plain", f"http://127.0.0.1:{port}", proc, "#chat-input"))
    for name, ms in (("before", 0.0), ("after", flush_ms)):
        port = free_port()
        env = base | {
            "QWENCHAT_NETWORK_UI_PORT": str(port),
            "QWENCHAT_NETWORK_ENGINE_PORT": str(free_port()),
            "QWENCHAT_LOGGING_DIR": str(tmp / f"logs-{name}"),
            "QWENCHAT_UI_STREAM_FLUSH_MS": str(ms),
            "QWENCHAT_UI_LANGUAGE": "en",
            "QWENCHAT_BUDGET_REPLY_RESERVE": str(REPLY_RESERVE),
        }
        proc = spawn([sys.executable, "-m", "backend", "serve"], env, tmp / f"{name}.out")
        apps.append(App(name, f"http://127.0.0.1:{port}", proc, '#qwenchat-status[data-state="ready"]'))
    for app in apps:
        wait_http(app.url, app.proc, tmp / f"{app.name}.out")
    return apps


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        supervisor.stop_process_group(proc, grace=10)


# ---------------------------------------------------------------- the message


def pasted_text(tokens: int, seed: int = 7) -> str:
    """English-like text of about ``tokens`` Qwen3 tokens (as a user pastes a document)."""
    if not tokens:
        return ""
    from tokenizers import Tokenizer

    from backend.packages import qwen_tokenizer_dir
    from bench.budget import en_text

    tok = Tokenizer.from_file(str(qwen_tokenizer_dir(progress=lambda *_: None) / "tokenizer.json"))
    rng, parts, n = random.Random(seed), [], 0
    while n < tokens:
        part = en_text(rng, 200) + "\n\n"
        parts.append(part)
        n += len(tok.encode(part, add_special_tokens=False).ids)
    return "".join(parts)


def fake_records(fake: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(fake + "/fake/requests", timeout=10) as resp:
        return list(json.loads(resp.read()))


def emit_time(fake: str, spec: str, seen: int) -> float | None:
    """The server's send time for the newest streamed request with ``spec`` after the first ``seen`` records."""
    for rec in reversed(fake_records(fake)[seen:]):
        if rec["spec"] == spec and rec["stream"] and rec.get("ended_at"):
            return float(rec["ended_at"] - rec["started_at"])
    return None


# ---------------------------------------------------------------- the browser

HOOK = """([sel, first, last, copies]) => {
  const n0 = document.querySelectorAll(sel).length;
  const b = (window.__bench = {t0: null, first: null, last: null});
  document.querySelector('#chat-input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && b.t0 === null) b.t0 = performance.now();
  }, {capture: true});
  const check = () => {
    if (b.last !== null) return;
    const els = [...document.querySelectorAll(sel)].slice(n0);
    if (!els.length) return;
    const texts = els.map(e => e.textContent || '');
    const now = performance.now();
    if (b.first === null && texts.some(t => t.includes(first))) b.first = now;
    if (texts.filter(t => t.includes(last)).length >= copies) {
      b.last = now; if (b.first === null) b.first = now; obs.disconnect();
    }
  };
  const obs = new MutationObserver(check);
  obs.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def measure(
    browser: Browser, app: App, message: str, first: str, last: str, timeout_s: float, compare: bool = False
) -> tuple[float, float]:
    """Send ``message`` in a fresh page of ``app``; seconds from Enter to ``first`` and to ``last`` in the page
    (``compare``: after turning compare mode on; ``last`` must then show in both sides)."""
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        page.goto(app.url)
        page.wait_for_selector(app.ready_selector)
        page.wait_for_selector("#chat-input")
        if app.name != "plain":
            page.wait_for_selector("#chat-settings-open-modal")  # before it, a typed message is lost
        if compare:
            compare_on(page)
        page.fill("#chat-input", message)
        time.sleep(0.3)  # let the page settle after a large paste
        page.evaluate(HOOK, [ANSWER, first, last, 2 if compare else 1])
        page.keyboard.press("Enter")
        page.wait_for_function("() => window.__bench.last !== null", timeout=timeout_s * 1000)
        b = page.evaluate("() => window.__bench")
        with contextlib.suppress(Exception):
            page.wait_for_selector("#stop-button", state="detached", timeout=30_000)
        return (b["first"] - b["t0"]) / 1000, (b["last"] - b["t0"]) / 1000
    finally:
        context.close()


def compare_on(page: Page) -> None:
    """Type /compare as a user does (the composer's command menu) and wait for its announcement."""
    before = page.locator(ANSWER).count()
    page.click("#chat-input")
    page.keyboard.type("/compare")
    page.wait_for_selector('[cmdk-item][data-value^="compare"]', timeout=10_000)
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => document.querySelectorAll({json.dumps(ANSWER)}).length > {before}")


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise SystemExit("Debian chromium is not installed (./test.sh installs it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# ---------------------------------------------------------------- report


def stats(values: list[float]) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    return f"{med:6.2f} s" if len(values) == 1 else f"{med:6.2f} s ({min(values):.2f}–{max(values):.2f})"


def report(res: Results, cases: list[Case], flush_ms: float, runs: int) -> None:
    def med(case: str, app: str, attr: str) -> float | None:
        vals = [getattr(s, attr) for s in res.samples.get((case, app), []) if getattr(s, attr) is not None]
        return statistics.median(vals) if vals else None

    print(f"\nEnter → last token visible, median (min–max) of {runs} run(s); 'after' = stream_flush_ms {flush_ms:g}")
    print(
        f"| case | server emit | plain example | ours before (0 ms) | ours after ({flush_ms:g} ms) "
        "| after / plain | after ≤ 1.3×emit+1 s |"
    )
    print("|---|---|---|---|---|---|---|")
    verdicts = []
    for c in cases:
        emits = [s.emit for s in res.samples.get((c.key, "after"), []) if s.emit is not None]
        row = [c.title(), stats(emits)]
        row += [stats([s.last for s in res.samples.get((c.key, a), [])]) for a in ("plain", "before", "after")]
        plain, after, emit = med(c.key, "plain", "last"), med(c.key, "after", "last"), med(c.key, "after", "emit")
        ratio = f"{after / plain:.2f}×" if plain and after else "—"
        ok = after is not None and emit is not None and after <= 1.3 * emit + 1.0 and (plain is None or after <= plain)
        verdicts.append(ok)
        row += [ratio, "met" if ok else "NOT met"]
        print("| " + " | ".join(row) + " |")
    print("\nEnter → first token visible, median (min–max)")
    print("| case | plain example | ours before | ours after |")
    print("|---|---|---|---|")
    for c in cases:
        print(
            f"| {c.title()} | "
            + " | ".join(
                stats([s.first for s in res.samples.get((c.key, a), [])]) for a in ("plain", "before", "after")
            )
            + " |"
        )
    if res.cold:
        print("\nfirst message after start, Enter → first token (a fresh start per sample)")
        print("| plain example | ours before | ours after |")
        print("|---|---|---|")
        print("| " + " | ".join(stats(res.cold.get(a, [])) for a in ("plain", "before", "after")) + " |")
    met = sum(verdicts)
    print(
        f"\nsummary: {met}/{len(verdicts)} cases within 1.3 × emit + 1 s and not slower than the plain example "
        f"(stream_flush_ms {flush_ms:g}); "
        + ", ".join(
            f"({c.key}) {med(c.key, 'after', 'last') or 0:.2f} s vs plain "
            + (f"{p:.2f} s" if (p := med(c.key, "plain", "last")) is not None else "not run (--apps)")
            for c in cases
        )
    )


# ---------------------------------------------------------------- main


def set_script(fake: str, chunks: list[str] | None) -> None:
    body = json.dumps({"chunks": chunks}).encode()
    req = urllib.request.Request(fake + "/fake/script", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).read()


def run(
    cases: list[Case], runs: int, flush_ms: float, cold: int, keep: Path | None, only: set[str] | None = None
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ui-", dir=keep)) if keep else Path(tempfile.mkdtemp(prefix="bench-ui-"))
    res = Results()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    texts = {c.key: pasted_text(c.paste) for c in cases}
    for c in cases:
        if c.paste:
            print(f"({c.key}) pasted text: {len(texts[c.key]):,} characters, ~{c.paste:,} Qwen3 tokens")
    fake, fake_proc = start_fake(tmp)
    procs: list[subprocess.Popen[bytes]] = [fake_proc]
    try:
        with chromium() as browser:
            apps: list[App] = []
            for i in range(max(cold, 1)):
                if apps:
                    stop_all([a.proc for a in apps])
                    procs = [fake_proc]
                (tmp / f"start{i}").mkdir()
                apps = start_apps(tmp / f"start{i}", fake, flush_ms)
                procs += [a.proc for a in apps]
                apps = [a for a in apps if only is None or a.name in only]
                time.sleep(2)  # the health poller's first round, as a user would open the page
                for app in apps:  # the first message of each process; cold when --cold
                    first, _ = measure(browser, app, "[[normal:tokens=20]] hello", "w0", "w19", 120)
                    if cold:
                        res.cold.setdefault(app.name, []).append(first)
            for r in range(runs):
                for c in cases:
                    order = apps[r % len(apps) :] + apps[: r % len(apps)]
                    for app in order:
                        if c.compare and app.name == "plain":
                            continue  # the plain example has no compare mode
                        seen = len(fake_records(fake))
                        msg = f"[[{c.spec}]] " + (texts[c.key] or "write")
                        timeout = 120 + c.tokens / (c.rate or 100) * 10
                        set_script(fake, c.script())
                        try:
                            first, last = measure(browser, app, msg, *c.first_last(), timeout, c.compare)
                        finally:
                            set_script(fake, None)
                        emit = emit_time(fake, c.spec, seen)
                        res.add(c.key, app.name, Sample(first, last, emit))
                        print(
                            f"run {r + 1} {c.title():40s} {app.name:7s} first {first:6.2f} s  last {last:7.2f} s  "
                            f"emit {emit or 0:6.2f} s  load {os.getloadavg()[0]:.2f}",
                            flush=True,
                        )
    finally:
        stop_all(procs)
    report(res, cases, flush_ms, runs)
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; logs in {tmp}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="abcde", help="which cases, e.g. 'ab' (default: abcde)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every case per app (default 3)")
    ap.add_argument("--flush-ms", type=float, default=40, help="[ui] stream_flush_ms for 'after' (default 40)")
    ap.add_argument("--cold", type=int, default=1, help="fresh starts timed for the first message (default 1)")
    ap.add_argument("--keep", type=Path, default=None, help="put the apps' logs under this folder")
    ap.add_argument("--apps", default="plain,before,after", help="which apps to measure (default: all three)")
    a = ap.parse_args()
    unknown = set(a.cases) - set(CASES)
    if unknown:
        ap.error(f"--cases {a.cases!r}: unknown {''.join(sorted(unknown))!r}; known: {''.join(CASES)}")
    only = {x.strip() for x in a.apps.split(",") if x.strip()}
    if not only or only - {"plain", "before", "after"}:
        ap.error(f"--apps {a.apps!r}: name some of plain, before, after (comma-separated)")
    run([CASES[k] for k in a.cases], a.runs, a.flush_ms, a.cold, a.keep, only)


if __name__ == "__main__":
    from bench.environment import use_test_environment

    use_test_environment(engine=True)  # as ./test.sh sets it up, when run from the documented command alone
    main()

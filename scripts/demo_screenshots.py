"""The screenshots of docs/DEMO.md: the five-minute demo, run in real Chromium against the real product.

    QWENCHAT_ENGINE_PYTHON=~/.cache/qwenchat/envs/engine-cpu-*/bin/python \\
        ~/.cache/qwenchat/envs/app-test-*/bin/python scripts/demo_screenshots.py [--out docs]

Launches `python -m backend serve` on the embedded default (SmolLM2-135M-Instruct + the 'pirate' LoRA on
vLLM-CPU) with login on and a second account, on free ports with logs in a temporary folder, then follows
docs/DEMO.md step by step and writes docs/demo-<n>-<step>.png. Needs the test environment (playwright and
Debian chromium: ./test.sh installs both). It prints each step as it goes; it is not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend import passwords  # noqa: E402
from tests.e2e import support as e2e  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

OWNER, OWNER_PW = "demo", "demo password"
VIEWER, VIEWER_PW = "stakeholder", "stakeholder password"


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def log_in(browser: Browser, url: str, user: str, password: str) -> Page:
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.goto(url)
    page.wait_for_selector("#email")
    page.fill("#email", user)
    page.fill("#password", password)
    page.click("button[type=submit]")
    e2e.wait_ready_ui(page)
    return page


def wait_done(page: Page, before: int) -> None:
    page.wait_for_function(
        """([n]) => document.querySelectorAll('.step[data-step-type="assistant_message"]').length > n""",
        arg=[before],
    )
    page.wait_for_selector("#stop-button", state="detached")
    time.sleep(0.5)


def n_steps(page: Page) -> int:
    return page.locator('.step[data-step-type="assistant_message"]').count()


def command(page: Page, name: str, text: str = "") -> None:
    before = n_steps(page)
    page.fill("#chat-input", "/" + name)
    page.locator("[role=option], [cmdk-item]", has_text=name).first.click()
    if text:
        page.type("#chat-input", text)
        page.keyboard.press("Enter")
    else:  # Enter sends nothing from an empty box; the send button sends the command alone
        page.click("#chat-submit")
    wait_done(page, before)


def ask(page: Page, text: str) -> None:
    before = n_steps(page)
    page.fill("#chat-input", text)
    page.keyboard.press("Enter")
    wait_done(page, before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the demo-*.png files")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def shot(page: Page, name: str) -> None:
        page.screenshot(path=str(out / f"demo-{name}.png"))
        say(f"wrote demo-{name}.png")

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="qwenchat-demo-") as tmp:
        viewer_hash = passwords.hash_password(VIEWER_PW)
        say("starting the product (vLLM-CPU loads in about 40 s) ...")
        app = e2e.launch(
            Path(tmp),
            {
                "QWENCHAT_LOGIN_ENABLE": "true",
                "QWENCHAT_LOGIN_USERNAME": OWNER,
                "QWENCHAT_LOGIN_PASSWORD": OWNER_PW,
                "QWENCHAT_LOGIN_USERS": f"{VIEWER}={viewer_hash}",
                "QWENCHAT_UI_LANGUAGE": "en",
            },
        )
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=e2e.chromium_path(), args=e2e.CHROMIUM_ARGS)
                page = log_in(browser, app.url, OWNER, OWNER_PW)
                shot(page, "1-welcome")
                say("step 2: a pirate starter")
                before = n_steps(page)
                page.locator("#starters button", has_text="What is the capital of France?").first.click()
                wait_done(page, before)
                shot(page, "2-starter")
                say("step 3: compare base and pirate side by side")
                command(page, "compare")
                ask(page, "What is the capital of France?")
                shot(page, "3-compare")
                say("step 4: blind compare and a vote")
                page.goto(app.url)
                e2e.wait_ready_ui(page)
                command(page, "compare", "blind")
                ask(page, "What is the capital of France?")
                shot(page, "4-blind")
                page.locator("button", has_text="is better").first.click()
                page.wait_for_function("() => document.body.innerText.includes('Vote stored')")
                time.sleep(1)
                shot(page, "5-voted")
                command(page, "leaderboard")
                shot(page, "6-leaderboard")
                say("step 5: share the chat")
                thread = page.locator('li[id^="thread-"]').first
                thread.hover()
                page.locator("#thread-options").first.click()
                page.click("#share-thread")
                dialog = page.locator("[role=dialog]")
                dialog.locator("button", has_text="Share").first.click()
                dialog.locator("button", has_text="Unshare").wait_for()
                link = dialog.locator("span[title*='/share/']").get_attribute("title")
                shot(page, "7-share")
                viewer = log_in(browser, app.url, VIEWER, VIEWER_PW)
                assert link is not None, "the share dialog shows no /share/ link"
                viewer.goto(link)
                viewer.locator('.step[data-step-type="assistant_message"]').first.wait_for()
                time.sleep(1)
                shot(viewer, "8-shared-view")
                browser.close()
        finally:
            e2e.stop(app)
    return 0


if __name__ == "__main__":
    sys.exit(main())

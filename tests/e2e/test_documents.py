"""End to end: documents attached in the composer (Chainlit's upload button), in real Chromium, against the real
product on the embedded model (the shared one of test_chat: a 1,050-token prompt budget).

A PDF and a DOCX built here, each holding a code word, go with one message: the footer's meter lists each one's
share, and the meter's count is vLLM's own ``prompt_tokens`` for the message framed with the converted text (so
what the engine received holds the documents). The answer's quality is not judged (a 135M model)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from backend.chat.documents import convert_file, framed_message
from tests.e2e import support as e2e
from tests.support.documents_build import make_docx, make_pdf

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def live(embedded_product):
    return embedded_product


@pytest.fixture(scope="module")
def page(live, browser):
    with e2e.browser_page(live.url, browser=browser) as pg:
        e2e.wait_ready_ui(pg)
        yield pg


def attach(page, paths: list[Path]) -> None:
    """Files into the composer as the upload button takes them; waits until each is uploaded."""
    uploads = []

    def seen(response) -> None:  # the uploads only: the page also GETs an uploaded file back (its preview)
        if response.request.method == "POST" and "/project/file" in response.url:
            uploads.append(response)

    page.on("response", seen)
    try:
        page.set_input_files("#upload-button-input", [str(p) for p in paths])
        deadline = time.monotonic() + 60
        while len(uploads) < len(paths) and time.monotonic() < deadline:
            page.wait_for_timeout(200)  # Playwright's sync API delivers events while it waits
    finally:
        page.remove_listener("response", seen)
    assert [r.status for r in uploads] == [200] * len(paths), [(r.url, r.status, r.text()[:300]) for r in uploads]
    page.wait_for_selector("#upload-button-loading", state="detached", timeout=60_000)


def meter_of(answer: str) -> tuple[int, dict[str, int]]:
    """(prompt tokens, {document: its tokens}) from a footer's "context: 312 / 1,050 tokens · a.pdf 45 · …"."""
    meter = answer.split("context: ")[1]
    used = int(meter.split(" /")[0].replace(",", ""))
    shares = {m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"· (\S+\.\w+) ([\d,]+)", meter)}
    return used, shares


def engine_prompt_tokens(app: e2e.LiveApp, content: str) -> int:
    """vLLM's usage.prompt_tokens for a chat of one user message, asked of the engine itself."""
    import asyncio
    import concurrent.futures

    from backend.chat.client import ChatClient

    async def ask() -> int:
        async with ChatClient(app.engine_url, e2e.ENGINE_KEY) as client:
            answer = await client.complete([{"role": "user", "content": content}], MODEL, max_tokens=1)
        assert answer.usage is not None and answer.usage.prompt_tokens is not None
        return answer.usage.prompt_tokens

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        return pool.submit(asyncio.run, ask()).result()


def test_a_pdf_and_a_docx_reach_the_model_and_the_meter_lists_each(page, live, tmp_path):
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(make_pdf(["Quarterly report.\nThe code word is PELICAN-7.", "Second page: nothing else."]))
    docx = tmp_path / "notes.docx"
    docx.write_bytes(make_docx(["Meeting notes.", "The second code word is WALRUS-3."], heading="Notes"))
    question = "What are the two code words?"

    attach(page, [pdf, docx])
    answer = e2e.send(page, question)
    answer = e2e.whole_answer(page)

    used, shares = meter_of(answer)
    assert set(shares) == {"report.pdf", "notes.docx"}, answer
    assert all(0 < tokens < used for tokens in shares.values())
    page.get_by_text("report.pdf, notes.docx").first.wait_for(timeout=10_000)  # the reading step, named by its files
    sent = framed_message(question, [convert_file(pdf, pdf.name), convert_file(docx, docx.name)])
    assert "PELICAN-7" in sent and "WALRUS-3" in sent
    assert engine_prompt_tokens(live, sent) == used  # what the meter counted is what vLLM counts for that text
    page.screenshot(path=str(live.log_dir / "documents.png"), full_page=True)


def test_a_scanned_pdf_is_refused_with_the_typed_text_kept(page, live, tmp_path):
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(make_pdf(["", "", ""], drawn=True))
    answers = len(e2e.assistant_messages(page))

    attach(page, [scan])
    e2e.submit(page, "please summarise the scan")

    error = page.locator(".step", has_text="no text layer").last
    error.wait_for(timeout=60_000)
    said = error.inner_text()
    assert "scan.pdf" in said and "3 pages" in said and "OCR" in said
    assert "please summarise the scan" in said  # the typed text, quoted back
    page.wait_for_selector("#stop-button", state="detached", timeout=60_000)
    assert len(e2e.assistant_messages(page)) == answers + 1  # the error only: nothing was sent to the model


def test_a_document_too_long_is_offered_cut_at_a_page_and_the_step_names_the_cut(page, live, tmp_path):
    long_pdf = tmp_path / "long.pdf"
    pages = [
        f"Page {i + 1}. " + "The lighthouse keeper counted the steps and wrote the weather down. " * 6
        for i in range(30)
    ]  # far above the 1,050-token budget
    long_pdf.write_bytes(make_pdf(pages))

    attach(page, [long_pdf])
    e2e.submit(page, "What did the keeper do?")

    button = page.locator("button", has_text=re.compile(r"Send pages 1–\d+ of 30"))
    button.wait_for(timeout=120_000)
    part = int(re.search(r"1–(\d+) of 30", button.inner_text()).group(1))
    assert 0 < part < 30
    assert "Nothing was sent" in page.locator(".step", has_text="long.pdf does not fit").last.inner_text()
    page.wait_for_selector("#stop-button", state="detached", timeout=60_000)
    before = len(e2e.assistant_messages(page))
    with page.expect_response(lambda r: r.request.method == "POST" and "/project/action" in r.url) as pressed:
        button.click()
    response = pressed.value  # the press reached the UI, and what it said
    assert response.status == 200, (response.status, response.text()[:500])

    page.get_by_text(f"sending long.pdf: pages 1–{part} of 30").first.wait_for(timeout=60_000)
    page.wait_for_function(
        """([n]) => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                      return m.length > n && / tokens · /.test(m[m.length - 1].innerText); }""",
        arg=[before],
        timeout=180_000,
    )
    used, shares = meter_of(e2e.assistant_messages(page)[-1])
    assert "long.pdf" in shares and used <= 1050

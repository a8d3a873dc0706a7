"""End to end, in real Chromium: what the model wrote and what the user typed is what the page shows (#22).

Each case of tests/e2e/fidelity_corpus.py is streamed by the fake server (chunks as given, a sequence split
across them), shown by the product, and its visible text compared with the same source rendered by a standard
CommonMark + GFM renderer (markdown-it-py, raw HTML as text, as Chainlit shows it) in the same page. The plain
Chainlit example (bench/plain_chainlit_app.py) gets the same stream in the same test: its renderer's text
directives eat ``:name`` (``set key:value`` shows as ``set key``), so the cases listed in EATEN must fail there
and all others must pass: the comparison itself is shown to tell the two apart.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from backend.launcher import supervisor
from tests.e2e import fidelity_corpus as corpus
from tests.e2e import support as e2e
from tests.support import live_app

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

# The cases whose text the plain Chainlit example loses (a text, leaf or container directive outside code).
# Chainlit's alert plugin takes ``:::info`` … ``:::``. (``:smile:``, ``C:\\``, ``12:30`` and ``<b>`` pass there.)
EATEN = {
    "word-colon-word",
    "typed-directive",
    "technical-pairs",
    "fenced-block",
    "colons-only",
    "colon-line-starts",
    "split-fence",
}

# The visible text of an element as a reader sees it: laid out (innerText), code blocks without Chainlit's
# header (language name, copy button), the streaming cursor's placeholder dropped, whitespace runs as one space.
VISIBLE_JS = """(el) => {
    const box = document.createElement('div');
    box.style.cssText = 'position:absolute;left:-10000px;top:0;width:900px';
    box.appendChild(el.cloneNode(true));
    document.body.appendChild(box);
    box.querySelectorAll('.relative.my-2 > :first-child, button').forEach(e => e.remove());
    const text = box.innerText;
    box.remove();
    return text.replace(/\\u200b/g, '').replace(/\\s+/g, ' ').trim();
}"""
EXPECTED_JS = (
    """(html) => { const el = document.createElement('div'); el.innerHTML = html; return (""" + VISIBLE_JS + ")(el); }"
)
ANSWERS = '.step[data-step-type="assistant_message"] .message-content'
USERS = '.step[data-step-type="user_message"] .message-content'


def standard_html(markdown: str) -> str:
    """CommonMark + GFM tables and strikethrough; raw HTML escaped (shown as text, as react-markdown does)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).render(markdown)


def expected(page, markdown: str) -> str:
    return page.evaluate(EXPECTED_JS, standard_html(markdown))


def shown(page, selector: str) -> list[str]:
    return [page.evaluate(VISIBLE_JS, h) for h in page.query_selector_all(selector)]


def post(url: str, body: dict) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture(scope="module")
def fake(fake_openai):
    return fake_openai  # shared (tests/conftest.py), reset for this module


@pytest.fixture(scope="module")
def live(external_app):
    return external_app  # on the fake server, English (tests/conftest.py); test_compare_columns uses it too


@pytest.fixture(scope="module")
def plain(fake, tmp_path_factory):
    """The plain streaming example from Chainlit's docs, against the same fake server (the failing baseline)."""
    try:
        proc, url = live_app.launch_plain(tmp_path_factory.mktemp("plain-chainlit"), fake + "/v1")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield url
    supervisor.stop_process_group(proc, grace=5)


@pytest.fixture(scope="module")
def page(live, browser):
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(live.url)
    e2e.wait_ready_ui(pg, timeout_ms=120_000)
    yield pg
    context.close()


@pytest.fixture(scope="module")
def plain_page(plain, browser):
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(plain)
    pg.wait_for_selector("#chat-input")
    yield pg
    context.close()


def answer(page, fake: str, chunks: list[str], question: str = "tell me") -> str:
    """Stream ``chunks`` as the answer to a new message; the answer bubble's visible text once finished."""
    post(fake + "/fake/script", {"chunks": chunks})
    before = len(shown(page, ANSWERS))
    e2e.send(page, question, timeout_ms=60_000)
    return shown(page, ANSWERS)[before]


@pytest.mark.parametrize("name", list(corpus.CORPUS))
def test_an_answer_shows_what_the_model_wrote(name, page, plain_page, fake):
    chunks = corpus.CORPUS[name]
    want = expected(page, corpus.source(name))
    ours = answer(page, fake, chunks)
    # The product's bubble ends with its footer (model, tokens, seconds) after the answer's text.
    assert ours.startswith(want + " fake-qwen"), f"shown:    {ours!r}\nexpected: {want!r} + footer"
    baseline = answer(plain_page, fake, chunks)
    if name in EATEN:
        assert baseline != want, f"the plain Chainlit example showed {name!r} whole: the test cannot fail"
    else:
        assert baseline == want, f"plain Chainlit: {baseline!r} (the comparison, not the renderer, is off)"


@pytest.mark.parametrize("name", corpus.TYPED)
def test_a_typed_message_shows_what_the_user_typed(name, page, plain_page, fake):
    text = corpus.source(name)
    want = expected(page, text)
    post(fake + "/fake/script", {"chunks": ["ok"]})
    for pg in (page, plain_page):
        e2e.send(pg, text, timeout_ms=60_000)
    assert shown(page, USERS)[-1] == want
    if name in EATEN:
        assert shown(plain_page, USERS)[-1] != want, "the plain Chainlit example showed it whole: cannot fail"
    else:
        assert shown(plain_page, USERS)[-1] == want, "plain Chainlit: the comparison, not the renderer, is off"


def test_an_answer_shows_what_the_model_wrote_while_it_streams(page, plain_page, fake):
    """Every case in one answer held before its last chunk: the bubble mid-stream shows all but that chunk."""
    chunks = [c for name in corpus.CORPUS for c in [*corpus.CORPUS[name], "\n\n"]]
    chunks[-1:] = ["\n\nthe last:chunk"]
    want = expected(page, "".join(chunks[:-1]))
    for pg, app in ((page, "product"), (plain_page, "plain")):
        post(fake + "/fake/script", {"chunks": chunks, "hold": 6})
        before = len(shown(pg, ANSWERS))
        pg.fill("#chat-input", "tell me everything")
        pg.keyboard.press("Enter")
        deadline, seen = time.monotonic() + 5, ""
        while time.monotonic() < deadline:
            now = shown(pg, ANSWERS)
            seen = now[before] if len(now) > before else ""
            if seen == want:
                break
            time.sleep(0.2)
        pg.wait_for_selector("#stop-button", state="detached", timeout=60_000)
        if app == "product":
            assert seen == want, f"mid-stream:\n{seen!r}\nexpected:\n{want!r}"
        else:
            assert seen != want, "the plain Chainlit example streamed the corpus whole: the test cannot fail"


def test_both_sides_of_a_compare_show_what_the_models_wrote(page, fake):
    """The whole corpus as one answer on both sides of a compared turn (each side's bubble: heading, text, footer)."""
    from tests.e2e.test_compare import command

    chunks = [c for name in corpus.CORPUS for c in [*corpus.CORPUS[name], "\n\n"]]
    want = expected(page, "".join(chunks))
    command(page, "compare")
    try:
        post(fake + "/fake/script", {"chunks": chunks})
        before = len(shown(page, ANSWERS))
        e2e.send(page, "compare these", timeout_ms=60_000)
        page.wait_for_function(
            "([n]) => document.querySelectorAll(SEL).length >= n + 3".replace("SEL", json.dumps(ANSWERS)),
            arg=[before],
        )
        sides = shown(page, ANSWERS)[before : before + 2]
        for side, model in zip(sides, ("fake-qwen", "fake-adapter"), strict=True):
            head = f"{'A' if model == 'fake-qwen' else 'B'} · {model} "
            assert side.startswith(head + want + f" {model} · "), f"shown:    {side!r}\nexpected: {head + want!r}"
    finally:
        command(page, "compare", "off")


def test_a_reasoning_step_shows_what_the_model_thought(page, fake):
    """Qwen3's inline <think> block goes to a collapsed step: opened, it shows its text as written."""
    thought = "The user wants key:value and model:qwen3 pairs; C:Users, :a:b:c and <|im_end|> stay."
    chunks = [
        "<think>\nThe user wants key",
        ":value and model:",
        "qwen3 pairs; C:Users, :a:b:c and <|im_end|> stay.",
        "\n</think>\n\n",
        "Answer:ok",
    ]
    post(fake + "/fake/script", {"chunks": chunks})
    e2e.send(page, "think first", timeout_ms=60_000)
    step = page.locator('.step[data-step-type="llm"]').last
    step.locator("button").first.click()  # the collapsed step's header opens it
    step.locator(".message-content").first.wait_for()
    assert shown(page, '.step[data-step-type="llm"] .message-content')[-1] == expected(page, thought)

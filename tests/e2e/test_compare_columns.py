"""End to end, in real Chromium: the two answers of a compared turn in columns on a wide screen, stacked on a
phone (#22 item 3).

Against the product in external mode on the fake server (its scripted answer, held before the last chunk, so
both sides are seen streaming at once). Boxes are the sides' message contents as laid out: at 1280 px A's
lies left of B's, level with it, both streaming at once, each with its own footer, the note under both; at
390 px B lies under A. Blind mode hides the names in both layouts until the vote. A side that fails shows its
error and Retry in its own column, and Retry answers there (failing again: the side is asked as first asked).
"""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e
from tests.e2e.test_compare import command
from tests.e2e.test_fidelity import fake, live, post  # noqa: F401  (the same external-mode app and fake server)

pytestmark = [pytest.mark.e2e, pytest.mark.product, pytest.mark.browser]

WIDE, PHONE = 1280, 390
ANSWER = ["The capital:", " Paris. " * 40, "Done."]

# The newest bubble of a side (its answer, or its error after it): the box of its text and the text.
SIDE_JS = """([label]) => {
    const steps = [...document.querySelectorAll(
        `.step:has(.message-content a[href="#qc-side-${label}"])`)];
    if (!steps.length) return null;
    const el = steps[steps.length - 1].querySelector('.message-content');
    const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, text: el.innerText,
            count: steps.length};
}"""
DONE = " · context: "  # the footer's tail


@pytest.fixture(params=[WIDE, PHONE], ids=["1280px", "390px"])
def page(request, live, browser):  # noqa: F811
    context = browser.new_context(locale="en-US", viewport={"width": request.param, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(live.url)
    e2e.wait_ready_ui(pg, timeout_ms=120_000)
    yield pg
    context.close()


def side(page, label: str) -> dict | None:
    return page.evaluate(SIDE_JS, [label.lower()])


def width(page) -> int:
    return int(page.viewport_size["width"])


def assert_laid_out(page, a: dict, b: dict) -> None:
    """Next to each other on a wide screen, stacked on a phone."""
    if width(page) == WIDE:
        assert a["right"] <= b["left"] and abs(a["top"] - b["top"]) < 4, (a, b)
        assert a["width"] > 400 and b["width"] > 400, (a, b)
    else:
        assert b["top"] >= a["bottom"] and abs(a["left"] - b["left"]) < 4, (a, b)


def streaming_sides(page, question: str) -> tuple[dict, dict]:
    """Send ``question``; both sides as they are while both stream (text shown, no footer yet)."""
    e2e.submit(page, question)
    page.wait_for_function(
        """() => ['a', 'b'].every(l => { const s = (SIDE)([l]);
            return s && s.text.includes('Paris') && !s.text.includes(' · context: '); })""".replace("SIDE", SIDE_JS),
        timeout=30_000,
    )
    a, b = side(page, "A"), side(page, "B")
    assert a and b
    return a, b


def test_a_and_b_stream_at_once_in_columns_on_a_wide_screen_and_stack_on_a_phone(page, fake):  # noqa: F811
    command(page, "compare")
    post(fake + "/fake/script", {"chunks": ANSWER, "hold": 3})
    a, b = streaming_sides(page, "hello")
    assert DONE not in a["text"] and DONE not in b["text"]  # both at once, neither finished
    assert_laid_out(page, a, b)
    page.wait_for_selector("#stop-button", state="detached", timeout=30_000)
    a, b = side(page, "A"), side(page, "B")
    assert a and b and a["text"].startswith("A · fake-qwen") and b["text"].startswith("B · fake-adapter"), (a, b)
    assert "fake-qwen · 3 tokens" in a["text"] and "fake-adapter · 3 tokens" in b["text"]  # each its own footer
    assert_laid_out(page, a, b)
    note = page.locator('.step[data-step-type="assistant_message"] .message-content').last.bounding_box()
    assert note and note["y"] >= max(a["bottom"], b["bottom"]), (note, a, b)  # under both, across the list
    assert page.get_by_role("button", name="Continue with B").count() >= 1


def test_blind_mode_hides_the_names_in_both_layouts_until_the_vote(page, fake):  # noqa: F811
    command(page, "compare", "blind")
    post(fake + "/fake/script", {"chunks": ANSWER, "hold": 2})
    a, b = streaming_sides(page, "who are you")
    assert_laid_out(page, a, b)
    page.wait_for_selector("#stop-button", state="detached", timeout=30_000)
    a, b = side(page, "A"), side(page, "B")
    assert a and b and a["text"].split("\n")[0].strip() == "A" and b["text"].split("\n")[0].strip() == "B"
    assert not any(name in s["text"] for s in (a, b) for name in ("fake-qwen", "fake-adapter")), (a, b)
    assert_laid_out(page, a, b)
    page.get_by_role("button", name="A is better").click()
    page.wait_for_function(
        "() => ['a', 'b'].every(l => (SIDE)([l]).text.includes(' · fake-'))".replace("SIDE", SIDE_JS)
    )
    a, b = side(page, "A"), side(page, "B")
    assert a and b
    heads = {a["text"].split("\n")[0], b["text"].split("\n")[0]}
    assert heads in ({"A · fake-qwen", "B · fake-adapter"}, {"A · fake-adapter", "B · fake-qwen"}), heads
    assert_laid_out(page, a, b)


def test_a_failing_side_shows_its_error_and_retry_in_its_own_column(page, fake):  # noqa: F811
    command(page, "compare")
    post(fake + "/fake/script", {"chunks": None})
    e2e.submit(page, "[[fault:error-mid:model=fake-adapter]] hello")
    page.wait_for_function("() => document.body.innerText.includes('fake engine failure mid-stream')")
    page.wait_for_selector("#stop-button", state="detached", timeout=30_000)
    a, error = side(page, "A"), side(page, "B")
    assert a and error and error["count"] == 2 and "fake engine failure mid-stream" in error["text"], error
    assert "fake-qwen · 8 tokens" in a["text"]
    if width(page) == WIDE:
        assert error["left"] >= a["right"], (a, error)  # the error stands in B's column, under B's partial answer
    else:
        assert error["top"] >= a["bottom"], (a, error)
    page.get_by_role("button", name="Retry").last.click()
    page.wait_for_function("() => (SIDE)(['b']).count === 4".replace("SIDE", SIDE_JS))  # its answer, error again
    again = side(page, "B")
    assert again and (again["left"] >= a["right"] if width(page) == WIDE else again["top"] >= a["bottom"]), again

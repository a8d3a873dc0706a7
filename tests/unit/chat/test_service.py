"""Pure UI helpers: dropdown items, sampling fields; the footer under each answer (backend/ui/markdown.py)."""

from __future__ import annotations

from backend.chat.budget import FitResult
from backend.chat.client import Finish, Usage
from backend.chat.health import HealthStatus, ModelEntry
from backend.chat.service import LocalAdapter, model_options, sampling_body, sampling_from
from backend.ui.markdown import footer


def status(*models: ModelEntry) -> HealthStatus:
    return HealthStatus(models=models, base_model="base")


def test_dropdown_lists_base_then_served_adapters_with_rank_then_loadable_ones():
    st = status(ModelEntry("base"), ModelEntry("pirate", parent="base", root="/a/pirate"))
    items = model_options(st, [LocalAdapter("poet", 16)], "en", rank_of=lambda root: 8)
    assert list(items.values()) == ["base", "pirate", "poet"]
    labels = list(items)
    assert "base model" in labels[0] and "r8" in labels[1] and "r16" in labels[2] and "not loaded" in labels[2]


def test_dropdown_labels_in_chinese():
    items = model_options(status(ModelEntry("base")), [], "zh-CN")
    assert "基础模型" in next(iter(items))


def test_sampling_from_settings_keeps_defaults_for_missing_values():
    out = sampling_from(
        {"temperature": 0.7, "top_k": 20.0}, {"temperature": 0.2, "top_p": 0.9, "top_k": -1, "min_p": 0.0}
    )
    assert out == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0}


def test_sampling_body_sends_vllm_extensions_only_when_active():
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": -1, "min_p": 0.0}) == {
        "temperature": 0.7,
        "top_p": 0.8,
    }
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05}) == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.05,
    }


def test_footer_names_the_model_tokens_time_and_context_meter():
    fitted = FitResult(messages=[], prompt_tokens=1234, budget=7168, max_model_len=8192, reply_reserve=1024)
    text = footer("pirate", Usage(40, 25), fitted, 1.25, "en", Finish("stop", "pirate"))
    assert text.startswith("\n\n*`pirate` ·") and "25 tokens" in text and "1.2 s" in text and "1,234 / 7,168" in text


import asyncio  # noqa: E402

import pytest  # noqa: E402

from backend.ui.markdown import close_fence, interrupted_marker  # noqa: E402
from backend.ui.markdown import footer as footer_  # noqa: E402


@pytest.mark.parametrize(
    "text, closed",
    [
        ("plain answer", "plain answer"),
        ("```python\nprint(1)\n```\ndone", "```python\nprint(1)\n```\ndone"),
        ("```python\nprint(1", "```python\nprint(1\n```"),
        ("see:\n  ```\n  indented", "see:\n  ```\n  indented\n```"),
        ("~~~\ncode", "~~~\ncode\n~~~"),
        ("```\n~~~ inside\n", "```\n~~~ inside\n\n```"),
        ("```\na\n```\n```js\nb", "```\na\n```\n```js\nb\n```"),
    ],
)
def test_an_answer_cut_inside_a_code_block_gets_the_block_closed(text, closed):
    assert close_fence(text) == closed


def test_model_ids_with_markdown_characters_are_shown_as_code_in_the_footer_and_the_marker():
    assert footer_("my_adapter*v2", None, None, 1.0, "en").startswith("\n\n*`my_adapter*v2` ·")
    assert interrupted_marker("stopped", "a_b") == "\n\n*⚠ stopped · `a_b`*"


class FakePoller:
    """The shared poller's view: loads show up in it only after they finish (refresh)."""

    def __init__(self) -> None:
        self.served: list[str] = []
        self.pending: list[str] = []

    @property
    def status(self) -> HealthStatus:
        return status(ModelEntry("base"), *[ModelEntry(n, parent="base") for n in self.served])

    async def refresh(self) -> HealthStatus:
        self.served += self.pending
        self.pending = []
        return self.status


def test_two_sessions_loading_at_once_see_each_others_adapter_in_the_limit_check(monkeypatch, tmp_path):
    from backend.adapters import folder, runtime
    from backend.chat.service import Loaded, Service
    from backend.settings import LoggingSettings, LoraSettings, Settings

    settings = Settings(
        lora=LoraSettings(dir=str(tmp_path), max_loras=1, max_cpu_loras=1),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )
    service = Service(settings)
    poller = service._poller = FakePoller()
    seen: list[tuple[str, list[str]]] = []

    def prepare(lora_dir, name, base_path, max_rank, *, base_aliases):
        return type("Diagnosis", (), {"path": tmp_path / name})()

    async def load(base_url, api_key, name, path, *, loaded, limit):
        seen.append((name, list(loaded)))
        await asyncio.sleep(0.05)
        poller.pending.append(name)

    async def unload(base_url, api_key, name):
        poller.served.remove(name)

    monkeypatch.setattr(folder, "prepare_runtime_load", prepare)
    monkeypatch.setattr(runtime, "load_adapter", load)
    monkeypatch.setattr(runtime, "unload_adapter", unload)

    async def both():
        stale = poller.status  # read by both sessions before either load
        return await asyncio.gather(
            service.ensure_loaded("a", stale), service.ensure_loaded("b", stale), service.ensure_loaded("a", stale)
        )

    assert asyncio.run(both()) == [Loaded("a"), Loaded("b", evicted="a"), Loaded("a", evicted="b")]
    # "b" found the one slot taken by "a" (counted although the stale view had not seen it) and made room;
    # the second "a" then found "b" there, not its own earlier load.
    assert seen == [("a", []), ("b", []), ("a", [])]

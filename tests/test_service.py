"""Pure UI helpers: dropdown items, sampling fields, the footer under each answer."""

from __future__ import annotations

from backend.budget import FitResult
from backend.client import Finish, Usage
from backend.health import HealthStatus, ModelEntry
from backend.service import LocalAdapter, footer, model_options, sampling_body, sampling_from


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
    out = sampling_from({"temperature": 0.7, "top_k": 20.0}, {"temperature": 0.2, "top_p": 0.9, "top_k": -1, "min_p": 0.0})
    assert out == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0}


def test_sampling_body_sends_vllm_extensions_only_when_active():
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": -1, "min_p": 0.0}) == {"temperature": 0.7, "top_p": 0.8}
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05}) == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05}


def test_footer_names_the_model_tokens_time_and_context_meter():
    fitted = FitResult(messages=[], prompt_tokens=1234, budget=7168, max_model_len=8192, reply_reserve=1024)
    text = footer("pirate", Usage(40, 25), fitted, 1.25, "en", Finish("stop", "pirate"))
    assert text.startswith("\n\n*pirate ·") and "25 tokens" in text and "1.2 s" in text and "1,234 / 7,168" in text

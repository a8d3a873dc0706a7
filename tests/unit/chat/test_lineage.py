"""Which listed model is the base and which are adapters, when the server in front (LiteLLM, a router) drops vLLM's
``parent`` field: [lora] parents declares it; with neither, only [model]'s name may be called the base model."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.chat import health_status
from backend.chat.health import HealthPoller, HealthSettings, ModelEntry
from backend.chat.health_status import parse_models
from backend.chat.service import model_options
from backend.errors import ConfigError
from backend.settings import load_settings
from tests.fakes.openai_server import FakeServer


def hidden(*ids: str) -> dict:
    """A /v1/models body as LiteLLM or a router gives it: no parent, no root."""
    return {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "x"} for i in ids]}


def vllm(*entries: tuple[str, str | None]) -> dict:
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "parent": p, "root": f"/m/{i}"} for i, p in entries],
    }


def kinds(models) -> dict[str, str]:
    return {m.id: "base" if m.is_base else "adapter" if m.is_adapter else "unknown" for m in models}


def test_hidden_lineage_and_no_config_calls_only_the_configured_model_the_base():
    models = parse_models(hidden("pirate", "smol"), {}, "smol")
    assert kinds(models) == {"pirate": "unknown", "smol": "base"}
    assert health_status.base_of(models).id == "smol"  # listed second, still the base (the probe, the default)


def test_hidden_lineage_with_lora_parents_makes_the_declared_ones_adapters_of_their_base():
    models = parse_models(hidden("pirate", "smol", "poet"), {"pirate": "smol", "poet": "smol"}, "")
    assert kinds(models) == {"pirate": "adapter", "smol": "base", "poet": "adapter"}
    assert next(m for m in models if m.id == "pirate").parent == "smol"


def test_hidden_lineage_with_neither_claims_no_base_but_still_has_a_model_to_probe_and_default_to():
    models = parse_models(hidden("pirate", "smol"), {}, "other-name")
    assert kinds(models) == {"pirate": "unknown", "smol": "unknown"}
    assert health_status.base_of(models).id == "pirate"  # the first listed: only for the probe and the default
    items = model_options(health_status.HealthStatus(models=models, base_model="pirate"), [], "en")
    assert list(items) == ["pirate", "smol"] and not any("base model" in label for label in items)


def test_a_single_model_without_lineage_is_the_base():
    assert kinds(parse_models(hidden("only"), {}, "")) == {"only": "base"}


def test_vllms_own_parent_field_wins_over_the_config():
    models = parse_models(vllm(("smol", None), ("pirate", "smol"), ("other", None)), {"pirate": "elsewhere"}, "x")
    assert kinds(models) == {"smol": "base", "pirate": "adapter", "other": "base"}  # vLLM said so: no guessing
    assert next(m for m in models if m.id == "pirate").parent == "smol"


def test_the_pirate_seen_through_litellm_is_no_longer_a_base_model():
    """The issue's case: through a LiteLLM proxy, 'pirate' showed as 'pirate (base model)'."""
    models = parse_models(hidden("smollm2-135m-instruct", "pirate"), {}, "smollm2-135m-instruct")
    items = model_options(health_status.HealthStatus(models=models, base_model="smollm2-135m-instruct"), [], "en")
    assert items == {"smollm2-135m-instruct (base model)": "smollm2-135m-instruct", "pirate": "pirate"}
    zh = model_options(health_status.HealthStatus(models=models), [], "zh")
    assert list(zh) == ["smollm2-135m-instruct (基础模型)", "pirate"]
    assert ModelEntry("pirate", lineage_unknown=True).is_base is False


@pytest.mark.asyncio
async def test_the_poller_applies_lora_parents_to_a_server_without_lineage():
    async with FakeServer(model="fake-qwen", adapter="pirate") as fake:
        fake.lineage = False
        fast = HealthSettings(poll_starting=0.05, poll_ready=0.05, probe_every=0.1, request_timeout=1.0)
        poller = HealthPoller(fake.base_url, "", fast, parents={"pirate": "fake-qwen"})
        try:
            st = await poller.refresh(probe=True)
        finally:
            await poller.stop()
    assert st.answering and st.base_model == "fake-qwen"
    assert [m.id for m in st.adapters] == ["pirate"] and st.adapters[0].parent == "fake-qwen"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_lora_parents_is_a_toml_table_of_adapter_to_base(tmp_path):
    s = load_settings(write(tmp_path, '[lora]\nparents = {pirate = "smol", poet = "smol"}\n'), env={})
    assert dict(s.lora.parents) == {"pirate": "smol", "poet": "smol"}
    s = load_settings(write(tmp_path, ""), env={"QWENCHAT_LORA_PARENTS": "pirate=smol"})
    assert dict(s.lora.parents) == {"pirate": "smol"}


@pytest.mark.parametrize(
    ("toml", "key", "fix"),
    [
        ('parents = {pirate = ""}', "lora.parents.pirate", "the name of the base model"),
        ('parents = {pirate = "pirate"}', "lora.parents.pirate", "the name of the base model"),
        ('parents = {pirate = "poet", poet = "smol"}', "lora.parents.pirate", "'poet' is listed as an adapter itself"),
        ("parents = {pirate = 3}", "lora.parents", "expected"),
        ('parents = "pirate"', "lora.parents", "expected"),
    ],
)
def test_bad_lora_parents_name_the_key_and_the_fix(tmp_path, toml, key, fix):
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, f"[lora]\n{toml}\n"), env={})
    text = caught.value.user_text()
    assert key in text and fix in text

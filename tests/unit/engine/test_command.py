"""The vLLM / Chainlit command builders (pure): argv, environment, engine choice, chat-template fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.engine import command
from backend.engine.supervisor import start_process
from backend.errors import EngineUnavailable
from backend.settings import ROOT, LoraSettings, ServerSettings, Settings, load_settings


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_command_uses_module_entry_point_kv_cache_space_and_lora_flags():
    s = Settings(server=ServerSettings(port=8123, cpu_kvcache_gib=2))
    cmd = command.build_engine_command(
        s, engine="cpu", python="/env/bin/python", api_key="secret", adapters={"pirate": Path("/a/pirate")}
    )
    argv = list(cmd.argv)
    assert argv[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv_value(argv, "--port") == "8123" and argv_value(argv, "--host") == "127.0.0.1"
    assert "--api-key" not in argv and cmd.env["VLLM_API_KEY"] == "secret"  # not visible in `ps`
    assert "--enable-lora" in argv and argv_value(argv, "--lora-modules") == "pirate=/a/pirate"
    assert argv_value(argv, "--max-lora-rank") == "16"
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert cmd.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--gpu-memory-utilization" not in argv
    assert "secret" not in cmd.render()


def test_gpu_profile_command_for_qwen3_4b_has_the_full_context_and_no_cpu_env():
    s = load_settings(ROOT / "config.toml", profile="qwen3-4b-instruct-2507", env={})
    cmd = command.build_engine_command(s, engine="gpu", python="python", api_key="k", adapters={})
    argv = list(cmd.argv)
    assert argv_value(argv, "--max-model-len") == "262144"
    assert argv_value(argv, "--gpu-memory-utilization") == "0.92"
    assert argv_value(argv, "--served-model-name") == "qwen3-4b-instruct-2507"
    assert "VLLM_CPU_KVCACHE_SPACE" not in cmd.env
    assert "--lora-modules" not in argv


def test_runtime_loading_is_enabled_only_when_configured():
    s = Settings(lora=LoraSettings(runtime_loading=False))
    cmd = command.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={})
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in cmd.env


def test_lora_disabled_adds_no_lora_flags():
    s = Settings(lora=LoraSettings(enable=False))
    argv = command.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert not [a for a in argv if "lora" in a]


def test_extra_args_are_appended_verbatim():
    s = Settings(server=ServerSettings(extra_args=("--enforce-eager", "--seed", "7")))
    argv = command.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert list(argv[-3:]) == ["--enforce-eager", "--seed", "7"]


def test_ui_command_runs_chainlit_headless_on_the_ui_port():
    s = Settings(server=ServerSettings(ui_port=8765))
    cmd = command.build_ui_command(s, python="/app/bin/python")
    assert list(cmd.argv[:4]) == ["/app/bin/python", "-m", "chainlit", "run"]
    assert "--headless" in cmd.argv and argv_value(list(cmd.argv), "--port") == "8765"


@pytest.mark.parametrize(
    "requested, has_gpu, expected",
    [
        ("auto", True, "gpu"),
        ("auto", False, "cpu"),
        ("cpu", True, "cpu"),
        ("gpu", True, "gpu"),
    ],
)
def test_engine_resolution(requested, has_gpu, expected):
    assert command.resolve_engine(requested, has_gpu) == expected


def test_forcing_gpu_without_one_is_a_clear_error():
    with pytest.raises(EngineUnavailable, match="no NVIDIA GPU"):
        command.resolve_engine("gpu", False)


def test_model_without_a_chat_template_is_served_with_the_chatml_fallback(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert command.needs_chat_template(tmp_path)
    template = command.fallback_chat_template(tmp_path)
    assert "<|im_start|>" in template.read_text()
    argv = command.build_engine_command(
        Settings(), engine="cpu", python="p", api_key="k", adapters={}, chat_template=template
    ).argv
    assert argv_value(list(argv), "--chat-template") == str(template)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert not command.needs_chat_template(tmp_path)


def test_processes_do_not_inherit_variables_that_would_misroute_them(monkeypatch, tmp_path):
    engine = command.build_engine_command(Settings(), engine="cpu", python="p", api_key="k", adapters={})
    ui = command.build_ui_command(Settings(), python="p")
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY"} <= set(engine.unset)
    assert "CI" in ui.unset and "OPENAI_BASE_URL" not in ui.unset  # external mode needs it in the UI
    monkeypatch.setenv("CI", "true")
    cmd = command.Command(("/bin/sh", "-c", "echo CI=${CI:-unset}"), {}, unset=("CI",))
    proc = start_process(cmd, tmp_path / "out.log")
    proc.wait(10)
    assert "CI=unset" in (tmp_path / "out.log").read_text()

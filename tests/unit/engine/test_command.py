"""The vLLM / Chainlit command builders (pure) and the preflight checks."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from backend import server
from backend.errors import EngineUnavailable, ModelPathError, PortInUse
from backend.settings import ROOT, LoraSettings, ModelSettings, ServerSettings, Settings, load_settings


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_command_uses_module_entry_point_kv_cache_space_and_lora_flags():
    s = Settings(server=ServerSettings(port=8123, cpu_kvcache_gib=2))
    cmd = server.build_engine_command(s, engine="cpu", python="/env/bin/python", api_key="secret",
                                      adapters={"pirate": Path("/a/pirate")})
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
    cmd = server.build_engine_command(s, engine="gpu", python="python", api_key="k", adapters={})
    argv = list(cmd.argv)
    assert argv_value(argv, "--max-model-len") == "262144"
    assert argv_value(argv, "--gpu-memory-utilization") == "0.92"
    assert argv_value(argv, "--served-model-name") == "qwen3-4b-instruct-2507"
    assert "VLLM_CPU_KVCACHE_SPACE" not in cmd.env
    assert "--lora-modules" not in argv


def test_runtime_loading_is_enabled_only_when_configured():
    s = Settings(lora=LoraSettings(runtime_loading=False))
    cmd = server.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={})
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in cmd.env


def test_lora_disabled_adds_no_lora_flags():
    s = Settings(lora=LoraSettings(enable=False))
    argv = server.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert not [a for a in argv if "lora" in a]


def test_extra_args_are_appended_verbatim():
    s = Settings(server=ServerSettings(extra_args=("--enforce-eager", "--seed", "7")))
    argv = server.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert list(argv[-3:]) == ["--enforce-eager", "--seed", "7"]


def test_ui_command_runs_chainlit_headless_on_the_ui_port():
    s = Settings(server=ServerSettings(ui_port=8765))
    cmd = server.build_ui_command(s, python="/app/bin/python")
    assert list(cmd.argv[:4]) == ["/app/bin/python", "-m", "chainlit", "run"]
    assert "--headless" in cmd.argv and argv_value(list(cmd.argv), "--port") == "8765"


@pytest.mark.parametrize("requested, has_gpu, expected", [
    ("auto", True, "gpu"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("gpu", True, "gpu"),
])
def test_engine_resolution(requested, has_gpu, expected):
    assert server.resolve_engine(requested, has_gpu) == expected


def test_forcing_gpu_without_one_is_a_clear_error():
    with pytest.raises(EngineUnavailable, match="no NVIDIA GPU"):
        server.resolve_engine("gpu", False)


def test_missing_model_path_names_the_path(tmp_path):
    with pytest.raises(ModelPathError) as info:
        server.check_model_dir(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value) and "does not exist" in str(info.value)


def test_model_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelPathError, match="no config.json"):
        server.check_model_dir(tmp_path)


def test_adapter_folder_given_as_model_is_explained(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelPathError, match="un-merged LoRA adapter"):
        server.check_model_dir(tmp_path)


def test_port_in_use_names_port_and_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse) as info:
            server.check_port_free("127.0.0.1", port, "[server].port")
    assert str(port) in str(info.value) and "[server].port" in str(info.value)


QWEN3_4B_CONFIG = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "head_dim": 128, "hidden_size": 2560, "max_position_embeddings": 262144}


def test_kv_cache_estimate_for_qwen3_4b_full_context_is_about_36_gib():
    per_token = server.kv_cache_bytes_per_token(QWEN3_4B_CONFIG)
    assert per_token == 147456
    assert per_token * 262144 / 1024**3 == pytest.approx(36.0)


def test_limits_flag_max_model_len_above_the_model_and_kv_cache_too_small():
    s = Settings(model=ModelSettings(max_model_len=300000), server=ServerSettings(cpu_kvcache_gib=4))
    advice = server.check_limits(s, QWEN3_4B_CONFIG, engine="cpu", available_bytes=None)
    levels = {a.level for a in advice}
    assert "error" in levels and "warning" in levels
    assert any("262144" in a.text for a in advice if a.level == "error")


def test_status_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "engine-status.json"
    server.write_status(path, state="starting", attempt=0)
    server.write_status(path, state="running", attempt=0)
    assert json.loads(path.read_text())["state"] == "running"
    assert not list(tmp_path.glob("*.tmp"))


def test_model_without_a_chat_template_is_served_with_the_chatml_fallback(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert server.needs_chat_template(tmp_path)
    template = server.fallback_chat_template(tmp_path)
    assert "<|im_start|>" in template.read_text()
    argv = server.build_engine_command(Settings(), engine="cpu", python="p", api_key="k", adapters={},
                                       chat_template=template).argv
    assert argv_value(list(argv), "--chat-template") == str(template)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert not server.needs_chat_template(tmp_path)


def test_processes_do_not_inherit_variables_that_would_misroute_them(monkeypatch, tmp_path):
    engine = server.build_engine_command(Settings(), engine="cpu", python="p", api_key="k", adapters={})
    ui = server.build_ui_command(Settings(), python="p")
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY"} <= set(engine.unset)
    assert "CI" in ui.unset and "OPENAI_BASE_URL" not in ui.unset  # external mode needs it in the UI
    monkeypatch.setenv("CI", "true")
    cmd = server.Command(("/bin/sh", "-c", "echo CI=${CI:-unset}"), {}, unset=("CI",))
    proc = server.start_process(cmd, tmp_path / "out.log")
    proc.wait(10)
    assert "CI=unset" in (tmp_path / "out.log").read_text()

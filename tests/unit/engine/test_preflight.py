"""The preflight checks before vLLM is launched: the model folder, free ports, the KV-cache estimate and limits."""

from __future__ import annotations

import socket

import pytest

from backend.engine import preflight
from backend.errors import ModelPathError, PortInUse
from backend.settings import ModelSettings, ServerSettings, Settings


def test_missing_model_path_names_the_path(tmp_path):
    with pytest.raises(ModelPathError) as info:
        preflight.check_model_dir(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value) and "does not exist" in str(info.value)


def test_model_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelPathError, match="no config.json"):
        preflight.check_model_dir(tmp_path)


def test_adapter_folder_given_as_model_is_explained(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelPathError, match="un-merged LoRA adapter"):
        preflight.check_model_dir(tmp_path)


def test_port_in_use_names_port_and_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse) as info:
            preflight.check_port_free("127.0.0.1", port, "[server].port")
    assert str(port) in str(info.value) and "[server].port" in str(info.value)


QWEN3_4B_CONFIG = {
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 2560,
    "max_position_embeddings": 262144,
}


def test_kv_cache_estimate_for_qwen3_4b_full_context_is_about_36_gib():
    per_token = preflight.kv_cache_bytes_per_token(QWEN3_4B_CONFIG)
    assert per_token == 147456
    assert per_token * 262144 / 1024**3 == pytest.approx(36.0)


def test_limits_flag_max_model_len_above_the_model_and_kv_cache_too_small():
    s = Settings(model=ModelSettings(max_model_len=300000), server=ServerSettings(cpu_kvcache_gib=4))
    advice = preflight.check_limits(s, QWEN3_4B_CONFIG, engine="cpu", available_bytes=None)
    levels = {a.level for a in advice}
    assert "error" in levels and "warning" in levels
    assert any("262144" in a.text for a in advice if a.level == "error")

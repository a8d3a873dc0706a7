"""The preflight checks before vLLM is launched: the model folder, free ports, the KV-cache estimate and limits."""

from __future__ import annotations

import socket

import pytest

from backend.errors import ModelPathError, PortInUse
from backend.launcher import preflight
from backend.settings import ModelSettings, Settings, VllmSettings


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


@pytest.mark.parametrize(
    ("make", "en", "zh"),
    [
        (lambda p: p / "missing", "does not exist", "不存在"),
        (lambda p: (p / "f").write_text("x") and p / "f", "is a file, not a model folder", "是一个文件"),
        (lambda p: p, "has no config.json", "缺少 config.json"),
        (lambda p: (p / "config.json").write_text("{}") and p, "has no weights", "没有权重文件"),
        (lambda p: (p / "adapter_config.json").write_text("{}") and p, "un-merged LoRA adapter", "未合并的 LoRA"),
    ],
    ids=["missing", "file", "no-config", "no-weights", "adapter"],
)
def test_a_bad_model_folder_is_said_in_the_reader_s_language(tmp_path, make, en, zh):
    """The problem is a catalog text too: no English inside the Chinese sentence (it used to be an English string)."""
    with pytest.raises(ModelPathError) as exc:
        preflight.check_model_dir(make(tmp_path))
    assert en in exc.value.user_text("en") and en in str(exc.value)
    chinese = exc.value.user_text("zh-CN")
    assert zh in chinese and en not in chinese, chinese


def test_port_in_use_names_port_and_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse) as info:
            preflight.check_port_free("127.0.0.1", port, "[network].engine_port")
    assert str(port) in str(info.value) and "[network].engine_port" in str(info.value)


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
    s = Settings(model=ModelSettings(max_model_len=300000), vllm=VllmSettings(cpu_kvcache_gib=4))
    advice = preflight.check_limits(s, QWEN3_4B_CONFIG, engine="cpu", available_bytes=None)
    levels = {a.level for a in advice}
    assert "error" in levels and "warning" in levels
    assert any("262144" in a.text for a in advice if a.level == "error")


# ---------------------------------------------------------------- memory per GPU (issue 13.3)

GIB = 1024**3


def qwen_gpu(tp=1, dp=1, util=0.92, seqs=4, path="/nowhere/Qwen3-4B-Instruct-2507"):
    return Settings(
        model=ModelSettings(path=path, max_model_len=262144, dtype="bfloat16"),
        vllm=VllmSettings(
            device="gpu", tensor_parallel_size=tp, data_parallel_size=dp, gpu_memory_utilization=util, max_num_seqs=seqs
        ),
    )


def test_built_in_qwen3_4b_shape_gives_about_8_gb_of_bf16_weights(tmp_path):
    s = qwen_gpu()
    config = preflight.known_config(s)
    assert config["num_hidden_layers"] == 36 and config["num_key_value_heads"] == 8 and config["head_dim"] == 128
    assert preflight.param_count(config) == pytest.approx(4.02e9, rel=0.01)  # the model card: 4.0B
    weights, source = preflight.weights_bytes(s, config, tmp_path / "absent")
    assert weights == pytest.approx(8.0e9, rel=0.01) and "config.json" in source
    assert preflight.known_config(Settings()) == {}  # the embedded model: no built-in shape needed


def test_tensor_parallel_halves_weights_and_kv_heads_per_gpu(tmp_path):
    config = preflight.known_config(qwen_gpu())
    one = preflight.gpu_memory_estimate(qwen_gpu(), config, tmp_path, gpu_bytes=None)
    two = preflight.gpu_memory_estimate(qwen_gpu(tp=2), config, tmp_path, gpu_bytes=None)
    assert len(one) == len(two) == 1
    assert "weights 7.5 GiB + KV cache 4 × 262144 tokens × 144 KiB = 144.0 GiB → 151.5 GiB per GPU" in one[0].text
    assert "weights 3.7 GiB + KV cache 4 × 262144 tokens × 72 KiB = 72.0 GiB → 75.7 GiB per GPU" in two[0].text
    assert "tensor_parallel_size 2 × data_parallel_size 1 = 2 GPU(s)" in two[0].text
    assert "82.3 GiB GPU" in two[0].text  # 75.7 / 0.92


def test_data_parallel_keeps_the_whole_model_on_each_gpu(tmp_path):
    config = preflight.known_config(qwen_gpu())
    dp2 = preflight.gpu_memory_estimate(qwen_gpu(dp=2), config, tmp_path, gpu_bytes=None)[0].text
    assert "1 × data_parallel_size 2 = 2 GPU(s)" in dp2 and "weights 7.5 GiB" in dp2 and "151.5 GiB per GPU" in dp2


def test_more_tensor_parallel_ranks_than_kv_heads_keep_one_head_each(tmp_path):
    config = preflight.known_config(qwen_gpu())
    tp16 = preflight.gpu_memory_estimate(qwen_gpu(tp=16), config, tmp_path, gpu_bytes=None)[0].text
    assert "× 18 KiB" in tp16  # 2 × 36 layers × 1 head (replicated, not 0.5) × 128 × 2 bytes


def test_safetensors_sizes_win_over_the_shape_when_the_folder_has_weights(tmp_path):
    with (tmp_path / "model-00001-of-00002.safetensors").open("wb") as f:
        f.truncate(6 * GIB)  # sparse: no disk used
    with (tmp_path / "model-00002-of-00002.safetensors").open("wb") as f:
        f.truncate(2 * GIB)
    s = qwen_gpu(tp=2, path=str(tmp_path))
    weights, source = preflight.weights_bytes(s, preflight.known_config(qwen_gpu()), tmp_path)
    assert weights == 8 * GIB and source == "the *.safetensors files"
    text = preflight.gpu_memory_estimate(s, preflight.known_config(qwen_gpu()), tmp_path, gpu_bytes=None)[0].text
    assert "weights 4.0 GiB +" in text and "from the *.safetensors files" in text


def test_the_machine_s_gpu_memory_says_how_many_full_sequences_fit(tmp_path):
    config = preflight.known_config(qwen_gpu())
    a100 = preflight.gpu_memory_estimate(qwen_gpu(tp=2), config, tmp_path, gpu_bytes=80 * GIB)
    assert a100[1].level == "info"
    assert "80.0 GiB × 0.92 = 73.6 GiB; after the weights 69.9 GiB of KV cache = 3.9 full-length" in a100[1].text
    l4 = preflight.gpu_memory_estimate(qwen_gpu(), config, tmp_path, gpu_bytes=24 * GIB)
    assert l4[1].level == "warning" and "14.6 GiB of KV cache = 0.4 full-length sequence(s)" in l4[1].text
    assert "raise tensor_parallel_size or lower [model].max_model_len" in l4[1].text


def test_no_estimate_without_a_model_shape(tmp_path):
    assert preflight.gpu_memory_estimate(qwen_gpu(), {}, tmp_path, gpu_bytes=None) == []

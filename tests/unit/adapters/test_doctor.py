"""The adapter doctor (``backend/adapters/doctor.py``) against a zoo of broken adapters, a PEFT folder given
as the model, and ``python -m backend doctor``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backend.adapters.doctor import diagnose_adapter, diagnose_model_dir, doctor_main, read_base_model
from backend.adapters.safetensors import read_safetensors_header
from tests.fakes import adapter_zoo as zoo

# ---------------------------------------------------------------- good adapters pass


@pytest.mark.parametrize("targets", [zoo.ATTN, zoo.MLP, zoo.ATTN + zoo.MLP], ids=["attention", "mlp", "all"])
def test_good_adapters_pass_with_no_findings(tmp_path: Path, base: Path, targets: tuple[str, ...]) -> None:
    adapter = zoo.make_adapter(tmp_path / "good", targets=targets, base_name=str(base))
    d = diagnose_adapter(adapter, base, max_rank=16)
    assert d.findings == (), d.format_text()
    assert d.ok and d.rank == 8


def test_all_linear_as_peft_saves_it_full_names_passes(tmp_path: Path, base: Path) -> None:
    # PEFT resolves "all-linear" into the full module names when it saves the config.
    names = [zoo.module_path(i, leaf) for i in range(zoo.LAYERS) for leaf in zoo.ATTN + zoo.MLP]
    adapter = zoo.make_adapter(tmp_path / "all", targets=zoo.ATTN + zoo.MLP, config_targets=names)
    assert diagnose_adapter(adapter, base).findings == ()


@pytest.mark.parametrize(
    "targets, ok",
    [
        ("all-linear", True),
        (r".*\.(q|k|v|o)_proj", True),
        (r".*\.c_attn", False),
    ],
)
def test_target_modules_as_a_string_is_a_regex_or_all_linear(
    tmp_path: Path, base: Path, targets: str, ok: bool
) -> None:
    adapter = zoo.make_adapter(tmp_path / "s", config_targets=targets)
    d = diagnose_adapter(adapter, base)
    assert ("unknown_target_module" not in d.codes) is ok, d.format_text()


def test_sharded_base_read_from_index_and_shard_headers(tmp_path: Path) -> None:
    base = zoo.make_base_model(tmp_path / "sharded", sharded=True)
    info = read_base_model(base)
    assert info.modules["model.layers.1.self_attn.k_proj"] == (32, 64)
    assert diagnose_adapter(zoo.make_adapter(tmp_path / "good"), base).findings == ()
    broken = zoo.zoo_wrong_shape(tmp_path)
    assert "shape_mismatch" in diagnose_adapter(broken, base).codes


def test_tied_base_still_has_an_lm_head_module(tmp_path: Path) -> None:
    base = zoo.make_base_model(tmp_path / "tied", tie=True)
    assert "lm_head.weight" not in read_safetensors_header(base / "model.safetensors")
    assert read_base_model(base).modules["lm_head"] == (zoo.VOCAB, zoo.HIDDEN)


def test_qwen2_base_with_biases_accepts_a_good_adapter(tmp_path: Path) -> None:
    base = zoo.make_base_model(tmp_path / "tiny-qwen2", arch="Qwen2ForCausalLM", model_type="qwen2")
    assert diagnose_adapter(zoo.make_adapter(tmp_path / "good"), base).findings == ()


# ---------------------------------------------------------------- the zoo: each gets its diagnosis

#: zoo case -> (code that must be an error, values the message must name)
ZOO_ERRORS = {
    "rank_32": ("rank_too_large", ["rank 32", "--max-lora-rank 16", "[lora].max_lora_rank", "r<=16"]),
    "target_config_only": ("unknown_target_module", ["'c_attn'"]),
    "target_with_tensors": ("unknown_tensor_module", ["c_attn", "model.layers.0.self_attn.c_attn"]),
    "tensor_missing_module": ("unknown_tensor_module", ["layers 2, 3, 4, 5", "only 2 layers"]),
    "renamed_lora_a": ("bad_key_name", ["lora_down.weight", "lora_A.weight"]),
    "adapter_name_in_keys": ("bad_key_name", ["'default'", "lora_A.default.weight"]),
    "missing_lora_b": ("missing_lora_b", ["v_proj", "layers 0, 1"]),
    "wrong_shape": ("shape_mismatch", ["k_proj", "[64, 8]", "[32, 8]"]),
    "missing_config": ("missing_config", ["adapter_config.json"]),
    "modules_to_save": ("modules_to_save", ["lm_head", "python -m backend merge"]),
    "dora": ("dora", ["use_dora", "DoRA"]),
    "fused_qkv": ("fused_packed_key", ["qkv_proj", "q_proj/k_proj/v_proj", "IndexError"]),
    "not_lora": ("not_lora", ["'IA3'"]),
    "nan_inf": ("non_finite", ["NaN or Inf", "lora_B.weight", "retrain or re-export"]),
}


@pytest.mark.parametrize("case", sorted(ZOO_ERRORS))
def test_each_broken_adapter_gets_its_own_error(tmp_path: Path, base: Path, case: str) -> None:
    code, values = ZOO_ERRORS[case]
    d = diagnose_adapter(zoo.ZOO[case](tmp_path), base, max_rank=16)
    assert not d.ok
    found = [f for f in d.errors if f.code == code]
    assert found, f"{case}: expected {code}, got {d.codes}\n{d.format_text()}"
    for value in values:
        assert value in found[0].message, f"{case}: {value!r} not in {found[0].message!r}"
    assert found[0].message.startswith(("adapter '", "model folder")), found[0].message


def test_zoo_table_covers_every_zoo_case() -> None:
    assert set(zoo.ZOO) == set(ZOO_ERRORS) | {"half_packed", "all_zero"}


def test_nan_and_inf_values_are_errors_naming_each_tensor(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_nan_inf(tmp_path), base)
    [finding] = [f for f in d.errors if f.code == "non_finite"]
    text = finding.message
    assert "layers.0.self_attn.k_proj.lora_B.weight holds 1 NaN or Inf" in text, text  # the first poisoned tensor
    assert "1 more" in text and "lora_A.weight" in text, text  # the other one, named in the same line
    assert "ready to serve" not in d.format_text()


def test_an_adapter_with_all_zero_lora_b_is_a_warning_and_still_serves(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_all_zero(tmp_path), base)
    assert d.ok and d.codes == ("all_zero",), d.format_text()
    assert "changes nothing" in d.warnings[0].message and "lora_B" in d.warnings[0].message


def test_normal_values_pass_with_no_value_finding(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.make_adapter(tmp_path / "trained", seed=3), base)
    assert d.findings == (), d.format_text()


def test_the_value_read_is_bounded_per_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.adapters import safetensors as st

    folder = zoo.zoo_nan_inf(tmp_path)
    monkeypatch.setattr(st, "MAX_VALUES_PER_TENSOR", 16)  # 4 float32 values of each tensor
    values = st.scan_values(folder / "adapter_model.safetensors")
    assert values and all(v.checked == 4 for v in values)


def test_renamed_lora_a_also_reports_the_orphaned_lora_b(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_renamed_lora_a(tmp_path), base)
    assert "missing_lora_a" in d.codes


def test_config_only_unknown_target_is_flagged_even_though_vllm_would_ignore_it(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_target_config_only(tmp_path), base)
    assert [f.code for f in d.errors] == ["unknown_target_module"]


def test_half_of_a_packed_group_is_a_warning_naming_the_missing_member(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_half_packed(tmp_path), base)
    assert d.ok and d.codes == ("partial_packed_group",)
    message = d.warnings[0].message
    assert "q_proj/k_proj" in message and "not v_proj" in message and "qkv_proj" in message
    assert "layers 0, 1" in message


def test_half_of_gate_up_is_a_warning_too(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.make_adapter(tmp_path / "gate", targets=("gate_proj", "down_proj")), base)
    assert d.codes == ("partial_packed_group",) and "not up_proj" in d.warnings[0].message


def test_repeated_problems_collapse_to_one_line(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(zoo.zoo_adapter_name_in_keys(tmp_path), base)
    assert d.codes == ("bad_key_name",)
    assert "16 tensors" in d.errors[0].message


def test_a_many_fault_adapter_lists_its_findings_errors_first_in_the_order_vllm_meets_them(
    tmp_path: Path, base: Path
) -> None:
    def break_it(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        d = zoo._rename("layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_down.weight")(d)
        d = {k: v for k, v in d.items() if "layers.0.self_attn.v_proj.lora_B" not in k}
        d[f"{zoo.PREFIX}model.layers.0.self_attn.o_proj.lora_magnitude_vector"] = np.zeros(zoo.HIDDEN, np.float32)
        d[f"{zoo.PREFIX}model.layers.1.self_attn.k_proj.lora_B.weight"] = np.zeros((zoo.HIDDEN, 8), np.float32)
        d[f"{zoo.PREFIX}model.layers.7.self_attn.q_proj.lora_A.weight"] = np.zeros((8, zoo.HIDDEN), np.float32)
        d[f"{zoo.PREFIX}model.layers.7.self_attn.q_proj.lora_B.weight"] = np.zeros((zoo.HIDDEN, 8), np.float32)
        d[f"{zoo.PREFIX}model.embed_tokens.lora_embedding_A"] = np.zeros((8, zoo.VOCAB), np.float32)
        d[f"{zoo.PREFIX}model.embed_tokens.lora_embedding_B"] = np.zeros((zoo.HIDDEN, 8), np.float32)
        return d

    config = {"use_dora": True, "modules_to_save": ["lm_head"], "rank_pattern": {"o_proj": 32}}
    folder = zoo.make_adapter(
        tmp_path / "many", targets=(*zoo.ATTN, "up_proj"), base_name="other/model", config=config, edit=break_it
    )
    d = diagnose_adapter(folder, base, 16)
    assert d.codes == (
        "rank_too_large",
        "modules_to_save",
        "dora",
        "bad_key_name",
        "dora",
        "missing_lora_b",
        "missing_lora_a",
        "unknown_tensor_module",
        "shape_mismatch",  # the adapter's own shapes (o_proj's rank_pattern)
        "shape_mismatch",  # the fit with the base (k_proj)
        "base_mismatch",
        "embedding_target",
        "partial_packed_group",
    )


def test_rank_from_rank_pattern_counts_against_max_rank(tmp_path: Path, base: Path) -> None:
    def bigger_q(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for k in list(d):
            if "q_proj.lora_A" in k:
                d[k] = np.zeros((32, zoo.HIDDEN), np.float32)
            elif "q_proj.lora_B" in k:
                d[k] = np.zeros((zoo.HIDDEN, 32), np.float32)
        return d

    adapter = zoo.make_adapter(tmp_path / "rp", config={"rank_pattern": {"q_proj": 32}}, edit=bigger_q)
    d = diagnose_adapter(adapter, base, max_rank=16)
    assert d.codes == ("rank_too_large",) and "rank_pattern" in d.errors[0].message
    assert diagnose_adapter(adapter, base, max_rank=32).findings == ()


def test_lora_rank_that_disagrees_with_the_config_is_a_shape_error(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "r4", config={"r": 4})  # tensors have rank 8
    d = diagnose_adapter(adapter, base)
    assert "shape_mismatch" in d.codes and "r = 4" in d.errors[0].message


@pytest.mark.parametrize("max_rank", [0, 10, 1024])
def test_max_rank_must_be_one_vllm_accepts(tmp_path: Path, base: Path, max_rank: int) -> None:
    d = diagnose_adapter(zoo.make_adapter(tmp_path / "good"), base, max_rank=max_rank)
    assert "bad_max_rank" in d.codes and str(max_rank) in d.errors[0].message


def test_base_mismatch_is_only_a_warning(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "other", base_name="Qwen/Qwen2.5-7B-Instruct")
    d = diagnose_adapter(adapter, base)
    assert d.ok and d.codes == ("base_mismatch",)
    assert "Qwen/Qwen2.5-7B-Instruct" in d.warnings[0].message and "tiny-llama" in d.warnings[0].message


def test_base_aliases_and_hub_id_with_same_name_match(tmp_path: Path, base: Path) -> None:
    same = zoo.make_adapter(tmp_path / "same", base_name="someorg/Tiny-Llama")
    assert diagnose_adapter(same, base).findings == ()  # last path part, case-insensitive
    other = zoo.make_adapter(tmp_path / "alias", base_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    d = diagnose_adapter(other, base, base_aliases=["HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert d.findings == ()


@pytest.mark.parametrize("arch, severity", [("LlamaForCausalLM", "warning"), ("Qwen2ForCausalLM", "error")])
def test_embedding_targets_depend_on_the_architecture(tmp_path: Path, arch: str, severity: str) -> None:
    base = zoo.make_base_model(tmp_path / "b", arch=arch, model_type="qwen2" if "Qwen2" in arch else "llama")
    p = zoo.PREFIX
    tensors = zoo.lora_tensors(8, ("q_proj", "k_proj", "v_proj"))
    tensors.update(
        {
            f"{p}model.embed_tokens.lora_embedding_A": np.zeros((8, zoo.VOCAB), np.float32),
            f"{p}model.embed_tokens.lora_embedding_B": np.zeros((zoo.HIDDEN, 8), np.float32),
            f"{p}model.embed_tokens.base_layer.weight": np.zeros((zoo.VOCAB, zoo.HIDDEN), np.float32),
        }
    )
    adapter = zoo.make_adapter(
        tmp_path / "emb", config_targets=["q_proj", "k_proj", "v_proj", "embed_tokens"], tensors=tensors
    )
    d = diagnose_adapter(adapter, base)
    found = [f for f in d.findings if f.code == "embedding_target"]
    assert [f.severity for f in found] == [severity], d.format_text()
    assert "shape_mismatch" not in d.codes  # [r, vocab] / [hidden, r] is the right embedding layout


def test_unsupported_peft_features_are_errors(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "pissa", config={"init_lora_weights": "pissa", "bias": "all"})
    d = diagnose_adapter(adapter, base)
    assert d.codes == ("unsupported_feature",)
    assert "'pissa'" in d.errors[0].message and "'all'" in d.errors[0].message


@pytest.mark.parametrize(
    "content, code",
    [
        ("{not json", "bad_config"),
        ('{"peft_type": "LORA", "r": 8}', "bad_config"),
        ('{"peft_type": "LORA", "r": -1, "lora_alpha": 8, "target_modules": ["q_proj"]}', "bad_config"),
        ("[1, 2]", "bad_config"),
    ],
)
def test_invalid_adapter_config_is_reported_not_raised(tmp_path: Path, base: Path, content: str, code: str) -> None:
    adapter = zoo.make_adapter(tmp_path / "bad")
    (adapter / "adapter_config.json").write_text(content)
    d = diagnose_adapter(adapter, base)
    assert code in [f.code for f in d.errors]


def test_missing_weights_and_truncated_weights(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "a")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])
    assert "bad_weights" in diagnose_adapter(adapter, base).codes
    weights.unlink()
    assert "no_weights" in diagnose_adapter(adapter, base).codes
    (adapter / "adapter_model.bin").write_bytes(b"pickle")
    d = diagnose_adapter(adapter, base)
    assert d.ok and "weights_not_inspected" in d.codes


def test_without_a_base_only_the_adapter_itself_is_checked(tmp_path: Path) -> None:
    d = diagnose_adapter(zoo.zoo_rank_32(tmp_path), None, max_rank=16)
    assert set(d.codes) == {"rank_too_large", "no_base"}
    assert diagnose_adapter(zoo.make_adapter(tmp_path / "g"), None).codes == ("no_base",)


def test_unreadable_base_is_an_error(tmp_path: Path) -> None:
    d = diagnose_adapter(zoo.make_adapter(tmp_path / "g"), tmp_path / "nowhere")
    assert d.codes == ("base_unreadable",) and "nowhere" in d.errors[0].message


def test_missing_adapter_folder(tmp_path: Path, base: Path) -> None:
    d = diagnose_adapter(tmp_path / "ghost", base)
    assert d.codes == ("missing_folder",)


# ---------------------------------------------------------------- a PEFT folder given as the model


def test_peft_folder_given_as_the_model_is_an_unmerged_adapter(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "pirate", base_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    d = diagnose_model_dir(adapter)
    assert d.codes == ("adapter_as_model",)
    message = d.errors[0].message
    assert "un-merged LoRA adapter, not a model" in message and "--lora-modules" in message
    assert "python -m backend merge --base HuggingFaceTB/SmolLM2-135M-Instruct" in message


def test_lora_weights_without_adapter_config_as_model_are_caught_too(tmp_path: Path) -> None:
    adapter = zoo.zoo_missing_config(tmp_path)
    (adapter / "config.json").write_text("{}")
    assert diagnose_model_dir(adapter).codes == ("adapter_as_model",)


def test_merged_model_with_a_leftover_adapter_config_is_only_a_warning(base: Path) -> None:
    (base / "adapter_config.json").write_text(json.dumps(zoo.peft_config()))
    d = diagnose_model_dir(base)
    assert d.ok and d.codes == ("stray_adapter_config",)


def test_a_real_model_folder_passes_the_model_check(base: Path, tmp_path: Path) -> None:
    assert diagnose_model_dir(base).findings == ()
    assert diagnose_model_dir(tmp_path / "none").codes == ("missing_model",)


# ---------------------------------------------------------------- python -m backend doctor


def test_doctor_exit_codes(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = zoo.make_adapter(tmp_path / "good")
    assert doctor_main([str(good), "--base", str(base), "--max-rank", "16"]) == 0
    out = capsys.readouterr().out
    assert "good: 0 errors, 0 warnings" in out
    broken = zoo.zoo_rank_32(tmp_path)
    assert doctor_main([str(broken), "--base", str(base), "--max-rank", "16"]) == 1
    out = capsys.readouterr().out
    assert "error   rank_too_large: adapter 'rank-32' has rank 32" in out
    half = zoo.zoo_half_packed(tmp_path)
    assert doctor_main([str(half), "--base", str(base), "--max-rank", "16"]) == 0  # warnings only
    assert "warning partial_packed_group" in capsys.readouterr().out


def test_doctor_json_shape(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = zoo.zoo_wrong_shape(tmp_path)
    assert doctor_main([str(broken), "--base", str(base), "--max-rank", "16", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["errors"] == 1 and data["rank"] == 8 and data["kind"] == "adapter"
    assert data["findings"][0]["code"] == "shape_mismatch"
    assert set(data["findings"][0]) == {"severity", "code", "message"}
    assert data["base"] == str(base)


def test_doctor_as_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    adapter = zoo.make_adapter(tmp_path / "pirate")
    assert doctor_main([str(adapter), "--as-model"]) == 1
    assert "un-merged LoRA adapter" in capsys.readouterr().out


def test_doctor_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        doctor_main(["--max-rank", "x"])
    assert exc.value.code == 2


# ---------------------------------------------------------------- findings are catalog texts


def test_a_finding_carries_a_catalog_key_and_is_made_in_the_readers_language(tmp_path: Path, base: Path) -> None:
    """The command line prints English; the UI shows the viewer's language (AdapterRejected's text)."""
    from backend.errors import AdapterRejected
    from backend.text import catalog

    d = diagnose_adapter(zoo.zoo_missing_lora_b(tmp_path / "missing-lora-b"), base)
    [finding] = d.errors
    assert finding.text.key.startswith("doctor.") and finding.text.key in catalog()["zh-CN"]
    assert finding.message == str(finding.text) and finding.message.startswith("adapter 'missing-lora-b': 2 modules")
    zh = finding.text.in_("zh-CN")
    assert zh.startswith("适配器 'missing-lora-b'：2 个模块") and "lora_B" in zh and "modules" not in zh
    rejected = AdapterRejected("missing-lora-b", d.errors_text())
    assert "适配器 'missing-lora-b'：2 个模块" in rejected.user_text("zh-CN")
    assert d.error_text() in rejected.user_text("en")


@pytest.mark.parametrize("case", sorted(n for n in vars(zoo) if n.startswith("zoo_")))
def test_every_zoo_finding_reads_in_chinese(tmp_path: Path, base: Path, case: str) -> None:
    import re

    adapter = getattr(zoo, case)(tmp_path / case)
    for d in (diagnose_adapter(adapter, base, 8), diagnose_adapter(adapter, None, 7), diagnose_model_dir(adapter)):
        for f in d.findings:
            zh = re.sub(r"`[^`]*`", "", f.text.in_("zh-CN"))
            assert re.search("[\u4e00-\u9fff]", zh) and not re.search(r"\b[a-z]{3,} [a-z]{3,} [a-z]{3,}\b", zh), zh

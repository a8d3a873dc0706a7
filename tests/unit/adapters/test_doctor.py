"""The adapter doctor against a zoo of broken adapters, the adapters-folder allow-list, and runtime
load/unload against a local fake of vLLM's documented /v1/(un)load_lora_adapter behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import AsyncIterator

import numpy as np
import pytest
from aiohttp import web

from backend.adapters import (
    AdapterInfo,
    diagnose_adapter,
    diagnose_model_dir,
    discover_adapters,
    doctor_main,
    load_adapter,
    load_adapter_from_folder,
    prepare_runtime_load,
    read_base_model,
    read_rank,
    read_safetensors_header,
    resolve_adapter,
    unload_adapter,
)
from backend.errors import (
    AdapterLimitReached,
    AdapterPathRefused,
    AdapterRejected,
    AdapterRuntimeDisabled,
    BackendError,
    ModelNotFound,
    ServerUnreachable,
)
from tests import adapter_zoo as zoo


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return zoo.make_base_model(tmp_path / "tiny-llama")


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


@pytest.mark.parametrize("targets, ok", [
    ("all-linear", True),
    (r".*\.(q|k|v|o)_proj", True),
    (r".*\.c_attn", False),
])
def test_target_modules_as_a_string_is_a_regex_or_all_linear(tmp_path: Path, base: Path, targets: str, ok: bool) -> None:
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
    assert set(zoo.ZOO) == set(ZOO_ERRORS) | {"half_packed"}


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
    tensors.update({
        f"{p}model.embed_tokens.lora_embedding_A": np.zeros((8, zoo.VOCAB), np.float32),
        f"{p}model.embed_tokens.lora_embedding_B": np.zeros((zoo.HIDDEN, 8), np.float32),
        f"{p}model.embed_tokens.base_layer.weight": np.zeros((zoo.VOCAB, zoo.HIDDEN), np.float32),
    })
    adapter = zoo.make_adapter(tmp_path / "emb", config_targets=["q_proj", "k_proj", "v_proj", "embed_tokens"],
                               tensors=tensors)
    d = diagnose_adapter(adapter, base)
    found = [f for f in d.findings if f.code == "embedding_target"]
    assert [f.severity for f in found] == [severity], d.format_text()
    assert "shape_mismatch" not in d.codes  # [r, vocab] / [hidden, r] is the right embedding layout


def test_unsupported_peft_features_are_errors(tmp_path: Path, base: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "pissa", config={"init_lora_weights": "pissa", "bias": "all"})
    d = diagnose_adapter(adapter, base)
    assert d.codes == ("unsupported_feature",)
    assert "'pissa'" in d.errors[0].message and "'all'" in d.errors[0].message


@pytest.mark.parametrize("content, code", [
    ("{not json", "bad_config"),
    ('{"peft_type": "LORA", "r": 8}', "bad_config"),
    ('{"peft_type": "LORA", "r": -1, "lora_alpha": 8, "target_modules": ["q_proj"]}', "bad_config"),
    ("[1, 2]", "bad_config"),
])
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


def test_safetensors_header_is_parsed_without_loading_weights(tmp_path: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "a")
    shapes = read_safetensors_header(adapter / "adapter_model.safetensors")
    assert shapes["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"] == (32, 8)
    bogus = tmp_path / "x.safetensors"
    bogus.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_safetensors_header(bogus)


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


# ---------------------------------------------------------------- the adapters folder (allow-list)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "adapters"
    zoo.make_adapter(root / "pirate", r=8, base_name="tiny-llama")
    zoo.make_adapter(root / "poet", r=16)
    return root


@pytest.mark.parametrize("name", ["", ".", "..", "../pirate", "pirate/..", "a/b", "a\\b", "/etc", "/tmp",
                                  "pi\x00rate", ".hidden", "C:evil", " pirate"])
def test_names_that_escape_the_folder_are_refused(folder: Path, name: str) -> None:
    with pytest.raises(AdapterPathRefused) as exc:
        resolve_adapter(folder, name)
    assert str(folder) in exc.value.user_text()


def test_absolute_path_to_a_real_adapter_is_refused(folder: Path) -> None:
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, str(folder / "pirate"))


def test_symlink_out_of_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    outside = zoo.make_adapter(tmp_path / "outside")
    os.symlink(outside, folder / "sneaky")
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, "sneaky")
    assert "sneaky" not in [a.name for a in discover_adapters(folder)]


def test_symlink_to_the_folder_itself_is_refused(folder: Path) -> None:
    os.symlink(folder, folder / "self")
    with pytest.raises(AdapterPathRefused):
        resolve_adapter(folder, "self")


def test_symlink_inside_the_folder_is_allowed(folder: Path) -> None:
    os.symlink(folder / "pirate", folder / "arr")
    assert resolve_adapter(folder, "arr") == (folder / "pirate").resolve()


def test_broken_symlink_is_not_an_adapter(folder: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "gone", folder / "dangling")
    assert [a.name for a in discover_adapters(folder)] == ["pirate", "poet"]
    with pytest.raises(AdapterRejected):
        resolve_adapter(folder, "dangling")


def test_missing_adapters_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(AdapterRejected) as exc:
        resolve_adapter(tmp_path / "nope", "pirate")
    assert "does not exist" in exc.value.user_text()


def test_a_plain_name_resolves_inside(folder: Path) -> None:
    assert resolve_adapter(folder, "pirate") == (folder / "pirate").resolve()


def test_unknown_name_lists_what_is_there(folder: Path) -> None:
    with pytest.raises(AdapterRejected) as exc:
        resolve_adapter(folder, "ghost")
    assert "pirate, poet" in exc.value.user_text()


def test_discover_lists_adapters_with_rank_and_reports_unreadable_ones(folder: Path) -> None:
    (folder / "notes").mkdir()  # no adapter_config.json: not an adapter
    broken = folder / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{oops")
    infos = discover_adapters(folder)
    assert [i.name for i in infos] == ["broken", "pirate", "poet"]
    assert infos[1] == AdapterInfo("pirate", (folder / "pirate").resolve(), 8, "tiny-llama")
    assert infos[1].label == "pirate (r=8)"
    assert infos[0].rank is None and "adapter_config.json" in infos[0].problem
    assert read_rank(folder / "poet") == 16 and read_rank(broken) is None


def test_discover_on_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert discover_adapters(tmp_path / "nope") == []


def test_prepare_runtime_load_runs_the_doctor(folder: Path, base: Path) -> None:
    assert prepare_runtime_load(folder, "pirate", base, 16).ok
    with pytest.raises(AdapterRejected) as exc:
        prepare_runtime_load(folder, "poet", base, 8)
    assert "rank 16, above --max-lora-rank 8" in exc.value.user_text()
    with pytest.raises(AdapterPathRefused):
        prepare_runtime_load(folder, "../poet", base, 16)


# ---------------------------------------------------------------- runtime load/unload against a fake vLLM


class FakeVLLM:
    """vLLM 0.32's documented answers (DESIGN §3, vllm/entrypoints/serve/lora/api_router.py)."""

    def __init__(self, runtime: bool = True, api_key: str = "k") -> None:
        self.runtime = runtime
        self.api_key = api_key
        self.loaded: dict[str, str] = {}
        self.calls: list[tuple[str, dict]] = []

    @staticmethod
    def _error(status: int, message: str, err_type: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": err_type, "param": None, "code": status}},
                                 status=status)

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if not self.runtime or request.path not in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return web.json_response({"detail": "Not Found"}, status=404)  # FastAPI: route not attached
        body = await request.json()
        self.calls.append((request.path, body))
        name = body.get("lora_name")
        if request.path.endswith("/unload_lora_adapter"):
            if name not in self.loaded:
                return self._error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del self.loaded[name]
            return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
        path = body.get("lora_path")
        if name in self.loaded:
            return self._error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                               "adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not Path(path).is_dir():
            return self._error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        if (Path(path) / "CRASH").exists():
            return self._error(500, "LoRA rank 32 is greater than max_lora_rank 16.", "InternalServerError")
        self.loaded[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


@contextlib.asynccontextmanager
async def serve(fake: FakeVLLM) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_load_then_unload(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            text = await load_adapter(url, "k", "pirate", folder / "pirate")
            assert text == "Success: LoRA adapter 'pirate' added successfully."
            assert fake.loaded == {"pirate": str(folder / "pirate")}
            assert await unload_adapter(url, "k", "pirate") == "Success: LoRA adapter 'pirate' removed successfully."
            assert fake.loaded == {}
    run(go())


def test_loading_the_same_name_twice_is_a_no_op(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            await load_adapter(url, "k", "pirate", folder / "pirate")
            text = await load_adapter(url, "k", "pirate", folder / "pirate")
            assert "already been loaded" in text and len(fake.calls) == 2
    run(go())


def test_an_openai_client_can_be_passed_instead_of_a_url(folder: Path) -> None:
    from openai import AsyncOpenAI

    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            client = AsyncOpenAI(base_url=url, api_key="k")
            await load_adapter(client, None, "pirate", folder / "pirate")
            assert "pirate" in fake.loaded
            await client.close()
    run(go())


def test_runtime_loading_disabled_says_which_setting(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM(runtime=False)) as url:
            with pytest.raises(AdapterRuntimeDisabled) as exc:
                await load_adapter(url, "k", "pirate", folder / "pirate")
            assert "[lora].runtime_loading = true" in exc.value.user_text()
            with pytest.raises(AdapterRuntimeDisabled):
                await unload_adapter(url, "k", "pirate")
    run(go())


def test_engine_refusal_is_adapter_rejected_with_its_message(folder: Path) -> None:
    (folder / "poet" / "CRASH").write_text("")

    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(AdapterRejected) as exc:
                await load_adapter(url, "k", "poet", folder / "poet")
            assert "max_lora_rank 16" in exc.value.user_text() and "500" in exc.value.user_text()
    run(go())


def test_engine_cannot_see_the_path(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(AdapterRejected) as exc:
                await load_adapter(url, "k", "ghost", tmp_path / "ghost")
            assert "cannot find" in exc.value.user_text() and "mounted" in exc.value.user_text()
    run(go())


def test_unload_unknown_is_model_not_found() -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(ModelNotFound) as exc:
                await unload_adapter(url, "k", "ghost")
            assert "'ghost'" in exc.value.user_text()
    run(go())


def test_wrong_api_key_names_the_setting(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM(api_key="right")) as url:
            with pytest.raises(BackendError) as exc:
                await load_adapter(url, "wrong", "pirate", folder / "pirate")
            assert "401" in exc.value.user_text() and "OPENAI_API_KEY" in exc.value.user_text()
    run(go())


def test_server_down_is_unreachable(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            pass  # closed again: nothing listens on that port now
        with pytest.raises(ServerUnreachable):
            await load_adapter(url, "k", "pirate", folder / "pirate", timeout=5)
    run(go())


def test_limit_is_enforced_before_calling_the_engine(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            with pytest.raises(AdapterLimitReached) as exc:
                await load_adapter(url, "k", "pirate", folder / "pirate", loaded=["a", "b"], limit=2)
            assert "[lora].max_cpu_loras" in exc.value.user_text() and "limit is 2" in exc.value.user_text()
            assert fake.calls == []
            await load_adapter(url, "k", "pirate", folder / "pirate", loaded=["a"], limit=2)
            assert "pirate" in fake.loaded
    run(go())


def test_load_from_folder_refuses_escapes_and_broken_adapters_before_the_engine(folder: Path, base: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            with pytest.raises(AdapterPathRefused):
                await load_adapter_from_folder(url, "k", folder, "../x", base, 16)
            with pytest.raises(AdapterRejected):
                await load_adapter_from_folder(url, "k", folder, "poet", base, 8)  # rank 16 > 8
            assert fake.calls == []
            d = await load_adapter_from_folder(url, "k", folder, "pirate", base, 16)
            assert d.ok and fake.loaded == {"pirate": str((folder / "pirate").resolve())}
    run(go())

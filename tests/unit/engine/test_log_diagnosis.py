"""Classifying why vLLM stopped, on recorded logs (tests/logs/README.md says where each comes from)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.launcher.log_diagnosis import ATTEMPT_MARKER, Cause, classify_failure, tail_relevant
from backend.text import Text

LOGS = Path(__file__).resolve().parents[2] / "logs"  # tests/logs


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text(encoding="utf-8")


# (log file, kind, adapter, words the English reason must contain, words the evidence must contain)
CASES = [
    ("cpu_unrecognized_flag", "unsupported_flag", None, ["--foo-bar", "[vllm].extra_args"], "unrecognized arguments"),
    (
        "cpu_invalid_lora_rank_choice",
        "unsupported_flag",
        None,
        ["--max-lora-rank 12", "1, 8, 16", "[lora].max_lora_rank"],
        "invalid choice",
    ),
    (
        "cpu_max_model_len_above_config",
        "unsupported_flag",
        None,
        ["99999", "4096", "[model].max_model_len"],
        "User-specified",
    ),
    (
        "cpu_kvcache_space_not_integer",
        "unsupported_flag",
        None,
        ["VLLM_CPU_KVCACHE_SPACE", "'1.5'", "cpu_kvcache_gib"],
        "invalid literal",
    ),
    ("cpu_port_in_use", "port_in_use", None, ["port 18778", "[network].engine_port"], "Address already in use"),
    ("reconstructed_uvicorn_port_in_use", "port_in_use", None, ["port 8000"], "address already in use"),
    ("cpu_model_path_missing", "model_missing", None, ["/nonexistent/model", "[model].path"], "Repo id must be"),
    (
        "cpu_model_folder_without_config",
        "model_missing",
        None,
        ["/tmp/h5logs/emptymodel", "config.json"],
        "Invalid repository ID",
    ),
    (
        "reconstructed_old_transformers_no_config",
        "model_missing",
        None,
        ["/srv/models/qwen-finetune", "config.json"],
        "does not appear to have",
    ),
    (
        "reconstructed_hub_unreachable",
        "model_missing",
        None,
        ["https://huggingface.co", "[model].path"],
        "couldn't connect",
    ),
    ("cpu_lora_path_missing", "lora_load_failed", "ghost", ["'ghost'", "/tmp/h5logs/nope"], "No adapter found"),
    (
        "cpu_lora_rank_too_big",
        "lora_load_failed",
        "big",
        ["'big'", "rank 32", "--max-lora-rank 16", "r<=16"],
        "greater than max_lora_rank",
    ),
    ("cpu_lora_unexpected_modules", "lora_load_failed", "bk", ["'bk'", "foo_proj"], "expected target modules"),
    ("reconstructed_lora_keyerror_while_loading", "lora_load_failed", "legal", ["'legal'", "KeyError"], "KeyError"),
    (
        "reconstructed_lora_indexerror_at_start",
        "lora_load_failed",
        "tiny-r4",
        ["'tiny-r4'", "IndexError"],
        "IndexError",
    ),
    (
        "cpu_kvcache_space_above_free_ram",
        "oom_cpu_kvcache",
        None,
        ["200.0 GiB", "7.85 of 11.09 GiB", "cpu_kvcache_gib"],
        "Available memory on node 0",
    ),
    (
        "cpu_kvcache_too_small_for_max_len",
        "oom_cpu_kvcache",
        None,
        ["max_model_len 4096", "cpu_kvcache_gib"],
        "To serve at least one request",
    ),
    (
        "reconstructed_gpu_kv_cache_too_small",
        "oom_gpu",
        None,
        ["262144", "36.00 GiB", "9.23 GiB", "67184", "gpu_memory_utilization"],
        "To serve at least one request",
    ),
    ("reconstructed_gpu_no_cache_blocks", "oom_gpu", None, ["gpu_memory_utilization"], "No available memory"),
    (
        "reconstructed_gpu_cuda_oom_at_load",
        "oom_gpu",
        None,
        ["350.00 MiB", "212.81 MiB of 23.68 GiB"],
        "CUDA out of memory",
    ),
    ("reconstructed_gpu_cuda_oom_while_serving", "oom_gpu", None, ["50.00 MiB", "max_num_seqs"], "CUDA out of memory"),
    ("cpu_head_dim_unsupported", "unknown", None, ["head_dim 16", "vLLM-CPU"], "Unsupported CPU attention"),
    ("cpu_engine_core_killed", "unknown", None, ["died unexpectedly", "memory"], "exited unexpectedly"),
    ("reconstructed_torchvision_nms", "unknown", None, ["torchvision", "uninstall"], "torchvision::nms"),
]


@pytest.mark.parametrize("name, kind, adapter, words, evidence", CASES, ids=[c[0] for c in CASES])
def test_each_recorded_failure_gets_its_cause_reason_and_evidence(name, kind, adapter, words, evidence):
    cause = classify_failure(log(name))
    assert cause is not None
    assert cause.kind == kind
    assert cause.adapter == adapter
    for word in words:
        assert word in cause.text("en"), (word, cause.text("en"))
    zh = cause.text("zh-CN")
    assert zh and zh != cause.text("en") and not re.search(r"\((?:exit code|its folder)", zh)  # no English inside
    assert any(evidence in line for line in cause.evidence), cause.evidence


def test_every_recorded_log_is_covered_by_a_case():
    covered = {c[0] for c in CASES}
    assert {p.stem for p in LOGS.glob("*.log")} == covered


def test_a_healthy_start_up_is_not_a_failure_even_with_its_errno_warning():
    # The real start-up log up to "ready" carries vLLM's ulimit WARNING quoting "OSError: [Errno 24] Too many
    # open files"; that must not read as a failure.
    text = log("cpu_engine_core_killed")
    healthy = text[: text.index("Application startup complete")]
    assert "OSError: [Errno 24]" in healthy
    assert classify_failure(healthy) is None
    assert tail_relevant(healthy) == []


def test_an_empty_log_has_no_cause():
    assert classify_failure("") is None


def test_an_unrecognised_error_is_unknown_with_the_root_exception_not_the_wrapper():
    text = "\n".join(
        [
            "(APIServer pid=7) INFO 11-29 19:50:05 [api_utils.py:286] non-default args: {'model': '/m'}",
            "(EngineCore pid=8) ERROR 11-29 19:50:31 [core.py:1512] EngineCore encountered a fatal error.",
            "(EngineCore pid=8) ERROR 11-29 19:50:31 [core.py:1512] Traceback (most recent call last):",
            '(EngineCore pid=8) ERROR 11-29 19:50:31 [core.py:1512]   File "/x/vllm/v1/worker/foo.py", line 3, in run',
            "(EngineCore pid=8) ERROR 11-29 19:50:31 [core.py:1512] ZeroDivisionError: division by zero",
            "(APIServer pid=7) ERROR 11-29 19:50:31 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ]
    )
    cause = classify_failure(text)
    assert cause is not None and cause.kind == "unknown"
    assert "ZeroDivisionError: division by zero" in cause.text("en")
    assert "ZeroDivisionError" in cause.evidence[0]


def test_only_the_last_launch_counts_when_logs_are_appended():
    oom = log("reconstructed_gpu_cuda_oom_at_load")
    port = log("cpu_port_in_use")
    assert classify_failure(f"{port}\n{ATTEMPT_MARKER} 2\n{oom}").kind == "oom_gpu"
    assert classify_failure(f"{oom}\n{ATTEMPT_MARKER} 2\n{port}").kind == "port_in_use"
    # without the marker, vLLM's own "non-default args" line starts a launch
    assert (
        classify_failure(f"{log('cpu_lora_rank_too_big')}\n{log('cpu_kvcache_space_above_free_ram')}").kind
        == "oom_cpu_kvcache"
    )


def test_an_oom_while_loading_an_adapter_is_an_oom():
    text = "\n".join(
        [
            "(APIServer pid=1) INFO 05-05 12:30:02 [utils.py:233] non-default args: {'lora_modules': "
            "[LoRAModulePath(name='big', path='/a/big', base_model_name=None)], 'model': '/m'}",
            "(EngineCore pid=2) ERROR 05-05 12:30:40 [core.py:845] Invocation of add_lora method failed",
            "(EngineCore pid=2) ERROR 05-05 12:30:40 [core.py:845] torch.OutOfMemoryError: CUDA out of memory. "
            "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.56 GiB of which 1.10 GiB is free.",
            "ValueError: Call to add_lora method failed: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ]
    )
    assert classify_failure(text).kind == "oom_gpu"


@pytest.mark.parametrize(
    "line, fragment",
    [
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
            "you tried to allocate 4294967296 bytes.",
            "4.00 GiB",
        ),
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:75] . DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)",
            "1.00 GiB",
        ),
    ],
)
def test_running_out_of_ram_on_cpu_names_the_size(line, fragment):
    cause = classify_failure(line)
    assert cause.kind == "oom_cpu_kvcache"
    assert fragment in cause.text("en")


def test_vllm_cpu_startup_reservation_of_92_percent_is_explained():
    line = (
        "(Worker pid=9) ERROR 11-29 19:49:54 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
        "(7.85/11.09 GiB) on startup is less than desired CPU memory utilization (0.92, 10.2 GiB). On the CPU "
        "backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved"
    )
    cause = classify_failure(line)
    assert cause.kind == "oom_cpu_kvcache"
    assert "0.92" in cause.text("en") and "VLLM_CPU_KVCACHE_SPACE" in cause.text("en")


def test_a_failed_adapter_is_named_from_its_path_among_several():
    text = "\n".join(
        [
            "(APIServer pid=1) INFO 10-03 16:20:44 [utils.py:233] non-default args: {'lora_modules': ["
            "LoRAModulePath(name='a', path='/ad/a', base_model_name=None), "
            "LoRAModulePath(name='b', path='/ad/b', base_model_name=None)], 'model': '/m'}",
            "(Worker pid=3) ERROR 10-03 16:21:31 [multiproc_executor.py:1063] ValueError: While loading /ad/b, expected "
            "target modules in {'q_proj'} but received ['model.layers.0.mlp.zzz']. Please verify",
        ]
    )
    cause = classify_failure(text)
    assert (cause.kind, cause.adapter) == ("lora_load_failed", "b")


def test_cause_serialises_for_the_status_file_and_speaks_both_languages():
    cause = classify_failure(log("cpu_lora_path_missing"))
    assert isinstance(cause, Cause)
    d = cause.as_dict()
    assert d["cause"] == "lora_load_failed" and d["adapter"] == "ghost" and d["evidence"]
    assert d["reason"] == cause.reason.to_json() and Text.from_json(d["reason"]) == cause.reason
    assert cause.text("zh-CN") == cause.reason.in_("zh-CN") != cause.text("en-US") == str(cause.reason)
    assert cause.restart_may_help is False
    assert classify_failure(log("reconstructed_gpu_cuda_oom_while_serving")).restart_may_help is True


def test_tail_keeps_root_cause_and_drops_frames_noise_and_repeats():
    tail = tail_relevant(log("cpu_lora_rank_too_big"), n=20)
    assert any("LoRA rank 32 is greater than max_lora_rank 16" in t for t in tail)
    assert not any(t.lstrip().startswith("File ") or t.strip().startswith("^") for t in tail)
    assert not any("[shutdown]" in t or "Traceback" in t or "DeprecationWarning" in t for t in tail)
    assert len(tail) == len(set(tail))
    assert not any(t.startswith("(") for t in tail)  # the "(Worker pid=…) ERROR date [file]" prefix is gone


def test_tail_keeps_continuation_lines_of_multi_line_errors():
    tail = tail_relevant(log("cpu_model_folder_without_config"))
    assert any("ValidationError" in t for t in tail)
    assert any("Invalid repository ID or local directory specified" in t for t in tail)


def test_tail_returns_at_most_n_of_the_last_lines():
    full = tail_relevant(log("cpu_kvcache_space_above_free_ram"), n=100)
    assert len(full) > 3
    assert tail_relevant(log("cpu_kvcache_space_above_free_ram"), n=3) == full[-3:]
    assert tail_relevant(log("cpu_kvcache_space_above_free_ram"), n=0) == []

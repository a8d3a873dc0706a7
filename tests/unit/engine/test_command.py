"""The vLLM / Chainlit command builders (pure): argv, environment, engine choice, chat-template fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.errors import ConfigError, EngineUnavailable
from backend.launcher import command
from backend.launcher.supervisor import settle_log, start_process
from backend.settings import ROOT, LoraSettings, NetworkSettings, Settings, VllmSettings, load_settings


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_command_uses_module_entry_point_kv_cache_space_and_lora_flags():
    s = Settings(network=NetworkSettings(engine_port=8123), vllm=VllmSettings(cpu_kvcache_gib=2))
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


def engine_argv(engine: str, vllm: VllmSettings | None = None) -> list[str]:
    s = Settings(vllm=vllm) if vllm is not None else Settings()
    return list(command.build_engine_command(s, engine=engine, python="/p", api_key="k", adapters={}).argv)


@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_the_scheduling_policy_goes_to_vllm_and_fcfs_leaves_the_command_as_it_was(engine):
    """Issue #20: [vllm] scheduling_policy = "priority" (the default) lets the chat client's per-answer priority
    order vLLM's waiting queue; "fcfs" is vLLM's own default, so no flag."""
    assert argv_value(engine_argv(engine), "--scheduling-policy") == "priority"
    assert "--scheduling-policy" not in engine_argv(engine, VllmSettings(scheduling_policy="fcfs"))


def test_the_stream_interval_is_four_tokens_on_a_gpu_one_on_cpu_or_as_set():
    """[vllm] stream_interval = 0 (the default): fewer, larger chunks where many answers stream at once (a GPU);
    on CPU vLLM's own default (no flag). A value set goes to either engine."""
    assert argv_value(engine_argv("gpu"), "--stream-interval") == "4"
    assert "--stream-interval" not in engine_argv("cpu")
    for engine in ("cpu", "gpu"):
        assert argv_value(engine_argv(engine, VllmSettings(stream_interval=8)), "--stream-interval") == "8"
        assert "--stream-interval" not in engine_argv(engine, VllmSettings(stream_interval=1))


def test_extra_args_are_appended_verbatim():
    s = Settings(vllm=VllmSettings(extra_args=("--enforce-eager", "--seed", "7")))
    argv = command.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert list(argv[-3:]) == ["--enforce-eager", "--seed", "7"]


def test_ui_command_runs_chainlit_headless_on_the_ui_port():
    s = Settings(network=NetworkSettings(ui_port=8765))
    cmd = command.build_ui_command(s, python="/app/bin/python")
    assert list(cmd.argv[:4]) == ["/app/bin/python", "-m", "backend.ui.launch", "run"]  # chainlit run, not nested
    assert "--headless" in cmd.argv and argv_value(list(cmd.argv), "--port") == "8765"


def test_the_ui_believes_forwarded_headers_only_from_the_configured_proxies():
    """uvicorn's own default trusts loopback: any local process could then pick its address for the throttle."""
    assert command.build_ui_command(Settings(), python="p").env["FORWARDED_ALLOW_IPS"] == ""
    s = load_settings(ROOT / "config.toml", env={"QWENCHAT_NETWORK_TRUSTED_PROXIES": "10.0.0.5 10.1.0.0/16"})
    assert command.build_ui_command(s, python="p").env["FORWARDED_ALLOW_IPS"] == "10.0.0.5,10.1.0.0/16"
    with pytest.raises(ConfigError) as exc:
        load_settings(ROOT / "config.toml", env={"QWENCHAT_NETWORK_TRUSTED_PROXIES": "nginx.local"})
    assert "network.trusted_proxies" in str(exc.value) and "nginx.local" in str(exc.value)


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
    settle_log(proc)  # the pump lags the pipe by a moment (a loaded machine once read the log before it)
    assert "CI=unset" in (tmp_path / "out.log").read_text()


def test_vllm_writes_the_pyc_of_what_it_imports_even_with_pythondontwritebytecode(monkeypatch, tmp_path):
    """Issue #19: a fresh engine environment's .pyc come after the first answer (prepare_bg.compile_later); vLLM's
    three processes must not each compile in memory what they import, so the variable is not passed on."""
    import sys

    engine = command.build_engine_command(Settings(), engine="cpu", python="p", api_key="k", adapters={})
    gpu = command.build_engine_command(Settings(), engine="gpu", python="p", api_key="k", adapters={})
    assert "PYTHONDONTWRITEBYTECODE" in engine.unset and "PYTHONDONTWRITEBYTECODE" in gpu.unset
    (tmp_path / "imported_by_the_engine.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    cmd = command.Command((sys.executable, "-c", "import imported_by_the_engine"), {"PYTHONPATH": str(tmp_path)})
    cmd = command.Command(cmd.argv, cmd.env, unset=engine.unset)
    proc = start_process(cmd, tmp_path / "out.log")
    assert proc.wait(30) == 0
    assert list((tmp_path / "__pycache__").glob("imported_by_the_engine.*.pyc"))


# ---------------------------------------------------------------- multi-GPU: tensor and data parallel (issue 13.3)


def qwen_profile(name):
    return load_settings(ROOT / "config.toml", profile=name, env={})


def gpu_argv(settings):
    return list(command.build_engine_command(settings, engine="gpu", python="p", api_key="k", adapters={}).argv)


def test_tensor_parallel_profile_splits_qwen3_4b_over_two_gpus():
    s = qwen_profile("gpu-tp2")
    argv = gpu_argv(s)
    assert argv_value(argv, "--tensor-parallel-size") == "2"
    assert "--data-parallel-size" not in argv
    assert argv_value(argv, "--served-model-name") == "qwen3-4b-instruct-2507"
    assert argv_value(argv, "--max-model-len") == "262144"
    command.check_parallel(s, engine="gpu", gpus=2)  # fits exactly


def test_data_parallel_profile_runs_one_qwen3_4b_replica_per_gpu():
    s = qwen_profile("gpu-dp2")
    argv = gpu_argv(s)
    assert argv_value(argv, "--data-parallel-size") == "2"
    assert "--tensor-parallel-size" not in argv
    command.check_parallel(s, engine="gpu", gpus=2)


def test_single_gpu_profile_and_cpu_commands_carry_no_parallel_flags():
    argv = gpu_argv(qwen_profile("qwen3-4b-instruct-2507"))
    assert "--tensor-parallel-size" not in argv and "--data-parallel-size" not in argv
    both = Settings(vllm=VllmSettings(tensor_parallel_size=2, data_parallel_size=3))
    argv = gpu_argv(both)
    assert argv_value(argv, "--tensor-parallel-size") == "2" and argv_value(argv, "--data-parallel-size") == "3"
    cpu = command.build_engine_command(both, engine="cpu", python="p", api_key="k", adapters={}).argv
    assert not [a for a in cpu if "parallel" in a]


@pytest.mark.parametrize(
    "tp, dp, named", [(2, 1, "vllm.tensor_parallel_size = 2"), (1, 2, "vllm.data_parallel_size = 2")]
)
def test_parallel_sizes_on_the_cpu_engine_are_refused_naming_the_setting(tp, dp, named):
    s = Settings(vllm=VllmSettings(tensor_parallel_size=tp, data_parallel_size=dp))
    with pytest.raises(ConfigError) as info:
        command.check_parallel(s, engine="cpu", gpus=None)
    text = info.value.user_text("en")
    assert text.startswith(f"config error: {named}: expected 1 on the cpu engine"), text
    assert "vLLM-CPU" in text and 'device = "gpu"' in text
    assert info.value.user_text("zh").startswith(f"配置错误：{named}")


def test_more_gpus_than_visible_is_refused_naming_both_settings():
    s = Settings(vllm=VllmSettings(tensor_parallel_size=2, data_parallel_size=2))
    with pytest.raises(ConfigError) as info:
        command.check_parallel(s, engine="gpu", gpus=3)
    text = info.value.user_text("en")
    assert "tensor_parallel_size × data_parallel_size (2 × 2 = 4 GPUs)" in text
    assert "the 3 GPU(s) visible here" in text
    assert "[vllm] tensor_parallel_size or [vllm] data_parallel_size" in text
    command.check_parallel(s, engine="gpu", gpus=4)
    command.check_parallel(s, engine="gpu", gpus=None)  # unknown (a dry run without GPUs): not refused here
    command.check_parallel(Settings(), engine="cpu", gpus=None)  # 1 × 1 is fine anywhere


def test_data_parallel_size_below_one_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"QWENCHAT_VLLM_DATA_PARALLEL_SIZE \(vllm.data_parallel_size\) = '0'.*1 or more replicas"
    ):
        load_settings(ROOT / "config.toml", env={"QWENCHAT_VLLM_DATA_PARALLEL_SIZE": "0"})
    s = load_settings(ROOT / "config.toml", env={"QWENCHAT_VLLM_DATA_PARALLEL_SIZE": "2"})
    assert s.vllm.data_parallel_size == 2


def fake_smi(tmp_path, monkeypatch, lines):
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_gpu_count_reads_nvidia_smi_and_cuda_visible_devices(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, [f"GPU {i}: NVIDIA A100 (UUID: GPU-{i})" for i in range(4)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert command.gpu_count() == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert command.gpu_count() == 2
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert command.gpu_count() is None


# ---------------------------------------------------------------- the engine gate (issue #18)


def engine_commands():
    """Every engine command we start: single CPU and GPU, and each local replica of a fleet."""
    from backend.launcher import fleet
    from backend.settings import FleetSettings

    single = Settings(network=NetworkSettings(engine_port=8123))
    yield "cpu", command.build_engine_command(single, engine="cpu", python="p", api_key="secret", adapters={})
    yield "gpu", command.build_engine_command(single, engine="gpu", python="p", api_key="secret", adapters={})
    fleet_settings = Settings(network=NetworkSettings(engine_port=9100), fleet=FleetSettings(local=2))
    for engine in ("cpu", "gpu"):
        yield from (
            (f"{engine} replica", cmd)
            for cmd in fleet.build_replica_commands(
                fleet_settings,
                engine=engine,
                python="p",
                api_key="secret",
                adapters={},
                cpus=[0, 1],
                gpu_ids=["0", "1"],
            )
        )


def test_every_engine_command_loads_the_gate_with_its_own_port_and_hosts():
    from backend.engine_plugins import gate

    commands = list(engine_commands())
    assert len(commands) == 6
    for what, cmd in commands:
        argv = list(cmd.argv)
        assert argv_value(argv, "--middleware") == "backend.engine_plugins.gate.EngineGate", what
        assert cmd.env["PYTHONPATH"] == str(ROOT), what  # where the engine imports it from
        assert cmd.env[gate.ENV_PORT] == argv_value(argv, "--port"), what
        assert cmd.env[gate.ENV_HOSTS].split(",") == ["localhost", "127.0.0.1", "::1"], what
        rendered = cmd.render()  # what --dry-run prints
        assert "--middleware backend.engine_plugins.gate.EngineGate" in rendered and "secret" not in rendered, what


def test_the_gate_answers_to_the_configured_host_name_too():
    from backend.engine_plugins import gate

    s = Settings(network=NetworkSettings(engine_host="GPU-B.lan"))
    cmd = command.build_engine_command(s, engine="cpu", python="p", api_key="k", adapters={})
    assert cmd.env[gate.ENV_HOSTS].split(",") == ["localhost", "127.0.0.1", "::1", "gpu-b.lan"]


def test_the_gate_imports_only_the_standard_library():
    """It runs in the engine's process, whose environment has none of our dependencies."""
    import ast
    import sys

    from backend.engine_plugins import gate

    tree = ast.parse(Path(gate.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) if n.level == 0}
    assert {m.split(".")[0] for m in imported} - {"__future__"} <= sys.stdlib_module_names
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]

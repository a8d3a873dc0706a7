"""Settings: defaults, config.toml, profiles, environment overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from backend.errors import ConfigError
from backend.settings import (
    ROOT,
    SECTIONS,
    BudgetSettings,
    ClientSettings,
    LoraSettings,
    ModelSettings,
    NetworkSettings,
    Settings,
    load_settings,
    replace,
    served_host_names,
)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_shipped_config_loads_and_matches_the_defaults():
    s = load_settings(ROOT / "config.toml", env={})
    d = Settings()
    assert s == d  # every section, not only some
    assert dict(s.lora.modules) == {"pirate": ""}


def test_gpu_profile_has_qwen_budget_and_model_card_sampling():
    s = load_settings(ROOT / "config.toml", profile="qwen3-4b-instruct-2507", env={})
    assert s.model.max_model_len == 262144
    assert (s.model.temperature, s.model.top_p, s.model.top_k, s.model.min_p) == (0.7, 0.8, 20, 0.0)
    assert s.vllm.device == "gpu"
    assert dict(s.lora.modules) == {}  # the SmolLM2 demo adapter does not apply to Qwen


def test_environment_overrides_config_and_converts_types(tmp_path):
    cfg = write(tmp_path, "[network]\nengine_port = 9000\n")
    s = load_settings(
        cfg,
        env={
            "QWENCHAT_NETWORK_ENGINE_PORT": "9100",
            "QWENCHAT_CLIENT_MAX_RETRIES": "0",
            "QWENCHAT_LORA_ENABLE": "false",
            "QWENCHAT_LOGGING_LEVEL": "debug",
        },
    )
    assert s.network.engine_port == 9100 and s.client.max_retries == 0 and s.lora.enable is False
    assert s.logging.level == "DEBUG"


def test_openai_base_url_switches_to_external_mode(tmp_path):
    s = load_settings(write(tmp_path, ""), env={"OPENAI_BASE_URL": "http://gpu-box:8000/v1/", "OPENAI_API_KEY": "k"})
    assert s.external and s.engine_base_url == "http://gpu-box:8000/v1" and s.api_key == "k"


def test_lora_modules_accept_vllm_style_name_equals_path(tmp_path):
    s = load_settings(write(tmp_path, '[lora]\nmodules = ["a=/x/a", "b=/x/b"]\n'), env={})
    assert dict(s.lora.modules) == {"a": "/x/a", "b": "/x/b"}


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ('[network]\nengine_port = "eighty"\n', "network.engine_port", "a TCP port, an integer from 1 to 65535"),
        ("[network]\nengine_port = 70000\n", "network.engine_port", "TCP port"),
        ("[network]\nengine_port = 80.0\n", "network.engine_port", "TCP port"),
        ('[network]\nengine_port = "8000"\n', "network.engine_port", "TCP port"),  # TOML: a number, not text
        ("[model]\ntemperature = true\n", "model.temperature", "a number"),
        ("[lora]\nmax_lora_rank = 24\n", "lora.max_lora_rank", "320"),
        ("[client]\nidle_timeout = 0\n", "client.idle_timeout", "positive"),
        ('[vllm]\ndevice = "tpu"\n', "vllm.device", "cpu"),
        ("[supervision]\nrestart_window_min = 0\n", "supervision.restart_window_min", "positive"),
        ("[supervision]\nstartup_timeout = -1\n", "supervision.startup_timeout", "positive"),
        ("[client]\nretry_backoff = -0.5\n", "client.retry_backoff", "0 or more"),
        ("[history]\nwait = -1\n", "history.wait", "from 0 to 600"),
        ("[history]\nwait = 3600\n", "history.wait", "from 0 to 600"),
        ("[history]\nwait = nan\n", "history.wait", "from 0 to 600"),
        ("[sever]\nport = 1\n", "sever", "[network]"),
        ("model = 3\n", "model", "a [section] table"),
        ("[model]\nmax_model_len = true\n", "model.max_model_len", "a positive number of tokens"),
        ("[lora]\nextra = 1\n", "lora.extra", "max_lora_rank"),
        ("[server]\nportt = 1\n", "server.portt", "ui_port"),  # an old section: its old keys
        ("[ui]\nlanguage = 1\n", "ui.language", '"zh"'),
        ('[ui]\nlanguage = "de"\n', "ui.language", "a language the catalog has: en, zh-CN"),
        ('[network]\nhost_names = "a b"\n', "network.host_names", "host names or IP addresses"),
        ("[network]\nhost_names = [1]\n", "network.host_names", "host names or IP addresses"),
        ('[logging]\nlevel = "loud"\n', "logging.level", '"DEBUG"'),
        ("[health]\nprobe_slow = 20.0\n", "health.probe_slow", "at most health.probe_timeout (10)"),
        ("[supervision]\nrestart_after_failed_probes = 0\n", "supervision.restart_after_failed_probes", "1 or more"),
        ('[model]\npth = "x"\n', "model.pth", "path"),
        ("[model\npath = 1\n", "config.toml", "valid TOML"),
    ],
)
def test_bad_value_names_key_value_and_expectation(tmp_path, text, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    message = str(info.value)
    assert key in message and fragment in message


@pytest.mark.parametrize(
    "variable, value, form",
    [
        ("QWENCHAT_NETWORK_ENGINE_PORT", "abc", "a TCP port, an integer from 1 to 65535"),
        ("QWENCHAT_NETWORK_ENGINE_PORT", "0", "a TCP port, an integer from 1 to 65535"),
        ("QWENCHAT_SERVER_PORT", "abc", "a TCP port, an integer from 1 to 65535"),  # an old name: named as given
        ("QWENCHAT_LOGIN_ENABLE", "maybe", "true or false"),
        ("QWENCHAT_CLIENT_IDLE_TIMEOUT", "soon", "a positive number of seconds"),
        ("QWENCHAT_VLLM_DEVICE", "tpu", '"cpu"'),
        ("QWENCHAT_VLLM_SCHEDULING_POLICY", "lifo", '"priority"'),
        ("QWENCHAT_LORA_STARTERS", "no-equals-sign", 'a table of name = ["text", ...]'),
        ("QWENCHAT_LORA_MODULES", "a", 'a table of name = "value"'),
    ],
)
def test_bad_environment_value_names_the_variable(tmp_path, variable, value, form):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), env={variable: value})
    message = str(info.value)
    assert message.startswith(f"config error: {variable} (") and f") = {value!r}: expected " in message
    assert form in message


def test_reply_reserve_must_leave_room_in_max_model_len():
    with pytest.raises(ConfigError) as info:
        Settings(model=ModelSettings(max_model_len=512), budget=BudgetSettings(reply_reserve=1024))
    assert "1024" in str(info.value) and "512" in str(info.value)


def test_unknown_profile_lists_the_available_ones(tmp_path):
    with pytest.raises(ConfigError, match="qwen3-4b-instruct-2507"):
        load_settings(write(tmp_path, ""), profile="nope", env={})


def test_settings_are_immutable():
    s = Settings(client=ClientSettings(idle_timeout=0.5))
    with pytest.raises(ValidationError, match="frozen"):
        s.client.idle_timeout = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        s.client = ClientSettings()  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.lora.modules["x"] = "y"  # type: ignore[index]


def test_embedded_adapter_resolves_to_the_shipped_demo():
    lora = LoraSettings()
    assert (lora.adapter_path("pirate") / "adapter_config.json").exists()


def test_launcher_key_wins_over_a_stray_openai_key_when_not_external(tmp_path):
    # `chainlit run` in CI mode sets OPENAI_API_KEY to a fake value; the launcher's key must win.
    s = load_settings(write(tmp_path, ""), env={"QWENCHAT_ENGINE_API_KEY": "launch", "OPENAI_API_KEY": "sk-FAKE"})
    assert s.api_key == "launch"


def test_a_relative_model_path_is_relative_to_the_repository_folder():
    # "./": a bare "models/x" that is no folder here reads as the hub id models/x (tests/unit/test_hub.py)
    assert ModelSettings(path="./models/x").resolved_path == (ROOT / "models" / "x").resolve()
    assert ModelSettings(path="tests/unit").resolved_path == ROOT / "tests" / "unit"  # an existing folder


@pytest.mark.parametrize(
    "url",
    ["localhost:8000/v1", "ftp://gpu-box/v1", "http://gpu-box:99999/v1", "http://gpu-box:abc/v1", "http://[::1/v1"],
)
def test_a_bad_openai_base_url_or_replica_url_names_the_setting_and_hides_a_password(tmp_path, url):
    """A base URL the client could never use is a config error at start, not a puzzling failure at the first
    message; a password in it is not printed."""
    secret = url.replace("//", "//bob:s3cret@", 1) if "//" in url else url
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), env={"OPENAI_BASE_URL": secret})
    assert "OPENAI_BASE_URL" in str(info.value) and "s3cret" not in str(info.value)
    remote = f'[fleet]\nremote = ["{secret}"]\n'
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, remote), env={})
    assert "fleet.remote" in str(info.value) and "s3cret" not in str(info.value)


def test_good_base_urls_pass(tmp_path):
    for url in ("https://api.example.com/openai/v1", "http://[::1]:8000/v1", "http://bob:pw@gpu-box/v1"):
        assert load_settings(write(tmp_path, ""), env={"OPENAI_BASE_URL": url}).engine_base_url == url


@pytest.mark.parametrize("url", ["postgresql://qw:s3cret@db:99999/h", "postgresql+asyncpg://qw:s3cret@db:abc/h"])
def test_a_history_db_url_with_a_bad_port_is_refused_at_start_without_its_password(tmp_path, url):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f'[login]\nenable = true\npassword = "pw"\n[history]\ndb = "{url}"\n'), env={})
    message = str(info.value)
    assert "history.db" in message and "port from 1 to 65535" in message
    assert "s3cret" not in message and "qw:***@db" in message


# ---------------------------------------------------------------- [network] host_names (the Host names the UI answers to)


def test_host_names_come_from_config_or_the_environment_normalised(tmp_path):
    s = load_settings(write(tmp_path, '[network]\nhost_names = ["Chat.Example.com", "10.0.0.5", "[::1]"]\n'), env={})
    assert s.network.host_names == ("Chat.Example.com", "10.0.0.5", "[::1]")
    assert served_host_names(s) == ("chat.example.com", "10.0.0.5", "::1")
    env = load_settings(write(tmp_path, ""), env={"QWENCHAT_NETWORK_HOST_NAMES": "gpu-box gpu-box.lan."})
    assert served_host_names(env) == ("gpu-box", "gpu-box.lan")


@pytest.mark.parametrize(
    "value", ["http://chat.example.com", "chat.example.com:8080", "chat.example.com/app", "a,b", "", "bad name"]
)
def test_a_bad_host_name_names_the_variable_the_value_and_the_form(tmp_path, value):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), env={"QWENCHAT_NETWORK_HOST_NAMES": f"'{value}'"})
    message = str(info.value)
    assert "QWENCHAT_NETWORK_HOST_NAMES" in message and repr(value) in message and '"10.0.0.5"' in message


@pytest.mark.parametrize(
    "ui_host, hosts, origins, expected",
    [
        ("127.0.0.1", (), (), ()),  # loopback: loopback names only (the middleware adds those)
        ("0.0.0.0", (), (), ()),  # every address, nothing named: the start asks for [ui] hosts
        ("::", (), (), ()),
        ("10.0.0.10", (), (), ("10.0.0.10",)),  # one address: people open it by that address
        ("chat.lan", (), (), ("chat.lan",)),
        ("0.0.0.0", ("gpu-box",), ("https://chat.example.com",), ("gpu-box", "chat.example.com")),
        ("10.0.0.10", ("gpu-box",), (), ("gpu-box", "10.0.0.10")),
    ],
)
def test_served_host_names_are_derived_from_ui_host_hosts_and_allowed_origins(ui_host, hosts, origins, expected):
    s = Settings(network=NetworkSettings(ui_host=ui_host, host_names=hosts, allowed_origins=origins))
    assert served_host_names(s) == expected


# ---------------------------------------------------------------- the keys: config.toml, the models, the old names


def test_every_key_of_config_toml_is_a_field_and_every_field_a_key_in_the_same_order():
    import tomllib

    shipped = tomllib.loads((ROOT / "config.toml").read_text())
    assert list(shipped) == [s for s in SECTIONS if s in shipped] and set(shipped) == set(SECTIONS)
    for section, cls in SECTIONS.items():
        assert list(shipped[section]) == list(cls.model_fields), section


def test_settings_alone_are_the_defaults_whatever_the_environment_says(monkeypatch):
    monkeypatch.setenv("QWENCHAT_NETWORK_ENGINE_PORT", "1234")
    monkeypatch.setenv("QWENCHAT_SERVER_PORT", "1235")
    assert Settings().network.engine_port == 8000


OLD_CONFIG = """
[server]
port = 9001
engine = "cpu"
[ui]
auth = true
password = "pw"
name = "Old Name"
hosts = ["chat.example.com"]
[budget]
max_model_len = 4096
[health]
restart_after_failed_probes = 2
"""


def test_old_keys_still_work_with_one_warning_line_each_naming_the_new_key(tmp_path, caplog):
    caplog.set_level("WARNING", logger="backend.settings")
    profile = tmp_path / "old-profile.toml"
    profile.write_text("[server]\nport = 9002\n")  # the same old key again: still one line
    s = load_settings(write(tmp_path, OLD_CONFIG), profile=str(profile), env={"QWENCHAT_UI_USERNAME": "boss"})
    assert s.network.engine_port == 9002 and s.vllm.device == "cpu"
    assert (s.login.enable, s.login.password, s.login.username) == (True, "pw", "boss")
    assert s.branding.name == "Old Name" and s.network.host_names == ("chat.example.com",)
    assert s.model.max_model_len == 4096 and s.supervision.restart_after_failed_probes == 2
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 9, lines
    assert sum("[server] port is now [network] engine_port" in line for line in lines) == 1
    assert sum("[budget] max_model_len is now [model] max_model_len" in line for line in lines) == 1
    assert sum("QWENCHAT_UI_USERNAME is now QWENCHAT_LOGIN_USERNAME" in line for line in lines) == 1


def test_new_keys_log_nothing(tmp_path, caplog):
    caplog.set_level("WARNING", logger="backend.settings")
    load_settings(ROOT / "config.toml", profile="gpu-dp2", env={"QWENCHAT_NETWORK_UI_PORT": "9999"})
    assert caplog.records == []


def test_the_old_budget_max_model_len_of_zero_meant_ask_the_server_and_is_dropped(tmp_path):
    s = load_settings(write(tmp_path, "[model]\nmax_model_len = 2048\n[budget]\nmax_model_len = 0\n"), env={})
    assert s.model.max_model_len == 2048
    assert load_settings(write(tmp_path, ""), env={"QWENCHAT_BUDGET_MAX_MODEL_LEN": "0"}).model.max_model_len == 8192
    assert load_settings(write(tmp_path, ""), env={"QWENCHAT_BUDGET_MAX_MODEL_LEN": "1200"}).model.max_model_len == 1200


@pytest.mark.parametrize(
    "text, key",
    [
        ("[server]\nport = 1\n[network]\nengine_port = 2\n", "network.engine_port"),
        ("[network]\nengine_port = 2\n[server]\nport = 1\n", "network.engine_port"),
        ("[model]\nmax_model_len = 2048\n[budget]\nmax_model_len = 1024\n", "model.max_model_len"),
    ],
)
def test_an_old_and_a_new_key_in_one_file_is_refused_naming_both(tmp_path, text, key):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    message = str(info.value)
    assert message.startswith(f"config error: {key} = ") and "one value (config.toml sets both" in message
    assert "[server] port" in message or "[budget] max_model_len" in message


def test_an_old_and_a_new_variable_together_are_refused_naming_both(tmp_path):
    env = {"QWENCHAT_SERVER_PORT": "9001", "QWENCHAT_NETWORK_ENGINE_PORT": "9002"}
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), env=env)
    assert "QWENCHAT_NETWORK_ENGINE_PORT" in str(info.value) and "QWENCHAT_SERVER_PORT" in str(info.value)


def test_old_and_new_names_in_different_places_follow_the_precedence(tmp_path):
    s = load_settings(write(tmp_path, "[server]\nport = 9001\n"), env={"QWENCHAT_NETWORK_ENGINE_PORT": "9002"})
    assert s.network.engine_port == 9002
    s = load_settings(write(tmp_path, "[network]\nengine_port = 9001\n"), env={"QWENCHAT_SERVER_PORT": "9002"})
    assert s.network.engine_port == 9002


def test_sections_built_in_code_name_the_section_and_key():
    with pytest.raises(ConfigError, match=r"client\.idle_timeout = 'soon': expected a positive number of seconds"):
        ClientSettings(idle_timeout="soon")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"client\.idel_timeout = 1: expected one of the keys"):
        ClientSettings(idel_timeout=1)  # type: ignore[call-arg]


def test_replace_makes_a_checked_copy():
    s = Settings()
    faster = replace(s, client=replace(s.client, idle_timeout=0.1))
    assert faster.client.idle_timeout == 0.1 and s.client.idle_timeout == 60.0 and faster.model == s.model
    with pytest.raises(ConfigError, match="client.idle_timeout"):
        replace(s.client, idle_timeout=0)


def test_a_bad_value_in_a_file_is_refused_even_when_the_environment_replaces_it(tmp_path):
    with pytest.raises(ConfigError, match="network.engine_port = 'eighty': expected a TCP port"):
        load_settings(write(tmp_path, "[server]\nport = 'eighty'\n"), env={"QWENCHAT_NETWORK_ENGINE_PORT": "9000"})


@pytest.mark.parametrize(
    "env, sent",
    [
        ({}, True),  # the default: engines the launcher starts run --scheduling-policy priority
        ({"QWENCHAT_VLLM_SCHEDULING_POLICY": "PRIORITY"}, True),
        ({"QWENCHAT_VLLM_SCHEDULING_POLICY": "fcfs"}, False),
        ({"OPENAI_BASE_URL": "http://gpu-b:8000/v1"}, False),  # an external server may run fcfs
        ({"QWENCHAT_FLEET_REMOTE": "http://gpu-b:8000/v1"}, False),  # so may a remote replica
        ({"QWENCHAT_FLEET_LOCAL": "2"}, True),  # local replicas are started with the same command
    ],
)
def test_answers_carry_a_priority_only_to_engines_started_with_the_priority_policy(tmp_path, env, sent):
    """Issue #20: vLLM refuses a non-zero priority under fcfs, so the chat client sends one only to engines the
    launcher started with [vllm] scheduling_policy = "priority"."""
    assert load_settings(write(tmp_path, ""), env=env).priority_scheduling is sent


def test_an_unknown_section_or_key_names_the_file_it_is_in(tmp_path):
    profile = tmp_path / "mine.toml"
    profile.write_text("[lora]\nmodulez = {}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), profile=str(profile), env={})
    assert "lora.modulez" in str(info.value) and "(in mine.toml)" in str(info.value)
    with pytest.raises(ConfigError, match=r"sever = .*\(in config\.toml\)"):
        load_settings(write(tmp_path, "[sever]\nport = 1\n"), env={})


def test_the_sources_are_pydantic_settings_own():
    """Issue 31: the files and the environment are read by the library's sources; what it does not do is one
    pre-pass on plain dicts, not a source of our own."""
    import importlib
    import pkgutil

    from pydantic_settings import PydanticBaseSettingsSource

    import backend

    names = [m.name for m in pkgutil.iter_modules(backend.__path__) if m.name.startswith("settings")]
    ours = [
        f"{module.__name__}.{name}"
        for module in map(importlib.import_module, (f"backend.{n}" for n in names))
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, PydanticBaseSettingsSource)
        and value.__module__ == module.__name__
    ]
    assert not ours, f"hand-written settings sources: {ours}"

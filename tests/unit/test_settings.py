"""Settings: defaults, config.toml, profiles, environment overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.errors import ConfigError
from backend.settings import (
    ROOT,
    ClientSettings,
    LoraSettings,
    ModelSettings,
    Settings,
    load_settings,
    served_host_names,
)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_shipped_config_loads_and_matches_the_defaults():
    s = load_settings(ROOT / "config.toml", env={})
    d = Settings()
    assert s.model == d.model and s.server == d.server and s.client == d.client and s.budget == d.budget
    assert s.health == d.health and s.ui == d.ui and s.logging == d.logging
    assert dict(s.lora.modules) == {"pirate": ""}


def test_gpu_profile_has_qwen_budget_and_model_card_sampling():
    s = load_settings(ROOT / "config.toml", profile="qwen3-4b-instruct-2507", env={})
    assert s.model.max_model_len == 262144
    assert (s.model.temperature, s.model.top_p, s.model.top_k, s.model.min_p) == (0.7, 0.8, 20, 0.0)
    assert s.server.engine == "gpu"
    assert dict(s.lora.modules) == {}  # the SmolLM2 demo adapter does not apply to Qwen


def test_environment_overrides_config_and_converts_types(tmp_path):
    cfg = write(tmp_path, "[server]\nport = 9000\n")
    s = load_settings(
        cfg,
        env={
            "QWENCHAT_SERVER_PORT": "9100",
            "QWENCHAT_CLIENT_MAX_RETRIES": "0",
            "QWENCHAT_LORA_ENABLE": "false",
            "QWENCHAT_LOGGING_LEVEL": "debug",
        },
    )
    assert s.server.port == 9100 and s.client.max_retries == 0 and s.lora.enable is False
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
        ('[server]\nport = "eighty"\n', "server.port", "an integer"),
        ("[server]\nport = 70000\n", "server.port", "TCP port"),
        ("[model]\ntemperature = true\n", "model.temperature", "a number"),
        ("[lora]\nmax_lora_rank = 24\n", "lora.max_lora_rank", "320"),
        ("[client]\nidle_timeout = 0\n", "client.idle_timeout", "positive"),
        ('[server]\nengine = "tpu"\n', "server.engine", "cpu"),
        ("[server]\nrestart_window_min = 0\n", "server.restart_window_min", "positive"),
        ("[server]\nstartup_timeout = -1\n", "server.startup_timeout", "positive"),
        ("[client]\nretry_backoff = -0.5\n", "client.retry_backoff", "0 or more"),
        ("[ui]\nhistory_wait = -1\n", "ui.history_wait", "from 0 to 600"),
        ("[ui]\nhistory_wait = 3600\n", "ui.history_wait", "from 0 to 600"),
        ("[ui]\nhistory_wait = nan\n", "ui.history_wait", "from 0 to 600"),
        ("[sever]\nport = 1\n", "sever", "[server]"),
        ('[model]\npth = "x"\n', "model.pth", "path"),
        ("[model\npath = 1\n", "config.toml", "valid TOML"),
    ],
)
def test_bad_value_names_key_value_and_expectation(tmp_path, text, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    message = str(info.value)
    assert key in message and fragment in message


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="QWENCHAT_SERVER_PORT.*'abc'.*integer"):
        load_settings(write(tmp_path, ""), env={"QWENCHAT_SERVER_PORT": "abc"})


def test_reply_reserve_must_leave_room_in_max_model_len():
    with pytest.raises(ConfigError) as info:
        Settings(model=ModelSettings(max_model_len=512), budget=Settings().budget.__class__(reply_reserve=1024))
    assert "1024" in str(info.value) and "512" in str(info.value)


def test_unknown_profile_lists_the_available_ones(tmp_path):
    with pytest.raises(ConfigError, match="qwen3-4b-instruct-2507"):
        load_settings(write(tmp_path, ""), profile="nope", env={})


def test_settings_are_immutable():
    s = Settings(client=ClientSettings(idle_timeout=0.5))
    with pytest.raises(AttributeError):
        s.client.idle_timeout = 3  # type: ignore[misc]
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
        load_settings(write(tmp_path, f'[ui]\nauth = true\npassword = "pw"\nhistory_db = "{url}"\n'), env={})
    message = str(info.value)
    assert "ui.history_db" in message and "port from 1 to 65535" in message
    assert "s3cret" not in message and "qw:***@db" in message


# ---------------------------------------------------------------- [ui] hosts (the Host names the UI answers to)


def test_ui_hosts_come_from_config_or_the_environment_normalised(tmp_path):
    s = load_settings(write(tmp_path, '[ui]\nhosts = ["Chat.Example.com", "10.0.0.5", "[::1]"]\n'), env={})
    assert s.ui.hosts == ("Chat.Example.com", "10.0.0.5", "[::1]")
    assert served_host_names(s) == ("chat.example.com", "10.0.0.5", "::1")
    env = load_settings(write(tmp_path, ""), env={"QWENCHAT_UI_HOSTS": "gpu-box gpu-box.lan."})
    assert served_host_names(env) == ("gpu-box", "gpu-box.lan")


@pytest.mark.parametrize(
    "value", ["http://chat.example.com", "chat.example.com:8080", "chat.example.com/app", "a,b", "", "bad name"]
)
def test_a_bad_ui_host_names_the_key_the_value_and_the_form(tmp_path, value):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, ""), env={"QWENCHAT_UI_HOSTS": f"'{value}'"})
    message = str(info.value)
    assert "ui.hosts" in message and repr(value) in message and '"10.0.0.5"' in message


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
    from backend.settings import ServerSettings, UISettings

    s = Settings(server=ServerSettings(ui_host=ui_host), ui=UISettings(hosts=hosts, allowed_origins=origins))
    assert served_host_names(s) == expected

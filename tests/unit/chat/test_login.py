"""backend/web/login.py: the password check, and login switched on without a password."""

from __future__ import annotations

import pytest

from backend.errors import ConfigError
from backend.settings import LoggingSettings, LoginSettings, Settings, load_settings
from backend.web import login


def auth_settings(tmp_path, **login) -> Settings:
    return Settings(login=LoginSettings(enable=True, **login), logging=LoggingSettings(dir=str(tmp_path / "logs")))


@pytest.mark.parametrize(
    "username,password,ok",
    [
        ("demo", "s3cret-pass", True),
        ("demo", "s3cret-passX", False),
        ("demo", "", False),
        ("Demo", "s3cret-pass", False),
        ("admin", "s3cret-pass", False),
        ("demo", "s3cret-pass\udcff", False),  # a lone surrogate from a form must not raise
    ],
)
def test_the_password_check_accepts_only_the_configured_name_and_password(tmp_path, username, password, ok):
    settings = auth_settings(tmp_path, username="demo", password="s3cret-pass")
    assert login.check_password(settings, username, password) is ok


def test_login_on_without_a_password_is_a_config_error_naming_both_places_to_set_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "none.toml", env={"QWENCHAT_LOGIN_ENABLE": "true"})
    text = err.value.user_text("en")
    assert "[login].password" in text and "QWENCHAT_LOGIN_PASSWORD" in text
    settings = load_settings(
        tmp_path / "none.toml", env={"QWENCHAT_LOGIN_ENABLE": "true", "QWENCHAT_LOGIN_PASSWORD": "pw"}
    )
    assert settings.login.password == "pw" and login.check_password(settings, "admin", "pw")

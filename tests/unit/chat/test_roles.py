"""Roles: only operators download from the hub, add adapters at run time and unload them; a user's attempt is one
clear line naming who may, in the user's language, logged with the account name. With login off the one person is
the operator, but a hub download is refused when the UI is public."""

from __future__ import annotations

import asyncio
import logging

import pytest

from backend.chat import roles
from backend.chat.health import HealthStatus, ModelEntry
from backend.chat.roles import OperatorOnly, PublicWithoutLogin
from backend.chat.service import Service
from backend.errors import AdapterDownloadFailed
from backend.settings import LoggingSettings, LoginSettings, NetworkSettings, Settings

STATUS = HealthStatus(models=(ModelEntry("base"), ModelEntry("pirate", parent="base")), base_model="base")


def service(tmp_path, *, login: bool = True, operators: tuple[str, ...] = (), public: bool = False) -> Service:
    settings = Settings(
        login=LoginSettings(enable=login, password="long enough" if login else "", operators=operators),
        network=NetworkSettings(public=public, ui_host="0.0.0.0" if public else "127.0.0.1"),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
        base_url="http://127.0.0.1:9/v1",  # external: a download that passes the role check stops right after it
        api_key="k",
    )
    return Service(settings)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


OPERATOR_COMMANDS = {
    "hub": lambda svc, who: svc.add_hub_adapter("acme/pirate-lora", who=who),
    "unload": lambda svc, who: svc.unload("pirate", STATUS, who=who),
    "status": lambda svc, who: svc.operator_report(who=who, answering={}, lang="en"),
}


@pytest.mark.parametrize("command", sorted(OPERATOR_COMMANDS))
def test_a_user_running_an_operator_command_gets_one_line_naming_the_operators(tmp_path, caplog, command):
    svc = service(tmp_path, operators=("admin", "carol"))
    with caplog.at_level(logging.WARNING), pytest.raises(OperatorOnly) as caught:
        run(OPERATOR_COMMANDS[command](svc, "bob"))
    en, zh = caught.value.user_text("en"), caught.value.user_text("zh-CN")
    assert en.startswith("Only an operator may") and "(operators: admin, carol)" in en and "\n" not in en, en
    assert "只有操作员" in zh and "admin, carol" in zh, zh
    assert "'bob'" in caplog.text and "not an operator" in caplog.text


def test_the_first_account_is_the_operator_by_default(tmp_path):
    svc = service(tmp_path)
    assert roles.operators(svc.settings) == ("admin",) and svc.is_operator("admin") and not svc.is_operator("bob")
    assert not svc.is_operator(None)  # a caller that did not say who: refused with login on
    with pytest.raises(AdapterDownloadFailed):  # past the role check: refused for being external, not for the role
        run(svc.add_hub_adapter("acme/pirate-lora", who="admin"))


def test_with_login_off_the_one_person_is_the_operator(tmp_path):
    svc = service(tmp_path, login=False)
    with pytest.raises(AdapterDownloadFailed):
        run(svc.add_hub_adapter("acme/pirate-lora"))


def test_with_login_off_a_public_ui_refuses_hub_downloads(tmp_path):
    svc = service(tmp_path, login=False, public=True)
    with pytest.raises(PublicWithoutLogin) as caught:
        run(svc.add_hub_adapter("acme/pirate-lora"))
    assert "[network] public = true" in caught.value.user_text("en")


def test_an_operators_status_names_the_engine_adapters_queue_answers_downloads_and_disk(tmp_path):
    svc = service(tmp_path)
    text = run(svc.operator_report(who="admin", answering={"bob": 2, "admin": 1}, lang="en"))
    for part in ("Engine:", "Adapters loaded: 0 of 4 slots", "Answers streaming: 3 (admin 1, bob 2)"):
        assert part in text, text
    assert "Hub download running: —; waiting: —" in text and "Disk free for downloads:" in text, text
    zh = run(svc.operator_report(who="admin", answering={}, lang="zh-CN"))
    assert "服务器状态" in zh and "下载可用磁盘空间" in zh

"""Issue 12 helpers: welcome-screen starters and branding (welcome.py), share decisions (share.py),
extra login accounts (login.py)."""

from __future__ import annotations

import json
import types

import pytest

from backend import passwords
from backend.chat import welcome
from backend.settings import LoggingSettings, LoginSettings, LoraSettings, Settings
from backend.storage import history, share
from backend.web import login

UUID = "0b6f1c2e-5d4a-4c3b-9a8f-7e6d5c4b3a21"
HASH = passwords.hash_password("viewer-password", iterations=passwords.MIN_ITERATIONS)


def with_starters(**starters: list[str]) -> Settings:
    table = types.MappingProxyType({k: tuple(v) for k, v in starters.items()})
    return Settings(lora=LoraSettings(starters=table))


# ---------------------------------------------------------------- starters


def test_the_demo_adapter_has_builtin_starters_in_both_languages():
    en = welcome.starters(Settings(), ["smollm2-135m-instruct", "pirate"], "en")
    zh = welcome.starters(Settings(), ["smollm2-135m-instruct", "pirate"], "zh")
    assert [s.model for s in en] == ["pirate"] * 3 and len(zh) == 3
    assert en[0].message == "What is the capital of France?" and en[0].label.endswith("· pirate")
    assert zh[0].message == "法国的首都是哪里？" and zh[0].label == "法国的首都是哪里？ · pirate"


def test_configured_starters_replace_a_models_list_and_an_empty_list_removes_it():
    s = with_starters(pirate=[], **{"smollm2-135m-instruct": ["Hi there"], "ghost": ["Boo?"]})
    shown = welcome.starters(s, ["smollm2-135m-instruct"], "en")
    assert [(x.model, x.message) for x in shown] == [("smollm2-135m-instruct", "Hi there"), ("ghost", "Boo?")]


def test_no_demo_starters_when_the_demo_adapter_is_not_configured():
    s = Settings(lora=LoraSettings(modules=types.MappingProxyType({})))
    assert welcome.starters(s, ["qwen3"], "en") == []


def test_served_models_starters_come_first_and_the_list_is_bounded():
    s = with_starters(ghost=["g1", "g2", "g3", "g4", "g5", "g6"], real=["r1", "r2", "r3", "r4", "r5", "r6"])
    shown = welcome.starters(s, ["real"], "en")
    assert len(shown) == welcome.MAX_STARTERS and [x.model for x in shown[:6]] == ["real"] * 6


def test_a_starter_message_names_its_model_in_either_language_and_a_typed_one_none():
    assert welcome.starter_model(Settings(), "Tell me about the sea.", "pirate") == "pirate"
    assert welcome.starter_model(Settings(), "给我讲讲大海。", "pirate") == "pirate"
    assert welcome.starter_model(Settings(), "Tell me about the sea, please", "pirate") is None
    # typed, not clicked: the same words without the starter's command are an ordinary message
    assert welcome.starter_model(Settings(), "Tell me about the sea.", None) is None
    assert welcome.starter_model(Settings(), "Tell me about the sea.", "compare") is None


def test_unserved_lists_starter_models_the_engine_does_not_serve_nor_the_folder_offers():
    s = with_starters(ghost=["Boo?"], local=["Hi"])
    assert welcome.unserved(s, ["smollm2", "pirate"], loadable=["local"]) == ["ghost"]
    assert welcome.unserved(Settings(), ["smollm2"]) == ["pirate"]


@pytest.mark.parametrize(
    ("colour", "hsl"), [("#ff0000", "0 100% 50%"), ("#2563eb", "221 83% 53%"), ("#000000", "0 0% 0%")]
)
def test_the_accent_becomes_chainlits_hsl_theme_variable(colour, hsl):
    assert welcome.accent_hsl(colour) == hsl
    assert f"--primary: {hsl};" in welcome.theme_css(colour)


# ---------------------------------------------------------------- sharing


def thread(shared: object, author: str = "owner", as_json: bool = True) -> dict:
    meta = {"is_shared": shared, "qwenchat": {"system_prompt": "private"}}
    return {"id": UUID, "userIdentifier": author, "metadata": json.dumps(meta) if as_json else meta}


def test_a_shared_thread_opens_for_any_logged_in_viewer_only():
    assert share.view_refusal(thread(True), "viewer") is None
    assert share.view_refusal(thread(True, as_json=False), "owner") is None
    assert share.view_refusal(thread(True), None) is share.LOGIN


def test_an_unshared_or_deleted_thread_is_refused_with_a_reason():
    assert share.view_refusal(thread(False), "viewer") is share.NOT_SHARED
    assert share.view_refusal(thread("true"), "viewer") is share.NOT_SHARED  # only the flag Chainlit sets
    assert share.view_refusal({"id": UUID, "metadata": "{not json"}, "viewer") is share.NOT_SHARED
    assert share.view_refusal(None, "viewer") is share.GONE
    assert share.GONE.status == 404 and share.NOT_SHARED.status == 403


def test_only_the_owner_may_share_or_unshare():
    assert share.share_refusal(UUID, "owner", "owner") is None
    assert share.share_refusal(UUID, "owner", "viewer") is share.NOT_OWNER
    assert share.share_refusal(UUID, "", "owner") is share.GONE
    assert share.share_refusal("../etc", "owner", "owner") is share.GONE
    assert share.share_refusal(UUID, "owner", None) is share.LOGIN
    assert share.NOT_OWNER.status == 403  # never 401: Chainlit's page logs the browser out on a 401


# ---------------------------------------------------------------- extra accounts


def auth(tmp_path, **login) -> Settings:
    return Settings(
        login=LoginSettings(enable=True, username="owner", password="owner-pass", **login),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )


def test_extra_accounts_log_in_with_their_own_password_only(tmp_path):
    settings = auth(tmp_path, users=types.MappingProxyType({"viewer": HASH}))
    assert login.check_password(settings, "viewer", "viewer-password")
    assert login.check_password(settings, "owner", "owner-pass")
    assert not login.check_password(settings, "viewer", "owner-pass")
    assert not login.check_password(settings, "owner", "viewer-password")
    assert not login.check_password(settings, "nobody", "viewer-password")
    assert not login.check_password(settings, "viewer", HASH)  # the stored hash is not a password


def test_changing_an_extra_account_signs_everyone_out(tmp_path):
    env: dict[str, str] = {}
    history.prepare(auth(tmp_path), env)
    plain = env["CHAINLIT_AUTH_SECRET"]
    history.prepare(auth(tmp_path, users=types.MappingProxyType({"viewer": HASH})), env)
    with_viewer = env["CHAINLIT_AUTH_SECRET"]
    other = passwords.hash_password("another-password", iterations=passwords.MIN_ITERATIONS)
    history.prepare(auth(tmp_path, users=types.MappingProxyType({"viewer": other})), env)
    assert len({plain, with_viewer, env["CHAINLIT_AUTH_SECRET"]}) == 3
    history.prepare(auth(tmp_path, users=types.MappingProxyType({"viewer": HASH})), env)
    assert env["CHAINLIT_AUTH_SECRET"] == with_viewer  # stable across restarts

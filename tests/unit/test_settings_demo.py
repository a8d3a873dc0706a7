"""Settings for the stakeholder demo (issue 12): [login] users, [branding] and [lora.starters]."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend import passwords
from backend.errors import ConfigError
from backend.settings import load_settings

HASH = passwords.hash_password("viewer-password", iterations=passwords.MIN_ITERATIONS)


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return load_settings(p, env=env or {})


def test_branding_users_and_starters_from_config(tmp_path):
    (tmp_path / "logo.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    s = load(
        tmp_path,
        f"""
[branding]
name = "Pirate Demo"
logo = "{tmp_path / "logo.svg"}"
favicon = "{tmp_path / "logo.svg"}"
accent = "#2563eb"
[login]
users = {{ alice = "{HASH}" }}
[lora.starters]
pirate = ["Ahoy?", "Where is the treasure?"]
base = []
""",
    )
    assert (s.branding.name, s.branding.accent) == ("Pirate Demo", "#2563eb")
    assert s.branding.logo.endswith("logo.svg") and s.branding.favicon.endswith("logo.svg")
    assert dict(s.login.users) == {"alice": HASH}
    assert dict(s.lora.starters) == {"pirate": ("Ahoy?", "Where is the treasure?"), "base": ()}


def test_starters_and_users_from_the_environment(tmp_path):
    s = load(
        tmp_path,
        "",
        {"QWENCHAT_LORA_STARTERS": "pirate=Ahoy?|Where?,smol=Hi", "QWENCHAT_LOGIN_USERS": f"bob={HASH}"},
    )
    assert dict(s.lora.starters) == {"pirate": ("Ahoy?", "Where?"), "smol": ("Hi",)}
    assert dict(s.login.users) == {"bob": HASH}


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ('[branding]\naccent = "blue"\n', "branding.accent", '"#rrggbb"'),
        ('[branding]\naccent = "#12345"\n', "branding.accent", '"#rrggbb"'),
        ('[branding]\nname = ""\n', "branding.name", "1 to 60 characters"),
        ('[branding]\nname = "' + "x" * 61 + '"\n', "branding.name", "1 to 60 characters"),
        ('[branding]\nlogo = "nowhere/logo.png"\n', "branding.logo", "an existing file"),
        ('[branding]\nfavicon = "README.md"\n', "branding.favicon", ".png, .svg, .ico"),
        ('[login]\nusers = { alice = "hunter22" }\n', "login.users.alice", "python -m backend hash-password"),
        (f'[login]\nusers = {{ admin = "{HASH}" }}\n', "login.users", "names other than [login] username"),
        ('[login]\nusers = ["alice"]\n', "login.users", 'a table of name = "value"'),
        ('[ui]\nusers = ["alice"]\n', "login.users", 'a table of name = "value"'),  # the old name: the new key
        ('[lora.starters]\npirate = "Ahoy?"\n', "lora.starters", 'a table of name = ["text", ...]'),
        ('[lora.starters]\npirate = ["  "]\n', "lora.starters.pirate", "non-empty questions"),
        ("[lora.starters]\npirate = [" + ", ".join(['"q"'] * 7) + "]\n", "lora.starters.pirate", "at most 6"),
    ],
)
def test_bad_demo_settings_name_the_key_the_value_and_the_fix(tmp_path, text, key, fragment):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    message = str(err.value.user_text("en"))
    assert key in message and fragment in message


def test_a_plain_password_in_users_is_not_echoed_whole(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, '[login]\nusers = { alice = "my-long-secret-password-123" }\n')
    assert "my-long-secret-password-123" not in err.value.user_text("en")

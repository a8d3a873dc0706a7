"""Settings for the stakeholder demo (issue 12): [ui] users, name, logo, favicon, accent and [lora.starters]."""

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
[ui]
name = "Pirate Demo"
logo = "{tmp_path / "logo.svg"}"
favicon = "{tmp_path / "logo.svg"}"
accent = "#2563eb"
users = {{ alice = "{HASH}" }}
[lora.starters]
pirate = ["Ahoy?", "Where is the treasure?"]
base = []
""",
    )
    assert (s.ui.name, s.ui.accent) == ("Pirate Demo", "#2563eb")
    assert s.ui.logo.endswith("logo.svg") and s.ui.favicon.endswith("logo.svg")
    assert dict(s.ui.users) == {"alice": HASH}
    assert dict(s.lora.starters) == {"pirate": ("Ahoy?", "Where is the treasure?"), "base": ()}


def test_starters_and_users_from_the_environment(tmp_path):
    s = load(
        tmp_path,
        "",
        {"QWENCHAT_LORA_STARTERS": "pirate=Ahoy?|Where?,smol=Hi", "QWENCHAT_UI_USERS": f"bob={HASH}"},
    )
    assert dict(s.lora.starters) == {"pirate": ("Ahoy?", "Where?"), "smol": ("Hi",)}
    assert dict(s.ui.users) == {"bob": HASH}


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ('[ui]\naccent = "blue"\n', "ui.accent", '"#rrggbb"'),
        ('[ui]\naccent = "#12345"\n', "ui.accent", '"#rrggbb"'),
        ('[ui]\nname = ""\n', "ui.name", "1 to 60 characters"),
        ('[ui]\nlogo = "nowhere/logo.png"\n', "ui.logo", "an existing file"),
        ('[ui]\nfavicon = "README.md"\n', "ui.favicon", ".png, .svg, .ico"),
        ('[ui]\nusers = { alice = "hunter22" }\n', "ui.users.alice", "python -m backend hash-password"),
        (f'[ui]\nusers = {{ admin = "{HASH}" }}\n', "ui.users", "names other than [ui].username"),
        ('[ui]\nusers = ["alice"]\n', "ui.users", 'a table of name = "value"'),
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
        load(tmp_path, '[ui]\nusers = { alice = "my-long-secret-password-123" }\n')
    assert "my-long-secret-password-123" not in err.value.user_text("en")

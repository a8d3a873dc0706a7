"""docs/CONFIGURATION.md is made from the settings and config.toml's comments, and kept current."""

from __future__ import annotations

from backend.settings import Settings
from backend.tools import config_doc


def test_the_committed_configuration_doc_is_what_the_settings_make_now():
    on_disk = config_doc.DOC.read_text(encoding="utf-8")
    made = config_doc.render(config_doc.CONFIG_TOML.read_text(encoding="utf-8"))
    assert on_disk == made, "docs/CONFIGURATION.md is stale: run 'python -m backend config-doc' and commit it"


def test_every_settings_key_is_documented_with_its_environment_name():
    doc = config_doc.render(config_doc.CONFIG_TOML.read_text(encoding="utf-8"))
    for section, field in Settings.model_fields.items():
        model = field.annotation
        for name in getattr(model, "model_fields", {}):
            assert f"`QWENCHAT_{section.upper()}_{name.upper()}`" in doc, f"[{section}] {name}"


def test_comments_above_inline_and_continued_belong_to_their_key():
    text = """[net]
# said above
port = 80   # inline, with "#" in quotes ok
            # continued
colour = "#fff"  # a hash in a value is not a comment

other = 1
"""
    found = config_doc.toml_comments(text)
    assert found[("net", "port")] == 'said above inline, with "#" in quotes ok continued'
    assert found[("net", "colour")] == "a hash in a value is not a comment"
    assert found[("net", "other")] == ""


def test_a_stale_doc_is_reported(tmp_path, capsys):
    stale = tmp_path / "CONFIGURATION.md"
    stale.write_text("old\n", encoding="utf-8")
    assert config_doc.main(check=True, out=stale) == 1
    assert "stale" in capsys.readouterr().out

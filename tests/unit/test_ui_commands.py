"""The command registry (backend/ui/commands.py): one table for the menu, the dispatch and typed commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.ui import commands

CATALOG = Path(__file__).resolve().parents[2] / "backend" / "catalog"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("/unload pirate", ("unload", "pirate")),
        ("/compare off", ("compare", "off")),
        ("/vote A clearer and shorter", ("vote", "A clearer and shorter")),
        ("/adapters", ("adapters", "")),
        ("  /export  ", ("export", "")),
        ("/Unload  pirate \n", ("unload", "pirate")),
        ("/adapters acme/some-lora@v2", ("adapters", "acme/some-lora@v2")),
        ("/compare\nblind", ("compare", "blind")),
        ("/usr/bin/env python", None),  # a path: goes to the model
        ("/compare/off", None),
        ("/nope x", None),  # not registered
        ("please /unload pirate", None),  # not the first word
        ("/", None),
        ("", None),
    ],
)
def test_typed_command_is_a_registered_first_word(text, expected):
    assert commands.typed_command(text) == expected


def test_the_registry_is_the_one_list_of_commands():
    ids = [c.id for c in commands.REGISTRY]
    assert len(ids) == len(set(ids)) and set(commands.BY_ID) == set(ids)
    assert {"adapters", "unload", "export", "compare", "leaderboard", "vote"} <= set(ids)


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_every_command_has_its_menu_text_in_each_catalog(lang):
    catalog = json.loads((CATALOG / f"{lang}.json").read_text(encoding="utf-8"))
    assert [c.id for c in commands.REGISTRY if not catalog.get(f"cmd_{c.id}")] == []
    entry = commands.REGISTRY[0].menu_entry(lang)
    assert entry["description"] == catalog[f"cmd_{entry['id']}"] and entry["button"] is False

"""Shared by the adapter tests: a tiny fake base model and an adapters folder, built with tests/fakes/adapter_zoo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import adapter_zoo as zoo


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return zoo.make_base_model(tmp_path / "tiny-llama")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "adapters"
    zoo.make_adapter(root / "pirate", r=8, base_name="tiny-llama")
    zoo.make_adapter(root / "poet", r=16)
    return root

"""Reading a safetensors header (``backend/adapters/safetensors.py``) without loading the weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.adapters.safetensors import read_safetensors_header
from tests.fakes import adapter_zoo as zoo


def test_safetensors_header_is_parsed_without_loading_weights(tmp_path: Path) -> None:
    adapter = zoo.make_adapter(tmp_path / "a")
    shapes = read_safetensors_header(adapter / "adapter_model.safetensors")
    assert shapes["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"] == (32, 8)
    bogus = tmp_path / "x.safetensors"
    bogus.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_safetensors_header(bogus)

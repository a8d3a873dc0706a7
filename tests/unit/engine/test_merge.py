"""`python -m backend merge` without the engine env or a model: bad arguments, the free-space check, and
leftover LoRA keys in a merged folder. The merge itself (engine env, tiny Qwen3) is in
tests/integration/test_merge.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from backend.tools import merge


@pytest.mark.parametrize(
    "argv", [[], ["--base", "b", "--adapter", "a"], ["--base", "b", "--adapter", "a", "--out", "o", "--dtype", "int8"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    assert merge.merge_main(argv) == 2
    assert "usage: python -m backend merge" in capsys.readouterr().err


def test_free_space_check_names_both_numbers():
    needed, free = 9 * 1024**3, 512 * 1024**2
    with pytest.raises(merge.MergeError) as info:
        merge.check_free_space(Path("/srv/models/merged"), needed, free=free)
    text = info.value.user_text("en")
    assert "9.0 GB" in text and str(needed) in text and "512.0 MB" in text and str(free) in text
    assert "--out /srv/models/merged" in text
    assert merge.check_free_space(Path("/srv/models/merged"), needed, free=needed) == needed


def test_inspect_merged_refuses_leftover_lora_keys(tmp_path):
    folder = tmp_path / "half-merged"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    save_file(
        {
            "model.layers.0.self_attn.q_proj.weight": np.zeros((4, 4), np.float32),
            "model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((2, 4), np.float32),
        },
        str(folder / "model.safetensors"),
    )
    with pytest.raises(merge.MergeError, match="still hold 1 LoRA tensors"):
        merge.inspect_merged(folder)
    os.remove(folder / "model.safetensors")
    save_file(
        {"model.layers.0.self_attn.q_proj.weight": np.zeros((4, 4), np.float32)}, str(folder / "model.safetensors")
    )
    assert merge.inspect_merged(folder).tensors == 1

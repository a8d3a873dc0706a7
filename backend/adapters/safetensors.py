"""Safetensors headers: tensor names and shapes without reading any weights (no torch).

read_safetensors_header(path)    # {name: shape}
read_safetensors_metadata(path)  # the raw JSON header
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_HEADER_LIMIT = 100 * 1024 * 1024  # a safetensors JSON header larger than this is not a real file


def read_safetensors_metadata(path: str | Path) -> dict[str, Any]:
    """The raw JSON header of a .safetensors file (name -> {dtype, shape, data_offsets}), no weights read.

    Format: 8-byte little-endian header length N, then N bytes of JSON. ValueError when unreadable.
    """
    path = Path(path)
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name} is shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        size = path.stat().st_size
        if n > min(_HEADER_LIMIT, size - 8):
            raise ValueError(
                f"{path.name} has a header length of {n} bytes, larger than the file; not a safetensors file"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path.name} has an unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has a safetensors header that is not a JSON object")
    return header


def read_safetensors_header(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a .safetensors header, without reading any weights; ValueError when unreadable."""
    path = Path(path)
    header = read_safetensors_metadata(path)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise ValueError(f"{path.name}: tensor {name!r} has no valid shape in the header")
        shapes[name] = tuple(shape)
    return shapes

"""Safetensors files without torch: tensor names and shapes from the header, and a bounded read of the values.

read_safetensors_header(path)    # {name: shape}
read_safetensors_metadata(path)  # the raw JSON header
scan_values(path)                # [TensorValues(name, checked, non_finite, all_zero)] per floating-point tensor
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
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


#: bit masks of the exponent (NaN/Inf when all ones) and of everything but the sign (zero when none), per dtype
_FLOAT_BITS: dict[str, tuple[str, int, int]] = {
    "F32": ("<u4", 0x7F800000, 0x7FFFFFFF),
    "F16": ("<u2", 0x7C00, 0x7FFF),
    "BF16": ("<u2", 0x7F80, 0x7FFF),
    "F64": ("<u8", 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
}
MAX_VALUES_PER_TENSOR = 16 * 1024 * 1024  # bytes of one tensor read for its values (LoRA tensors: ~0.1-10 MB)
MAX_VALUES_TOTAL = 512 * 1024 * 1024  # bytes read over the whole file; the tensors past it are not read


@dataclass(frozen=True)
class TensorValues:
    """What a bounded read found in one floating-point tensor: non-finite values, and whether all were zero."""

    name: str
    checked: int  # values read (the first MAX_VALUES_PER_TENSOR bytes of the tensor)
    non_finite: int  # NaN or ±Inf among them
    all_zero: bool  # every value read is ±0


def scan_values(path: str | Path) -> list[TensorValues]:
    """Each floating-point tensor's values (bounded: see the limits above), by their bits with numpy (no torch):
    an exponent of all ones is NaN or Inf; no bit but the sign is zero. Integer tensors are skipped."""
    import numpy as np

    path = Path(path)
    header = read_safetensors_metadata(path)
    found: list[TensorValues] = []
    budget = MAX_VALUES_TOTAL
    with path.open("rb") as f:
        start = 8 + int(struct.unpack("<Q", f.read(8))[0])
        for name, meta in sorted(header.items()):
            if name == "__metadata__" or not isinstance(meta, dict) or meta.get("dtype") not in _FLOAT_BITS:
                continue
            kind, exponent, magnitude = _FLOAT_BITS[meta["dtype"]]
            begin, end = (int(x) for x in meta.get("data_offsets", (0, 0)))
            width = np.dtype(kind).itemsize
            size = min(end - begin, MAX_VALUES_PER_TENSOR, budget) // width * width
            if size <= 0:
                continue
            f.seek(start + begin)
            bits = np.frombuffer(f.read(size), dtype=kind)
            budget -= size
            non_finite = int(np.count_nonzero((bits & exponent) == exponent))
            all_zero = not np.any(bits & magnitude)
            found.append(TensorValues(name, int(bits.size), non_finite, bool(all_zero)))
    return found

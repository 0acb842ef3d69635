"""A strict check of a .safetensors file's header, without loading tensors (works on multi-GB files instantly)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pipeline.errors import PipelineError

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E8M0": 1, "F4": 1}
MAX_HEADER = 100 * 2**20


def check_safetensors(path: Path) -> dict:
    """Validate the header of `path` against its size; returns {tensor name: (dtype, shape)}."""
    size = path.stat().st_size

    def bad(why: str) -> PipelineError:
        return PipelineError(f"{path}: not a valid safetensors file: {why}",
                             "the file is truncated or corrupt: delete it and fetch again")

    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise bad(f"only {size} bytes")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or n > size - 8:
            raise bad(f"header length {n} does not fit in a {size}-byte file")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad(f"header is not JSON ({exc})") from None
    data_size = size - 8 - n
    tensors, end_max = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info.get("dtype"), info.get("shape"), info.get("data_offsets", (-1, -1))
        if dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
        count = 1
        for d in shape:
            count *= d
        if not 0 <= begin <= end <= data_size:
            raise bad(f"tensor {name!r} data [{begin}, {end}) lies outside the {data_size}-byte data section")
        if dtype != "F4" and end - begin != count * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r} is {end - begin} bytes, its shape {shape} x {dtype} needs "
                      f"{count * DTYPE_BYTES[dtype]}")
        end_max = max(end_max, end)
        tensors[name] = (dtype, tuple(shape))
    if end_max != data_size:
        raise bad(f"data section is {data_size} bytes but tensors end at {end_max}")
    return tensors

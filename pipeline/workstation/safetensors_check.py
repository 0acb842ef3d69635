"""A strict check of a .safetensors file's header, without loading tensors (works on multi-GB files instantly).

A model directory may be damaged, truncated or built to break a parser: the header must be a JSON object of
tensors, each with a known dtype, a shape of non-negative integers and a [begin, end) range of exactly its bytes;
ranges may not overlap and must cover the data section. The file must be a regular file (a link to one is
followed, as in a Hugging Face cache snapshot; a FIFO or a link loop is an error, never a hang).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import open_regular

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E8M0": 1, "F4": 1}
MAX_HEADER = 100 * 2**20
MAX_DIM = 2**40
MAX_RANK = 8


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_safetensors(path: Path) -> dict:
    """Validate the header of `path` against its size; returns {tensor name: (dtype, shape)}."""
    def bad(why: str) -> PipelineError:
        return PipelineError(f"{path}: not a valid safetensors file: {why}", "the file is truncated or corrupt (or "
                             "not safetensors): replace it with the model's own file")

    try:
        fh = open_regular(path, follow=True)
    except PipelineError as exc:
        raise bad(exc.message.removeprefix(f"{path}: ")) from None
    with fh:
        import os
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(8)
        if len(raw) < 8:
            raise bad(f"only {size} bytes")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or n > size - 8:
            raise bad(f"header length {n} does not fit in a {size}-byte file")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, RecursionError) as exc:
            raise bad(f"header is not JSON ({str(exc)[:80]})") from None
    if not isinstance(header, dict):
        raise bad(f"header is a JSON {type(header).__name__}, not an object of tensors")
    data_size = size - 8 - n
    tensors, ranges = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise bad("__metadata__ is not an object of strings")
            continue
        if not isinstance(info, dict):
            raise bad(f"tensor {name!r} is described by a JSON {type(info).__name__}, not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name!r} has unknown dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_int(d) and 0 <= d <= MAX_DIM
                                                                           for d in shape):
            raise bad(f"tensor {name!r} has shape {str(shape)[:60]}: expected a list of non-negative integers")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_int(o) for o in offsets):
            raise bad(f"tensor {name!r} has data_offsets {str(offsets)[:60]}: expected [begin, end] integers")
        begin, end = offsets
        count = 1
        for d in shape:
            count *= d
        if not 0 <= begin <= end <= data_size:
            raise bad(f"tensor {name!r} data [{begin}, {end}) lies outside the {data_size}-byte data section")
        if dtype != "F4" and end - begin != count * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r} is {end - begin} bytes, its shape {shape} x {dtype} needs "
                      f"{count * DTYPE_BYTES[dtype]}")
        ranges.append((begin, end, name))
        tensors[name] = (dtype, tuple(shape))
    covered = 0
    for begin, end, name in sorted(ranges):     # contiguous, as the safetensors library itself requires
        if begin != covered:
            raise bad(f"tensor {name!r} data [{begin}, {end}) " + ("overlaps another tensor's" if begin < covered
                                                                    else f"leaves a gap after byte {covered}"))
        covered = end
    if covered != data_size:
        raise bad(f"data section is {data_size} bytes but tensors end at {covered}")
    return tensors

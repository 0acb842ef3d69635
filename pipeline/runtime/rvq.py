"""The RVQ codes Edge-LLM's TTS runtime writes beside each WAV (rvq_req{N}.safetensors: one integer tensor,
[frames, code groups]), read with the standard library (the device has no numpy), bounded: the header's size, its
JSON, the one tensor's dtype, shape and byte span are checked against the file before a value is read.

safetensors: an 8-byte little-endian header length, the JSON header {name: {"dtype", "shape", "data_offsets"}} (and
an optional "__metadata__"), then the tensors' bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pipeline.errors import PipelineError

MAX_HEADER = 1 << 16
INTEGERS = {"I32": "i", "I64": "q", "I16": "h", "U16": "H"}


def read_codes(path: Path, groups: int, max_frames: int) -> list[list[int]]:
    """[frames][groups] codes from `path`; raises PipelineError naming what is wrong with the file."""
    def bad(why: str) -> PipelineError:
        return PipelineError(f"{path}: not the runtime's RVQ codes: {why}", "see the runtime's log")

    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise bad("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise bad(f"a header of {n} bytes in a file of {size}")
        try:
            header = json.loads(fh.read(n))
        except ValueError as exc:
            raise bad(f"its header is not JSON ({exc})") from None
        tensors = {k: v for k, v in header.items() if k != "__metadata__"} if isinstance(header, dict) else {}
        if len(tensors) != 1:
            raise bad(f"{len(tensors)} tensors where one is written")
        ((name, t),) = tensors.items()
        dtype, shape, span = (t.get(k) if isinstance(t, dict) else None for k in ("dtype", "shape", "data_offsets"))
        if dtype not in INTEGERS:
            raise bad(f"tensor {name} is {dtype}, not an integer type")
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(d, int) for d in shape)
                and shape[1] == groups and 0 <= shape[0] <= max_frames):
            raise bad(f"tensor {name} has shape {shape}, not [frames <= {max_frames}, {groups}]")
        width = struct.calcsize(INTEGERS[dtype])
        if not (isinstance(span, list) and len(span) == 2 and span[1] - span[0] == shape[0] * shape[1] * width
                and span[0] >= 0 and 8 + n + span[1] <= size):
            raise bad(f"tensor {name}'s bytes {span} do not hold {shape} {dtype} in the file")
        fh.seek(8 + n + span[0])
        flat = struct.unpack(f"<{shape[0] * shape[1]}{INTEGERS[dtype]}", fh.read(span[1] - span[0]))
    return [list(flat[i * groups:(i + 1) * groups]) for i in range(shape[0])]

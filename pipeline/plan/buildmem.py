"""What an engine build holds at its peak, per builder, and how to build on the target board itself.

On a Jetson the CPU and GPU share one DRAM. What the GPU holds (the network's weights while TensorRT builds and times
tactics, tactic workspace, the CUDA context) is pinned: it cannot be swapped. What the builder process holds on the
CPU side (the checkpoint it parsed, the serialized engine before it is written, the Python/TensorRT libraries) is
pageable: swap on fast storage can hold it, at the cost of a slower build. So a build fits a board when the pinned
part fits in free RAM and the whole peak fits in free RAM plus free swap.

trtllm-build 0.12 (TensorRT-LLM's `build` path: `from_checkpoint` loads every tensor of rank*.safetensors into the
model's parameters as numpy arrays; `to_trt` builds the network whose weights TensorRT copies to the GPU; the builder
returns the serialized engine as one IHostMemory buffer that `Engine.save` writes while the model is still alive):
    host   = libraries (Python, torch imported by tensorrt_llm, TensorRT) + checkpoint arrays + serialized engine
    device = engine weights + tactic workspace (~2x the engine's activations) + CUDA context
Edge-LLM llm_build (C++: the ONNX parser keeps the external weight data in host memory, TensorRT copies it to the
GPU, the serialized engine is one host buffer; its issue tracker reports ~3-4x the parameter bytes, and 0.8.0+ exports
can keep INT4 FFN weights outside the engine, which removes them from all three):
    host   = libraries + parsed ONNX weights + serialized engine
    device = engine weights + tactic workspace + CUDA context
Each backend's record holds its builder's estimate (pipeline/backends: build_memory). These are estimates from how
the builders work, not measurements: the device report records the measured peak
(pipeline/device/memwatch.py: the board's MemAvailable and SwapFree sampled through the build) next to them, with
their ratio, so the first real builds tell us how far off they are.
"""

from __future__ import annotations

import math

from pipeline.backends import BuildMemory
from pipeline.contract import BuildOnBoard

GB = 1e9
SWAP_MARGIN = 1_000_000_000         # swap beyond the computed shortfall: page cache, the desktop waking up
SWAP_FILE = "/ssd/{size}GB.swap"    # NVMe mounted at /ssd, as jetson-containers' setup guide does
HEADLESS = "sudo systemctl isolate multi-user.target   # stop the desktop for this boot (~0.8 GB back)"


# Engine build time, for the device's timeout only: no build times are published for these boards, so this is a
# generous bound from how the builders work (parse, tactic timing per layer, serialize), not a figure to compare
# with: a few minutes of fixed cost and five minutes per GB of engine weights, doubled where the build pages to swap.
BUILD_FIXED_S = 180
BUILD_S_PER_GB = 300


def build_seconds(engine_weights: int, pages: bool) -> float:
    return round((BUILD_FIXED_S + BUILD_S_PER_GB * engine_weights / GB) * (2 if pages else 1), 1)


def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def swap_commands(size_bytes: int) -> list[str]:
    size = max(1, math.ceil(size_bytes / GB))
    path = SWAP_FILE.format(size=size)
    return [f"sudo fallocate -l {size}G {path}", f"sudo chmod 600 {path}", f"sudo mkswap {path}",
            f"sudo swapon {path}   # for this boot; add it to /etc/fstab to keep it"]


EXTERNAL_INT4_FFN = "int4_ffn"   # Edge-LLM's export kind (external_weights.py): dense FFN INT4 GEMM weights + scales
EXTERNAL_INT4_MOE = "int4_moe"   # the same for an MoE model's experts (Edge-LLM's docs: "int4_ffn int4_moe" for MoE)


def externalized_kinds(on_board: BuildOnBoard, dense_ffn: bool = True, parts: tuple[str, ...] = ()
                       ) -> tuple[str, ...]:
    """The weight kinds the export must keep outside the engine for this way of building: the dense MLPs' where the
    model has any (Qwen3-30B-A3B has none: every layer is an MoE layer, and Edge-LLM's export then writes no int4_ffn
    file), and the parts' (an MoE model's experts: ModelShape.externalizable)."""
    if on_board.how != "externalize":
        return ()
    return ((EXTERNAL_INT4_FFN,) if dense_ffn else ()) + parts


def build_on_board(build: BuildMemory, usable: int, usable_headless: int, target_id: str,
                   externalized: BuildMemory | None = None, same_sm_boards: tuple[str, ...] = ()) -> BuildOnBoard:
    """The first way a careful user would try: as is, headless, headless + swap for the pageable part, (Edge-LLM)
    INT4 FFN weights outside the engine, then another board of the same SM."""
    if build.peak <= usable:
        return BuildOnBoard("as-is", 0, [], f"the build's peak ({_gb(build.peak)}) fits the {target_id} as it is")
    if build.peak <= usable_headless:
        return BuildOnBoard("headless", 0, [HEADLESS], f"the build needs {_gb(build.peak)}: fits without the desktop")
    for how, b in (("swap", build), ("externalize", externalized)):
        if b is not None and b.device_total <= usable_headless:
            swap = b.peak - usable_headless + SWAP_MARGIN if b.peak > usable_headless else 0
            extra = "; the export keeps the INT4 FFN weights (an MoE model's experts too) outside the engine " \
                "(Edge-LLM external weight files, which llm_build copies beside the engine and the runtime loads)" \
                if how == "externalize" else ""
            where = f"headless with {math.ceil(swap / GB)} GB of swap on NVMe for the pageable part" if swap else \
                "headless"
            slower = " The build will be slower while it pages; the engine is the same" if swap else ""
            return BuildOnBoard(how, swap, [HEADLESS, *(swap_commands(swap) if swap else [])],
                                f"the build needs {_gb(b.peak)} (GPU-pinned {_gb(b.device_total)}, pageable "
                                f"{_gb(b.host_total)}; largest part: {b.dominant}): {where}{extra}.{slower}")
    if same_sm_boards:
        return BuildOnBoard("other-board", 0, [], f"the GPU-pinned part alone ({_gb(build.device_total)}) exceeds "
                            f"what a headless {target_id} has ({_gb(usable_headless)}): build on "
                            f"{', '.join(same_sm_boards)} (same SM and stack) and copy the engine bundle")
    return BuildOnBoard("none", 0, [], f"the GPU-pinned part ({_gb(build.device_total)}) exceeds every known board "
                        "of this SM: use a smaller model or format")

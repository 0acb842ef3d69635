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
These are estimates from how the builders work, not measurements: the device report records the measured peak
(pipeline/device/memwatch.py: the board's MemAvailable and SwapFree sampled through the build) next to them, with
their ratio, so the first real builds tell us how far off they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
CUDA_CONTEXT = 400_000_000          # CUDA context + TensorRT builder kernels resident on the GPU side
TACTIC_FLOOR = 256 * 2**20          # builder scratch beyond the activations it times tactics with
TRTLLM_LIBS = 1_000_000_000         # python + torch + tensorrt_llm + TensorRT libraries (trtllm-build is Python)
LLM_BUILD_LIBS = 400_000_000        # llm_build is C++: TensorRT and the ONNX parser
SWAP_MARGIN = 1_000_000_000         # swap beyond the computed shortfall: page cache, the desktop waking up
SWAP_FILE = "/ssd/{size}GB.swap"    # NVMe mounted at /ssd, as jetson-containers' setup guide does
HEADLESS = "sudo systemctl isolate multi-user.target   # stop the desktop for this boot (~0.8 GB back)"


@dataclass(frozen=True)
class BuildMemory:
    host: dict[str, int]        # pageable: swap can hold it
    device: dict[str, int]      # pinned on the GPU side of the unified memory: must fit in RAM

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    @property
    def device_total(self) -> int:
        return sum(self.device.values())

    @property
    def peak(self) -> int:
        return self.host_total + self.device_total

    @property
    def dominant(self) -> str:
        parts = {**{f"{k} (host)": v for k, v in self.host.items()},
                 **{f"{k} (GPU)": v for k, v in self.device.items()}}
        return max(parts, key=lambda k: parts[k])

    def as_dict(self) -> dict:
        return {"build_peak": self.peak, "build_host": self.host_total, "build_device": self.device_total}


def trtllm_build(engine_weights: int, activations: int, ffn_int4: int = 0) -> BuildMemory:
    return BuildMemory(
        host={"libraries": TRTLLM_LIBS, "checkpoint arrays": engine_weights, "serialized engine": engine_weights},
        device={"engine weights": engine_weights, "tactic workspace": 2 * activations + TACTIC_FLOOR,
                "CUDA context": CUDA_CONTEXT})


def llm_build(engine_weights: int, activations: int, ffn_int4: int = 0) -> BuildMemory:
    """ffn_int4: bytes of INT4 FFN weights the export keeps outside the engine (0: all inside)."""
    inside = engine_weights - ffn_int4
    return BuildMemory(
        host={"libraries": LLM_BUILD_LIBS, "parsed ONNX weights": inside, "serialized engine": inside},
        device={"engine weights": inside, "tactic workspace": 2 * activations + TACTIC_FLOOR,
                "CUDA context": CUDA_CONTEXT})


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


@dataclass(frozen=True)
class BuildOnBoard:
    how: str                    # as-is | headless | swap | externalize | other-board | none
    swap_bytes: int
    commands: list[str]
    note: str

    @property
    def externalize(self) -> tuple[str, ...]:
        """The weight kinds the export must keep outside the engine for this way of building."""
        return (EXTERNAL_INT4_FFN,) if self.how == "externalize" else ()

    def as_dict(self) -> dict:
        return {"how": self.how, "swap_bytes": self.swap_bytes, "commands": self.commands, "note": self.note}


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
            extra = "; the export keeps the INT4 FFN weights outside the engine (Edge-LLM external weight files, " \
                "which llm_build copies beside the engine and the runtime loads)" if how == "externalize" else ""
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

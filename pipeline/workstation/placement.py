"""Where the workstation calibrates a model: one GPU, spread over several, spread over GPU and CPU, or the CPU.

Calibration holds the fp16 model plus activations of one calibration window; a model larger than one GPU is spread
layer by layer over the workstation's GPUs with an accelerate device map (ModelOpt calibrates dispatched models).
A model larger than all GPUs is spread over the GPUs and host memory ("gpu+cpu"): accelerate keeps the layers that do
not fit in host memory and moves each one to the GPU for its forward (ModelOpt 0.47 calibrates such offloaded models,
reading and writing their weights through the offload hooks), so every matmul still runs on a GPU; after
calibration the model is gathered on the CPU (workstation/calibrate.py). A CPU-only workstation (or GPUs with no
room at all) calibrates on the CPU in fp32 (fp16 matmuls are slow on CPUs), from host memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipeline.errors import PipelineError

GiB = 2**30
# Per GPU, kept free of weights: the CUDA context, ModelOpt's calibration statistics, one window's activations
# (a 8B model at 512 tokens needs well under 1 GiB) and the allocator's fragmentation. ModelOpt's own examples
# reserve a similar fraction when they build max_memory for device_map="auto".
GPU_HEADROOM_FRACTION = 0.15
GPU_HEADROOM_MIN = 2 * GiB
HOST_HEADROOM = 4 * GiB


@dataclass(frozen=True)
class Placement:
    kind: str                              # "gpu" | "multi-gpu" | "gpu+cpu" | "cpu"
    device: str                            # where inputs go: "cuda:0" or "cpu"
    max_memory: dict = field(default_factory=dict)   # accelerate max_memory (empty: no device map)
    model_bytes: int = 0
    note: str = ""
    devices: tuple[str, ...] = ()          # where accelerate put the layers of a spread model, once loaded

    def as_dict(self) -> dict:
        d = asdict(self)
        d["max_memory"] = {str(k): v for k, v in self.max_memory.items()}
        d["devices"] = list(self.devices)
        return d


def _budget(free: int) -> int:
    return max(0, free - max(GPU_HEADROOM_MIN, int(free * GPU_HEADROOM_FRACTION)))


def choose(model_bytes: int, gpu_free: list[int], host_free: int, budgets: list[int] | None = None) -> Placement:
    """model_bytes: the model at its calibration dtype (fp16 on GPUs). gpu_free: free bytes per visible GPU.
    budgets: bytes of weights per GPU, instead of what gpu_free leaves after the headroom."""
    gb = lambda n: f"{n / 1e9:.1f} GB"      # noqa: E731
    if not gpu_free:
        need = model_bytes * 2 + HOST_HEADROOM          # fp32 on the CPU
        if need > host_free:
            raise PipelineError(f"calibrating on the CPU holds the model in fp32: {gb(need)} of host memory, "
                                f"{gb(host_free)} free",
                                "run the quantize stage on a workstation with an NVIDIA GPU, or free host memory")
        return Placement("cpu", "cpu", {}, model_bytes, f"CPU, fp32 ({gb(need)} of host memory)")
    budgets = budgets or [_budget(f) for f in gpu_free]
    if model_bytes <= budgets[0]:
        return Placement("gpu", "cuda:0", {}, model_bytes, f"one GPU ({gb(model_bytes)} of {gb(budgets[0])})")
    max_memory: dict = {i: b for i, b in enumerate(budgets) if b > 0}
    if model_bytes <= sum(budgets):
        return Placement("multi-gpu", "cuda:0", max_memory, model_bytes,
                         f"spread over {len(max_memory)} GPUs ({gb(model_bytes)} over {gb(sum(budgets))})")
    # Beyond the GPUs: the rest in host memory, moved to a GPU layer by layer for its forward (fp16 throughout)
    offloaded = model_bytes - sum(budgets)
    if sum(budgets) > 0 and offloaded + HOST_HEADROOM <= host_free:
        return Placement("gpu+cpu", "cuda:0", {**max_memory, "cpu": host_free - HOST_HEADROOM}, model_bytes,
                         f"spread over {len(max_memory)} GPU(s) and host memory ({gb(sum(budgets))} on the GPUs, "
                         f"{gb(offloaded)} in host memory, moved to a GPU per layer)")
    need = model_bytes * 2 + HOST_HEADROOM
    if need > host_free:
        raise PipelineError(f"the model ({gb(model_bytes)} in fp16) does not fit the GPUs ({gb(sum(budgets))} "
                            f"usable), and calibrating on the CPU in fp32 needs {gb(need)} of host memory, "
                            f"{gb(host_free)} free", "use a workstation with more GPU or host memory")
    return Placement("cpu", "cpu", {}, model_bytes,
                     f"does not fit the GPUs ({gb(model_bytes)} > {gb(sum(budgets))} usable): CPU, fp32 "
                     f"({gb(need)} of host memory; slow)")


def checkpoint_bytes(model_dir, dtype_bytes: int = 2) -> int:
    """Parameters in the checkpoint's safetensors headers, at dtype_bytes each (no tensor data is read)."""
    import math

    from pipeline.workstation.safetensors_check import check_safetensors

    return dtype_bytes * sum(math.prod(shape) for shard in sorted(model_dir.glob("*.safetensors"))
                             for _dtype, shape in check_safetensors(shard).values())


def probe(model_dir) -> Placement:
    """The placement for this workstation, now."""
    import os

    import torch

    gpus = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # PIPELINE_GPU_BUDGET_BYTES="N[,N...]": weights allowed per GPU (a shared GPU; tests that force a spread)
    from pipeline.settings import get
    budgets = [int(b) for b in (get("PIPELINE_GPU_BUDGET_BYTES") or "").split(",") if b.strip()]
    return choose(checkpoint_bytes(model_dir), gpus, host, budgets[:len(gpus)] or None)

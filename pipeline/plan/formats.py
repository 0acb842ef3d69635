"""Quantization formats as data: what each costs in memory, what hardware it needs, what each tool calls it.

Recipes name formats by `WeightFormat.name` / `KVFormat.name`. Everything else (planner, quantize, export, build
command) looks the format up here instead of branching on strings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    name: str
    label: str
    bits: float                     # bits per quantized weight element, scales excluded
    scale_bits_per_group: float     # bits of scale stored per group (or per output channel when group_size is None)
    default_group_size: int | None  # group along the input dimension; None = per output channel
    min_sm: float                   # lowest compute capability with kernels for it
    modelopt_config: str | None     # ModelOpt config name (None: nothing to calibrate)
    trtllm_quant_algo: str | None   # TensorRT-LLM 0.12 checkpoint quant_algo
    math: str                       # precision of the prefill GEMMs: a key of a target's tensor_tflops
    decode_class: str               # how the decode model counts its weight bytes (plan/perf.py ROW_PRECISIONS)
    gpu_calibration_only: bool = False  # ModelOpt cannot run its quantized forward on CPU
    needs_calibration: bool = True

    def bytes_for(self, in_features: int, out_features: int, group_size: int | None) -> float:
        """Bytes of one linear weight of shape (out, in) in this format, scales included."""
        elements = in_features * out_features
        if self.name == "fp16":
            return elements * 2.0
        groups = out_features * (in_features / group_size if group_size else 1)
        return elements * self.bits / 8 + groups * self.scale_bits_per_group / 8


@dataclass(frozen=True)
class KVFormat:
    name: str
    label: str
    bytes_per_element: int
    min_sm: float
    trtllm_kv_algo: str | None


WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in [
    WeightFormat("fp16", "FP16", 16, 0, None, 5.3, None, None, "fp16", "fp16", needs_calibration=False),
    # W4A16 AWQ: int4 weights, one fp16 scale per group of input channels, fp16 pre-quant scale per input channel
    # (the latter is negligible and counted in the per-layer small tensors). Prefill dequantizes to FP16 math.
    WeightFormat("int4_awq", "INT4-AWQ (W4A16)", 4, 16, 128, 8.0, "INT4_AWQ_CFG", "W4A16_AWQ", "fp16", "int4"),
    WeightFormat("int8_sq", "INT8 SmoothQuant (W8A8)", 8, 32, None, 7.2, "INT8_SMOOTHQUANT_CFG",
                 "W8A8_SQ_PER_CHANNEL", "int8", "fp8"),
    # TensorRT-LLM 0.12's own int8_wo flow calibrates nothing and quantizes at engine load (FACTS.md); decode reads
    # its 8-bit weights, prefill dequantizes to FP16 math.
    WeightFormat("int8_wo", "INT8 weight-only (W8A16)", 8, 16, None, 7.0, None, "W8A16", "fp16", "fp8",
                 needs_calibration=False),
    # INT4 weights with FP8 activations: prefill runs FP8 math (SM >= 8.9), decode reads 4-bit weights.
    WeightFormat("w4a8_awq", "INT4-AWQ weights, FP8 activations (W4A8)", 4, 16, 128, 8.9, "W4A8_AWQ_BETA_CFG",
                 "W4A8_AWQ", "fp8", "int4"),
    WeightFormat("fp8", "FP8 (E4M3)", 8, 32, None, 8.9, "FP8_DEFAULT_CFG", "FP8", "fp8", "fp8"),
    # NVFP4: E2M1 values, one FP8 scale per 16 elements (plus a per-tensor FP32 scale, negligible).
    WeightFormat("nvfp4", "NVFP4", 4, 8, 16, 10.0, "NVFP4_DEFAULT_CFG", "NVFP4", "fp4", "nvfp4",
                 gpu_calibration_only=True),
]}

KV_FORMATS: dict[str, KVFormat] = {f.name: f for f in [
    KVFormat("fp16", "FP16 KV cache", 2, 5.3, None),
    KVFormat("int8", "INT8 KV cache", 1, 7.2, "INT8"),
    KVFormat("fp8", "FP8 KV cache", 1, 8.9, "FP8"),
]}

INT4_GROUP_SIZES = (128, 64, 32)  # what TensorRT-LLM's W4A16 kernels and ModelOpt accept, preferred first


def pick_group_size(fmt: WeightFormat, dims: list[int], requested: int | None) -> tuple[int | None, str | None]:
    """Choose a group size that divides every quantized input dimension.

    Returns (group_size, problem). A requested size that does not divide is a problem (we never silently change
    what the recipe pinned); with no request the largest size that divides every dimension is chosen.
    """
    if fmt.default_group_size is None:
        return None, None
    if fmt.name == "nvfp4":  # the block size is fixed by the format
        bad = sorted({d for d in dims if d % 16})
        return 16, (f"NVFP4 needs every quantized input dimension divisible by 16; {bad} are not" if bad else None)
    candidates = (requested,) if requested else INT4_GROUP_SIZES
    for g in candidates:
        if all(d % g == 0 for d in dims):
            return g, None
    bad = sorted({d for d in dims if d % (requested or INT4_GROUP_SIZES[-1])})
    if requested:
        ok = [g for g in INT4_GROUP_SIZES if all(d % g == 0 for d in dims)]
        hint = f"use group_size = {ok[0]}" if ok else "this model cannot be quantized group-wise; use int8_wo or fp16"
        return None, f"group_size {requested} does not divide quantized input dimension(s) {bad}; {hint}"
    return None, (f"no INT4 group size in {list(INT4_GROUP_SIZES)} divides input dimension(s) {bad}; "
                  "use int8_wo or fp16")

"""Quantization formats as data: what each costs in memory, what hardware it needs, what each tool calls it.

Recipes name formats by `WeightFormat.name` / `KVFormat.name`. Everything else (planner, quantize, export, build
command, the speed models) looks the format up here and asks its record; no module outside this one compares a format
name or keeps a table keyed by one (tests/shared/test_formats.py checks the whole package for it).
"""

from __future__ import annotations

from dataclasses import dataclass

# Edge-LLM's INT4 GEMM plugin V2 (cuteDSL) needs every projection's N and K to be multiples of this; V1 takes any
INT4_V2_ALIGN = 64


@dataclass(frozen=True)
class WeightFormat:
    """Everything any module asks of a weight format: its memory cost, hardware, calibration and each tool's name."""
    name: str
    label: str
    bits: float                     # bits per quantized weight element, scales excluded
    scale_bits_per_group: float     # bits of scale stored per group (or per output channel when group_size is None)
    default_group_size: int | None  # group along the input dimension; None = per output channel
    min_sm: float                   # lowest compute capability with kernels for it
    modelopt_config: str | None     # ModelOpt config name (None: nothing to calibrate)
    trtllm_quant_algo: str | None   # TensorRT-LLM 0.12 checkpoint quant_algo
    math: str                       # precision of the prefill GEMMs: a key of a target's tensor_tflops
    decode_class: str               # the published rows' precision whose storage decode counts (ROW_PRECISIONS)
    gpu_calibration_only: bool = False  # ModelOpt cannot run its quantized forward on CPU
    needs_calibration: bool = True
    unquantized: bool = False       # fp16: weights as the checkpoint has them (no scales, no vocabulary padding)
    awq: bool = False               # AWQ: per-input-channel fp16 pre-quant scales; takes the recipe's group_size
    fixed_group_size: int | None = None     # a block size the format fixes (NVFP4: 16), not a choice
    # the ModelOpt config that simulates the deployed numerics where nothing is calibrated (int8_wo: TensorRT-LLM
    # quantizes at engine load, per channel; the reference model fake-quantizes the same way for the goldens)
    reference_modelopt_config: str | None = None
    quantized_at_engine_load: bool = False  # exported as fp16 weights; the engine builder quantizes them
    edgellm_ops: frozenset[str] = frozenset()   # ops (domain:type) Edge-LLM's ONNX export must hold for it
    edgellm_int4_plugin: bool = False   # Edge-LLM exports it through its INT4 groupwise GEMM plugin
    edgellm_moe_op: str | None = None   # the MoE plugin (domain:type) Edge-LLM's qwen3_moe export uses for its experts
    hardware: str = ""              # the tensor cores it needs, for refusals ("FP8", "FP4")
    # held only by checkpoints that arrive quantized (AutoAWQ, GPTQ): nothing here quantizes into it
    checkpoint_only: bool = False

    def bytes_for(self, in_features: int, out_features: int, group_size: int | None) -> float:
        """Bytes of one linear weight of shape (out, in) in this format, scales included."""
        elements = in_features * out_features
        if self.unquantized:
            return elements * 2.0
        groups = out_features * (in_features / group_size if group_size else 1)
        return elements * self.bits / 8 + groups * self.scale_bits_per_group / 8

    @property
    def fits_weights_to_data(self) -> bool:
        """AWQ and SmoothQuant: the calibration data reshapes the weights (per-channel scales), not only ranges, so
        a vision-language model is calibrated with image prompts too (workstation/image_calibration.py)."""
        return any(k in (self.modelopt_config or "") for k in ("AWQ", "SMOOTHQUANT"))

    @property
    def calibration_config(self) -> str | None:
        """The ModelOpt config the quantize stage applies: the format's own, or its reference simulation."""
        return self.modelopt_config or self.reference_modelopt_config

    @property
    def rounds_activations(self) -> bool:
        """Its GEMMs take activations rounded to 8 bits or fewer (SmoothQuant, FP8, W4A8, NVFP4), not FP16."""
        return self.math != "fp16"

    @property
    def takes_group_size(self) -> bool:
        """The recipe's quantization.group_size applies (INT4 AWQ formats; a zero-point checkpoint's own)."""
        return self.awq or self.checkpoint_only


@dataclass(frozen=True)
class KVFormat:
    name: str
    label: str
    bytes_per_element: int
    min_sm: float
    trtllm_kv_algo: str | None
    modelopt_num_bits: int | tuple[int, int] | None = None   # ModelOpt's K/V quantizer: 8 (INT8) or (4, 3) (E4M3)
    # The query is quantized too, per tensor in the K/V number format, with its own calibrated scale. Edge-LLM 0.11
    # (the backend that builds the FP8 KV cache: SM >= 8.9) enables ModelOpt's q_bmm quantizer whenever the KV cache
    # is FP8 and exports the scale as q_proj.q_scale, so that its runtime quantizes the prefill query to E4M3
    # without saturating (tensorrt_edgellm/quantization: quantization_configs.py, quantize.py).
    quantizes_query: bool = False

    @property
    def unquantized(self) -> bool:
        return self.modelopt_num_bits is None

    @property
    def needs_calibration(self) -> bool:
        return not self.unquantized



@dataclass(frozen=True)
class RowPrecision:
    """A precision as the published Jetson benchmark rows name it (data/perf_rows.csv), and how an engine class
    stores it: the decode model counts bytes per token from this."""
    name: str
    aliases: tuple[str, ...]            # substrings of the reference CSV's precision text, in the order tried
    weight_format: str                  # the weight format those engines run (prefill rows are filed under it)
    bits: dict[str, tuple[float, float]]   # engine class -> (bits per body weight incl. scales, lm_head bits)


Q_DQ = frozenset({":QuantizeLinear", ":DequantizeLinear"})

WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in [
    WeightFormat(name="fp16", label="FP16", bits=16, scale_bits_per_group=0, default_group_size=None, min_sm=5.3,
                 modelopt_config=None, trtllm_quant_algo=None, math="fp16", decode_class="fp16",
                 needs_calibration=False, unquantized=True, edgellm_moe_op="trt_edgellm:Fp16MoePlugin"),
    # W4A16 AWQ: int4 weights, one fp16 scale per group of input channels, fp16 pre-quant scale per input channel
    # (the latter is negligible and counted in the per-layer small tensors). Prefill dequantizes to FP16 math.
    WeightFormat(name="int4_awq", label="INT4-AWQ (W4A16)", bits=4, scale_bits_per_group=16, default_group_size=128,
                 min_sm=8.0, modelopt_config="INT4_AWQ_CFG", trtllm_quant_algo="W4A16_AWQ", math="fp16",
                 decode_class="int4", awq=True, edgellm_int4_plugin=True, edgellm_moe_op="trt_edgellm:Int4MoePlugin"),
    # INT4 with a zero point per group (AutoAWQ, GPTQ checkpoints): 4 bits, an fp16 scale and a 4-bit zero per group.
    # Edge-LLM 0.11 runs it on its INT4 groupwise GEMM with the zero baked into the nibbles (prequantized.py).
    WeightFormat(name="int4_zp", label="INT4 with zero points (AutoAWQ / GPTQ, W4A16)", bits=4,
                 scale_bits_per_group=20, default_group_size=128, min_sm=8.0, modelopt_config=None,
                 trtllm_quant_algo="W4A16_GPTQ", math="fp16", decode_class="int4", needs_calibration=False,
                 edgellm_int4_plugin=True, checkpoint_only=True),
    WeightFormat(name="int8_sq", label="INT8 SmoothQuant (W8A8)", bits=8, scale_bits_per_group=32,
                 default_group_size=None, min_sm=7.2, modelopt_config="INT8_SMOOTHQUANT_CFG",
                 trtllm_quant_algo="W8A8_SQ_PER_CHANNEL", math="int8", decode_class="fp8", edgellm_ops=Q_DQ),
    # TensorRT-LLM 0.12"s own int8_wo flow calibrates nothing and quantizes at engine load (FACTS.md); decode reads
    # its 8-bit weights, prefill dequantizes to FP16 math.
    WeightFormat(name="int8_wo", label="INT8 weight-only (W8A16)", bits=8, scale_bits_per_group=16,
                 default_group_size=None, min_sm=7.0, modelopt_config=None, trtllm_quant_algo="W8A16", math="fp16",
                 decode_class="fp8", needs_calibration=False, reference_modelopt_config="INT8_WEIGHT_ONLY_CFG",
                 quantized_at_engine_load=True),
    # INT4 weights with FP8 activations: prefill runs FP8 math (SM >= 8.9), decode reads 4-bit weights.
    WeightFormat(name="w4a8_awq", label="INT4-AWQ weights, FP8 activations (W4A8)", bits=4, scale_bits_per_group=16,
                 default_group_size=128, min_sm=8.9, modelopt_config="W4A8_AWQ_BETA_CFG", trtllm_quant_algo="W4A8_AWQ",
                 math="fp8", decode_class="int4", awq=True, hardware="FP8"),
    WeightFormat(name="fp8", label="FP8 (E4M3)", bits=8, scale_bits_per_group=32, default_group_size=None, min_sm=8.9,
                 modelopt_config="FP8_DEFAULT_CFG", trtllm_quant_algo="FP8", math="fp8", decode_class="fp8",
                 edgellm_ops=Q_DQ, hardware="FP8"),
    # NVFP4: E2M1 values, one FP8 scale per 16 elements (plus a per-tensor FP32 scale, negligible). Its ops were
    # seen in the NVFP4 export of tiny-llama on an H100 (bench/nvfp4.py).
    WeightFormat(name="nvfp4", label="NVFP4", bits=4, scale_bits_per_group=8, default_group_size=16, min_sm=10.0,
                 modelopt_config="NVFP4_DEFAULT_CFG", trtllm_quant_algo="NVFP4", math="fp4", decode_class="nvfp4",
                 gpu_calibration_only=True, fixed_group_size=16, hardware="FP4",
                 edgellm_moe_op="trt_edgellm:Nvfp4MoePlugin",
                 edgellm_ops=frozenset({"trt:TRT_FP4DynamicQuantize", "trt:DequantizeLinear"})),
]}

KV_FORMATS: dict[str, KVFormat] = {f.name: f for f in [
    KVFormat(name="fp16", label="FP16 KV cache", bytes_per_element=2, min_sm=5.3, trtllm_kv_algo=None),
    KVFormat(name="int8", label="INT8 KV cache", bytes_per_element=1, min_sm=7.2, trtllm_kv_algo="INT8",
             modelopt_num_bits=8),
    KVFormat(name="fp8", label="FP8 KV cache", bytes_per_element=1, min_sm=8.9, trtllm_kv_algo="FP8",
             modelopt_num_bits=(4, 3), quantizes_query=True),
]}

# Engine classes of the published rows (plan/perf.py): TensorRT engines from ModelOpt checkpoints keep lm_head in
# fp16; MLC's q4f16 quantizes it too.
ROW_PRECISIONS: dict[str, RowPrecision] = {r.name: r for r in [
    RowPrecision("nvfp4", ("nvfp4",), "nvfp4", {"tensorrt": (4 + 8 / 16, 16)}),
    RowPrecision("int4", ("int4", "w4a16"), "int4_awq", {"tensorrt": (4 + 16 / 128, 16), "mlc": (4 + 16 / 32,
                                                                                                4 + 16 / 32)}),
    RowPrecision("fp8", ("fp8",), "fp8", {"tensorrt": (8, 16)}),
    RowPrecision("fp16", ("fp16",), "fp16", {"tensorrt": (16, 16)}),
]}

# a vision-language model's tower: Edge-LLM exports it in FP16, or FP8 with --visual_quantization fp8 (SM 8.9+)
VISUAL_FORMATS = ("fp16", "fp8")
TOWER_FP16, TOWER_FP8 = VISUAL_FORMATS     # what callers compare a tower's precision with
DEFAULT_KV = KV_FORMATS["fp16"]             # a recipe's and an ad-hoc plan's KV cache unless they say otherwise
UNQUANTIZED = WEIGHT_FORMATS["fp16"]        # what drafts are exported in, and the no-quantization format
SMALLEST = WEIGHT_FORMATS["int4_awq"]       # the smallest format every Jetson builds: the advice when a model is big
# a recipe's quantization.weights that takes whatever weight format its pre-quantized checkpoint holds (resolved
# from the checkpoint's config when the recipe is loaded: recipe/__init__.py, held_weights)
AS_HELD = "as-is"


def row_precision(text: str) -> RowPrecision | None:
    """The row precision a reference CSV's precision text names (the first whose alias it holds)."""
    t = text.lower()
    return next((r for r in ROW_PRECISIONS.values() if any(a in t for a in r.aliases)), None)


def quantized_formats_for(sm: float) -> list[str]:
    """The quantized weight formats a board of this SM has kernels for, in registry order (for advice)."""
    return [f.name for f in WEIGHT_FORMATS.values() if not f.unquantized and not f.checkpoint_only and f.min_sm <= sm]


def kv_formats_for(sm: float) -> list[str]:
    return [k.name for k in KV_FORMATS.values() if k.min_sm <= sm]


INT4_GROUP_SIZES = (128, 64, 32)  # what TensorRT-LLM's W4A16 kernels and ModelOpt accept, preferred first


def pick_group_size(fmt: WeightFormat, dims: list[int], requested: int | None) -> tuple[int | None, str | None]:
    """Choose a group size that divides every quantized input dimension.

    Returns (group_size, problem). A requested size that does not divide is a problem (we never silently change
    what the recipe pinned); with no request the largest size that divides every dimension is chosen.
    """
    if fmt.default_group_size is None:
        return None, None
    if fmt.fixed_group_size:  # the block size is fixed by the format
        g = fmt.fixed_group_size
        bad = sorted({d for d in dims if d % g})
        return g, (f"{fmt.label} needs every quantized input dimension divisible by {g}; {bad} are not" if bad
                   else None)
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


def rounds_activations(weights: str, kv_cache: str, visual: str) -> bool:
    """A model deployed in these formats rounds what flows through it to 8 bits or fewer somewhere: its GEMMs'
    inputs, its K/V (and FP8 KV's query), or its vision tower's linears' inputs (an FP8 tower)."""
    return WEIGHT_FORMATS[weights].rounds_activations or not KV_FORMATS[kv_cache].unquantized or visual == TOWER_FP8

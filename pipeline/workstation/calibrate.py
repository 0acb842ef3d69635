"""calibrate: NVIDIA ModelOpt post-training quantization of a fetched checkpoint, saved as ModelOpt state.

The saved model is exactly the numerics that get deployed: after calibration, q/k/v and gate/up are pre-processed
for fusion here (shared pre-quant scale, shared input amax), as the TensorRT-LLM export would do. Reference outputs
computed from this model therefore match the exported checkpoint (FACTS.md: without this, cosine 0.993).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Protocol

from pipeline.contract import ExpertCalibration, QuantizeSummary, VisualLimits
from pipeline.errors import PipelineError
from pipeline.formats import (
    KV_FORMATS,
    TOWER_FP8,
    TOWER_FP16,
    VISUAL_FORMATS,
    WEIGHT_FORMATS,
    KVFormat,
    WeightFormat,
)
from pipeline.progress import StepTimer
from pipeline.texts import TextSource
from pipeline.workstation.grid import grid_modules, snap_to_export_grid
from pipeline.workstation.models import (
    gather_on_cpu,
    import_modelopt,
    input_device,
    language_layers,
    load_model,
    pick_device,
)
from pipeline.workstation.state import ModelHandoff, save_quantized, unchanged_parameters


class CalibrationSettings(Protocol):
    """What calibration reads of a recipe's [quantization.calibration] (pipeline.recipe.Calibration)."""
    @property
    def source(self) -> str | TextSource: ...
    @property
    def samples(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def seed(self) -> int: ...


# the visual towers' module names (workstation/visual_export.py TOWER_MODULES), as quantizer name patterns match them
# Gemma 4's multimodal checkpoints: vision_tower, audio_tower and their embedders into the language model
TOWER_QUANTIZER_MODULES = ("visual.", "vision_tower.", "multi_modal_projector.", "audio_tower.", "embed_vision.",
                           "embed_audio.")


# FP8 on a tower (Edge-LLM 0.11's --visual_quantization fp8, quantization/quantization_configs.py): per-tensor E4M3
# weights and static per-tensor E4M3 inputs, as FP8_DEFAULT_CFG has them. Only the tower's linears: Edge-LLM's
# exporter builds those through make_linear (FP8Linear where the checkpoint carries scales), its patch embedding as
# an FP16 Conv3d and its position table as an FP16 gather, so their quantizers (which Edge-LLM's own config leaves
# on for convolutions) would calibrate numerics no engine computes.
E4M3_PER_TENSOR = {"num_bits": (4, 3), "axis": None}


def tower_fp8_entries() -> list[dict]:
    return [{"quantizer_name": f"*{module}*{kind}_quantizer", "parent_class": "nn.Linear", "cfg": dict(E4M3_PER_TENSOR),
             "enable": True} for module in TOWER_QUANTIZER_MODULES for kind in ("weight", "input")]


def modelopt_config(fmt: WeightFormat, kv: KVFormat, group_size: int | None, visual: str = TOWER_FP16,
                    keep_fp16: tuple[str, ...] = ()) -> dict | None:
    """The ModelOpt quant config for a recipe's weight and KV formats and its tower's precision (fp16, fp8: a
    vision-language model's `quantization.visual`); None: nothing to quantize. keep_fp16: linears (by their last
    name, ModelShape.kept_fp16) left unquantized, weights and inputs, as Edge-LLM's quantizer leaves them."""
    import_modelopt()
    import modelopt.torch.quantization as mtq

    # a format calibrated by nothing (int8_wo: quantized at engine load) is simulated by its reference config, so
    # that the goldens carry the deployed numerics (pipeline/formats.py)
    name = fmt.calibration_config
    if name is None and kv.unquantized and visual == TOWER_FP16:
        return None     # an FP8 tower alone still needs the model's linears converted (all off but the tower's)
    cfg: dict[str, Any] = copy.deepcopy(getattr(mtq, name)) if name else {
        "quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    if group_size and fmt.takes_group_size:
        for entry in cfg["quant_cfg"]:
            if entry.get("quantizer_name") == "*weight_quantizer":
                blocks = entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]
                for b in blocks:
                    if "block_sizes" in b:
                        b["block_sizes"][-1] = group_size
    if kv.modelopt_num_bits is not None:
        bmm = "*[qkv]_bmm_quantizer" if kv.quantizes_query else "*[kv]_bmm_quantizer"
        cfg["quant_cfg"].append({"quantizer_name": bmm, "cfg": {"num_bits": kv.modelopt_num_bits, "axis": None}})
    # a vision-language model's tower: Edge-LLM exports it apart, in FP16, or FP8 calibrated after the language
    # model (calibrate_tower_fp8)
    cfg["quant_cfg"] += [{"quantizer_name": f"*{module}*", "enable": False} for module in TOWER_QUANTIZER_MODULES]
    cfg["quant_cfg"] += [{"quantizer_name": f"*.{name}.{kind}_quantizer", "enable": False}
                         for name in keep_fp16 for kind in ("weight", "input")]
    if visual not in VISUAL_FORMATS:
        raise ValueError(f"tower precision {visual!r}")
    return cfg


def calibrate_tower_fp8(model, forward_loop) -> int:
    """FP8 on the tower's linears, max-calibrated with `forward_loop` (image prompts through the whole model), after
    the language model's own calibration and apart from it: AWQ and SmoothQuant would otherwise search pre-quant
    scales for the tower's linears too, which Edge-LLM's FP8Linear has no input for, and a range-only language model
    stays calibrated on its text as with an FP16 tower. Returns the number of tower quantizers calibrated."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.model_calib import max_calibrate

    mtq.set_quantizer_by_cfg(model, tower_fp8_entries())
    towers = [m for name, m in model.named_modules()
              if any(name.endswith(t.rstrip(".")) and name.count(".") <= 1 for t in TOWER_QUANTIZER_MODULES)]
    for tower in towers:
        max_calibrate(tower, lambda _tower: forward_loop(model))
    quantizers = [q for t in towers for n, q in t.named_modules() if n.endswith(("weight_quantizer", "input_quantizer"))
                  and getattr(q, "is_enabled", False)]
    missing = [q for q in quantizers if q.amax is None]
    if missing or not quantizers:
        raise PipelineError(f"the FP8 tower's calibration left {len(missing)} of {len(quantizers)} quantizers "
                            "without a range", "this is a bug in the tower's calibration; please report it with the "
                            "recipe")
    return len(quantizers)


# a decoder layer's blocks whose linears the export reads (attention; a hybrid's gated delta-net or Nemotron-H's one
# mixer; the MLP), and the projections in one of them that read one input and that a fused export gives one scale.
# A gated delta-net's qkv and z projections: in NVFP4 the export's resmoothing (which Edge-LLM's quantizer keeps for
# NVFP4 hybrids) gives them one global scale, and Edge-LLM's exporter then fuses them into one GEMM (its b and a
# projections stay FP16 beside it); in INT4-AWQ they keep their own scales like every linear there
LAYER_BLOCKS = ("self_attn", "linear_attn", "mixer", "mlp")
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("in_proj_qkv", "in_proj_z"))


def fuse_for_export(model, share_awq_scales: bool = True) -> int:
    """Make the calibrated model compute what the exported checkpoint will, before anything is derived from it.

    - fused groups (q/k/v; gate/up) get one pre-quant scale and one input amax, as the export will do, where the
      backend needs it (share_awq_scales; for AWQ formats: TensorRT-LLM 0.12). Otherwise each AWQ linear keeps its
      own scale (Edge-LLM), and the groups are left alone;
    - pre-quant scales are rounded to fp16, the precision they are exported in (SmoothQuant activations are
      rounded to int8 after this scale: an fp32 scale flips some roundings the engine will make differently);
    - K and V quantizers share one amax: TensorRT-LLM 0.12 has one kv_cache_scaling_factor per layer.
    """
    import torch
    from modelopt.torch.export.quant_utils import preprocess_linear_fusion

    n = 0
    for layer in language_layers(model):
        blocks = [m for name, m in layer.named_children() if name in LAYER_BLOCKS]
        # projections that read one input; a family that stores them as one tensor (Phi-3's qkv_proj and
        # gate_up_proj) has one linear there, whose quantizers already see that input once (FUSED_GROUPS: which
        # groups, and why a gated delta-net's qkv/z is one of them)
        # (Gemma 4's K = V full layers hold v_proj = None: their q/k are not a group of three)
        groups = [[getattr(m, p) for p in parts] for m in blocks for parts in FUSED_GROUPS
                  if all(getattr(m, p, None) is not None for p in parts)]
        for group in groups:
            per_linear = not share_awq_scales and \
                getattr(getattr(group[0], "input_quantizer", None), "pre_quant_scale", None) is not None
            if hasattr(group[0], "weight_quantizer") and not per_linear:
                preprocess_linear_fusion(group)
                n += 1
        for linear in (child for m in blocks for child in m.children()):
            quantizer = getattr(linear, "input_quantizer", None)
            if quantizer is not None and quantizer.pre_quant_scale is not None:
                quantizer.pre_quant_scale = quantizer.pre_quant_scale.half().float()
        for attn in blocks:
            k, v = getattr(attn, "k_bmm_quantizer", None), getattr(attn, "v_bmm_quantizer", None)
            if k is not None and v is not None and k.is_enabled and k.amax is not None and v.amax is not None:
                k.amax = v.amax = torch.maximum(k.amax, v.amax)
    return n


def load_cuda_extensions() -> None:
    """ModelOpt's fake-quantization kernels (integer and FP8), which torch compiles on their first use on a machine
    (about a minute each on an H200) and caches (TORCH_EXTENSIONS_DIR). Loaded as a step of their own, with a line
    saying so: a first run's compile is then named, not a minute in which the first calibration sample seems to
    hang; ./bootstrap.sh compiles them ahead on a machine with a CUDA GPU. (ModelOpt's third, for MX formats, serves
    no format here.) Without a CUDA toolkit ModelOpt says it could not build them and quantizes through plain
    torch."""
    from modelopt.torch.quantization import extensions

    from pipeline.progress import Progress

    with Progress("ModelOpt's CUDA extensions (compiled on their first use on this machine, then cached)",
                  unit="extension") as bar:
        for i, load in enumerate((extensions.get_cuda_ext, extensions.get_cuda_ext_fp8), 1):
            load()
            bar.update(i, 2)


def reshapes_weights(cfg: dict) -> bool:
    """Whether the config's algorithm reshapes weights against the calibration data (AWQ's pre-quant scales,
    SmoothQuant's smoothing) rather than only recording ranges ("max": FP8, NVFP4)."""
    algorithm = cfg.get("algorithm")
    method = algorithm.get("method") if isinstance(algorithm, dict) else algorithm
    return method not in (None, "max")


def quantize(model_dir: Path, out: Path, weights: str, kv_cache: str, group_size: int | None,
             calibration: CalibrationSettings,
             recipe_file: str, handoff: ModelHandoff | None = None, visual: VisualLimits | None = None,
             visual_precision: str = TOWER_FP16, accept_uncalibrated_experts: bool = False,
             share_awq_scales: bool = True) -> QuantizeSummary:
    """Calibrate and save ModelOpt state into `out`; returns what was made (quantize.json, and the timings). With a
    `handoff`, the calibrated model is left there for the next stage of this process. visual: a vision-language model's
    image profile: where the algorithm reshapes weights against the data, the language model is calibrated with image
    prompts too (image_calibration.py), as Edge-LLM's own quantizer does (text alone optimizes the image tokens'
    ranges away); an FP8 tower (visual_precision) is calibrated with them too, as only images reach it."""
    import torch

    from pipeline.plan.shapes import load_shape
    from pipeline.progress import Progress
    from pipeline.workstation.calibration import load_texts, token_windows

    fmt, kv = WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache]
    kept = load_shape(model_dir).kept_fp16(fmt)
    cfg = modelopt_config(fmt, kv, group_size, visual_precision, kept)
    info: dict[str, Any] = {"weights": weights, "kv_cache": kv_cache, "group_size": group_size, "modelopt_config": None,
                            **({"visual": visual_precision} if visual_precision != TOWER_FP16 else {}),
                            **({"kept_fp16": list(kept)} if kept and cfg is not None else {})}
    if cfg is None:
        summary = QuantizeSummary(**info, method="none")
        (out / "quantize.json").write_text(summary.record())
        return summary

    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.config import need_calibration
    from transformers import AutoTokenizer

    device = pick_device(fmt)
    timer = StepTimer()
    torch.manual_seed(calibration.seed)
    # Weight-only max calibration (int8_wo with an fp16 KV cache) reads the weights, not data: ModelOpt documents
    # forward_loop as not required there and its own PTQ example skips it. The stage key leaves calibration out
    # for these formats too (chain.quantize_spec), so running data through them would be only time (a 3B model
    # on a CPU: 30 s of 4 x 64 tokens).
    windows: list = []
    asked: list[dict] = []      # image prompts: ids and the processor's pixel inputs
    tower_fp8 = visual is not None and visual_precision == TOWER_FP8
    if need_calibration(cfg) or tower_fp8:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        texts = load_texts(calibration.source, recipe_file)
        windows = token_windows(tokenizer, texts, calibration.samples, calibration.seq_len, calibration.seed) \
            if need_calibration(cfg) else []
        if visual is not None and (reshapes_weights(cfg) or tower_fp8):
            from pipeline.workstation.image_calibration import image_calibration
            asked = image_calibration(model_dir, tokenizer, visual)
    if handoff is not None:
        handoff.drop()
    with timer("load"):
        model = load_model(model_dir, device)

    inputs = input_device(model)
    if inputs == "cpu" and fmt.gpu_calibration_only:
        raise PipelineError(f"{fmt.label} calibration needs a CUDA GPU, and this model does not fit this "
                            f"workstation's GPUs ({model.placement['note']})", "use a workstation with more GPU memory")

    # the language model's data: its text, and image prompts where the algorithm fits weights to the data
    lm_asked = asked if reshapes_weights(cfg) else []

    def forward_loop(m):
        with Progress(f"calibrating {fmt.label}", unit="sample") as bar:
            for i, w in enumerate(windows, 1):
                m(torch.tensor([w], device=inputs))
                bar.update(i, len(windows) + len(lm_asked))
            for i, a in enumerate(lm_asked, len(windows) + 1):
                m(**{k: v.to(inputs) for k, v in a.items()})
                bar.update(i, len(windows) + len(lm_asked))

    def tower_loop(m):
        with Progress("calibrating the FP8 visual tower", unit="image prompt") as bar:
            for i, a in enumerate(asked, 1):
                m(**{k: v.to(inputs) for k, v in a.items()})
                bar.update(i, len(asked))

    if inputs != "cpu":
        with timer("cuda extensions"):
            load_cuda_extensions()
    from pipeline.workstation import experts
    with timer("calibrate"), torch.no_grad(), experts.count_routed_tokens(model) as routed:
        mtq.quantize(model, cfg, forward_loop if windows else None)
        tower_quantizers = calibrate_tower_fp8(model, tower_loop) if tower_fp8 else 0
    coverage = experts.ExpertCoverage(routed) if routed else None
    pinned = experts.pin_nvfp4_expert_inputs(model) if coverage is not None else 0     # as the engine runs them
    if coverage is not None and not pinned and not accept_uncalibrated_experts:
        experts.refuse_unreached(model, coverage, recipe_file)      # before anything is saved: no output is left
    if getattr(model, "placement", {}).get("kind") == "gpu+cpu":
        with timer("gather"):
            model = gather_on_cpu(model)     # offloaded layers: read through their hooks, then an ordinary model
    with timer("fuse"):
        fused = fuse_for_export(model, share_awq_scales or not fmt.awq)     # only AWQ's may stay per linear
    # Saved as computed (fp32 on the CPU, fp16 on a GPU): rounding it to fp16 for the CPU case would change
    # SmoothQuant's scales relative to the weights they were derived from. Every later stage restores this file.
    with timer("save"):
        unchanged = unchanged_parameters(model, model_dir)       # before snapping, which moves every grid weight
        changed = {name + ".weight" for name, _ in grid_modules(model)} - unchanged
        # int8_wo: the engine quantizes at load and keeps each scale in fp16 (grid.snap_to_export_grid)
        levels = snap_to_export_grid(model, keep=changed, fp16_scales=fmt.quantized_at_engine_load)
        saved = save_quantized(model, out, unchanged, levels)
    if handoff is not None:
        handoff.put(model_dir, out, model)
    info.update(method="modelopt", modelopt_config=fmt.calibration_config,
                device=inputs.split(":")[0], placement=getattr(model, "placement", {"kind": "cpu"}),
                calibration_tokens=sum(map(len, windows)),      # 0: weight-only, calibrated from the weights
                **({"calibration_images": len(asked)} if asked else {}),
                **({"tower_quantizers": tower_quantizers} if tower_quantizers else {}),
                **({"experts": ExpertCalibration(**coverage.as_record(), inputs_pinned=pinned or None)}
                   if coverage is not None else {}),
                fused_groups=fused, saved_bytes=saved,
                **({"awq_scales": "per-linear"} if fmt.awq and not share_awq_scales else {}))
    # the timings go to the stage's manifest (and its terminal line), not into quantize.json (QuantizeSummary.record)
    summary = QuantizeSummary(**info, seconds=timer.seconds)
    (out / "quantize.json").write_text(summary.record())
    return summary

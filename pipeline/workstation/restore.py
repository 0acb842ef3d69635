"""The quantize stage of a pre-quantized checkpoint: nothing is calibrated; the checkpoint's own numerics become the
stage's output, in the form every later stage already reads.

- ModelOpt FP8, W4A16_AWQ and NVFP4: ModelOpt's quantizers are put on the dequantized model and every amax and pre-quant
  scale is set from the checkpoint's own scales (amax = scale x the format's largest level), so the saved state is
  what a calibration that had found those scales would save: the export (either backend), the goldens and the
  accuracy stage read it as they read our own calibrations. NVFP4 (on a CUDA GPU, where ModelOpt's FP4 quantizer
  runs): the global scales are set from the checkpoint's, and the per-block scales and packed weights ModelOpt
  recomputes from the dequantized weights are checked bit for bit against the checkpoint's. A mixture-of-experts
  model's routed experts (NVIDIA's NVFP4 Nemotron 3 Nano) are restored and checked per expert in transformers' fused
  container, their inputs run at the global scale Edge-LLM's Nvfp4MoePlugin runs them at (experts.py).
- AutoAWQ and GPTQ: zero-point INT4, which ModelOpt's quantizers do not represent. Nothing is saved beside the
  record; the reference model is the checkpoint dequantized as the engine computes it (prequantized.py) and the
  Edge-LLM export hands the checkpoint's own files to Edge-LLM's loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.contract import QuantizeSummary
from pipeline.errors import PipelineError
from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
from pipeline.workstation import prequantized as pqz
from pipeline.workstation.prequantized import Prequantized

E4M3_MAX = 448.0       # NVFP4's global scales: amax / (E2M1's largest x E4M3's largest)


def _amax_of(scale, divisor: float):
    """Per element, the fp32 amax whose amax / divisor is exactly `scale` where one exists (ModelOpt divides to get
    the scale back, and the plain product can land one ulp off): the product, else whichever neighbour of it divides
    back exactly, else the product (some scales are no single fp32 division's result)."""
    import torch
    amax = scale * divisor
    for neighbour in (torch.nextafter(amax, torch.full_like(amax, float("inf"))),
                      torch.nextafter(amax, torch.full_like(amax, float("-inf")))):
        amax = torch.where((amax / divisor != scale) & (neighbour / divisor == scale), neighbour, amax)
    return amax


def _checked(key: str, scale):
    """A checkpoint's scale in fp32, or the refusal where any of its values is not finite and positive (a NaN is
    caught by isfinite, never let through by the comparison)."""
    import torch
    s = scale.to(torch.float32)
    if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
        raise PipelineError(f"{key}: scales must be finite and positive", "the checkpoint is damaged: use the files "
                            "of one checkpoint revision")
    return s


def _quantizer_scales(model, scales: dict, nvfp4: bool = False) -> int:
    """Every enabled quantizer's amax (and pre-quant scale) from the checkpoint's scales; returns how many were set.
    A quantizer the checkpoint gives no scale for is one error naming it (its numerics would be made up here).
    nvfp4: a weight's global amax comes from weight_scale_2 (its per-block scales are ModelOpt's to recompute, and
    are checked after), and both global scales are amax / (6 x 448)."""
    import torch

    from pipeline.workstation.experts import fused_experts
    set_ = 0
    for name, module in model.named_modules():
        if nvfp4 and fused_experts(module) and hasattr(module, "down_proj_weight_quantizers"):
            set_ += _expert_scales(name, module, scales)
            continue
        for role, tensor in (("weight_quantizer", "weight_scale_2" if nvfp4 else "weight_scale"),
                             ("input_quantizer", "input_scale"),
                             ("k_bmm_quantizer", "k_proj.k_scale"), ("v_bmm_quantizer", "v_proj.v_scale"),
                             ("q_bmm_quantizer", "q_proj.q_scale")):
            q = getattr(module, role, None)
            if q is None:
                continue
            if role == "input_quantizer" and f"{name}.pre_quant_scale" in scales:
                q.pre_quant_scale = scales[f"{name}.pre_quant_scale"].to(torch.float32).half().float()
            if not getattr(q, "is_enabled", False):
                continue
            key = f"{name}.{tensor}"
            largest = float(q.maxbound) * (E4M3_MAX if nvfp4 and role in ("weight_quantizer", "input_quantizer")
                                           else 1.0)
            if key not in scales:
                if role == "q_bmm_quantizer":
                    # no q_scale in the checkpoint: Edge-LLM's attention quantizes the query with scale 1.0
                    # (edgellm_export.query_scales says why ours writes one)
                    q.amax = torch.tensor(largest)
                    set_ += 1
                    continue
                raise PipelineError(f"{key}: the checkpoint holds no scale for this quantizer", "use the checkpoint's "
                                    "own files (a ModelOpt export writes one per quantized tensor)")
            amax = _amax_of(_checked(key, scales[key]), largest)
            current = getattr(q, "amax", None)
            if current is not None and current.numel() == amax.numel():
                amax = amax.reshape(current.shape)
            elif amax.numel() != 1:
                raise PipelineError(f"{key}: {amax.numel()} scales where ModelOpt's quantizer holds "
                                    f"{current.numel() if current is not None else 1}", "this is a bug; please report "
                                    "it with the checkpoint's hf_quant_config.json")
            q.amax = amax.reshape(current.shape if current is not None else ()).to(q.amax.device
                                                                                  if current is not None else "cpu")
            set_ += 1
    return set_


def _follow_the_tensors(model, scales: dict) -> None:
    """A linear the checkpoint holds without a weight scale is unquantized there: its weight and input quantizers
    are disabled, as Edge-LLM 0.11's loader decides per linear from the tensors (config.py,
    _detect_modelopt_unquantized_linears), whatever exclude_modules says or fails to say (ModelOpt writes no entry
    for some skipped modules, and mangles others)."""
    for name, m in model.named_modules():
        wq = getattr(m, "weight_quantizer", None)
        if not getattr(wq, "is_enabled", False):
            continue
        if f"{name}.weight_scale" in scales or f"{name}.weight_scale_2" in scales:
            continue
        for role in ("weight_quantizer", "input_quantizer"):
            q = getattr(m, role, None)
            if q is not None:
                q.disable()


def _expert_scales(name: str, experts, scales: dict) -> int:
    """A fused expert container's per-expert NVFP4 weight quantizers from the checkpoint's per-expert global scales
    (`{name}.{j}.{up,gate,down}_proj.weight_scale_2`). Gated experts fuse gate and up under one quantizer, so the two
    must share one global scale (ModelOpt's export writes them so); the shared input quantizers are left to
    experts.pin_nvfp4_expert_inputs (Edge-LLM's plugin runs the experts' inputs at a global scale of 1.0, whatever
    the checkpoint's input_scale says). Returns how many were set."""
    import torch

    first = experts._first_proj_attr
    parts = {first: ("gate_proj", "up_proj") if first == "gate_up_proj" else (first,), "down_proj": ("down_proj",)}
    set_ = 0
    for attr, projs in parts.items():
        for j, q in enumerate(getattr(experts, f"{attr}_weight_quantizers")):
            if not getattr(q, "is_enabled", False):
                continue
            keys = [f"{name}.{j}.{p}.weight_scale_2" for p in projs]
            missing = [k for k in keys if k not in scales]
            if missing:
                raise PipelineError(f"{missing[0]}: the checkpoint holds no scale for this expert's quantizer",
                                    "use the checkpoint's own files (a ModelOpt export writes one per expert)")
            held = [_checked(k, scales[k]).reshape(()) for k in keys]
            if any(not torch.equal(h, held[0]) for h in held[1:]):
                raise PipelineError(f"{keys[0]} and {keys[1]}: gate and up of one expert have different global "
                                    "scales, and transformers fuses them into one tensor whose quantizer holds one",
                                    "use a checkpoint exported from fused experts (ModelOpt 0.47 or later), or "
                                    "quantize the unquantized model here")
            q.amax = _amax_of(held[0], float(q.maxbound) * E4M3_MAX).to(experts.down_proj.device)
            set_ += 1
    return set_


def _experts_reproduced(model, held: dict, source: str) -> int:
    """Each fused expert container's per-expert tensors as ModelOpt's unified export splits and packs them
    (moe_utils._export_fused_experts, on a copy), compared with the checkpoint's as _nvfp4_reproduced compares a
    linear's. The experts' input_scale is not compared: the engine ignores it (see _expert_scales)."""
    import copy

    import torch
    from modelopt.torch.export.moe_utils import _export_fused_experts

    from pipeline.workstation.experts import fused_experts
    compared = 0
    for name, module in list(model.named_modules()):
        if not (fused_experts(module) and hasattr(module, "down_proj_weight_quantizers")):
            continue
        split = copy.deepcopy(module)
        _export_fused_experts(split, torch.float16)
        for sub, m in split.named_modules():
            for role in ("weight", "weight_scale", "weight_scale_2"):
                tensor = getattr(m, role, None)
                want = held.get(f"{name}.{sub}.{role}")
                if sub and want is not None and tensor is not None:
                    _same_or_refuse(f"{name}.{sub}", role, tensor, want, source)
                    compared += 1
        del split
    return compared


def _same_or_refuse(name: str, role: str, tensor, want, source: str) -> None:
    """One NVFP4 tensor ModelOpt computed against the checkpoint's (see _nvfp4_reproduced), or the refusal."""
    import torch
    got = tensor.detach().to("cpu").reshape(want.shape).to(want.dtype)
    if role == "weight":    # as E2M1 values: the checkpoint may spell a zero as -0 (code 8), ModelOpt
        # re-quantizing a dequantized -0.0 spells it +0; both are the value 0
        same = torch.equal(pqz.nvfp4_values(got), pqz.nvfp4_values(want))
    elif got.element_size() == 1:
        same = not bool(got.view(torch.uint8).ne(want.view(torch.uint8)).any())
    else:       # the fp32 global scales: within one unit in the last place (the writer's export may
        # compute amax / (6 x 448) by another sequence of fp32 operations than the single division ours
        # does: an input amax of 0.52734375 gave 0.00019618443912 there and 0.00019618442457 here)
        same = torch.equal(got, want) or bool((torch.nextafter(got, want) == want).all())
    if not same:
        raise PipelineError(f"{source}: {name}.{role}: ModelOpt's NVFP4 quantizer does not give the "
                            "checkpoint's values back from its weights and global scales (it was not "
                            "written by ModelOpt's max calibration), so its numerics cannot be "
                            "reproduced here", "use the unquantized model and quantize it here, or an "
                            "FP8 checkpoint")


def _nvfp4_reproduced(model, model_dir: Path, source: str) -> int:
    """Each NVFP4 linear's tensors as ModelOpt's export computes them from the restored model (the packed weight, its
    per-block FP8 scales, both global scales), compared with the checkpoint's: the per-block scales bit for bit, the
    weight as E2M1 values (-0 and +0 are one value), the fp32 global scales to one ulp. The numerics the goldens and
    the engine get are the checkpoint's, or the restore is refused naming the first tensor that differs. Returns how
    many tensors were compared."""
    import torch
    from modelopt.torch.export.model_config import QUANTIZATION_NVFP4
    from modelopt.torch.export.quant_utils import (
        get_activation_scaling_factor,
        get_weight_scaling_factor,
        get_weight_scaling_factor_2,
        to_quantized_weight,
    )
    from safetensors import safe_open

    from pipeline.workstation.dequantized import model_names
    rename = model_names(model)     # the checkpoint's names as the model's modules have them
    held: dict[str, Any] = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            held |= {rename(k): f.get_tensor(k) for k in f.keys()   # noqa: SIM118 - safe_open has keys() only
                     if k.endswith((".weight", ".weight_scale", ".weight_scale_2", ".input_scale"))}
    compared = _experts_reproduced(model, held, source)
    with torch.no_grad():
        for name, m in model.named_modules():
            wq = getattr(m, "weight_quantizer", None)
            if wq is None or not getattr(wq, "is_enabled", False):
                continue
            s2 = get_weight_scaling_factor_2(m)
            s = get_weight_scaling_factor(m)
            ours = {"weight": to_quantized_weight(m.weight, s, QUANTIZATION_NVFP4, s2, pqz.NVFP4_BLOCK),
                    "weight_scale": s, "weight_scale_2": s2, "input_scale": get_activation_scaling_factor(m)}
            for role, tensor in ours.items():
                want = held.get(f"{name}.{role}")
                if want is None or tensor is None:
                    continue
                _same_or_refuse(name, role, tensor, want, source)
                compared += 1
    return compared


def restore(model_dir: Path, out: Path, pq: Prequantized, kv_cache: str, handoff: Any = None) -> QuantizeSummary:
    """The quantize stage's output for a pre-quantized checkpoint (see the module doc); returns what was made."""
    from pipeline.workstation.models import load_model
    info: dict[str, Any] = {"weights": pq.weights, "kv_cache": pq.kv_cache, "group_size": pq.group_size,
                            "method": "checkpoint", "checkpoint": pq.as_record(), "modelopt_config": None}
    if kv_cache != pq.kv_cache:
        raise PipelineError(f"{pq.source}: the checkpoint's KV cache is {pq.kv_cache}; the recipe asks for {kv_cache}",
                            f"set quantization.kv_cache = '{pq.kv_cache}'")
    if pq.zero_point:
        from pipeline.workstation.prequantized import clamped_fraction, gptq_zero_offset, read_tensors, split_quantized
        linears, _ = split_quantized(pq, read_tensors(model_dir))
        offset = gptq_zero_offset(pq, next(iter(linears.values()))["qzeros"]) if pq.kind == pqz.GPTQ else 0
        info.update(zero_offset=offset, engine_clipped=round(clamped_fraction(pq, linears, offset), 8))
        summary = QuantizeSummary(**info)
        (out / "quantize.json").write_text(summary.record())
        return summary
    if pq.algo not in pqz.RESTORED:
        raise PipelineError(f"{pq.source}: {pq.label}: its numerics are not reproduced by this version yet (it "
                            f"restores ModelOpt {', '.join(pqz.RESTORED)} checkpoints)", "use one of those, or "
                            "quantize the unquantized model here")
    import modelopt.torch.quantization as mtq

    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.calibrate import modelopt_config
    from pipeline.workstation.grid import grid_modules, snap_to_export_grid
    from pipeline.workstation.models import input_device
    from pipeline.workstation.state import save_quantized, unchanged_parameters
    fmt, kv = WEIGHT_FORMATS[pq.weights], KV_FORMATS[pq.kv_cache]
    if handoff is not None:
        handoff.drop()
    from pipeline.workstation.models import pick_device
    nvfp4 = pq.algo == "NVFP4"
    # NVFP4: ModelOpt's FP4 quantizer runs on a CUDA GPU only (pick_device says so on a machine without one); the
    # others restore on the CPU, in fp32, as they always have
    model = load_model(model_dir, pick_device(fmt) if nvfp4 else "cpu")
    cfg = modelopt_config(fmt, kv, pq.group_size, keep_fp16=load_shape(model_dir).kept_fp16(fmt))
    assert cfg is not None      # a quantized format
    cfg = dict(cfg, algorithm="max")    # weights only: every other range comes from the checkpoint
    from pipeline.workstation.dequantized import model_names
    rename = model_names(model)
    for name in pq.excluded:            # what the checkpoint left unquantized stays so (under the model's names):
        # its linears' weights and inputs; the KV cache's quantizers follow kv_cache_quant_algo, for every attention
        # (NVIDIA's NVFP4 Nemotron keeps its attention in BF16 beside an FP8 KV cache)
        cfg["quant_cfg"] = [*cfg["quant_cfg"], *({"quantizer_name": f"*{rename(name.strip('*'))}*{role}*",
                                                  "enable": False} for role in ("weight_quantizer", "input_quantizer"))]
    import torch

    from pipeline.workstation.experts import pin_nvfp4_expert_inputs
    with torch.no_grad():
        mtq.quantize(model, cfg, None)
        _follow_the_tensors(model, model.pipeline_checkpoint_scales)
        restored = _quantizer_scales(model, model.pipeline_checkpoint_scales, nvfp4)
        pinned = pin_nvfp4_expert_inputs(model)     # as Edge-LLM's Nvfp4MoePlugin runs them
    checked = _nvfp4_reproduced(model, model_dir, pq.source) if nvfp4 else 0
    if fmt.awq:     # q/k/v and gate/up: ModelOpt's export folded their pre-quant scales into the norms before them;
        # a scale of ones keeps what TensorRT-LLM 0.12's loader requires of W4A16_AWQ (a prequant_scaling_factor on
        # every linear), exactly
        for _name, m in grid_modules(model):
            if m.input_quantizer.pre_quant_scale is None:
                m.input_quantizer.pre_quant_scale = torch.ones(m.weight.shape[1])
    # nothing is fused or shared (calibrate.fuse_for_export): the checkpoint's scales are what the engine reads, K and
    # V each their own (Edge-LLM's attention takes both)
    unchanged = unchanged_parameters(model, model_dir)
    changed = {name + ".weight" for name, _ in grid_modules(model)} - unchanged
    levels = snap_to_export_grid(model, keep=changed)
    saved = save_quantized(model, out, unchanged, levels)
    if handoff is not None:
        handoff.put(model_dir, out, model)
    info.update(method="checkpoint", modelopt_config=fmt.calibration_config, device=str(input_device(model)),
                calibration_tokens=0, restored_quantizers=restored, saved_bytes=saved,
                **({"reproduced_tensors": checked} if nvfp4 else {}),
                **({"expert_inputs_pinned": pinned} if pinned else {}))
    summary = QuantizeSummary(**info)
    (out / "quantize.json").write_text(summary.record())
    return summary

"""The export grid: integer-quantized weights put exactly on the levels the TensorRT-LLM export writes.

After calibration every INT4/INT8 weight is snapped to w = k * s (k the integer the exporter will write, s ModelOpt's
weight scaling factor). Reference outputs computed from the snapped model are then the deployed numerics, and the
saved state holds k (int8, a quarter of fp32, half of fp16) instead of the weights calibration rescaled.
"""

from __future__ import annotations

import contextlib

# suffixes of a saved weight's integer levels in the quantize stage's tensors file
LEVELS = ".levels"              # int8, one level per byte (INT8 formats)
LEVELS_INT4 = ".levels_int4"    # INT4 levels two per byte, (rows, cols / 2): low nibble = even column


def pack_int4(k):
    """(rows, cols) int8 levels in [-8, 7] -> (rows, cols / 2) int8, low nibble = even column."""
    return (k[:, 0::2] & 0x0F) | (k[:, 1::2] << 4)


def unpack_int4(packed):
    """pack_int4's inverse: arithmetic shifts sign-extend each nibble."""
    import torch

    low, high = (packed << 4) >> 4, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def split_levels(tensors: dict) -> dict:
    """Take the saved levels out of a tensors dict: {"<linear>.weight": int8 levels, one per weight}."""
    levels = {}
    for key in [k for k in tensors if k.endswith((LEVELS, LEVELS_INT4))]:
        t = tensors.pop(key)
        name, suffix = key.rsplit(".", 1)
        levels[name] = unpack_int4(t) if "." + suffix == LEVELS_INT4 else t
    return levels


def export_scale(quantizer):
    """ModelOpt's INT4/INT8 weight scaling factor (get_scaling_factor: export_amax / maxbound in fp32), divided on
    the CPU wherever the model lives. CUDA divides a tensor by a Python number as a multiplication by its
    reciprocal, one ulp off the true quotient for some amax; a weight exactly halfway between two levels (common
    for AWQ-scaled fp16 weights) then snapped to the other level, so one saved state gave two grids: H100, tiny
    Llama, a GPU-calibrated state restored on the CPU differed in 14 INT4-AWQ weights (top-1 0.958 vs the export).
    The exporter's own 1-ulp-different scale still reads these grid weights back as the same integers."""
    return quantizer.export_amax().float().cpu() / quantizer.maxbound


def grid_modules(model):
    """(name, linear) for every linear with an INT4 / INT8 weight quantizer."""
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        if (wq is not None and getattr(wq, "is_enabled", False) and getattr(wq, "num_bits", None) in (4, 8)
                and getattr(module, "weight", None) is not None and module.weight.dim() == 2):
            yield name, module


BLOCK_BYTES = 4 << 20     # fp32 rows snapped at a time on a CPU: a block that stays in cache through four passes


def _row_blocks(w):
    """[lo, hi) row ranges of a weight: cache-sized blocks on a CPU, the whole tensor on a GPU (one kernel each)."""
    rows = w.shape[0] if w.device.type != "cpu" else max(1, BLOCK_BYTES // (4 * w.shape[1]))
    return [(lo, min(lo + rows, w.shape[0])) for lo in range(0, w.shape[0], rows)]


def snap_to_export_grid(model, levels: dict | None = None, keep: frozenset | set = frozenset(),
                        fp16_scales: bool = False) -> dict:
    """Put every integer-quantized weight on the grid the export writes: w = round(w / s) * s.

    The fake quantizer computes w * (maxbound / amax) and the export w / (amax / maxbound): for a weight exactly
    halfway between two levels (common when calibration ran in fp16: AWQ-scaled fp16 weights often sit at
    k + 0.5 steps) the two round differently, and the reference outputs would not be the deployed numerics
    (tiny Llama calibrated in fp16: 2 of 8192 weights of one layer, top-1 agreement 0.97). On the grid both agree.

    levels: {"<linear>.weight": int8 k} saved by an earlier snap; those weights become k * s without rounding again.
    keep: names of the weights whose levels to return, on the weight's device, for save_quantized: keyed by name +
    LEVELS (int8), or name + LEVELS_INT4 for INT4 levels packed two per byte (a 3B INT4-AWQ model's 2.9 GB of
    levels took 2.4 s to save on an H200, a third of what the pipeline adds there).
    fp16_scales: the levels found with the fp32 scale, the weight made with that scale rounded to fp16, as the
    engine keeps it (TensorRT-LLM 0.12's load-time INT8 weight-only quantization, int8_wo: s = max|w| / 127 in fp32
    for the rounding, fp16(s) in the GEMM). With an INT8 KV cache the fp32 scale's weights moved K and V by up to
    2^-11 and flipped some cached values a level: layer updates 0.47% off the engine's, where exact is 0.0."""
    import torch

    kept, exact = {}, True
    with torch.no_grad():
        for name, module in grid_modules(model):
            w, key = module.weight, name + ".weight"
            s = export_scale(module.weight_quantizer).to(w.device).reshape(w.shape[0], -1, 1)
            made = s.half().float() if fp16_scales else s        # the scale the engine multiplies by
            top = 7 if module.weight_quantizer.num_bits == 4 else 127
            k = torch.empty(w.shape, dtype=torch.int8, device=w.device) if key in keep else None
            given = levels.get(key) if levels is not None else None
            in_place = w.dtype == torch.float32 and w.is_contiguous()
            for lo, hi in _row_blocks(w):
                # in place, by blocks of rows that stay in a CPU's cache (one trip through memory instead of four)
                # and through a per-group view: the same operations in the same precision as
                # (w / scale.repeat_interleave(group)).round().clamp(), without weight-sized temporaries
                x = w[lo:hi] if in_place else w[lo:hi].float().contiguous()
                grouped = x.view(hi - lo, s.shape[1], -1)
                if given is not None:
                    grouped.copy_(given[lo:hi].view(grouped.shape))
                else:
                    grouped.div_(s[lo:hi]).round_().clamp_(-top - 1, top)
                if k is not None:
                    k[lo:hi] = x
                grouped.mul_(made[lo:hi])
                if not in_place:
                    w[lo:hi] = x
            if k is not None and top == 7 and w.shape[1] % 2 == 0:
                kept[key + LEVELS_INT4] = pack_int4(k)
            elif k is not None:
                kept[key + LEVELS] = k
            exact = exact and w.dtype == torch.float32
    # fp32 weights hold the grid values exactly; fp16 weights (GPU calibration) only to fp16 precision, and the
    # fake quantizer then still differs from them by up to half an fp16 ulp: those keep it (weights_on_grid)
    model.pipeline_on_grid = exact
    model.pipeline_grid_fp16_scales = fp16_scales
    for _, module in grid_modules(model):
        module._pipeline_fp16_scales = fp16_scales
    return kept


@contextlib.contextmanager
def weights_on_grid(model):
    """Forward passes of a snapped model without its INT4/INT8 weight fake-quantizers.

    On grid weights the fake quantizer is the identity (to one ulp: 1e-5 of a logit on a 1B model) and on a CPU
    it costs 4x the forward pass itself (1B model, 32 tokens: 9.4 s vs 2.2 s). Activation, KV and pre-quant-scale
    quantizers stay on. A model that was not snapped keeps its weight quantizers.

    A model snapped in fp16 (calibrated on a GPU) holds k * s rounded to fp16. Where a linear's weight is fp32 when
    it runs (models.computed_in_fp32: the export's reference), it is put back on the grid in fp32 first (the fp16
    value is within half a level of k * s, so the levels come back exactly, times the scale the engine multiplies
    by) and computed without its fake quantizer, as an fp32-calibrated model is; its fp16 value is what
    computed_in_fp32 restores afterwards. Its fake quantizer would have used ModelOpt's fp32 scale, not the
    engine's fp16 one (int8_wo: layer updates 4e-4 off the engine's, and with an INT8 KV cache 0.0063, past the
    export check's 0.005, on an H200)."""
    on_grid = getattr(model, "pipeline_on_grid", False)
    modules = list(grid_modules(model))
    off = [m.weight_quantizer for _, m in modules] if on_grid else []
    for q in off:
        q.disable()
    snapped_in_fp16 = hasattr(model, "pipeline_grid_fp16_scales") and not on_grid
    hooks = [h for _, m in modules for h in (m.register_forward_pre_hook(_resnap_in_fp32),
                                               m.register_forward_hook(_requantize))] if snapped_in_fp16 else []
    try:
        yield model
    finally:
        for h in hooks:
            h.remove()
        for q in off:
            q.enable()


def _resnap_in_fp32(module, _args) -> None:
    import torch

    w = module.weight
    if w.dtype != torch.float32 or not module.weight_quantizer.is_enabled:
        return
    with torch.no_grad():
        s = export_scale(module.weight_quantizer).to(w.device).reshape(w.shape[0], -1, 1)
        made = s.half().float() if getattr(module, "_pipeline_fp16_scales", False) else s
        top = 7 if module.weight_quantizer.num_bits == 4 else 127
        grouped = w.data.view(w.shape[0], s.shape[1], -1)
        grouped.div_(s).round_().clamp_(-top - 1, top).mul_(made)
    module.weight_quantizer.disable()
    module._pipeline_resnapped = True


def _requantize(module, _args, _out) -> None:
    if getattr(module, "_pipeline_resnapped", False):
        module.weight_quantizer.enable()
        module._pipeline_resnapped = False

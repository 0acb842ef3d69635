"""Edge-LLM's published vision-language rows (data/vlm_rows.csv) predicted as a plan predicts them: the ViT with its
own board and tower left out of the fit (plan/parts/tower_speed.py), the prefill of image + text tokens and the
decode by the text models' fits (plan/prefill.py, plan/perf.py, which never saw a VLM row), and the Orin rows' peak
GPU memory by the memory plan at the benchmark's own build limits. `python -m pipeline.perf fit` prints each row and
the errors.

Thor's memory column counts something else (0.9 GB for a 2B model whose weights alone are more), so it is not
compared. The plan holds the visual engine's activations at its largest profile (TensorRT's default allocation); the
published AGX Orin rows (built for 16384 image tokens) hold about what the Orin NX rows (2048) hold, so the runtime
sizes them smaller there: the plan is ~10% over on AGX Orin and ~10% under on NX and Nano.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pipeline.plan.parts.tower import constants_for
from pipeline.plan.parts.tower_speed import VlmRow, fit_classes, load_rows, vit_rows


@dataclass(frozen=True)
class RowCheck:
    row: VlmRow
    vit_ms: float           # leave-one-out: constants fitted without this board and tower
    prefill_ms: float
    ttft_ms: float
    decode_tok_s: float
    memory_mb: float

    def errors(self) -> dict[str, float]:
        r = self.row
        out = {"vit": self.vit_ms / r.vit_ms - 1, "prefill": self.prefill_ms / r.prefill_ms - 1,
               "ttft": self.ttft_ms / (r.vit_ms + r.prefill_ms) - 1, "decode": self.decode_tok_s / r.decode_tok_s - 1}
        if r.gpu_mem_mb:
            out["memory"] = self.memory_mb / r.gpu_mem_mb - 1
        return out


def check_rows(rows: list[VlmRow] | None = None) -> list[RowCheck]:
    """Each published VLM row predicted as a plan would predict it: the ViT with its own board and tower left out of
    the fit, the prefill and decode by the text models' fits (which saw no VLM row)."""
    from pipeline.formats import DEFAULT_KV, WEIGHT_FORMATS, pick_group_size
    from pipeline.plan import perf, prefill
    from pipeline.plan.memory import decode_bytes_per_token
    from pipeline.plan.targets import get_target

    rows = rows if rows is not None else load_rows()
    towers = vit_rows(rows)
    data = perf.fit_data()
    out = []
    for r in rows:
        others = [t for t in towers if (t.target, t.model) != (r.target, r.model)]
        vit = constants_for(fit_classes(others), r.target).ms(r.x())
        mode = _power_mode(r.target)
        pre = prefill.predict_ttft_ms(r.shape, r.precision, r.target, r.prefill_tokens, mode, data["prefill"])
        assert pre is not None, r
        fmt = WEIGHT_FORMATS[r.precision]
        read = decode_bytes_per_token(r.shape, fmt, pick_group_size(fmt, r.shape.quantized_input_dims(fmt), None)[0],
                                      DEFAULT_KV, r.prefill_tokens + 64)
        tok = perf.fitted()[perf.TENSORRT].tok_s(read, get_target(r.target).bandwidth_bytes(mode))
        out.append(RowCheck(r, vit, pre, vit + pre, tok, benchmark_memory(r) / 1e6))
    return out


def benchmark_memory(r: VlmRow) -> int:
    """The memory plan's total at the benchmark's own limits (Edge-LLM's performance page: batch 1, --maxInputLen
    2048, --maxKVCacheCapacity 2200; visual_build 8 / 2048 / 2048 on Orin NX and Nano, 8 / 16384 / 2048 elsewhere)."""
    from pipeline.backends import get
    from pipeline.contract import BuildLimits, VisualLimits
    from pipeline.formats import DEFAULT_KV, WEIGHT_FORMATS, pick_group_size
    from pipeline.plan.memory import plan_memory
    from pipeline.plan.parts.tower import plan_tower
    from pipeline.plan.targets import get_target

    t, fmt = get_target(r.target), WEIGHT_FORMATS[r.precision]
    limits = BuildLimits.of(1, 2048, 2200)
    most = 2048 if r.target.startswith(("orin-nx", "orin-nano")) else 16384
    visual = plan_tower(r.tower, t, limits, VisualLimits(8, most, 2048), "fp16", [], None)
    group = pick_group_size(fmt, r.shape.quantized_input_dims(fmt), None)[0]
    return plan_memory(r.shape, fmt, group, DEFAULT_KV, limits, get(r.backend).runtime_overhead, t.usable_bytes,
                       t.usable_headless_bytes, visual=visual.weights + visual.activations).total


def _power_mode(target_id: str) -> str:
    """The power mode the decode fit maps this board's Edge-LLM rows to (plan/perf.py DEVICE_MAP)."""
    from pipeline.plan.perf import DEVICE_MAP
    from pipeline.plan.targets import get_target
    modes = {dev: mode for dev, mode in DEVICE_MAP.values()}
    return modes.get(target_id, get_target(target_id).fastest_power_mode)


def check_summary(checks: list[RowCheck]) -> dict[str, dict[str, float]]:
    """Median and worst absolute relative error of each predicted quantity over the rows."""
    out = {}
    for key in ("vit", "prefill", "ttft", "decode", "memory"):
        errs = [abs(c.errors()[key]) for c in checks if key in c.errors()]
        out[key] = {"median": round(statistics.median(errs), 4), "worst": round(max(errs), 4)}
    return out

"""The visual tower's time on a board, and a vision-language model's time to first token:

    vit_s(image)  = tower FLOPs(patches of the image) / (efficiency x fp16 tensor TFLOPS) + fixed_s
    ttft_s        = vit_s + prefill_s(image tokens + text tokens)          (plan/prefill.py, the text model's fit)

The ViT is FP16 on Orin (Edge-LLM exports it so; FP8 needs SM89+) and its constants are fitted per board family to
the ViT times Edge-LLM publishes (data/vlm_rows.csv: batch 1, COCO images of ~265 tokens, FP16 ViT), one row per
board and tower; `python -m pipeline.perf fit` refits them and prints the leave-one-out error, which the plan quotes.
The prefill, decode and memory columns of the same rows are not fitted: plan/vision_check.py checks the text
models' fits and the memory plan against them.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline.plan.shapes import ModelShape

ROWS = Path(__file__).parents[1] / "data" / "vlm_rows.csv"


@dataclass(frozen=True)
class VlmRow:
    target: str
    model: str
    backend: str            # the engine backend the row was measured with (backends/)
    precision: str          # the language model's weight format (plan/formats.py)
    image_tokens: int
    prefill_tokens: int     # image and text tokens of the prompt
    vit_ms: float
    prefill_ms: float
    decode_tok_s: float
    gpu_mem_mb: float | None    # peak GPU memory, MB (Orin rows)
    source: str

    @property
    def shape(self) -> ModelShape:
        from pipeline.plan.perf import known_shape
        shape = known_shape(self.model)
        assert shape is not None and shape.tower is not None, self.model    # the rows name known VLM configs
        return shape

    def x(self) -> float:
        """The image's ViT seconds at 100% of the board's FP16 tensor peak."""
        return peak_seconds(self.shape, self.target, self.image_tokens)


def load_rows(path: Path = ROWS) -> list[VlmRow]:
    with open(path, newline="") as fh:
        return [VlmRow(r["target"], r["model"], r["backend"], r["precision"], int(r["image_tokens"]),
                       int(r["prefill_tokens"]),
                       float(r["vit_ms"]), float(r["prefill_ms"]), float(r["decode_tok_s"]),
                       float(r["gpu_mem_mb"]) if r["gpu_mem_mb"] else None, r["source"])
                for r in csv.DictReader(fh)]


def vit_rows(rows: list[VlmRow]) -> list[VlmRow]:
    """One row per board and tower: the ViT's time does not depend on the language model's format."""
    seen: dict[tuple[str, str], VlmRow] = {}
    for r in rows:
        seen.setdefault((r.target, r.model), r)
    return list(seen.values())


def peak_seconds(shape: ModelShape, target_id: str, image_tokens: int, math: str = "fp16") -> float:
    from pipeline.plan.targets import get_target
    assert shape.tower is not None
    tflops = get_target(target_id).tensor_tflops[math]
    return shape.tower.flops(image_tokens * shape.tower.merge_area) / (tflops * 1e12)


def vit_class(target_id: str) -> str:
    from pipeline.plan.targets import get_target
    return get_target(target_id).family


@dataclass(frozen=True)
class VitConstants:
    efficiency: float
    fixed_s: float

    def ms(self, peak_s: float) -> float:
        return 1000 * (peak_s / self.efficiency + self.fixed_s)


def fit(rows: list[VlmRow]) -> VitConstants:
    from pipeline.plan.perf import weighted_line
    a, b = weighted_line([(r.x(), r.vit_ms / 1000, (1000 / r.vit_ms) ** 2) for r in rows])
    return VitConstants(round(1 / a, 6), round(b, 6))


def fit_classes(rows: list[VlmRow]) -> dict[str, VitConstants]:
    """Per board family where it has at least two rows of different towers, and all rows together."""
    out: dict[str, VitConstants] = {}
    for cls in sorted({vit_class(r.target) for r in rows}):
        mine = [r for r in rows if vit_class(r.target) == cls]
        if len({round(r.x(), 12) for r in mine}) >= 2:
            out[cls] = fit(mine)
    out["all"] = fit(rows)
    return out


def _constants(classes: dict[str, VitConstants], target_id: str) -> VitConstants:
    return classes.get(vit_class(target_id), classes["all"])


def leave_one_out(rows: list[VlmRow]) -> list[float]:
    """Relative error of each row's ViT time predicted by constants fitted to all the other rows."""
    return [_constants(fit_classes(rows[:i] + rows[i + 1:]), r.target).ms(r.x()) / r.vit_ms - 1
            for i, r in enumerate(rows)]


def fit_report(rows: list[VlmRow] | None = None) -> dict:
    rows = vit_rows(rows if rows is not None else load_rows())
    loo = leave_one_out(rows)
    return {"classes": {k: {"efficiency": c.efficiency, "fixed_s": c.fixed_s} for k, c in fit_classes(rows).items()},
            "rows": len(rows), "loo_median_abs_error": round(statistics.median(abs(e) for e in loo), 4),
            "loo_max_abs_error": round(max(abs(e) for e in loo), 4)}


def predict_vit_ms(shape: ModelShape, target_id: str, image_tokens: int, fit_data: dict | None,
                   math: str = "fp16") -> float | None:
    """One image of `image_tokens` tokens through the tower (None without a fit, a tower or the board's peak)."""
    from pipeline.plan.targets import get_target
    if fit_data is None or shape.tower is None or not get_target(target_id).tensor_tflops.get(math):
        return None
    classes = {k: VitConstants(v["efficiency"], v["fixed_s"]) for k, v in fit_data["classes"].items()}
    return _constants(classes, target_id).ms(peak_seconds(shape, target_id, image_tokens, math))

"""The visual tower's time on a board fitted to published rows, and a vision-language model's time to first token:

    vit_s(image)  = tower FLOPs(patches of the image) / (efficiency x fp16 tensor TFLOPS) + fixed_s
    ttft_s        = vit_s + prefill_s(image tokens + text tokens)          (plan/prefill.py, the text model's fit)

The ViT is FP16 on Orin (Edge-LLM exports it so; FP8 needs SM89+) and its constants are fitted per board family to
the ViT times Edge-LLM publishes (data/vlm_rows.csv: batch 1, COCO images of ~265 tokens, FP16 ViT), one row per
board and tower; `python -m pipeline.perf fit` refits them and prints the leave-one-out error, which the plan quotes.
The prefill, decode and memory columns of the same rows are not fitted: plan/parts/tower_check.py checks the text
models' fits and the memory plan against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.plan.parts.tower import TowerShape, VitConstants, constants_for, peak_seconds, vit_class
from pipeline.plan.rows import DATA, PublishedFit, max_abs, median_abs, read_rows, weighted_line
from pipeline.plan.shapes import ModelShape

ROWS = DATA / "vlm_rows.csv"


@dataclass(frozen=True)
class VlmRow:
    target: str
    model: str
    backend: str            # the engine backend the row was measured with (backends/)
    precision: str          # the language model's weight format (pipeline/formats.py)
    image_tokens: int
    prefill_tokens: int     # image and text tokens of the prompt
    vit_ms: float
    prefill_ms: float
    decode_tok_s: float
    gpu_mem_mb: float | None    # peak GPU memory, MB (Orin rows)
    source: str

    @property
    def tower(self) -> TowerShape:
        tower = self.shape.tower
        assert tower is not None, self.model
        return tower

    @property
    def shape(self) -> ModelShape:
        from pipeline.plan.perf import known_shape
        shape = known_shape(self.model)
        assert shape is not None and shape.tower is not None, self.model    # the rows name known VLM configs
        return shape

    def x(self) -> float:
        """The image's ViT seconds at 100% of the board's FP16 tensor peak."""
        return peak_seconds(self.tower, self.target, self.image_tokens)


def load_rows(path: Path = ROWS) -> list[VlmRow]:
    return read_rows(path, VlmRow)


def vit_rows(rows: list[VlmRow]) -> list[VlmRow]:
    """One row per board and tower: the ViT's time does not depend on the language model's format."""
    seen: dict[tuple[str, str], VlmRow] = {}
    for r in rows:
        seen.setdefault((r.target, r.model), r)
    return list(seen.values())


def fit(rows: list[VlmRow]) -> VitConstants:
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


VIT: PublishedFit[VlmRow, dict[str, VitConstants]] = PublishedFit(
    ROWS, VlmRow, fit_classes, lambda c, r: constants_for(c, r.target).ms(r.x()), lambda r: r.vit_ms)


def leave_one_out(rows: list[VlmRow]) -> list[float | None]:
    """Relative error of each row's ViT time predicted by constants fitted to all the other rows."""
    return VIT.leave_one_out(rows)


def fit_report(rows: list[VlmRow] | None = None) -> dict:
    rows = vit_rows(rows if rows is not None else load_rows())
    loo = leave_one_out(rows)
    return {"classes": {k: {"efficiency": c.efficiency, "fixed_s": c.fixed_s} for k, c in fit_classes(rows).items()},
            "rows": len(rows), "loo_median_abs_error": median_abs(loo), "loo_max_abs_error": max_abs(loo)}

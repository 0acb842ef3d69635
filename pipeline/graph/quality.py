"""The quality gate before a kit is signed: the recipe's accuracy limits against the accuracy stage's measurement,
with advice drawn from what was measured for the same model in other formats (not a fixed list).

    [validation]
    max_perplexity_increase = 0.25    # perplexity of the quantized model on the held-out text, relative: +25%
    min_top1_agreement = 0.7          # next-token agreement with the original model
    accept_quality = false            # true (or `doit build ... accept-quality=1`): sign anyway, say so
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.recipe import ValidationSettings


class QualityLimits(Protocol):
    """The gate's limits, as a recipe's [validation] holds them (and GateLimits, where no recipe is at hand)."""
    @property
    def max_perplexity_increase(self) -> float: ...
    @property
    def min_top1_agreement(self) -> float: ...


@dataclass(frozen=True)
class GateLimits:
    max_perplexity_increase: float
    min_top1_agreement: float


def not_finite(report: contract.AccuracyFigures) -> list[str]:
    """The figures of a measurement that are not numbers (NaN, Inf): a model whose logits are not finite."""
    figures = {"perplexity change": report.perplexity_change, "top-1 agreement": report.top1_agreement,
               "image top-1 agreement": report.image_top1_agreement}
    return [f"{name} is {value}" for name, value in figures.items()
            if value is not None and not math.isfinite(value)]


def misses(change: float, top1: float, heldout: str, validation: QualityLimits) -> list[str]:
    """Each limit a measurement (perplexity change, top-1 agreement on `heldout`) misses, with by how much; a figure
    that is not a number misses every limit (a comparison with NaN is false: it passed them all)."""
    if not (math.isfinite(change) and math.isfinite(top1)):
        return [f"perplexity change {change} and top-1 agreement {top1} on {heldout}: not finite"]
    out = []
    limit = validation.max_perplexity_increase
    if change > limit:
        out.append(f"perplexity {change:+.1%} on {heldout} exceeds max_perplexity_increase "
                   f"{limit:+.0%} by {(change - limit) * 100:.1f} points")
    need = validation.min_top1_agreement
    if top1 < need:
        out.append(f"top-1 agreement {top1:.1%} is below min_top1_agreement {need:.0%} by {(need - top1) * 100:.1f} "
                   "points")
    return out


def misses_of(report: contract.AccuracyFigures, validation: QualityLimits) -> list[str]:
    out = misses(report.perplexity_change, report.top1_agreement, report.heldout, validation)
    need, images = validation.min_top1_agreement, report.image_top1_agreement
    if images is not None and images < need:       # a vision-language model's image prompts: the same limit
        out.append(f"top-1 agreement on the {report.image_prompts} image prompts {images:.1%} is below "
                   f"min_top1_agreement {need:.0%} by {(need - images) * 100:.1f} points")
    return out


def measured_formats(stages: Path, fetch_digest: str, heldout: str) -> dict[str, contract.AccuracyReport]:
    """The other formats measured for the same fetched model on the same held-out text (accuracy stages on disk,
    read strictly: bounded, regular files only, every field typed; one that does not read is no report)."""
    found: dict[str, contract.AccuracyReport] = {}
    from pipeline.graph.stages.accuracy import ACCURACY
    for path in sorted(stages.glob(f"{ACCURACY.name}/*/{contract.ACCURACY_JSON}")):
        try:
            r = contract.AccuracyReport.load(path)
        except contract.ContractError:
            continue
        if r.model_digest == fetch_digest and r.heldout == heldout and r.weights:
            found[r.weights] = r
    return found


def gate(accuracy: contract.AccuracyReport, validation: ValidationSettings, others: dict[str, contract.AccuracyReport],
         recipe_file: str, accept: bool) -> str | None:
    """None when the kit may be signed silently; a line to print when accepted despite a miss; else refuses. A
    measurement that is not finite is refused whatever the limits and accept_quality say: the model computes NaN or
    Inf (a damaged checkpoint's scales), and no kit is signed from it."""
    broken = not_finite(accuracy)
    if broken:
        raise PipelineError(f"{recipe_file}: {accuracy.weights}: the accuracy stage measured {', '.join(broken)}: "
                            "the quantized model's logits are not finite, and no kit is signed from it",
                            "check the checkpoint's scales and weights (a pre-quantized checkpoint with NaN or Inf "
                            "scales computes NaN), or quantize it from the original weights")
    missed = misses_of(accuracy, validation)
    if not missed:
        return None
    better = sorted((w for w, r in others.items() if w != accuracy.weights and not misses_of(r, validation)),
                    key=lambda w: others[w].perplexity_change)
    advice = ("formats measured within the limits on this model: " + ", ".join(
        f"{w} (perplexity {others[w].perplexity_change:+.1%}, top-1 {others[w].top1_agreement:.0%})"
        for w in better)) if better else \
        "no other format has been measured on this model yet: build the recipe with another quantization.weights " \
        "to measure it"
    text = f"{accuracy.weights} misses the recipe's quality gate: {'; '.join(missed)}"
    if accept:
        return f"signed anyway (accept_quality): {text}"
    raise PipelineError(f"{recipe_file}: {text}; {advice}",
                        "use a format that measured better (quantization.weights), or sign anyway with "
                        "[validation] accept_quality = true or `doit build recipe=... accept-quality=1`")

"""Prefill (time to first token) model: a prompt costs its matrix FLOPs over the effective tensor throughput, plus a
fixed cost.

    prefill_s(isl) = flops(isl) / (efficiency x tensor_tflops[math precision]) + fixed_s + read_s
    flops(isl)     = 2 x linear_params x isl            (every body linear, every prompt token; an MoE model's
                                                         active experts per token)
                   + 2 x num_layers x isl^2 x q_size    (QK^T and AV, causal: half of 2 x 2 x isl^2 x q_size each)
                   + 2 x embedding_params               (lm_head for the last token only)

`read_s` is one decode step of the decode model (plan/perf.py): the weights are read once for the whole prompt, which
dominates short prompts; long prompts are compute-bound, scaled by the board's dense tensor-core throughput at the
format's math precision (INT4-AWQ and INT8 weight-only dequantize to FP16 math, INT8 SmoothQuant uses INT8, FP8 and
NVFP4 their own). `efficiency` and `fixed_s` are fitted per class (board family x math precision; all rows together
where a class has none) to the published prefill/TTFT rows of TensorRT engines (data/prefill_rows.csv, extracted
from the workspace's jetson-llm-benchmarks.csv with their sources). `python -m pipeline.perf fit` refits them and
prints the leave-one-out error, which the plan quotes as the prediction's error band.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.plan.rows import DATA, PublishedFit, max_abs, median_abs, read_rows
from pipeline.plan.shapes import ModelShape

ROWS = DATA / "prefill_rows.csv"


def _math(weights: str) -> str:
    """The precision of a weight format's prefill GEMMs (pipeline/formats.py)."""
    from pipeline.formats import WEIGHT_FORMATS
    return WEIGHT_FORMATS[weights].math


def prefill_flops(shape: ModelShape, isl: int) -> float:
    """What the fit prices: the linears, attention's quadratic term for the layers that attend, the last token's
    lm_head and what the parts add per token (a recurrence's state updates)."""
    return 2.0 * shape.active_linear_params(1) * isl + 2.0 * shape.attention_layers * isl * isl * shape.q_size \
        + 2.0 * shape.embedding_params + shape.prefill_flops_per_token() * isl


@dataclass(frozen=True)
class PrefillConstants:
    efficiency: float
    fixed_s: float

    def seconds(self, flops: float, tflops: float, read_s: float) -> float:
        return self.seconds_at_peak(flops / (tflops * 1e12), read_s)

    def seconds_at_peak(self, peak_s: float, read_s: float) -> float:
        """peak_s: the FLOPs' time at 100% of the tensor peak."""
        return peak_s / self.efficiency + self.fixed_s + read_s


def weight_read_s(shape: ModelShape, weights: str, target_id: str, context: int,
                  power_mode: str | None = None) -> float:
    """One decode step's time by the fitted decode model: reading the weights (and the KV cache) once."""
    from pipeline.formats import ROW_PRECISIONS, WEIGHT_FORMATS
    from pipeline.plan import perf
    from pipeline.plan.targets import get_target
    body, head = ROW_PRECISIONS[WEIGHT_FORMATS[weights].decode_class].bits[perf.TENSORRT]
    # a prompt reads the weights once; of an MoE model's experts, those its tokens reach
    return 1 / perf.fitted()[perf.TENSORRT].tok_s(perf.bytes_per_token(shape, body, head, context, 2, context),
                                                   get_target(target_id).bandwidth_bytes(power_mode))



def prefill_class(target_id: str, weights: str) -> str:
    from pipeline.plan.targets import get_target
    return f"{get_target(target_id).family}-{_math(weights)}"


@dataclass(frozen=True)
class PrefillRow:
    target: str
    model: str
    precision: str          # a weight format name (pipeline/formats.py)
    isl: int
    prefill_ms: float
    source: str

    @property
    def shape(self) -> ModelShape:
        from pipeline.plan.perf import known_shape
        shape = known_shape(self.model)
        assert shape is not None, self.model      # extract() keeps only rows of known models
        return shape

    def x(self) -> float:
        """Seconds at 100% of the tensor peak."""
        from pipeline.plan.targets import get_target
        peak = get_target(self.target).tensor_tflops[_math(self.precision)] * 1e12
        return prefill_flops(self.shape, self.isl) / peak

    def read_s(self) -> float:
        return weight_read_s(self.shape, self.precision, self.target, self.isl)


def load_rows(path: Path = ROWS) -> list[PrefillRow]:
    return read_rows(path, PrefillRow)


def fastest_published(target: str, rows: list[PrefillRow] | None = None) -> PrefillRow | None:
    """The shortest TTFT published for this target (any model, format, prompt length): the least a user of that
    board waits for a first token, against which a fixed per-request cost (the HTTP server's) is judged."""
    mine = [r for r in (load_rows() if rows is None else rows) if r.target == target]
    return min(mine, key=lambda r: r.prefill_ms) if mine else None


def fit(rows: list[PrefillRow]) -> PrefillConstants:
    """Least squares on relative error: y - read_s = a*x + b, weights 1/y^2 (y: the published time); efficiency =
    1/a."""
    from pipeline.plan.rows import weighted_line
    a, b = weighted_line([(r.x(), r.prefill_ms / 1000 - r.read_s(), (1000 / r.prefill_ms) ** 2) for r in rows])
    return PrefillConstants(round(1 / a, 6), round(b, 6))


def fit_classes(rows: list[PrefillRow]) -> dict[str, PrefillConstants]:
    classes = {prefill_class(r.target, r.precision) for r in rows}
    out = {c: fit([r for r in rows if prefill_class(r.target, r.precision) == c]) for c in sorted(classes)
           if sum(prefill_class(r.target, r.precision) == c for r in rows) >= 3}
    out["all"] = fit(rows)
    return out


def constants_for(classes: dict[str, PrefillConstants], target_id: str, weights: str) -> PrefillConstants:
    return classes.get(prefill_class(target_id, weights), classes["all"])


def predict_ms(classes: dict[str, PrefillConstants], row: PrefillRow) -> float:
    return 1000 * constants_for(classes, row.target, row.precision).seconds_at_peak(row.x(), row.read_s())


PREFILL: PublishedFit[PrefillRow, dict[str, PrefillConstants]] = PublishedFit(ROWS, PrefillRow, fit_classes,
                                                                                predict_ms, lambda r: r.prefill_ms)


def leave_one_out(rows: list[PrefillRow]) -> list[float | None]:
    """Relative error of each row predicted by constants fitted to all the other rows."""
    return PREFILL.leave_one_out(rows)


def fit_report(rows: list[PrefillRow] | None = None) -> dict:
    rows = rows if rows is not None else load_rows()
    loo = leave_one_out(rows)
    return {"classes": {k: {"efficiency": c.efficiency, "fixed_s": c.fixed_s} for k, c in fit_classes(rows).items()},
            "rows": len(rows), "loo_median_abs_error": median_abs(loo), "loo_max_abs_error": max_abs(loo)}


def predict_ttft_ms(shape: ModelShape, weights: str, target_id: str, isl: int, power_mode: str | None = None,
                    fit_data: dict | None = None) -> float | None:
    """Time to first token for a prompt of `isl` tokens at batch 1 (None where the board's throughput is unknown)."""
    from pipeline.plan.targets import get_target
    tflops = get_target(target_id).tensor_tflops.get(_math(weights))
    if not tflops or fit_data is None:
        return None
    classes = {k: PrefillConstants(v["efficiency"], v["fixed_s"]) for k, v in fit_data["classes"].items()}
    c = constants_for(classes, target_id, weights)
    read = weight_read_s(shape, weights, target_id, isl, power_mode)
    return 1000 * c.seconds(prefill_flops(shape, isl), tflops, read)


def extract(reference_csv: Path) -> list[dict]:
    """Batch-1 prefill/TTFT rows of TensorRT engines on known boards and models, one precision each."""
    from pipeline.formats import ROW_PRECISIONS
    from pipeline.plan.perf import TENSORRT, _precision, reference_match
    from pipeline.plan.targets import get_target

    out = []
    with open(reference_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            engine = r["engine"]
            if not (engine.startswith("TensorRT Edge-LLM") or engine.startswith("TensorRT-LLM")) or "EAGLE" in engine:
                continue
            match = reference_match(r)
            row = _precision(TENSORRT, r["precision"])
            prec = ROW_PRECISIONS[row].weight_format if row else None
            isl = re.sub(r"[^0-9]", "", r["isl_tokens"])
            if not (match and prec and isl):
                continue
            dev, model = match
            ms = None
            try:
                ms = float(r["ttft_or_prefill_ms"])
            except ValueError:
                try:
                    ms = int(isl) / float(r["prefill_tok_s"]) * 1000
                except (ValueError, ZeroDivisionError):
                    continue
            if not get_target(dev[0]).tensor_tflops.get(_math(prec)):
                continue
            out.append({"target": dev[0], "model": model, "precision": prec, "isl": int(isl),
                        "prefill_ms": round(ms, 3), "reference_device": r["device"], "reference_engine": engine,
                        "reference_model": r["model"], "reference_precision": r["precision"],
                        "source": r["source_url"]})
    return out

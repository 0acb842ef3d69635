"""Decode and prefill speed of a hybrid recurrent model: the dense fits, plus what its recurrent layers cost beyond
the bytes and FLOPs those fits already count.

The dense decode fit (plan/perf.py) prices a step by the bytes it reads, here with each recurrent layer's state read
and written back (plan/memory.py); the dense prefill fit (plan/prefill.py) prices a prompt by its FLOPs, here with
attention's quadratic term for the attention layers only and ~4 FLOPs per state element and token for the
recurrence. Against Edge-LLM's published Qwen3.5 rows (data/hybrid_rows.csv, with their sources) that alone is
close on Thor (decode within 5%, INT4 TTFT within 9%) and not on Orin: decode 7-19% too fast and TTFT 40-84% too
short. The Orin gap per layer grows with the layer's state (Qwen3.5 0.8B / 4B / 27B on AGX Orin: 2.2, 2.1, 2.2 x
1e-10 s per state element and step), so it is priced so:

    decode step   += recurrent_layers x state_elements x decode_s[target:kind]
    prefill       += recurrent_layers x state_elements x tokens x prefill_s[target:kind]

each constant fitted per board and recurrent kind as the mean of what each of its rows implies (never below 0: a
board whose rows the dense fits already meet costs nothing extra), for a recurrent kind with at least MIN_ROWS rows (a
lone row would only be reproduced, never checked). A board without a constant borrows the largest of its family (the
slower board: a safe side), else nothing, and the plan says so. A hybrid with MoE blocks also pays the MoE fit's
routing cost per MoE layer (plan/parts/experts_speed.py). `python -m pipeline.perf fit` refits it and prints every row's
leave-one-out error; the plan quotes their medians, per recurrent kind, as the hybrid's error bands. One Mamba-2 row
is published for a Jetson (Nemotron 3 Nano 30B-A3B, NVFP4 on Thor): too few to fit, so Mamba-2 layers are priced by
bytes and FLOPs alone, and that row's error is the band the plan quotes for them.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.plan.parts.experts_speed import dense_step_s, weights_of
from pipeline.plan.parts.hybrid import MIN_ROWS, cost, key_of
from pipeline.plan.rows import DATA, BoardRow, PublishedFit, max_abs, median_abs, read_rows
from pipeline.plan.shapes import ModelShape

ROWS = DATA / "hybrid_rows.csv"


@dataclass(frozen=True)
class HybridRow(BoardRow):
    context: int            # the KV cache and state a decode step reads past
    decode_tok_s: float
    prefill_ms: float
    prefill_tokens: int
    source: str


def load_rows(path: Path = ROWS) -> list[HybridRow]:
    return read_rows(path, HybridRow)


def _units(shape: ModelShape) -> float:
    assert shape.hybrid is not None
    return shape.hybrid.units


def dense_prefill_ms(shape: ModelShape, weights: str, target: str, tokens: int, power_mode: str | None) -> float | None:
    from pipeline.plan.perf import fit_data
    from pipeline.plan.prefill import predict_ttft_ms
    return predict_ttft_ms(shape, weights, target, tokens, power_mode, fit_data().get("prefill"))


def routing_s(shape: ModelShape, weights: str, target: str) -> tuple[float, str | None]:
    """A hybrid's MoE blocks' routing cost per step (the MoE fit's per-layer cost; plan/parts/experts_speed.py), and a
    note where
    that cost is borrowed; 0 without MoE blocks."""
    if shape.experts is None:
        return 0.0, None
    from pipeline.plan.parts.experts import layer_cost, routing_costs, weights_key
    from pipeline.plan.perf import fit_data
    layer_s, note = layer_cost(weights_key(target, weights), routing_costs(fit_data()))
    return shape.experts.layers * (layer_s or 0.0), note


def fit(rows: list[HybridRow]) -> dict[str, dict[str, float]]:
    """{"decode_s": {key: s}, "prefill_s": {key: s}}: per board and recurrent kind (of a kind with at least MIN_ROWS
    rows), the mean of its rows' implied costs, at least 0."""
    from pipeline.plan.perf import known_shape
    dec: dict[str, list[float]] = {}
    pre: dict[str, list[float]] = {}
    for r in rows:
        shape = known_shape(r.model)
        if shape is None or shape.hybrid is None:
            continue
        key, units = key_of(r.target, shape.hybrid.recurrent.kind), _units(shape)
        weights = weights_of(r.precision)
        dec.setdefault(key, []).append((1 / r.decode_tok_s - dense_step_s(shape, weights, r.target, r.power_mode,
                                                                          r.context)
                                        - routing_s(shape, weights, r.target)[0]) / units)
        ms = dense_prefill_ms(shape, weights, r.target, r.prefill_tokens, r.power_mode)
        if ms is not None:
            pre.setdefault(key, []).append((r.prefill_ms - ms) / 1000 / (units * r.prefill_tokens))
    rows_of: Counter[str] = Counter()
    for key, v in dec.items():
        rows_of[key.split(":")[1]] += len(v)
    kinds = {kind for kind, n in rows_of.items() if n >= MIN_ROWS}
    return {"decode_s": {k: max(0.0, statistics.fmean(v)) for k, v in sorted(dec.items()) if k.split(":")[1] in kinds},
            "prefill_s": {k: max(0.0, statistics.fmean(v)) for k, v in sorted(pre.items()) if k.split(":")[1] in kinds}}


def predict_tok_s(shape: ModelShape, weights: str, target: str, power_mode: str, context: int, batch: int,
                  fitted: dict[str, dict[str, float]], kv=None, group_size: int | None = None) -> float:
    assert shape.hybrid is not None
    c, _ = cost("decode_s", target, shape.hybrid.recurrent.kind, fitted)
    step = dense_step_s(shape, weights, target, power_mode, context, batch, kv, group_size) \
        + routing_s(shape, weights, target)[0] + batch * _units(shape) * c
    return batch / step


def predict_ttft_ms(shape: ModelShape, weights: str, target: str, tokens: int, power_mode: str | None,
                    fitted: dict[str, dict[str, float]]) -> float | None:
    assert shape.hybrid is not None
    ms = dense_prefill_ms(shape, weights, target, tokens, power_mode)
    if ms is None:
        return None
    c, _ = cost("prefill_s", target, shape.hybrid.recurrent.kind, fitted)
    return ms + 1000 * _units(shape) * tokens * c


def _shape(r: HybridRow) -> ModelShape:
    from pipeline.plan.perf import known_shape
    shape = known_shape(r.model)
    assert shape is not None and shape.hybrid is not None, r.model      # the rows name known hybrid models
    return shape


DECODE: PublishedFit[HybridRow, dict[str, dict[str, float]]] = PublishedFit(
    ROWS, HybridRow, fit, lambda c, r: predict_tok_s(_shape(r), weights_of(r.precision), r.target, r.power_mode,
                                                     r.context, 1, c), lambda r: r.decode_tok_s)
TTFT: PublishedFit[HybridRow, dict[str, dict[str, float]]] = PublishedFit(
    ROWS, HybridRow, fit, lambda c, r: predict_ttft_ms(_shape(r), weights_of(r.precision), r.target, r.prefill_tokens,
                                                       r.power_mode, c), lambda r: r.prefill_ms)


def fit_report(rows: list[HybridRow] | None = None) -> dict[str, Any]:
    """The constants and every row predicted with its board's constants fitted without it (leave-one-out: a board
    with one row borrows as a plan would)."""
    rows = rows if rows is not None else load_rows()
    checks: list[dict[str, Any]] = []
    for r, tok, ms in zip(rows, DECODE.held_out_predictions(rows), TTFT.held_out_predictions(rows), strict=True):
        hybrid = _shape(r).hybrid
        assert tok is not None and hybrid is not None
        checks.append({"target": r.target, "model": r.model, "precision": r.precision, "kind": hybrid.recurrent.kind,
                       "decode": round(tok, 1), "decode_published": r.decode_tok_s,
                       "decode_error": round(tok / r.decode_tok_s - 1, 4),
                       "ttft_ms": None if ms is None else round(ms, 1), "ttft_published_ms": r.prefill_ms,
                       "ttft_error": None if ms is None else round(ms / r.prefill_ms - 1, 4)})
    return {**fit(rows), "rows": len(rows), "checks": checks,
            "bands": {kind: _bands([c for c in checks if c["kind"] == kind])
                      for kind in sorted({c["kind"] for c in checks})}}


def _bands(checks: list[dict[str, Any]]) -> dict[str, float | None]:
    """One recurrent kind's leave-one-out errors: median and worst, decode and TTFT (what the plan quotes)."""
    dec = [c["decode_error"] for c in checks]
    pre = [c["ttft_error"] for c in checks]
    return {"rows": len(checks), "decode_loo_median_abs_error": median_abs(dec),
            "decode_loo_max_abs_error": max_abs(dec), "ttft_loo_median_abs_error": median_abs(pre),
            "ttft_loo_max_abs_error": max_abs(pre)}

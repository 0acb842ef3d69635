"""Decode speed of a mixture-of-experts model fitted to published rows: the experts its tokens reach, read like any
weight, plus a fixed cost per MoE layer and step (routing, top-k, the expert dispatch of Edge-LLM's Int4MoePlugin
(Marlin) and NVFP4 MoE plugins).

A decode step reads the model's dense parts (attention, norms, routers, the LM head, the KV cache) and of each MoE
layer only the experts its tokens are routed to (plan/shapes.py Experts: `active` for one token, the expected number
of distinct experts for a batch, routing taken as independent). Priced by the dense fit alone, Qwen3-30B-A3B on Thor
comes out 11% (NVFP4) to 27% (INT4) faster than published. The gap is a fixed cost per step, not a slower read:
fitted as a fixed cost, the batch-1 rows predict the published batch-8 rows (which read 6.5x the experts per step)
within -9% to +4% without seeing them; fitted as a lower expert-read efficiency instead, the same rows
under-predict batch 8 by 23-32%. So

    step_s = (dense_bytes + expert_bytes) / (efficiency x bandwidth) + fixed_s + moe_layers x layer_s[key]

with `efficiency` and `fixed_s` the dense fit's (plan/perf.py, which never sees an MoE row) and `layer_s` fitted per
board family and row precision (key "thor-nvfp4", ...) to Edge-LLM's published batch-1 MoE rows (data/moe_rows.csv,
with their sources): each row gives the cost that explains it exactly, and the fit is their mean. A key without a
row borrows the same precision on another board family, else the largest fitted cost, and the plan says so.
`python -m pipeline.perf fit` refits it, prints each batch-1 row's leave-one-out error (its key fitted without it)
and checks the batch-8 rows; the plan quotes the median leave-one-out error as MoE decode's error band.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.formats import KVFormat
from pipeline.plan.parts.experts import key_of, layer_cost
from pipeline.plan.rows import DATA, BoardRow, PublishedFit, max_abs, median_abs, read_rows
from pipeline.plan.shapes import ModelShape

ROWS = DATA / "moe_rows.csv"


@dataclass(frozen=True)
class MoeRow(BoardRow):
    batch: int
    context: int            # tokens in each sequence's KV cache, on average over the answer
    decode_tok_s: float     # generated tok/s of the whole batch
    source: str
    prefill_ms: float | None = None     # the prompt's prefill (batch 1), published beside the decode figure
    prefill_tokens: int | None = None


def load_rows(path: Path = ROWS) -> list[MoeRow]:
    return read_rows(path, MoeRow)


def split_bytes(shape: ModelShape, weights: str, context: int, batch: int = 1, kv: KVFormat | None = None,
                group_size: int | None = None) -> tuple[float, float]:
    """(dense bytes, expert bytes) one decode step of `batch` sequences reads: the weights once (of the experts,
    those the batch reaches), each sequence's KV cache (`context` tokens; FP16 unless `kv` says, as the published
    rows ran). group_size: the format's default for the model unless given."""
    from pipeline.formats import DEFAULT_KV, WEIGHT_FORMATS, pick_group_size
    from pipeline.plan.memory import decode_bytes_per_token, linear_bytes
    fmt, kv = WEIGHT_FORMATS[weights], kv or DEFAULT_KV
    group = group_size if group_size is not None else pick_group_size(fmt, shape.quantized_input_dims(fmt), None)[0]
    total = decode_bytes_per_token(shape, fmt, group, kv, context, batch)
    total += (batch - 1) * shape.sequence_read_bytes(kv.bytes_per_element, context)
    experts = linear_bytes([x for x in shape.linears(batch) if x[0].startswith("experts.")], fmt, group)
    return total - experts, experts


def weights_of(precision: str) -> str:
    """The weight format of a published row's precision (a ROW_PRECISIONS name)."""
    from pipeline.formats import ROW_PRECISIONS
    return ROW_PRECISIONS[precision].weight_format


def dense_step_s(shape: ModelShape, weights: str, target: str, power_mode: str, context: int, batch: int = 1,
                 kv: KVFormat | None = None, group_size: int | None = None) -> float:
    """One step of `batch` sequences by the dense fit: every byte it reads (the experts it reaches; a hybrid's
    recurrent states, plan/parts/hybrid_speed.py) and its fixed cost."""
    from pipeline.plan import perf
    from pipeline.plan.targets import get_target
    dense_fit = perf.fitted()[perf.TENSORRT]
    dense, experts = split_bytes(shape, weights, context, batch, kv, group_size)
    return (dense + experts) / (dense_fit.efficiency * get_target(target).bandwidth_bytes(power_mode)) \
        + dense_fit.fixed_s


def implied_layer_s(row: MoeRow, shape: ModelShape) -> float:
    """The cost per MoE layer and step that makes the dense fit predict this row exactly."""
    assert shape.experts is not None
    dense_s = dense_step_s(shape, weights_of(row.precision), row.target, row.power_mode, row.context, row.batch)
    return (row.batch / row.decode_tok_s - dense_s) / shape.experts.layers


def predict_tok_s(shape: ModelShape, weights: str, target: str, power_mode: str, context: int, batch: int,
                  layer_s: float, kv: KVFormat | None = None, group_size: int | None = None) -> float:
    """Generated tok/s of `batch` sequences decoding together at `context` tokens each."""
    assert shape.experts is not None
    step = dense_step_s(shape, weights, target, power_mode, context, batch, kv, group_size) \
        + shape.experts.layers * layer_s
    return batch / step


def fit(rows: list[MoeRow]) -> dict[str, float]:
    """layer_s per key (board family and row precision): the mean of its batch-1 rows' implied costs."""
    from pipeline.plan.perf import known_shape
    by: dict[str, list[float]] = {}
    for r in rows:
        shape = known_shape(r.model)
        if r.batch == 1 and shape is not None:
            by.setdefault(key_of(r.target, r.precision), []).append(implied_layer_s(r, shape))
    return {k: round(statistics.fmean(v), 8) for k, v in sorted(by.items())}


def predict_row(layer_s: dict[str, float], r: MoeRow) -> float | None:
    """A published row's decode by fitted costs (None where none is fitted for its key or a borrowable one)."""
    from pipeline.plan.perf import known_shape
    shape = known_shape(r.model)
    assert shape is not None and shape.experts is not None, r.model      # the rows name known MoE models
    cost, _ = layer_cost(key_of(r.target, r.precision), layer_s)
    return None if cost is None else predict_tok_s(shape, weights_of(r.precision), r.target, r.power_mode, r.context,
                                                   r.batch, cost)


EXPERTS: PublishedFit[MoeRow, dict[str, float]] = PublishedFit(ROWS, MoeRow, fit, predict_row,
                                                                lambda r: r.decode_tok_s)


def fit_report(rows: list[MoeRow] | None = None) -> dict:
    """The constants, and each row predicted: batch-1 rows with their key fitted without them (leave-one-out; a key
    with one row borrows as a plan would), batch-8 rows with the full fit (never fitted to them)."""
    rows = rows if rows is not None else load_rows()
    checks: list[dict[str, Any]] = []
    for r, got in zip(rows, EXPERTS.held_out_predictions(rows, held_out=lambda r: r.batch == 1), strict=True):
        if got is not None:
            checks.append({"target": r.target, "model": r.model, "precision": r.precision, "batch": r.batch,
                           "context": r.context, "published": r.decode_tok_s, "predicted": round(got, 1),
                           "error": round(got / r.decode_tok_s - 1, 4), "leave_one_out": r.batch == 1})
    prefill = prefill_checks(rows)
    return {"layer_s": fit(rows), "rows": len(rows), "checks": checks,
            "loo_median_abs_error": median_abs([c["error"] for c in checks if c["leave_one_out"]]),
            "loo_max_abs_error": max_abs([c["error"] for c in checks if c["leave_one_out"]]),
            "batch_max_abs_error": max_abs([c["error"] for c in checks if not c["leave_one_out"]]),
            "prefill_checks": prefill,
            "prefill_median_abs_error": median_abs([c["error"] for c in prefill]),
            "prefill_max_abs_error": max_abs([c["error"] for c in prefill])}


def prefill_checks(rows: list[MoeRow]) -> list[dict[str, Any]]:
    """Each published MoE prefill predicted by the dense prefill fit (plan/prefill.py: the active experts' FLOPs per
    token, the experts the prompt reaches read once), which never saw an MoE row: not fitted, only checked."""
    from pipeline.plan.perf import fit_data, known_shape
    from pipeline.plan.prefill import predict_ttft_ms
    pre = fit_data().get("prefill")
    out: list[dict[str, Any]] = []
    for r in rows:
        shape = known_shape(r.model)
        if r.prefill_ms is None or r.prefill_tokens is None or shape is None or pre is None:
            continue
        ms = predict_ttft_ms(shape, weights_of(r.precision), r.target, r.prefill_tokens, r.power_mode, pre)
        if ms is not None:
            out.append({"target": r.target, "model": r.model, "precision": r.precision, "tokens": r.prefill_tokens,
                        "published_ms": r.prefill_ms, "predicted_ms": round(ms, 1),
                        "error": round(ms / r.prefill_ms - 1, 4)})
    return out

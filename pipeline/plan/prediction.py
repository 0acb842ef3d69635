"""The plan's speed prediction: single-stream decode by power mode, aggregate decode per batch and time to first
token. A decode step costs the bytes it reads by the dense fit (plan/perf.py) plus each part's term (an MoE's
routing, a hybrid's recurrence: plan/parts/), a prompt its FLOPs by the prefill fit (plan/prefill.py) plus each part's
term; the error bands are the first part's with a speed fit of its own, else the dense fits'."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import backends
from pipeline.contract import Prediction
from pipeline.plan.memory import decode_bytes_per_token
from pipeline.plan.perf import fit_data, fitted

if TYPE_CHECKING:
    from pipeline.formats import KVFormat, WeightFormat
    from pipeline.plan.parts.base import Part
    from pipeline.plan.request import PlanRequest
    from pipeline.plan.shapes import ModelShape
    from pipeline.plan.targets import TargetProfile


def step_s(shape: ModelShape, fmt: WeightFormat, group_size: int | None, kv: KVFormat, target: TargetProfile,
           mode: str, context: int, batch: int, perf_class: str) -> float:
    """One decode step of `batch` sequences at `context` tokens each: the weights read once (of an MoE's experts,
    those the batch reaches), each sequence's KV cache and states, the fit's fixed cost, and the parts' terms."""
    c, fit = fitted()[perf_class], fit_data()
    read = decode_bytes_per_token(shape, fmt, group_size, kv, context, batch) \
        + (batch - 1) * shape.sequence_read_bytes(kv.bytes_per_element, context)
    extra = sum(p.decode_s(shape, fmt.name, target.id, batch, fit) for p in shape.parts)
    return read / (c.efficiency * target.bandwidth_bytes(mode)) + c.fixed_s + extra


def predict_speed(req: PlanRequest, engine: backends.Backend, backend: str | None, fmt, group_size: int | None, kv,
                  warnings: list[str]):
    """(the speed prediction, decode tok/s by power mode, the power mode, TTFT ms): single-stream decode from the
    bytes each token reads, aggregate decode per batch, prefill."""
    t, shape = req.target, req.shape
    context = req.limits.max_input_len
    mode = req.power_mode or t.fastest_power_mode
    constants = fitted()[engine.perf_class]
    bytes_read = decode_bytes_per_token(shape, fmt, group_size, kv, context)
    for p in shape.parts:
        warnings.extend(p.speed_notes(t.id, fmt.name, fit_data()))

    def speed(m: str, b: int) -> float:
        return b / step_s(shape, fmt, group_size, kv, t, m, context, b, engine.perf_class)
    levels = batch_levels(req.limits.max_batch_size)
    by_mode = {m: round(speed(m, 1), 1) for m in t.bandwidth_gbs}
    by_batch = {str(b): round(speed(mode, b), 1) for b in levels} if mode in t.bandwidth_gbs else None
    if backend is not None and engine.perf_note:
        warnings.append(engine.perf_note)
    support = backends.family_support(backend, shape.architecture) if backend else None
    if support is not None and support.text_only:
        warnings.append(f"towers: {support.text_only}")
    if support is not None and support.unbuilt(fmt.name):
        warnings.append(f"planned, not built yet as {fmt.name}: {support.unbuilt(fmt.name)}")
    for p in shape.parts:
        unbuilt = p.unbuilt(support) if support is not None else None
        if unbuilt:
            warnings.append(f"planned, not built yet with its {p.called}: {unbuilt}")
    ttft, ttft_fields = predict_ttft(req, mode)
    prediction = Prediction(
        power_mode=mode, bandwidth_gbs=t.bandwidth_gbs.get(mode), context_tokens=context,
        bytes_per_token=int(bytes_read), engine_class=engine.perf_class, efficiency=constants.efficiency,
        fixed_s=constants.fixed_s, by_power_mode=by_mode, aggregate_tok_s_by_batch=by_batch,
        speculative_note=(f"decode predicted without speculation: the {req.draft.method} draft's gain depends on "
                          "its acceptance rate on your prompts (validation measures it)")
        if req.draft is not None else None,
        **ttft_fields)
    return prediction, by_mode, mode, ttft


def batch_levels(max_batch_size: int) -> list[int]:
    """The batches the plan predicts aggregate decode for: powers of two up to max_batch_size, and it."""
    return sorted({1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size} | {max_batch_size})


def _fitted_part(shape: ModelShape) -> Part | None:
    """The part whose own fit gives the error bands (the first with one), None for the dense fits'."""
    return next((p for p in shape.parts if p.own_speed_fit), None)


def ttft_ms(shape: ModelShape, weights: str, target_id: str, tokens: int, mode: str | None, fit: dict
            ) -> float | None:
    """A prompt of `tokens` tokens at batch 1: the prefill fit on its FLOPs and weight reads, and the parts' terms."""
    from pipeline.plan.prefill import predict_ttft_ms
    ms = predict_ttft_ms(shape, weights, target_id, tokens, mode, fit.get("prefill"))
    return None if ms is None else ms + sum(p.prefill_ms(shape, target_id, tokens, fit) for p in shape.parts)


def predict_ttft(req: PlanRequest, mode: str) -> tuple[float | None, dict]:
    """Time to first token for a prompt of max_input_len tokens, and the prediction's fields: the decode and
    prefill fits' leave-one-out error bands and the TTFT at a few prompt lengths."""
    data = fit_data()
    own = _fitted_part(req.shape)
    fields: dict = {"decode_error_band": own.decode_band(data) if own else data.get("loo_median_abs_error")}
    pre = data.get("prefill")
    if pre is None:
        return None, fields

    def ttft_at(n: int) -> float | None:
        return ttft_ms(req.shape, req.weights, req.target.id, n, mode, data)
    ms = ttft_at(req.limits.max_input_len)
    # at a few prompt lengths too: the device interpolates at its golden prompts' length to compare with what it
    # measured (it has no model shape of its own)
    lengths = sorted({n for n in (8, 32, 128, 512) if n < req.limits.max_input_len} | {req.limits.max_input_len})
    by_len = {str(n): ttft_at(n) for n in lengths}
    # a part with its own fit: its error on its published rows (an MoE's: the dense fit's error on the MoE prefill
    # rows, which it never saw; a hybrid's: its leave-one-out error per recurrent kind)
    ttft_band = own.ttft_band(data) if own else None
    fields.update(ttft_input_tokens=req.limits.max_input_len,
                  ttft_ms_by_input_tokens={k: round(v, 1) for k, v in by_len.items() if v is not None},
                  ttft_error_band=ttft_band if ttft_band is not None else pre["loo_median_abs_error"])
    return (None if ms is None else round(ms, 1)), fields

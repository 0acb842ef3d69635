"""The plan's speed prediction: single-stream decode by power mode, aggregate decode per batch and time to first
token, each from the fit that applies to the model (dense, mixture-of-experts: plan/moe.py, hybrid recurrent:
plan/hybrid_perf.py), with that fit's error band."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import backends
from pipeline.contract import Prediction
from pipeline.plan.memory import decode_bytes_per_token
from pipeline.plan.perf import fitted

if TYPE_CHECKING:
    from pipeline.plan.planner import PlanRequest


def predict_speed(req: PlanRequest, engine: backends.Backend, backend: str | None, fmt, group_size: int | None, kv,
                warnings: list[str]):
    """(the speed prediction, decode tok/s by power mode, the power mode, TTFT ms): single-stream decode from the
    bytes each token reads, aggregate decode per batch, prefill."""
    t = req.target
    context = req.limits.max_input_len
    mode = req.power_mode or t.fastest_power_mode
    constants = fitted()[engine.perf_class]
    bytes_read = decode_bytes_per_token(req.shape, fmt, group_size, kv, context)
    kv_per_seq = req.shape.sequence_read_bytes(kv.bytes_per_element, context)    # what each further sequence adds
    levels = batch_levels(req.limits.max_batch_size)
    if req.shape.hybrid is not None:     # its recurrent layers' cost beyond their bytes (plan/hybrid_perf.py)
        from pipeline.plan import hybrid_perf
        from pipeline.plan.perf import fit_data
        hybrid_fit = fit_data().get("hybrid") or {}
        for which, what in (("decode_s", "decode"), ("prefill_s", "TTFT")):
            note = hybrid_perf.cost(which, t.id, req.shape.hybrid.recurrent.kind, hybrid_fit)[1]
            if note:
                warnings.append(f"{what}: {note}")
        routing_note = hybrid_perf.routing_s(req.shape, fmt.name, t.id)[1]     # its MoE blocks' routing
        if routing_note:
            warnings.append(f"decode: {routing_note}")

        def hybrid_speed(m: str, b: int) -> float:
            return hybrid_perf.predict_tok_s(req.shape, fmt.name, t.id, m, context, b, hybrid_fit, kv, group_size)
        by_mode = {m: round(hybrid_speed(m, 1), 1) for m in t.bandwidth_gbs}
        by_batch = {str(b): round(hybrid_speed(mode, b), 1) for b in levels} if mode in t.bandwidth_gbs else None
    elif req.shape.experts is not None:       # the experts the tokens reach, and a routing cost per layer (plan/moe.py)
        from pipeline.plan import moe
        from pipeline.plan.perf import fit_data
        cost, borrowed = moe.layer_cost(moe.key_of(t.id, fmt.decode_class), (fit_data().get("moe") or {}).get(
            "layer_s") or {})
        if borrowed:
            warnings.append(f"decode: {borrowed}")

        def speed(m: str, b: int) -> float:
            return moe.predict_tok_s(req.shape, fmt.name, t.id, m, context, b, cost or 0.0, kv, group_size)
        by_mode = {m: round(speed(m, 1), 1) for m in t.bandwidth_gbs}
        by_batch = {str(b): round(speed(mode, b), 1) for b in levels} if mode in t.bandwidth_gbs else None
    else:
        by_mode = {m: round(constants.tok_s(bytes_read, t.bandwidth_bytes(m)), 1) for m in t.bandwidth_gbs}
        by_batch = {str(b): round(constants.aggregate_tok_s(bytes_read, kv_per_seq, b, t.bandwidth_bytes(mode)), 1)
                    for b in levels} if mode in t.bandwidth_gbs else None
    if backend is not None and engine.perf_note:
        warnings.append(engine.perf_note)
    support = backends.family_support(backend, req.shape.architecture) if backend else None
    if support is not None and support.text_only:
        warnings.append(f"text only: {support.text_only}")
    if support is not None and support.unbuilt(fmt.name):
        warnings.append(f"planned, not built yet as {fmt.name}: {support.unbuilt(fmt.name)}")
    if support is not None and support.experts_not_built and req.shape.experts is not None:
        warnings.append(f"planned, not built yet with its routed experts: {support.experts_not_built}")
    ttft, ttft_fields = predict_ttft(req, mode)
    prediction = Prediction(
        power_mode=mode, bandwidth_gbs=t.bandwidth_gbs.get(mode), context_tokens=context,
        bytes_per_token=int(bytes_read), engine_class=engine.perf_class, efficiency=constants.efficiency,
        fixed_s=constants.fixed_s, by_power_mode=by_mode, aggregate_tok_s_by_batch=by_batch,
        speculative_note=("decode predicted without speculation: EAGLE-3's gain depends on the draft's acceptance "
                          "rate on your prompts (validation measures it)") if req.draft is not None else None,
        **ttft_fields)
    return prediction, by_mode, mode, ttft


def batch_levels(max_batch_size: int) -> list[int]:
    """The batches the plan predicts aggregate decode for: powers of two up to max_batch_size, and it."""
    return sorted({1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size} | {max_batch_size})


def predict_ttft(req: PlanRequest, mode: str) -> tuple[float | None, dict]:
    """Time to first token for a prompt of max_input_len tokens, and the prediction's fields: the decode and
    prefill fits' leave-one-out error bands and the TTFT at a few prompt lengths."""
    from pipeline.plan.perf import fit_data
    from pipeline.plan.prefill import predict_ttft_ms

    data = fit_data()
    moe_fit, hybrid_fit = data.get("moe") or {}, data.get("hybrid") or {}
    band = _hybrid_band(req, hybrid_fit, "decode_loo_median_abs_error") if req.shape.hybrid is not None else \
        moe_fit.get("loo_median_abs_error") if req.shape.experts is not None else data.get("loo_median_abs_error")
    fields: dict = {"decode_error_band": band}
    pre = data.get("prefill")
    if pre is None:
        return None, fields

    def ttft_at(n: int) -> float | None:
        if req.shape.hybrid is not None:
            from pipeline.plan import hybrid_perf
            return hybrid_perf.predict_ttft_ms(req.shape, req.weights, req.target.id, n, mode, hybrid_fit)
        return predict_ttft_ms(req.shape, req.weights, req.target.id, n, mode, pre)
    ms = ttft_at(req.limits.max_input_len)
    # at a few prompt lengths too: the device interpolates at its golden prompts' length to compare with what it
    # measured (it has no model shape of its own)
    lengths = sorted({n for n in (8, 32, 128, 512) if n < req.limits.max_input_len} | {req.limits.max_input_len})
    by_len = {str(n): ttft_at(n) for n in lengths}
    # an MoE model: the dense fit's error on the published MoE prefill rows, which it never saw (plan/moe.py); a
    # hybrid: its leave-one-out error on the published hybrid rows (plan/hybrid_perf.py)
    ttft_band = _hybrid_band(req, hybrid_fit, "ttft_loo_median_abs_error") if req.shape.hybrid is not None else \
        moe_fit.get("prefill_median_abs_error") if req.shape.experts is not None else None
    fields.update(ttft_input_tokens=req.limits.max_input_len,
                  ttft_ms_by_input_tokens={k: round(v, 1) for k, v in by_len.items() if v is not None},
                  ttft_error_band=ttft_band if ttft_band is not None else pre["loo_median_abs_error"])
    return (None if ms is None else round(ms, 1)), fields


def _hybrid_band(req: PlanRequest, hybrid_fit: dict, which: str) -> float | None:
    """The hybrid fit's leave-one-out error for this model's recurrent kind (plan/hybrid_perf.py)."""
    assert req.shape.hybrid is not None
    return ((hybrid_fit.get("bands") or {}).get(req.shape.hybrid.recurrent.kind) or {}).get(which)

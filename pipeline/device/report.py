"""The device validation report: checks against the kit's goldens and the plan, as JSON, Markdown and an SVG chart.

Every figure under "measured" was measured in this run (or, for a reused engine, in the run that built it, which the
report says): outputs and speed by the backend's runtime, memory by the board's /proc/meminfo sampled while each phase
ran (pipeline/device/memwatch.py), the KV cache as the runtime says it allocated it. A figure nothing measured is
None and reads "not measured". Each check says what was required, what was measured and by how much it failed;
memory checks compare with the plan's prediction (within MEMORY_TOLERANCE: the plan is an estimate) and with the
board's usable memory.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

from pipeline import backends, contract
from pipeline.device.checks import GB, check, gb, memory_checks, speech_rates
from pipeline.errors import PipelineError
from pipeline.plan.memory import TOKENS_PER_BLOCK

GAP = 0.25                  # measured vs predicted speed beyond this is flagged, with the usual causes
def kv_check(kv: contract.KvAllocation | None, plan: contract.Plan, backend: backends.Backend) -> list[contract.Check]:
    """The paged KV cache the runtime says it allocated, against the plan's cap (max_batch_size sequences of
    max_seq_len, in whole blocks) and its byte budget."""
    lim = plan.limits
    cap = -(-lim.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK * lim.max_batch_size
    budget = plan.memory.kv_cache if plan.memory else 0
    name = "KV cache allocated by the runtime within the plan's budget"
    if kv is None:
        if not backend.reports_kv_allocation:
            return []
        return [check(name, f"<= {cap} tokens", None, False, "the runtime did not report its KV cache allocation")]
    tokens, size = kv.tokens, kv.bytes
    # the runtime prints GiB to two decimals: a byte figure is within the budget up to that rounding
    ok = tokens <= cap and (not size or not budget or size <= budget + 0.005 * 2**30)
    return [check(name, f"<= {cap} tokens ({lim.max_batch_size} x {lim.max_seq_len}, whole blocks of "
                   f"{TOKENS_PER_BLOCK}) and <= {gb(budget)}", tokens, ok, tokens - cap)]


def build_report(goldens: contract.Goldens, validation: contract.Validation, plan: contract.Plan,
                 board: contract.Board, build: contract.BuildRecord | None, reused: bool,
                 validation_memory: contract.PhaseMemory | None) -> contract.Report:
    """The checks and figures of one device run; build=None: no engine was built in it (an installed bundle), so
    no build figure or build check appears (another board's figures are never reported as measured here)."""
    if plan.speech is not None:     # a speech model without a decoder's parts: its own gate (device/speech_report.py)
        from pipeline.device.speech_report import speech_model_report
        return speech_model_report(goldens, validation, plan, board, build, reused, validation_memory)
    need = goldens.min_token_agreement
    if len(validation.prompts) != len(goldens.prompts):
        # zip() would drop the prompts the runtime did not answer and pass the report on the rest
        raise PipelineError(f"the runtime answered {len(validation.prompts)} of the kit's "
                            f"{len(goldens.prompts)} golden prompts", "see the validation log in the work directory")
    backend = backends.get(plan.backend)
    unit = validation.agreement_unit
    compared = [backends.agreement(g, v, unit) for g, v in zip(goldens.prompts, validation.prompts, strict=True)]
    per_prompt = [contract.PromptOutcome(prompt=g.prompt, agreement=round(score, 4), ttft_s=v.ttft_s,
                                         decode_tok_s=v.decode_tok_s, acceptance=v.acceptance, vit_ms=v.vit_ms,
                                         near_tie_at=None if tie is None else tie.step)
                  for g, v, (score, tie) in zip(goldens.prompts, validation.prompts, compared, strict=True)]
    # the visual engine's time per image, at the test images' mean size, beside the plan's at that size
    imaged = [(g.image_tokens or 0, v.vit_ms) for g, v in zip(goldens.prompts, validation.prompts, strict=True)
              if g.image and v.vit_ms is not None]
    vit_ms = round(sum(ms for _, ms in imaged) / len(imaged), 3) if imaged else None
    image_tokens = round(sum(n for n, _ in imaged) / len(imaged)) if imaged else None
    by_tokens = plan.visual.vit_ms_by_image_tokens if plan.visual else None
    predicted_vit = at_size(by_tokens or {}, image_tokens) if image_tokens else None
    agreement = min(p.agreement for p in per_prompt)
    checks = [check(f"{unit} agreement with goldens (worst prompt)", f">= {need}", agreement,
                     agreement >= need, round(need - agreement, 4))]
    checks += kv_check(validation.kv_cache, plan, backend)
    memory = plan.memory
    if build is not None:
        checks += memory_checks("engine build", build.memory, memory.build_peak if memory else None, None, "")
        checks += memory_checks("engine build", build.memory, None, memory.usable_headless if memory else None,
                                "a headless board's usable memory (the rest may page out to swap)", ram_only=True)
    checks += memory_checks("runtime", validation_memory, memory.total if memory else None,
                            memory.usable_headless if memory else None, "the board's usable memory (headless)")
    speech = speech_rates(goldens, validation, plan, checks)

    rates = [p.decode_tok_s for p in per_prompt if p.decode_tok_s]
    measured_decode = round(sum(rates) / len(rates), 2) if rates else None
    ttfts = [p.ttft_s for p in per_prompt if p.ttft_s is not None]
    measured_ttft = round(sum(ttfts) / len(ttfts), 4) if len(ttfts) == len(per_prompt) else None
    accept = [p.acceptance for p in per_prompt if p.acceptance]
    prompt_tokens = round(sum(len(g.input_ids) for g in goldens.prompts) / len(goldens.prompts))
    by_len = plan.prediction.ttft_ms_by_input_tokens if plan.prediction else None
    predicted_ttft = at_size(by_len or {}, prompt_tokens)
    predicted_decode = plan.predicted_decode_tok_s
    predicted_accept, spec_note = _speculative(plan, goldens)
    if predicted_accept is not None and predicted_decode is not None:
        predicted_decode = predicted_accept[1]
    gaps = speed_gaps(measured_decode, predicted_decode, None if measured_ttft is None else measured_ttft * 1000,
                      predicted_ttft, board)
    lim = plan.limits
    notes = [f"weak check: the golden answer to {g.prompt!r} has {len(g.output_ids)} tokens, less than half of "
             f"max_new_tokens ({goldens.max_new_tokens}); ask for longer answers" for g in goldens.prompts
             if len(g.output_ids) < goldens.max_new_tokens / 2]
    notes += [f"the answer to {g.prompt!r} took token {tie.token_id} at step {tie.step + 1} of {len(g.output_ids)}, "
              + (f"{tie.margin} nats below the golden's choice (a near tie: at most {goldens.tie_logprob})"
                 if tie.cause != "routing" else
                 f"the reference's answer with MoE block {tie.layer}'s k-th and next expert swapped (their router "
                 f"logits {tie.margin} apart: a near tie, at most {goldens.tie_logprob})")
              + "; it agrees up to there and the rest answers another context, so it was not compared"
              for g, (_, tie) in zip(goldens.prompts, compared, strict=True) if tie is not None]
    if unit == "token" and not validation.load_runs:       # the serve session's run, asked for no load run
        notes.append("no load run (--load-requests 0): no throughput or latency figures at concurrency")
    if reused:
        notes.append("engine reused from an earlier run of this kit: its build time and memory were measured then")
    if validation.kv_cache is None and not backend.reports_kv_allocation:
        notes.append(f"{backend.label}'s runtime does not report its KV cache allocation; the engine's KV capacity "
                     f"was fixed at build time to the plan's {lim.max_batch_size} x {lim.max_seq_len} tokens")
    if spec_note:
        notes.append(spec_note)
    elif plan.speculative and accept:
        notes.append(f"decode is predicted without speculation; the measured rate includes the "
                     f"{plan.speculative.method} draft's gain")
    peaks = [v.peak_unified_memory for v in validation.prompts if v.peak_unified_memory]
    return contract.Report(
        ok=all(c.ok for c in checks), checks=checks,
        device=contract.DeviceFacts(target=board.target, board=board.board, jetpack=board.jetpack, l4t=board.l4t,
                                    tensorrt=board.tensorrt, power_mode=board.power_mode,
                                    bandwidth_gbs=board.bandwidth_gbs),
        measured=contract.Measured(
            decode_tok_s=measured_decode, ttft_s=measured_ttft, prompt_tokens=prompt_tokens,
            speed_source=validation.speed_source, acceptance=round(sum(accept) / len(accept), 3) if accept else None,
            kv_cache=validation.kv_cache, build_seconds=build.seconds if build else None,
            build_memory=build.memory if build else None,
            runtime_memory=validation_memory, peak_unified_memory=max(peaks) if peaks else None,
            load_runs=validation.load_runs, vit_ms=vit_ms, image_tokens=image_tokens),
        predicted=contract.Predicted(
            decode_tok_s=predicted_decode, ttft_ms=predicted_ttft, memory_total=memory.total if memory else None,
            build_peak=memory.build_peak if memory else None, kv_cache_bytes=memory.kv_cache if memory else None,
            kv_cache_tokens=-(-lim.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK * lim.max_batch_size,
            usable_headless=memory.usable_headless if memory else None,
            power_mode=plan.prediction.power_mode if plan.prediction else None,
            aggregate_tok_s_by_batch=_batched(plan, validation.load_runs), vit_ms=predicted_vit,
            acceptance=predicted_accept[0] if predicted_accept else None),
        gaps=gaps, notes=notes, prompts=per_prompt, speech=speech)


def _speculative(plan: contract.Plan, goldens: contract.Goldens) -> tuple[tuple[float, float] | None, str]:
    """An MTP draft's predicted tokens per step (what it earned along the golden answers in deployed numerics:
    workstation/mtp.acceptance_on) and the decode rate with it (plan/speculative.speculative_decode_tok_s), with the
    note that says how; (None, "") where there is no such prediction."""
    from pipeline.plan.speculative import speculative_decode_tok_s
    spec, per_step, steps = plan.speculative, goldens.draft_tokens_per_step, goldens.draft_steps
    base = plan.predicted_decode_tok_s
    if spec is None or spec.method != "mtp" or per_step is None or not steps or base is None or \
            plan.prediction is None:
        return None, ""
    draft_bytes = spec.draft_params * 2         # the draft runs in fp16
    decode = speculative_decode_tok_s(base, per_step, steps, draft_bytes, plan.prediction.bytes_per_token)
    first = goldens.draft_first_token_accuracy
    return (per_step, round(decode, 2)), (
        f"decode is predicted with the MTP draft: run along the golden answers in deployed numerics it made "
        f"{per_step:.2f} tokens a base step with {steps} proposals a step"
        + (f" (its first proposal right {first:.0%} of the time)" if first is not None else "")
        + f"; each step is one pass over the base ({plan.prediction.bytes_per_token / 1e9:.3f} GB) and {steps} over "
        f"the draft ({draft_bytes / 1e9:.3f} GB): {base} tok/s without it")


def _batched(plan: contract.Plan, load: list[contract.LoadResult]) -> dict[str, float] | None:
    """The plan's aggregate decode prediction at each load run's batch."""
    by_batch = plan.prediction.aggregate_tok_s_by_batch if plan.prediction else None
    if not by_batch or not load:
        return None
    wanted = {str(r.batch) for r in load}
    return {b: v for b, v in by_batch.items() if b in wanted}


def at_size(by_len: dict[str, float], tokens: int) -> float | None:
    """A plan figure given at several sizes (TTFT by prompt tokens, ViT time by image tokens) at `tokens`,
    interpolated linearly between the sizes it was computed for."""
    pts = sorted((int(k), v) for k, v in by_len.items())
    if not pts:
        return None
    lo = max((p for p in pts if p[0] <= tokens), default=pts[0])
    hi = min((p for p in pts if p[0] >= tokens), default=pts[-1])
    if hi[0] == lo[0]:
        return round(lo[1], 1)
    return round(lo[1] + (hi[1] - lo[1]) * (tokens - lo[0]) / (hi[0] - lo[0]), 1)


def speed_gaps(decode: float | None, decode_pred: float | None, ttft_ms: float | None, ttft_pred: float | None,
               board: contract.Board) -> list[contract.Gap]:
    """Each figure more than GAP off its prediction, with the likely causes (usually the power mode)."""
    causes = []
    if board.power_mode and not board.power_mode.startswith("MAXN"):
        causes.append(f"power mode is {board.power_mode}, not MAXN (sudo nvpmodel -m 0)")
    causes += ["jetson_clocks not run (sudo jetson_clocks pins the clocks at their maximum)",
               "the desktop is running (sudo systemctl isolate multi-user.target)",
               "another process holds memory or the GPU (see tegrastats / jtop)"]
    out = []
    for what, got, want, slower in (("decode tok/s", decode, decode_pred, lambda g, w: g < w),
                                    ("TTFT ms", ttft_ms, ttft_pred, lambda g, w: g > w)):
        if got and want and abs(got / want - 1) > GAP:
            out.append(contract.Gap(figure=what, measured=got, predicted=want, off_by=round(got / want - 1, 3),
                                    likely_causes=causes if slower(got, want) else
                                    ["faster than predicted: the prediction is conservative here; please report it"]))
    return out


def figures(report: contract.Report) -> list[tuple[str, str, float | None, float | None]]:
    """(what, unit, measured, predicted) for the table and the chart, in display units."""
    m, p = report.measured, report.predicted

    def in_gb(v):
        return None if v is None else v / GB
    return [("decode", "tok/s", m.decode_tok_s, p.decode_tok_s),
            (f"TTFT, {m.prompt_tokens}-token prompts", "ms", None if m.ttft_s is None else m.ttft_s * 1000, p.ttft_ms),
            ("runtime memory", "GB", in_gb(m.runtime_memory.taken if m.runtime_memory else None),
             in_gb(p.memory_total)),
            ("engine build memory", "GB", in_gb(m.build_memory.taken if m.build_memory else None),
             in_gb(p.build_peak)),
            ("KV cache", "tokens", m.kv_cache.tokens if m.kv_cache else None, p.kv_cache_tokens),
            *([(f"ViT, {m.image_tokens}-token images", "ms", m.vit_ms, p.vit_ms)] if m.image_tokens else []),
            *([("draft acceptance", "tokens/step", m.acceptance, p.acceptance)] if m.acceptance else []),
            *load_figures(report)]


def load_figures(report: contract.Report) -> list[tuple[str, str, float | None, float | None]]:
    """Decode of all sequences together at each load run's batch: batch / the median gap between a request's
    tokens (prefill and queueing excluded, as in the prediction) next to the plan's aggregate prediction."""
    predicted = report.predicted.aggregate_tok_s_by_batch or {}
    return [(f"decode, concurrency {r.concurrency} (batch {r.batch}), all sequences", "tok/s",
             round(r.batch / r.itl_p50_s, 2) if r.itl_p50_s else None, predicted.get(str(r.batch)))
            for r in report.measured.load_runs]


def _fmt(v: float | None, unit: str, missing: str = "not measured") -> str:
    if v is None:
        return missing
    return f"{v:,.0f} {unit}" if unit == "tokens" or v >= 100 else f"{v:.2f} {unit}"


def _ms(v: float | None) -> str:
    return "not measured" if v is None else f"{v * 1000:.2f} ms"


def write_report(out: Path, report: contract.Report) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / contract.REPORT_JSON).write_text(report.dumps())
    d, m = report.device, report.measured
    lines = [f"# Validation on {d.target or d.board}: {'PASSED' if report.ok else 'FAILED'}", "",
             "| check | required | measured | ok | short by |", "|---|---|---|---|---|"]
    for c in report.checks:
        lines.append(f"| {c.check} | {c.required} | {'not measured' if c.measured is None else c.measured}"
                     f" | {'yes' if c.ok else 'NO'} | {'' if c.by is None else c.by} |")
    lines += ["", f"| figure (power mode {d.power_mode}) | measured | predicted | measured / predicted |",
              "|---|---|---|---|"]
    for what, unit, got, want in figures(report):
        ratio = f"{got / want:.2f}" if got is not None and want else ""
        lines.append(f"| {what} | {_fmt(got, unit)} | {_fmt(want, unit, 'not predicted')} | {ratio} |")
    if m.load_runs:
        lines += ["", "| clients | requests/s | generated tok/s (end to end) | TTFT p50 / p95 | inter-token p50 / p95 "
                  "|",
                  "|---|---|---|---|---|"]
        lines += [f"| {r.concurrency} | {r.req_s} | {r.tok_s} | {_ms(r.ttft_p50_s)} / {_ms(r.ttft_p95_s)}"
                  f" | {_ms(r.itl_p50_s)} / {_ms(r.itl_p95_s)} |" for r in m.load_runs]
    lines += ["", f"Speed measured by: {m.speed_source or 'not measured'}. Memory: what each phase took from "
              "the board (MemAvailable and SwapFree sampled while it ran)."
              + (f" KV cache: {m.kv_cache.source}." if m.kv_cache else ""),
              "Engine build: " + ("not measured in this run" if m.build_seconds is None else f"{m.build_seconds} s")
              + ".", ""]
    lines += [f"Note: {n}." for n in report.notes]
    for g in report.gaps:
        lines.append(f"**{g.figure} is {g.off_by:+.0%} off the prediction** ({g.measured} vs "
                     f"{g.predicted}). Likely causes: " + "; ".join(g.likely_causes) + ".")
    (out / contract.REPORT_MD).write_text("\n".join(lines) + "\n")
    (out / contract.REPORT_SVG).write_text(chart_svg(report))


def chart_svg(report: contract.Report) -> str:
    """Measured next to predicted for each figure, one row each: labelled, with values and units, each row scaled to
    its own larger value (the units differ), and the ratio."""
    rows = figures(report)
    width, label_w, bar_w, row_h, top = 760, 230, 380, 46, 58
    height = top + row_h * len(rows) + 40
    d = report.device
    title = f"Validation on {d.target or d.board}: {'PASSED' if report.ok else 'FAILED'} (power mode {d.power_mode})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="13">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="12" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{label_w}" y="34" width="12" height="10" fill="#283c78"/>'
           f'<text x="{label_w + 18}" y="44">measured</text>',
           f'<rect x="{label_w + 100}" y="34" width="12" height="10" fill="#96aae6"/>'
           f'<text x="{label_w + 118}" y="44">predicted (plan)</text>']
    for i, (what, unit, got, want) in enumerate(rows):
        y = top + i * row_h
        scale = max(v for v in (got, want, 1e-12) if v is not None)
        out.append(f'<text x="12" y="{y + 22}">{escape(what)} ({escape(unit)})</text>')
        for j, (value, color) in enumerate(((got, "#283c78"), (want, "#96aae6"))):
            by = y + 4 + j * 18
            w = 0 if value is None else max(1, int(bar_w * value / scale))
            out.append(f'<rect x="{label_w}" y="{by}" width="{w}" height="14" fill="{color}"/>')
            out.append(f'<text x="{label_w + w + 6}" y="{by + 12}">{escape(_fmt(value, unit))}</text>')
        if got is not None and want:
            out.append(f'<text x="{width - 12}" y="{y + 22}" text-anchor="end">x{got / want:.2f}</text>')
    out.append(f'<text x="12" y="{height - 14}" fill="#555">measured on the board in this run; predicted by the '
               f'kit\'s plan; x = measured / predicted</text>')
    return "\n".join(out + ["</svg>"]) + "\n"

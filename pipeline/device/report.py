"""The device validation report: checks against the kit's goldens and the plan, as JSON, Markdown and an SVG chart.

Every figure under "measured" was measured in this run (or, for a reused engine, in the run that built it, which the
report says): outputs and speed by the backend's runtime, memory by the board's /proc/meminfo sampled while each phase
ran (pipeline/device/memwatch.py), the KV cache as the runtime says it allocated it. A figure nothing measured is
None and reads "not measured". Each check says what was required, what was measured and by how much it failed;
memory checks compare with the plan's prediction (within MEMORY_TOLERANCE: the plan is an estimate) and with the
board's usable memory.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from xml.sax.saxutils import escape

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.plan.memory import TOKENS_PER_BLOCK

MEMORY_TOLERANCE = 0.2      # measured memory up to 20% over the plan's estimate passes; more fails the check
GAP = 0.25                  # measured vs predicted speed beyond this is flagged, with the usual causes
GB = 1e9


def token_agreement(golden: typing.Sequence, produced: typing.Sequence) -> float:
    """Fraction of golden tokens reproduced up to the first divergence (greedy decoding diverges for good after)."""
    n = 0
    for a, b in zip(golden, produced, strict=False):  # up to the shorter: a short answer is a divergence
        if a != b:
            break
        n += 1
    return n / max(1, len(golden))


def _check(name: str, required: str, measured, ok: bool, by=None) -> dict:
    return {"check": name, "required": required, "measured": measured, "ok": bool(ok), "by": None if ok else by}


def _gb(v) -> str:
    return "not measured" if v is None else f"{v / GB:.2f} GB"


def memory_checks(phase: str, measured: dict | None, planned: int | None, usable: int | None, usable_what: str,
                  ram_only: bool = False) -> list[dict]:
    """What a phase took from the board against the plan's estimate for it (within MEMORY_TOLERANCE) and against
    the board's usable memory. Memory nothing measured fails both: the report may not pass on a guess."""
    taken = measured.get("taken") if measured else None
    if taken is not None and ram_only and measured:
        taken -= measured.get("swapped") or 0
    out = []
    if planned:
        limit = int(planned * (1 + MEMORY_TOLERANCE))
        out.append(_check(f"{phase} memory within the plan's estimate (+{MEMORY_TOLERANCE:.0%})",
                          f"<= {limit} bytes ({_gb(limit)}; plan {_gb(planned)})", taken,
                          taken is not None and taken <= limit, None if taken is None else taken - limit))
    if usable:
        what = f"{phase} {'RAM' if ram_only else 'memory'} within {usable_what}"
        out.append(_check(what, f"<= {usable} bytes ({_gb(usable)})", taken, taken is not None and taken <= usable,
                          None if taken is None else taken - usable))
    return out


def kv_check(kv: dict | None, plan: contract.Plan, backend: backends.Backend) -> list[dict]:
    """The paged KV cache the runtime says it allocated, against the plan's cap (max_batch_size sequences of
    max_seq_len, in whole blocks) and its byte budget."""
    lim = plan.limits
    cap = -(-lim.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK * lim.max_batch_size
    budget = int((plan.memory or {}).get("kv_cache") or 0)
    name = "KV cache allocated by the runtime within the plan's budget"
    if kv is None:
        if not backend.reports_kv_allocation:
            return []
        return [_check(name, f"<= {cap} tokens", None, False, "the runtime did not report its KV cache allocation")]
    tokens, size = kv.get("tokens"), kv.get("bytes")
    # the runtime prints GiB to two decimals: a byte figure is within the budget up to that rounding
    ok = isinstance(tokens, int) and tokens <= cap and (not size or not budget or size <= budget + 0.005 * 2**30)
    return [_check(name, f"<= {cap} tokens ({lim.max_batch_size} x {lim.max_seq_len}, whole blocks of "
                   f"{TOKENS_PER_BLOCK}) and <= {_gb(budget)}", tokens, ok,
                   None if not isinstance(tokens, int) else tokens - cap)]


def build_report(goldens: contract.Goldens, validation: dict, plan: contract.Plan, board: contract.Board,
                 build: dict, validation_memory: dict | None) -> dict:
    need = goldens.min_token_agreement
    if len(validation["prompts"]) != len(goldens.prompts):
        # zip() would drop the prompts the runtime did not answer and pass the report on the rest
        raise PipelineError(f"the runtime answered {len(validation['prompts'])} of the kit's "
                            f"{len(goldens.prompts)} golden prompts", "see the validation log in the work directory")
    backend = backends.get(plan.backend)
    per_prompt = []
    for g, v in zip(goldens.prompts, validation["prompts"], strict=True):
        # token ids where the runtime gives them (TensorRT-LLM); else characters of the decoded text (Edge-LLM)
        agree = token_agreement(g.output_ids, v["output_ids"]) if backend.agreement_unit == "token" else \
            token_agreement(list(g.text), list(v["output_text"]))
        per_prompt.append({"prompt": g.prompt, "agreement": round(agree, 4), "ttft_s": v.get("ttft_s"),
                           "decode_tok_s": v.get("decode_tok_s"), "acceptance": v.get("acceptance")})
    agreement = min(p["agreement"] for p in per_prompt)
    checks = [_check(f"{backend.agreement_unit} agreement with goldens (worst prompt)", f">= {need}", agreement,
                     agreement >= need, round(need - agreement, 4))]
    checks += kv_check(validation.get("kv_cache"), plan, backend)
    memory = plan.memory or {}
    build_memory = build.get("memory")
    checks += memory_checks("engine build", build_memory, memory.get("build_peak"), None, "")
    checks += memory_checks("engine build", build_memory, None, memory.get("usable_headless"),
                            "a headless board's usable memory (the rest may page out to swap)", ram_only=True)
    checks += memory_checks("runtime", validation_memory, memory.get("total"), memory.get("usable_headless"),
                            "the board's usable memory (headless)")

    rates = [p["decode_tok_s"] for p in per_prompt if p["decode_tok_s"]]
    measured_decode = round(sum(rates) / len(rates), 2) if rates else None
    ttfts = [p["ttft_s"] for p in per_prompt if p["ttft_s"] is not None]
    measured_ttft = round(sum(ttfts) / len(ttfts), 4) if len(ttfts) == len(per_prompt) else None
    accept = [p["acceptance"] for p in per_prompt if p["acceptance"]]
    prompt_tokens = round(sum(len(g.input_ids) for g in goldens.prompts) / len(goldens.prompts))
    predicted_ttft = ttft_at(plan.prediction.get("ttft_ms_by_input_tokens") or {}, prompt_tokens)
    predicted_decode = plan.predicted_decode_tok_s
    gaps = speed_gaps(measured_decode, predicted_decode, None if measured_ttft is None else measured_ttft * 1000,
                      predicted_ttft, board)
    lim = plan.limits
    notes = [f"weak check: the golden answer to {g.prompt!r} has {len(g.output_ids)} tokens, less than half of "
             f"max_new_tokens ({goldens.max_new_tokens}); ask for longer answers" for g in goldens.prompts
             if len(g.output_ids) < goldens.max_new_tokens / 2]
    if build.get("reused"):
        notes.append("engine reused from an earlier run of this kit: its build time and memory were measured then")
    if validation.get("kv_cache") is None and not backend.reports_kv_allocation:
        notes.append(f"{backend.label}'s runtime does not report its KV cache allocation; the engine's KV capacity "
                     f"was fixed at build time to the plan's {lim.max_batch_size} x {lim.max_seq_len} tokens")
    if plan.speculative and accept:
        notes.append("decode is predicted without speculation; the measured rate includes EAGLE-3's gain")
    return {"format": contract.Report.FORMAT, "ok": all(c["ok"] for c in checks), "checks": checks,
            "device": {k: getattr(board, k) for k in ("target", "board", "jetpack", "l4t", "tensorrt", "power_mode",
                                                      "bandwidth_gbs")},
            "measured": {"decode_tok_s": measured_decode, "ttft_s": measured_ttft, "prompt_tokens": prompt_tokens,
                         "speed_source": validation.get("speed_source"),
                         "acceptance": round(sum(accept) / len(accept), 3) if accept else None,
                         "kv_cache": validation.get("kv_cache"),
                         "build_seconds": build.get("seconds"), "build_memory": build_memory,
                         "runtime_memory": validation_memory,
                         "peak_unified_memory": max((v.get("peak_unified_memory") or 0
                                                     for v in validation["prompts"]), default=0) or None},
            "predicted": {"decode_tok_s": predicted_decode, "ttft_ms": predicted_ttft,
                          "memory_total": memory.get("total"), "build_peak": memory.get("build_peak"),
                          "kv_cache_bytes": memory.get("kv_cache"),
                          "kv_cache_tokens": -(-lim.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
                          * lim.max_batch_size,
                          "usable_headless": memory.get("usable_headless"),
                          "power_mode": plan.prediction.get("power_mode")},
            "gaps": gaps, "notes": notes, "prompts": per_prompt}


def ttft_at(by_len: dict[str, float], tokens: int) -> float | None:
    """The plan's TTFT prediction at `tokens`, interpolated linearly between the lengths it was computed for."""
    pts = sorted((int(k), v) for k, v in by_len.items())
    if not pts:
        return None
    lo = max((p for p in pts if p[0] <= tokens), default=pts[0])
    hi = min((p for p in pts if p[0] >= tokens), default=pts[-1])
    if hi[0] == lo[0]:
        return round(lo[1], 1)
    return round(lo[1] + (hi[1] - lo[1]) * (tokens - lo[0]) / (hi[0] - lo[0]), 1)


def speed_gaps(decode: float | None, decode_pred: float | None, ttft_ms: float | None, ttft_pred: float | None,
               board: contract.Board) -> list[dict]:
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
            out.append({"figure": what, "measured": got, "predicted": want, "off_by": round(got / want - 1, 3),
                        "likely_causes": causes if slower(got, want) else
                        ["faster than predicted: the prediction is conservative here; please report it"]})
    return out


def figures(report: dict) -> list[tuple[str, str, float | None, float | None]]:
    """(what, unit, measured, predicted) for the table and the chart, in display units."""
    m, p = report["measured"], report["predicted"]

    def gb(v):
        return None if v is None else v / GB
    kv = m.get("kv_cache") or {}
    return [("decode", "tok/s", m["decode_tok_s"], p["decode_tok_s"]),
            (f"TTFT, {m['prompt_tokens']}-token prompts", "ms", None if m["ttft_s"] is None else m["ttft_s"] * 1000,
             p["ttft_ms"]),
            ("runtime memory", "GB", gb((m.get("runtime_memory") or {}).get("taken")), gb(p["memory_total"])),
            ("engine build memory", "GB", gb((m.get("build_memory") or {}).get("taken")), gb(p["build_peak"])),
            ("KV cache", "tokens", kv.get("tokens"), p.get("kv_cache_tokens"))]


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "not measured"
    return f"{v:,.0f} {unit}" if unit == "tokens" or v >= 100 else f"{v:.2f} {unit}"


def write_report(out: Path, report: dict) -> None:
    contract.Report.from_dict(report, f"the report being written to {out}")     # the contract, or a bug here
    out.mkdir(parents=True, exist_ok=True)
    (out / contract.REPORT_JSON).write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Validation on {report['device']['target'] or report['device']['board']}: "
             f"{'PASSED' if report['ok'] else 'FAILED'}", "", "| check | required | measured | ok | short by |",
             "|---|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {c['check']} | {c['required']} | {'not measured' if c['measured'] is None else c['measured']}"
                     f" | {'yes' if c['ok'] else 'NO'} | {'' if c['by'] is None else c['by']} |")
    m = report["measured"]
    lines += ["", f"| figure (power mode {report['device']['power_mode']}) | measured | predicted | measured / "
              "predicted |", "|---|---|---|---|"]
    for what, unit, got, want in figures(report):
        ratio = f"{got / want:.2f}" if got is not None and want else ""
        lines.append(f"| {what} | {_fmt(got, unit)} | {_fmt(want, unit)} | {ratio} |")
    if m.get("acceptance"):
        lines.append(f"| EAGLE-3 acceptance (tokens per base step) | {m['acceptance']} | not predicted | |")
    lines += ["", f"Speed measured by: {m.get('speed_source') or 'not measured'}. Memory: what each phase took from "
              "the board (MemAvailable and SwapFree sampled while it ran)."
              + (f" KV cache: {m['kv_cache']['source']}." if m.get("kv_cache") else ""),
              f"Engine build: {'not measured' if m['build_seconds'] is None else str(m['build_seconds']) + ' s'}.", ""]
    lines += [f"Note: {n}." for n in report.get("notes", [])]
    for g in report.get("gaps", []):
        lines.append(f"**{g['figure']} is {g['off_by']:+.0%} off the prediction** ({g['measured']} vs "
                     f"{g['predicted']}). Likely causes: " + "; ".join(g["likely_causes"]) + ".")
    (out / contract.REPORT_MD).write_text("\n".join(lines) + "\n")
    (out / contract.REPORT_SVG).write_text(chart_svg(report))


def chart_svg(report: dict) -> str:
    """Measured next to predicted for each figure, one row each: labelled, with values and units, each row scaled to
    its own larger value (the units differ), and the ratio."""
    rows = figures(report)
    width, label_w, bar_w, row_h, top = 760, 230, 380, 46, 58
    height = top + row_h * len(rows) + 40
    title = (f"Validation on {report['device']['target'] or report['device']['board']}: "
             f"{'PASSED' if report['ok'] else 'FAILED'} (power mode {report['device']['power_mode']})")
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

"""The device validation report: checks against the kit's goldens and the plan, as JSON, Markdown and a PNG plot.

Every check says what was required, what was measured and by how much it failed. The plot (measured vs predicted
decode rate, peak memory vs the plan) is drawn by a few lines of zlib: the device half has no plotting library.
"""

from __future__ import annotations

import json
import struct
import typing
import zlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError


def token_agreement(golden: typing.Sequence, produced: typing.Sequence) -> float:
    """Fraction of golden tokens reproduced up to the first divergence (greedy decoding diverges for good after)."""
    n = 0
    for a, b in zip(golden, produced, strict=False):  # up to the shorter: a short answer is a divergence
        if a != b:
            break
        n += 1
    return n / max(1, len(golden))


def tegrastats_peak_ram(log: str) -> int | None:
    """Peak 'RAM used/totalMB' over a tegrastats log, in bytes."""
    import re

    used = [int(m) for m in re.findall(r"RAM (\d+)/\d+MB", log)]
    return max(used) * 2**20 if used else None


def build_report(goldens: contract.Goldens, validation: dict, plan: contract.Plan, board: contract.Board,
                 peak_ram: int | None, build: dict) -> dict:
    need = goldens.min_token_agreement
    per_prompt = []
    if len(validation["prompts"]) != len(goldens.prompts):
        # zip() would drop the prompts the runtime did not answer and pass the report on the rest
        raise PipelineError(f"the runtime answered {len(validation['prompts'])} of the kit's "
                            f"{len(goldens.prompts)} golden prompts", "see the validation log in the work directory")
    for g, v in zip(goldens.prompts, validation["prompts"], strict=True):
        # token ids where the runtime gives them (TensorRT-LLM); else characters of the decoded text (Edge-LLM)
        agree = token_agreement(g.output_ids, v["output_ids"]) if "output_ids" in v else \
            token_agreement(list(g.text), list(v["output_text"]))
        per_prompt.append({"prompt": g.prompt, "agreement": round(agree, 4),
                           "ttft_s": v["ttft_s"], "decode_tok_s": v["decode_tok_s"]})
    agreement = min(p["agreement"] for p in per_prompt)
    rates = [p["decode_tok_s"] for p in per_prompt if p["decode_tok_s"]]
    predicted = plan.predicted_decode_tok_s
    planned = (plan.memory or {}).get("total")
    unit = "token" if "output_ids" in validation["prompts"][0] else "text"
    checks = [{"check": f"{unit} agreement with goldens (worst prompt)", "required": f">= {need}",
               "measured": agreement, "ok": agreement >= need,
               "by": None if agreement >= need else round(need - agreement, 4)}]
    if peak_ram and planned:
        # the plan is for the engine's process; tegrastats counts the whole board, so this is an upper bound
        checks.append({"check": "peak board memory within usable memory",
                       "required": f"<= {board.memory_total}",
                       "measured": peak_ram, "ok": peak_ram <= (board.memory_total or peak_ram),
                       "by": None})
    measured_decode = round(sum(rates) / len(rates), 2) if rates else None
    measured_ttft = round(sum(p["ttft_s"] for p in per_prompt) / len(per_prompt), 4) \
        if all(p["ttft_s"] is not None for p in per_prompt) else None
    prompt_tokens = round(sum(len(g.input_ids) for g in goldens.prompts) / len(goldens.prompts))
    predicted_ttft = ttft_at(plan.prediction.get("ttft_ms_by_input_tokens") or {}, prompt_tokens)
    gaps = speed_gaps(measured_decode, predicted, None if measured_ttft is None else measured_ttft * 1000,
                      predicted_ttft, board)
    return {"format": contract.Report.FORMAT, "ok": all(c["ok"] for c in checks), "checks": checks,
            "device": {k: getattr(board, k) for k in ("target", "board", "jetpack", "l4t", "tensorrt", "power_mode",
                                                      "bandwidth_gbs")},
            "measured": {"decode_tok_s": measured_decode, "ttft_s": measured_ttft, "prompt_tokens": prompt_tokens,
                         "peak_ram": peak_ram, "build_seconds": build.get("seconds"),
                         "kv_cache_reserved": validation.get("kv_cache")},
            "predicted": {"decode_tok_s": predicted, "ttft_ms": predicted_ttft, "memory_total": planned,
                          "build_peak": (plan.memory or {}).get("build_peak"),
                          "power_mode": plan.prediction.get("power_mode")},
            "gaps": gaps,
            "notes": [f"weak check: the golden answer to {g.prompt!r} has {len(g.output_ids)} tokens, less than half "
                      f"of max_new_tokens ({goldens.max_new_tokens}); ask for longer answers" for g in goldens.prompts
                      if len(g.output_ids) < goldens.max_new_tokens / 2],
            "prompts": per_prompt}


GAP = 0.25      # measured vs predicted beyond this is flagged, with the usual causes


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


def write_report(out: Path, report: dict) -> None:
    contract.Report.from_dict(report, f"the report being written to {out}")     # the contract, or a bug here
    out.mkdir(parents=True, exist_ok=True)
    (out / contract.REPORT_JSON).write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Validation on {report['device']['target'] or report['device']['board']}: "
             f"{'PASSED' if report['ok'] else 'FAILED'}", "", "| check | required | measured | ok | short by |",
             "|---|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {c['check']} | {c['required']} | {c['measured']} | {'yes' if c['ok'] else 'NO'} | "
                     f"{'' if c['by'] is None else c['by']} |")
    m, p = report["measured"], report["predicted"]

    def gb(v):
        return "n/a" if not v else f"{v / 1e9:.2f} GB"
    ttft = "n/a" if m["ttft_s"] is None else f"{m['ttft_s'] * 1000:.0f} ms"
    lines += ["", "| figure | measured | predicted |", "|---|---|---|",
              f"| decode tok/s (power mode {report['device']['power_mode']}) | {m['decode_tok_s']} | "
              f"{p['decode_tok_s']} |",
              f"| TTFT, {m['prompt_tokens']}-token prompts | {ttft} | "
              f"{'n/a' if p['ttft_ms'] is None else str(round(p['ttft_ms'])) + ' ms'} |",
              f"| peak board memory (run) | {gb(m['peak_ram'])} | {gb(p['memory_total'])} (plan total) |",
              f"| engine build | {m['build_seconds']} s | peak {gb(p['build_peak'])} |", ""]
    lines += [f"Note: {n}." for n in report.get("notes", [])]
    for g in report.get("gaps", []):
        lines.append(f"**{g['figure']} is {g['off_by']:+.0%} off the prediction** ({g['measured']} vs "
                     f"{g['predicted']}). Likely causes: " + "; ".join(g["likely_causes"]) + ".")
    (out / contract.REPORT_MD).write_text("\n".join(lines) + "\n")
    bars = [("decode tok/s", m["decode_tok_s"], p["decode_tok_s"]),
            ("TTFT ms", None if m["ttft_s"] is None else m["ttft_s"] * 1000, p["ttft_ms"]),
            ("memory GB", (m["peak_ram"] or 0) / 1e9 or None, (p["memory_total"] or 0) / 1e9 or None)]
    (out / contract.REPORT_PNG).write_bytes(bar_chart_png(bars))


def bar_chart_png(groups: list[tuple[str, float | None, float | None]], height: int = 120) -> bytes:
    """Pairs of bars (measured: dark, predicted: light), each group scaled to its own larger value."""
    bar, gap = 24, 16
    width = gap + len(groups) * (2 * bar + gap)
    rows = [[255, 255, 255] * width for _ in range(height)]
    for gi, (_, measured, predicted) in enumerate(groups):
        top = max(v for v in (measured, predicted, 1e-9) if v is not None)
        for bi, (value, color) in enumerate(((measured, (40, 40, 120)), (predicted, (150, 170, 230)))):
            if not value:
                continue
            x0 = gap + gi * (2 * bar + gap) + bi * bar
            h = int((height - 10) * value / top)
            for y in range(height - h, height):
                for x in range(x0, x0 + bar - 2):
                    rows[y][3 * x:3 * x + 3] = color
    raw = b"".join(b"\x00" + bytes(r) for r in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

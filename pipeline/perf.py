"""`python -m pipeline.perf fit | extract REFERENCE.csv`: the decode, prefill and ViT models' data and fits.

The models live in pipeline/plan/perf.py (decode), pipeline/plan/prefill.py (time to first token) and the parts'
own fits (pipeline/plan/parts/*_speed.py: routed experts, recurrent layers, the visual tower); this entry point is the
short name the README and the plan's notes use, and the one place that drives them all. `fit` also checks the published
vision-language rows' prefill and decode against the text models' fits and prints those errors.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.plan import perf, prefill
from pipeline.plan.parts import experts_speed, hybrid_speed, tower_check, tower_speed

# perf_fit.json's sections (None: the decode fit's, at the top level), each a speed model's report, in the order they
# are fitted: the MoE fit prices its rows with the dense decode and prefill fits written before it, the hybrid fit
# with those and the MoE routing cost
SECTIONS: tuple[tuple[str | None, Callable[[], dict]], ...] = (
    (None, perf.fit_report), ("prefill", prefill.fit_report), ("vision", tower_speed.fit_report),
    ("moe", experts_speed.fit_report), ("hybrid", hybrid_speed.fit_report))


def refit(write: bool) -> dict:
    """Every speed model fitted to its rows, in SECTIONS order, each on the sections before it; written to
    data/perf_fit.json section by section where `write` (a later model reads the earlier ones from there), else
    computed on the stored ones (what a current perf_fit.json holds: tests/shared/test_perf.py compares)."""
    report: dict = {}
    for key, fit_report in SECTIONS:
        part = fit_report()
        if key is None:
            report.update(part)
        else:
            report[key] = part
        if write:
            perf.FIT.write_text(json.dumps(report, indent=1) + "\n")
            perf.fit_data.cache_clear()
            perf.fitted.cache_clear()
    return report


def main(argv: list[str]) -> int:
    if argv[:1] == ["extract"] and len(argv) == 2:
        for path, rows in ((perf.ROWS, perf.extract(Path(argv[1]))), (prefill.ROWS, prefill.extract(Path(argv[1])))):
            with open(path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            print(f"wrote {len(rows)} rows to {path}")
        return 0
    if argv[:1] == ["fit"]:
        report = refit(write=True)
        d, p, v = report, report["prefill"], report["vision"]
        print(json.dumps(report, indent=1))
        print(f"leave-one-out error, decode ({d['rows']} rows): median {d['loo_median_abs_error']:.1%}, worst "
              f"{d['loo_max_abs_error']:.1%}; prefill/TTFT ({p['rows']} rows): median {p['loo_median_abs_error']:.1%}"
              f", worst {p['loo_max_abs_error']:.1%}; ViT ({v['rows']} boards x towers): median "
              f"{v['loo_median_abs_error']:.1%}, worst {v['loo_max_abs_error']:.1%}")
        checks = tower_check.check_rows()
        print(f"vision-language rows ({len(checks)}, Edge-LLM's published Qwen3-VL / Qwen2.5-VL): predicted / "
              "published")
        for c in checks:
            r, e = c.row, c.errors()
            print(f"  {r.target:<14} {r.model.split('/')[-1]:<24} {r.precision:<9} ViT {c.vit_ms:6.1f}/{r.vit_ms:<6} "
                  f"({e['vit']:+.0%})  prefill {c.prefill_ms:6.1f}/{r.prefill_ms:<6} ({e['prefill']:+.0%})  TTFT "
                  f"({e['ttft']:+.0%})  decode {c.decode_tok_s:6.1f}/{r.decode_tok_s:<6} ({e['decode']:+.0%})"
                  + (f"  memory {c.memory_mb:5.0f}/{r.gpu_mem_mb:<5.0f} MB ({e['memory']:+.0%})" if r.gpu_mem_mb
                     else ""))
        for key, s in tower_check.check_summary(checks).items():
            print(f"  {key:<8} error: median {s['median']:.1%}, worst {s['worst']:.1%}")
        m = report["moe"]
        print(f"mixture-of-experts rows ({m['rows']}, Edge-LLM's published Qwen3-30B-A3B): routing cost per MoE "
              "layer and step " + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in m["layer_s"].items())
              + f"; batch-1 leave-one-out error median {m['loo_median_abs_error']:.1%}, worst "
              f"{m['loo_max_abs_error']:.1%}; batch 8 (not fitted) worst {m['batch_max_abs_error']:.1%}")
        for c in m["checks"]:
            print(f"  {c['target']:<14} {c['model'].split('/')[-1]:<16} {c['precision']:<6} batch {c['batch']} "
                  f"context {c['context']:<5} decode {c['predicted']:6.1f}/{c['published']:<6} ({c['error']:+.0%})"
                  + ("" if c["leave_one_out"] else "  (not fitted: batch)"))
        print(f"  prefill by the dense fit (never fitted to these): median {m['prefill_median_abs_error']:.1%}, worst "
              f"{m['prefill_max_abs_error']:.1%}")
        for c in m["prefill_checks"]:
            print(f"  {c['target']:<14} {c['model'].split('/')[-1]:<16} {c['precision']:<6} {c['tokens']:>5} tokens "
                  f"prefill {c['predicted_ms']:6.1f}/{c['published_ms']:<6} ms ({c['error']:+.0%})")
        _print_hybrid(report["hybrid"])
        return 0
    print("usage: python -m pipeline.perf extract REFERENCE.csv | fit", file=sys.stderr)
    return 2


def _print_hybrid(h: dict) -> None:
    print(f"hybrid recurrent rows ({h['rows']}, Edge-LLM's published Qwen3.5 and Nemotron-H): recurrent cost per state "
          "element and layer, decode step " + ", ".join(f"{k} {v:.2e} s" for k, v in h["decode_s"].items())
          + "; prefill token " + ", ".join(f"{k} {v:.2e} s" for k, v in h["prefill_s"].items()))
    for kind, b in h["bands"].items():
        print(f"  {kind} ({b['rows']} rows), leave-one-out error: decode median "
              f"{b['decode_loo_median_abs_error']:.1%}, worst {b['decode_loo_max_abs_error']:.1%}; TTFT median "
              f"{b['ttft_loo_median_abs_error']:.1%}, worst {b['ttft_loo_max_abs_error']:.1%}")
    for c in h["checks"]:
        print(f"  {c['target']:<14} {c['model'].split('/')[-1]:<24} {c['precision']:<6} decode "
              f"{c['decode']:6.1f}/{c['decode_published']:<6} ({c['decode_error']:+.0%})  TTFT "
              f"{c['ttft_ms']:7.1f}/{c['ttft_published_ms']:<7} ms ({c['ttft_error']:+.0%})")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m pipeline.perf fit | extract REFERENCE.csv`: the decode and prefill models' data and fits.

The models live in pipeline/plan/perf.py (decode) and pipeline/plan/prefill.py (time to first token); this entry
point is the short name the README and the plan's notes use, and the one place that drives both.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from pipeline.plan import perf, prefill


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
        report = {**perf.fit_report(), "prefill": prefill.fit_report()}
        perf.FIT.write_text(json.dumps(report, indent=1) + "\n")
        perf.fit_data.cache_clear()
        perf.fitted.cache_clear()
        d, p = report, report["prefill"]
        print(json.dumps(report, indent=1))
        print(f"leave-one-out error, decode ({d['rows']} rows): median {d['loo_median_abs_error']:.1%}, worst "
              f"{d['loo_max_abs_error']:.1%}; prefill/TTFT ({p['rows']} rows): median {p['loo_median_abs_error']:.1%}"
              f", worst {p['loo_max_abs_error']:.1%}")
        return 0
    print("usage: python -m pipeline.perf extract REFERENCE.csv | fit", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

import csv
import json

import pytest
from conftest import REPO

from pipeline.plan import perf

REFERENCE = REPO.parent / "shared" / "reference" / "jetson-llm-benchmarks.csv"


def test_fit_is_reproducible_and_within_15_percent():
    rows = perf.load_rows()
    assert len(rows) >= 40 and all(r.source.startswith("http") for r in rows)
    report = perf.fit_report(rows)
    stored = json.loads(perf.FIT.read_text())
    assert report["classes"] == stored["classes"], "data/perf_fit.json is stale: run python -m pipeline.plan.perf fit"
    assert report["median_abs_error"] <= 0.15
    for cls, err in report["median_abs_error_by_class"].items():
        assert err <= 0.15, cls


def test_constants_are_physical():
    for cls, c in perf.fitted().items():
        assert 0.3 < c.efficiency <= 1.0, cls       # cannot read faster than the bus
        assert 0 <= c.fixed_s < 0.01, cls


@pytest.mark.skipif(not REFERENCE.is_file(), reason="workspace reference CSV not beside the checkout")
def test_rows_are_exactly_what_extract_takes_from_the_reference(tmp_path):
    extracted = perf.extract(REFERENCE)
    with open(perf.ROWS, newline="") as fh:
        committed = list(csv.DictReader(fh))
    assert [{k: str(v) for k, v in r.items()} for r in extracted] == committed

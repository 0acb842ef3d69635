import csv
import json

import pytest
from conftest import REPO

from pipeline.plan import perf, prefill

REFERENCE = REPO.parent / "shared" / "reference" / "jetson-llm-benchmarks.csv"


def test_fit_is_reproducible_and_within_15_percent():
    rows = perf.load_rows()
    assert len(rows) >= 40 and all(r.source.startswith("http") for r in rows)
    report = perf.fit_report(rows)
    stored = json.loads(perf.FIT.read_text())
    assert report["classes"] == stored["classes"], "data/perf_fit.json is stale: run python -m pipeline.perf fit"
    # the prefill (TTFT) constants too: a change to the prefill model that is not refitted leaves them stale
    assert prefill.fit_report()["classes"] == stored["prefill"]["classes"], \
        "data/perf_fit.json's prefill constants are stale: run python -m pipeline.perf fit"
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


def test_prefill_flops_count_every_linear_the_attention_and_the_last_lm_head():
    """Llama-3.2-3B at 512 tokens, counted by hand: 2 x linear params x tokens, plus QK^T and AV (causal: half of
    2 x 2 x isl^2 x q_size per layer), plus the lm_head for the last token."""
    shape = perf.known_shape("meta-llama/Llama-3.2-3B-Instruct")
    h, i, layers, q, kv, vocab = 3072, 8192, 28, 24 * 128, 8 * 128, 128256
    linear = layers * (h * q + 2 * h * kv + q * h + 3 * h * i)
    assert shape.linear_params == linear
    isl = 512
    assert prefill.prefill_flops(shape, isl) == 2.0 * linear * isl + 2.0 * layers * isl * isl * q + 2.0 * vocab * h

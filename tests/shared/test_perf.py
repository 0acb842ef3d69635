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


def test_every_speed_models_fit_is_what_perf_fit_json_stores():
    """The five speed models (decode, prefill, ViT, MoE routing, recurrent layers) refitted to their published rows
    through the one fitter (plan/rows.py) give exactly the stored constants, leave-one-out errors and checks."""
    from pipeline.perf import refit
    assert refit(write=False) == json.loads(perf.FIT.read_text()), \
        "data/perf_fit.json is stale: run python -m pipeline.perf fit"


def test_the_one_row_reader_reads_every_published_table_as_its_row_type(tmp_path):
    from pipeline.plan.parts import experts_speed, hybrid_speed, tower_speed
    from pipeline.plan.rows import read_rows
    for model in (perf.DECODE, prefill.PREFILL, tower_speed.VIT, experts_speed.EXPERTS, hybrid_speed.DECODE):
        rows = model.load()
        assert rows and all(isinstance(r, model.row) and r.source.startswith("http") for r in rows), model.path
    moe = experts_speed.load_rows()
    assert {type(r.batch) for r in moe} == {int} and None in {r.prefill_ms for r in moe}      # an empty cell
    odd = tmp_path / "rows.csv"
    odd.write_text("target,power_mode,model,precision,batch,context,decode_tok_s,source,prefill_ms,prefill_tokens,x\n"
                   "agx-thor,MAXN,m,int4,8,100,55.5,http://s,,,ignored\n")
    (r,) = read_rows(odd, experts_speed.MoeRow)
    assert (r.batch, r.decode_tok_s, r.prefill_ms, r.prefill_tokens) == (8, 55.5, None, None)


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


def test_aggregate_decode_against_the_published_batch_8_rows():
    """In-flight batching: a step reads the weights once and each sequence's KV cache. Against Edge-LLM's published
    batch-8 rows for Qwen3-8B on AGX Thor (jetson-llm-benchmarks.csv: INT4-AWQ 307.9 tok/s over 437 prefill tokens,
    NVFP4 372.2 over 2927; prefill tokens are the batch's, so ~55 and ~366 per sequence, plus half of 128 decoded)
    the model is +21% and -12% off: the same error band as its batch-1 rows."""
    from pipeline.plan.perf import TENSORRT, Row, fitted, known_shape

    c = fitted()[TENSORRT]
    shape = known_shape("Qwen/Qwen3-8B")
    for precision, context, published in (("int4", 55 + 64, 307.9), ("nvfp4", 366 + 64, 372.2)):
        row = Row("agx-thor", "MAXN", TENSORRT, "Qwen/Qwen3-8B", precision, context, published, "")
        kv = shape.kv_bytes_per_token(2) * context
        one = c.aggregate_tok_s(row.bytes_read(), kv, 1, row.bandwidth())
        assert one == pytest.approx(c.tok_s(row.bytes_read(), row.bandwidth()))      # batch 1 is single-stream
        eight = c.aggregate_tok_s(row.bytes_read(), kv, 8, row.bandwidth())
        assert abs(eight / published - 1) < 0.25, (precision, eight)
        assert 7 * one < eight < 8 * one                # the weights are shared, the KV cache is not


def test_the_plan_predicts_aggregate_decode_per_batch_up_to_max_batch_size(tmp_path):
    import contextlib
    import io

    from pipeline.cli import main

    (tmp_path / "config.json").write_text(json.dumps(perf.known_model_configs()["meta-llama/Llama-3.2-3B-Instruct"]))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "--model-config", str(tmp_path / "config.json"), "--quant", "int4_awq", "--target",
                     "orin-nano-8gb", "--batch", "6", "--json"]) == 0
    plan = json.loads(buf.getvalue())
    by_batch = plan["prediction"]["aggregate_tok_s_by_batch"]
    assert list(by_batch) == ["1", "2", "4", "6"] and by_batch["1"] == plan["predicted_decode_tok_s"]
    assert by_batch["1"] < by_batch["2"] < by_batch["4"] < by_batch["6"] < 6 * by_batch["1"]


def test_fastest_published_ttft_per_target_is_the_least_a_board_user_waits():
    # the figures bench/serve.py judges the server's fixed per-request cost against (5% of them)
    nano = prefill.fastest_published("orin-nano-8gb")
    assert nano is not None and (nano.model, nano.precision, nano.isl, nano.prefill_ms) == \
        ("Qwen/Qwen3-0.6B", "int4_awq", 61, 30.7)
    assert all(r.prefill_ms >= nano.prefill_ms for r in prefill.load_rows() if r.target == "orin-nano-8gb")
    thor = prefill.fastest_published("agx-thor")
    assert thor is not None and thor.prefill_ms == 6.6 and thor.precision == "nvfp4"
    assert prefill.fastest_published("no-such-board") is None
    rows = [prefill.PrefillRow("t", "m", "fp16", 8, 5.0, "s"), prefill.PrefillRow("t", "m", "fp16", 8, 4.99, "s")]
    assert prefill.fastest_published("t", rows) is rows[1]


def test_fastest_published_decode_per_target_is_the_shortest_token_gap_a_board_user_sees():
    # bench/serve.py judges the server's fixed per-token cost against 5% of this gap
    nano = perf.fastest_published("orin-nano-8gb")
    assert nano is not None and (nano.model, nano.engine_class, nano.context, nano.decode_tok_s) == \
        ("Qwen/Qwen3-0.6B", "tensorrt", 125, 77.0)
    assert all(r.decode_tok_s <= 77.0 for r in perf.load_rows() if r.target == "orin-nano-8gb")
    thor = perf.fastest_published("agx-thor")
    assert thor is not None and thor.decode_tok_s == 319.7
    assert perf.fastest_published("no-such-board") is None
    rows = [perf.Row("t", "p", "mlc", "m", "int4", 8, 10.0, "s"), perf.Row("t", "p", "mlc", "m", "int4", 8, 10.01, "s")]
    assert perf.fastest_published("t", rows) is rows[1]

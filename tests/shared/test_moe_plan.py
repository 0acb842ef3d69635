"""Mixture-of-experts models in the planner: memory by all the experts, decode by the ones each step reaches plus a
routing cost per MoE layer fitted to Edge-LLM's published Qwen3-30B-A3B rows (plan/parts/experts_speed.py)."""

import csv
import json

import pytest
from conftest import REPO

from pipeline.contract import BuildLimits
from pipeline.errors import InputError
from pipeline.formats import DEFAULT_KV, WEIGHT_FORMATS
from pipeline.plan.memory import decode_bytes_per_token, weight_bytes
from pipeline.plan.parts import experts_speed as moe
from pipeline.plan.perf import FIT, known_model_configs, known_shape
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target

REFERENCE = REPO.parent / "shared" / "reference" / "jetson-llm-benchmarks.csv"
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"


def test_qwen3_30b_a3b_is_30_5b_parameters_3_3b_active():
    shape = known_shape(QWEN3_MOE)
    e = shape.experts
    assert (e.count, e.active, e.intermediate, e.layers, e.shared_intermediate) == (128, 8, 768, 48, 0)
    # the model card's 30.5B total / 3.3B activated; the checkpoint holds 30,532,122,624, which also counts q/k
    # norms (256 per layer), too small to matter to a plan
    assert 30_532_122_624 - shape.total_params == 48 * 256
    active = shape.active_linear_params(1) + shape.num_layers * shape.small_params_per_layer \
        + 2 * shape.embedding_params
    assert 3.3e9 < active < 3.4e9
    assert e.touched(1) == 8 and e.touched(8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    assert 127.99 < e.touched(2048) <= 128


def test_memory_counts_every_expert_and_a_decode_step_reads_the_active_ones():
    shape, fmt = known_shape(QWEN3_MOE), WEIGHT_FORMATS["int4_awq"]
    stored = weight_bytes(shape, fmt, 128)[0]
    one = decode_bytes_per_token(shape, fmt, 128, DEFAULT_KV, 0) - weight_bytes(shape, fmt, 128)[2]
    assert 15.0e9 < stored < 16.0e9                 # 29.9B quantized weights at ~4.1 bits, pre-quant scales, routers
    # 8 of 128 experts (0.96 GB), the attention (0.48 GB), the routers (25 MB)
    assert 1.4e9 < one < 1.5e9 and one < stored / 10
    # a step of 8 sequences reads 51.6 distinct experts of each layer's 128 (routing taken as independent): 6.45x one
    # token's 8, and the rest once
    (d1, x1), (d8, x8) = moe.split_bytes(shape, "int4_awq", 0, 1), moe.split_bytes(shape, "int4_awq", 0, 8)
    assert x8 / x1 == pytest.approx(shape.experts.touched(8) / 8) and d8 == pytest.approx(d1)
    assert decode_bytes_per_token(shape, fmt, 128, DEFAULT_KV, 0, 8) == pytest.approx(d8 + x8)


def test_the_moe_fit_is_stored_and_explains_the_batch_8_rows_it_never_saw():
    report = moe.fit_report()
    assert json.loads(FIT.read_text())["moe"] == report, "perf_fit.json's moe is stale: python -m pipeline.perf fit"
    assert set(report["layer_s"]) == {"orin-int4", "thor-int4", "thor-nvfp4"}
    assert all(10e-6 < v < 200e-6 for v in report["layer_s"].values())     # tens of microseconds per MoE layer
    assert report["loo_median_abs_error"] <= 0.05
    batch = [c for c in report["checks"] if not c["leave_one_out"]]
    assert len(batch) == 3 and all(abs(c["error"]) <= 0.10 for c in batch), batch


def test_a_lower_expert_read_efficiency_would_not_explain_batch_8():
    """The alternative model (experts read slower, no fixed cost) fitted to the same batch-1 Thor INT4 row misses
    its batch-8 row by more than a quarter: the routing cost is a fixed cost per step."""
    rows = {(r.target, r.precision, r.batch, r.context): r for r in moe.load_rows()}
    one, eight = rows[("agx-thor", "int4", 1, 125)], rows[("agx-thor", "int4", 8, 119)]
    shape = known_shape(QWEN3_MOE)
    from pipeline.plan import perf
    dense = perf.fitted()[perf.TENSORRT]
    bw = get_target("agx-thor").bandwidth_bytes("MAXN")
    d1, x1 = moe.split_bytes(shape, "int4_awq", one.context, 1)
    eff = x1 / (bw * (1 / one.decode_tok_s - d1 / (dense.efficiency * bw) - dense.fixed_s))
    d8, x8 = moe.split_bytes(shape, "int4_awq", eight.context, 8)
    slower = 8 / (d8 / (dense.efficiency * bw) + x8 / (eff * bw) + dense.fixed_s)
    assert slower / eight.decode_tok_s - 1 < -0.25
    fixed = moe.predict_tok_s(shape, "int4_awq", "agx-thor", "MAXN", eight.context, 8, moe.fit(moe.load_rows())[
        "thor-int4"])
    assert abs(fixed / eight.decode_tok_s - 1) < 0.10


@pytest.mark.skipif(not REFERENCE.is_file(), reason="workspace reference CSV not beside the checkout")
def test_the_thor_rows_are_the_reference_csvs():
    with open(REFERENCE, newline="") as fh:
        ref = {(r["precision"], r["isl_tokens"]): float(r["decode_tok_s"]) for r in csv.DictReader(fh)
               if r["model"] == "Qwen3-30B-A3B" and r["device"] == "Jetson AGX Thor T5000 devkit"
               and r["engine"].startswith("TensorRT Edge-LLM")}
    ours = {(r.precision, r.context): r.decode_tok_s for r in moe.load_rows() if r.target == "agx-thor"
            and r.batch == 1}
    assert ours == {("int4", 2048): ref[("INT4 GPTQ", "2048")], ("nvfp4", 2048): ref[("NVFP4", "2048")],
                    ("int4", 125): ref[("INT4 GPTQ", "61")], ("nvfp4", 125): ref[("NVFP4", "61")]}


def _plan(weights, target, inp=61, seq=256, backend=None):
    return make_plan(PlanRequest(shape=known_shape(QWEN3_MOE), model_label=QWEN3_MOE, weights=weights,
                                 kv_cache="fp16", target=get_target(target), limits=BuildLimits.of(2, inp, seq),
                                 backend=backend))


def test_the_plan_predicts_the_published_decode_of_qwen3_30b_a3b_on_agx_orin_and_thor():
    orin = _plan("int4_awq", "agx-orin-64gb")
    assert orin.ok and orin.backend == "edgellm" and orin.memory.fits
    p = orin.prediction
    assert p.decode_error_band == moe.fit_report()["loo_median_abs_error"]
    assert abs(p.by_power_mode["MAXN"] / 56.7 - 1) <= p.decode_error_band      # Edge-LLM 0.9.0, MTBench, batch 1
    thor = _plan("nvfp4", "agx-thor", inp=2048, seq=4096)
    assert thor.ok and abs(thor.prediction.by_power_mode["MAXN"] / 84.1 - 1) <= 0.05     # llm_bench, pastKV 2048
    # by total parameters decode would come out ~6x too slow; by active ones the weights would be ~9x too small
    assert orin.memory.weights > 15e9 and 50 < p.by_power_mode["MAXN"] < 65


def test_fp8_is_refused_for_moe_on_edgellm_naming_its_moe_plugins_and_0_12_refuses_the_family():
    fp8 = _plan("fp8", "agx-thor")
    assert not fp8.ok and "FP16, INT4 (Marlin) and NVFP4" in " ".join(fp8.refused), fp8.refused
    old = _plan("int4_awq", "agx-orin-64gb", backend="trtllm-0.12")
    assert not old.ok and "Qwen3-MoE was added to TensorRT-LLM after 0.12" in old.refused[0], old.refused


def test_expert_fields_are_checked_and_a_dense_family_with_experts_is_refused():
    cfg = known_model_configs()[QWEN3_MOE]
    with pytest.raises(InputError) as exc:
        shape_from_config({**cfg, "num_experts_per_tok": 200}, "moe.json")
    assert "num_experts_per_tok" in str(exc.value) and "more experts per token than the 128" in str(exc.value)
    with pytest.raises(InputError) as exc:
        shape_from_config({**cfg, "moe_intermediate_size": 0}, "moe.json")
    assert "moe_intermediate_size" in str(exc.value)
    dense = {**known_model_configs()["Qwen/Qwen3-8B"], "num_experts": 64}
    with pytest.raises(InputError) as exc:
        shape_from_config(dense, "dense.json")
    assert "a mixture-of-experts config, and Qwen3 is a dense family here" in str(exc.value)
    sparse = shape_from_config({**cfg, "decoder_sparse_step": 2, "mlp_only_layers": [1, 3]}, "moe.json")
    assert sparse.experts.layers == 24 - 2 and sparse.linear_params < known_shape(QWEN3_MOE).linear_params


GPT_OSS_20B = {     # openai/gpt-oss-20b's config.json fields the planner reads (its expert count and top-k as the hub
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "sliding_window": 128, "attention_bias": True, "tie_word_embeddings": False}


@pytest.mark.parametrize("target,weights", [("agx-orin-64gb", "int4_awq"), ("agx-thor", "nvfp4")])
def test_gpt_oss_is_read_and_refused_on_every_backend_naming_what_runs_it_on_a_jetson(target, weights):
    shape = shape_from_config(GPT_OSS_20B, "gpt-oss-20b/config.json")
    assert (shape.experts.count, shape.experts.active, shape.experts.layers) == (32, 4, 24)
    assert 20.5e9 < shape.total_params < 21.5e9         # "21B parameters, 3.6B active"
    # (Thor has no TensorRT-LLM 0.12 stack at all: forcing it there is refused for that first)
    for backend in (None, "edgellm") + (("trtllm-0.12",) if target.startswith("agx-orin") else ()):
        p = make_plan(PlanRequest(shape=shape, model_label="gpt-oss-20b", weights=weights, kv_cache="fp16",
                                  target=get_target(target), limits=BuildLimits.of(1, 512, 1024), backend=backend))
        assert not p.ok and "vLLM (NVIDIA's Jetson vLLM container) or llama.cpp / Ollama" in " ".join(p.refused), \
            (backend, p.refused)


def test_an_moe_models_experts_leave_the_engine_with_its_ffns_when_externalized():
    """Edge-LLM externalizes int4_moe beside int4_ffn: nearly all of Qwen3-30B-A3B's quantized weights are experts
    (the export check of an externalized MoE: tests/workstation/test_moe_build.py)."""
    from pipeline.contract import BuildOnBoard
    from pipeline.plan.buildmem import externalized_kinds
    from pipeline.plan.planner import externalizable_share
    moe_shape, dense = known_shape(QWEN3_MOE), known_shape("Qwen/Qwen3-8B")
    experts = sum(i * o * n for name, i, o, n in moe_shape.linears() if name.startswith("experts."))
    assert externalizable_share(moe_shape) == pytest.approx(experts / moe_shape.linear_params) \
        and externalizable_share(moe_shape) > 0.96
    assert 0.7 < externalizable_share(dense) < 0.8        # its MLPs
    out = BuildOnBoard("externalize", 0, [], "")
    assert externalized_kinds(out) == ("int4_ffn",)
    assert externalized_kinds(out, dense_ffn=True, parts=("int4_moe",)) == ("int4_ffn", "int4_moe")
    # every layer of Qwen3-30B-A3B is an MoE layer: Edge-LLM's export writes no int4_ffn file for it, so none is asked
    assert externalized_kinds(out, dense_ffn=False, parts=("int4_moe",)) == ("int4_moe",)
    assert externalized_kinds(BuildOnBoard("swap", 1, [], ""), parts=("int4_moe",)) == ()


def test_moe_prefill_is_checked_against_the_published_rows_and_its_error_is_the_plans_ttft_band():
    """The dense prefill fit (active experts' FLOPs per token, the experts a prompt reaches read once) was never fitted
    to an MoE row: its error on the five published ones is printed and quoted as an MoE plan's TTFT band."""
    report = moe.fit_report()
    checks = {(c["target"], c["precision"], c["tokens"]): c for c in report["prefill_checks"]}
    assert set(checks) == {("agx-thor", "int4", 2048), ("agx-thor", "nvfp4", 2048), ("agx-thor", "int4", 61),
                           ("agx-thor", "nvfp4", 61), ("agx-orin-64gb", "int4", 61)}
    assert checks[("agx-orin-64gb", "int4", 61)]["published_ms"] == 91.0
    errors = sorted(abs(c["error"]) for c in checks.values())
    assert report["prefill_median_abs_error"] == errors[2] and report["prefill_max_abs_error"] == errors[-1] < 0.5
    p = _plan("int4_awq", "agx-orin-64gb").prediction
    assert p.ttft_error_band == report["prefill_median_abs_error"]
    dense = make_plan(PlanRequest(shape=known_shape("Qwen/Qwen3-8B"), model_label="q", weights="int4_awq",
                                  kv_cache="fp16", target=get_target("agx-orin-64gb"),
                                  limits=BuildLimits.of(2, 61, 256))).prediction
    assert dense.ttft_error_band == json.loads(FIT.read_text())["prefill"]["loo_median_abs_error"]

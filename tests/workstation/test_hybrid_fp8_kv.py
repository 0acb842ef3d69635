"""The FP8 KV cache where TensorRT Edge-LLM 0.11 builds it for the hybrids: its qwen3_5, qwen3_5_moe and nemotron_h
models enable it from the checkpoint's k_scale tensors as its dense models do (its attention plugin quantizing K and
V into E4M3 with the calibrated scales, the query too). Each tiny hybrid with FP16 weights and an FP8 KV cache,
exported and run by the runtime double along the calibrated model's answer: the plugin holds the calibrated scales
and the engine computes the model. Gemma 4 stays FP16-KV (backends/edgellm.py says why)."""

import pytest

from pipeline.contract import BuildLimits
from pipeline.plan.perf import known_model_configs
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target
from tests.workstation.test_families import COSINE


@pytest.mark.integration
@pytest.mark.parametrize("name", ["tiny-qwen3_5", "tiny-nemotron-h", "tiny-qwen3_5-moe"])
def test_a_hybrids_fp8_kv_cache_is_the_calibrated_one_through_the_runtime(builtin, tmp_path, name):  # noqa: F811
    from tests.edgellm_run import model_vs_engine
    from tests.workstation.test_export import CAL

    r = model_vs_engine(builtin(name), tmp_path, "fp16", "fp8", CAL, share_awq_scales=False)
    mean, least = COSINE["fp8"]         # the K/V rounding's error model (test_families.py)
    assert r["logit_cosine"] > mean and r["logit_cosine_min"] > least, r
    assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1, r
    got, calibrated = r["qkv_scales"], r["calibrated_scales"]
    assert len(got) == 1 and sum(got, []) == pytest.approx(sum(calibrated, []), rel=2 ** -10), (got, calibrated)


@pytest.mark.parametrize("repo, weights, kv, refused", [
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvfp4", "fp8", None),     # NVIDIA's NVFP4 checkpoint's formats
    ("Qwen/Qwen3.5-9B", "nvfp4", "fp8", None),
    ("Qwen/Qwen3.5-35B-A3B", "fp16", "fp8", None),
    ("Qwen/Qwen3.5-9B", "int4_awq", "fp8", "loads a ModelOpt INT4-AWQ checkpoint without its FP8 KV cache"),
    ("google/gemma-4-31B-it", "nvfp4", "fp8", "builds Gemma 4 (multimodal checkpoint) only with a fp16 KV cache"),
])
def test_the_plan_takes_the_fp8_kv_cache_where_edgellm_builds_it(repo, weights, kv, refused):
    shape = shape_from_config(known_model_configs()[repo], repo)
    p = make_plan(PlanRequest(shape=shape, model_label=repo, weights=weights, kv_cache=kv,
                              target=get_target("agx-thor"), limits=BuildLimits.of(1, 1024, 2048)))
    if refused is None:
        assert p.ok and p.backend == "edgellm" and p.memory.kv_cache > 0, p.refused
    else:
        assert not p.ok and refused in " ".join(p.refused), p.refused


from tests.workstation.test_export import builtin  # noqa: E402,F401  (fixture)

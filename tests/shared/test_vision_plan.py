"""The visual tower as the planner counts it (plan/parts/tower.py) and its time (plan/parts/tower_speed.py): parameter
counts exactly transformers' own for the real configs, FLOPs counted by hand, the ViT fit reproducible from the
published
rows and within its printed leave-one-out error."""

import json

import pytest
import torch

from pipeline.errors import InputError
from pipeline.plan import perf
from pipeline.plan.parts import tower_check as vision_check
from pipeline.plan.parts import tower_speed as vision_time
from pipeline.plan.perf import known_model_configs, known_shape
from pipeline.plan.shapes import shape_from_config

VLMS = ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct",
        "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"]


def _transformers_tower_params(arch: str, raw: dict) -> int:
    import transformers
    cfg_cls = {"Qwen3VLForConditionalGeneration": transformers.Qwen3VLConfig,
               "Qwen2_5_VLForConditionalGeneration": transformers.Qwen2_5_VLConfig,
               "InternVLForConditionalGeneration": transformers.InternVLConfig}[arch]
    config = cfg_cls(**{k: v for k, v in raw.items() if k != "architectures"})
    with torch.device("meta"):
        model = getattr(transformers, arch)(config)
    parts = [model.model.visual] if arch != "InternVLForConditionalGeneration" else \
        [model.model.vision_tower, model.model.multi_modal_projector]
    return sum(p.numel() for part in parts for p in part.parameters())


@pytest.mark.parametrize("repo", VLMS)
def test_tower_params_are_exactly_transformers_own(repo):
    raw = known_model_configs()[repo]
    shape = known_shape(repo)
    assert shape is not None and shape.tower is not None
    assert shape.tower.params() == _transformers_tower_params(raw["architectures"][0], raw)
    # the language model is read from text_config, the tower from vision_config: nothing of one in the other
    assert shape.hidden_size == raw["text_config"]["hidden_size"]
    assert shape.tower.out_hidden == raw["text_config"]["hidden_size"]


@pytest.mark.parametrize("bias", [False, True])
def test_internvl_tower_params_with_and_without_qkv_bias(bias):
    import transformers
    config = transformers.InternVLConfig()
    config.vision_config.attention_bias = bias
    raw = {**config.to_dict(), "architectures": ["InternVLForConditionalGeneration"]}
    tower = shape_from_config(raw).tower
    assert tower is not None and tower.qkv_bias is bias
    assert tower.params() == _transformers_tower_params("InternVLForConditionalGeneration", raw)


def test_tower_flops_counted_by_hand():
    """Qwen3-VL-2B, one image of 265 tokens (1060 patches): 24 blocks of 4h^2 + 2hi weights per patch, four mergers
    (the main one and three DeepStack) of 4h x 4h + 4h x out per token, full attention over the image per block."""
    t = known_shape("Qwen/Qwen3-VL-2B-Instruct").tower
    h, i, out, p = 1024, 4096, 2048, 1060
    block = 4 * h * h + 2 * h * i
    merger = 4 * ((4 * h) ** 2 + 4 * h * out)
    assert t.flops(p) == 2.0 * 24 * block * p + 2.0 * merger * p / 4 + 4.0 * h * p * 24 * p
    # Qwen2.5-VL: 28 of its 32 blocks attend within 8 x 8-patch windows (112 px / 14), 4 to the whole image
    q = known_shape("Qwen/Qwen2.5-VL-7B-Instruct").tower
    assert (q.window_patches, q.full_blocks) == (64, 4)
    h, i, out, p = 1280, 3420, 3584, 1396
    linear = 2.0 * 32 * (4 * h * h + 3 * h * i) * p + 2.0 * ((4 * h) ** 2 + 4 * h * out) * p / 4
    assert q.flops(p) == pytest.approx(linear + 4.0 * h * p * (4 * p + 28 * 64), rel=1e-12)


def test_damaged_vision_config_is_one_error_naming_every_field():
    raw = json.loads(json.dumps(known_model_configs()["Qwen/Qwen3-VL-2B-Instruct"]))
    raw["vision_config"].update(depth=0, hidden_size="1024", deepstack_visual_indexes=[5, 99])
    with pytest.raises(InputError) as e:
        shape_from_config(raw, "config.json")
    text = str(e.value)
    for field in ("vision_config.depth", "vision_config.hidden_size", "vision_config.deepstack_visual_indexes"):
        assert field in text, field
    del raw["vision_config"]
    with pytest.raises(InputError, match="vision_config"):
        shape_from_config(raw, "config.json")


@pytest.mark.parametrize("edit, field, message", [
    (lambda v: v.update(out_hidden_size=1536), "vision_config.out_hidden_size",
     "is not the language model's hidden_size 2048"),
    (lambda v: v.update(num_heads=7), "vision_config.num_heads", "does not divide the tower's hidden_size 1024"),
])
def test_a_tower_that_cannot_feed_its_language_model_is_refused_naming_the_field(edit, field, message):
    """#66: a tower whose merger writes another width than the language model reads, or whose heads do not divide
    its width, was planned as fitting."""
    raw = json.loads(json.dumps(known_model_configs()["Qwen/Qwen3-VL-2B-Instruct"]))
    edit(raw["vision_config"])
    with pytest.raises(InputError) as e:
        shape_from_config(raw, "config.json")
    assert field in str(e.value) and message in str(e.value), str(e.value)


def test_vit_fit_is_reproducible_and_its_leave_one_out_error_is_what_the_plan_quotes():
    stored = perf.fit_data()["vision"]
    report = vision_time.fit_report()
    assert report == stored, "data/perf_fit.json's ViT constants are stale: run python -m pipeline.perf fit"
    assert report["rows"] == 11             # one per board and tower: 4 on Thor, 7 on Orin
    rows = vision_time.vit_rows(vision_time.load_rows())
    loo = vision_time.leave_one_out(rows)
    assert max(abs(e) for e in loo) == pytest.approx(report["loo_max_abs_error"], abs=1e-4)
    for cls, c in report["classes"].items():
        assert 0.1 < c["efficiency"] <= 1.0, cls        # below the tensor peak, and not absurdly far below
        assert 0 <= c["fixed_s"] < 0.02, cls


def test_published_vlm_rows_are_predicted_within_the_printed_error():
    """Every published row: the ViT (its board and tower left out of the fit) within the fit's worst leave-one-out
    error; TTFT and decode by the text fits (which never saw a VLM row) within 35% and 25%, medians within 10%."""
    checks = vision_check.check_rows()
    assert len(checks) == 14
    worst = perf.fit_data()["vision"]["loo_max_abs_error"]
    for c in checks:
        e = c.errors()
        assert abs(e["vit"]) <= worst + 1e-4, (c.row, e)
        assert abs(e["ttft"]) <= 0.35 and abs(e["decode"]) <= 0.25, (c.row, e)
    summary = vision_check.check_summary(checks)
    assert summary["ttft"]["median"] <= 0.10 and summary["decode"]["median"] <= 0.10


def test_the_memory_plan_at_the_benchmarks_limits_is_within_15_percent_of_the_published_orin_rows():
    checks = [c for c in vision_check.check_rows() if c.row.gpu_mem_mb]
    assert len(checks) == 7
    for c in checks:
        assert abs(c.errors()["memory"]) <= 0.15, (c.row.target, c.row.model, c.memory_mb, c.row.gpu_mem_mb)

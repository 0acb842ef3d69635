"""A vision-language model's plan: the visual engine in the memory plan, visual_build's profile checked as
visual_build checks it, the ViT's time and TTFT with an image, the build commands Edge-LLM 0.11 takes."""

import json

import pytest
from conftest import REPO

from pipeline import backends
from pipeline.contract import BuildLimits, Plan, VisualLimits
from pipeline.plan.parts.tower import default_limits, predict_vit_ms
from pipeline.plan.perf import known_model_configs, known_shape
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.targets import get_target

EDGELLM = backends.get("edgellm")


def plan(repo="Qwen/Qwen3-VL-2B-Instruct", target="agx-thor", weights="int4_awq", limits=BuildLimits.of(2, 1024, 2048),
         **kw) -> Plan:
    return make_plan(PlanRequest(shape=known_shape(repo), model_label=repo, weights=weights, kv_cache="fp16",
                                 target=get_target(target), limits=limits, backend="edgellm", **kw))


@pytest.mark.parametrize("repo", ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct",
                                  "Qwen/Qwen2.5-VL-7B-Instruct"])
@pytest.mark.parametrize("target", ["orin-nano-8gb", "agx-orin-64gb", "agx-thor"])
def test_the_cli_plans_a_real_vlm_config_with_visual_memory_vit_and_ttft(project, tmp_path, repo, target):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(known_model_configs()[repo]))
    proc = project.cli("plan", "--model-config", str(cfg), "--quant", "int4_awq", "--target", target, "--backend",
                       "edgellm", "--max-seq", "2048", "--max-input", "1024", "--json")
    out = Plan.from_dict(json.loads(proc.stdout), "plan --json")
    v = out.visual
    assert v is not None and v.params == known_shape(repo).tower.params()
    assert v.weights == v.params * 2                    # an FP16 tower
    assert out.memory.visual == v.weights + v.activations
    assert out.memory.total == sum(getattr(out.memory, k) for k in (
        "weights", "embedding", "lm_head", "kv_cache", "draft", "visual", "activations", "runtime_overhead"))
    # the largest image the default profile takes, timed by the ViT fit; TTFT = that ViT + the prefill
    assert v.image_tokens == v.limits.max_image_tokens_per_image == 512
    assert v.vit_ms == round(predict_vit_ms(known_shape(repo), target, 512, json.loads(
        (REPO / "pipeline" / "data" / "perf_fit.json").read_text())["vision"]), 1)
    assert v.ttft_ms == round(v.vit_ms + out.predicted_ttft_ms, 1)
    assert out.predicted_decode_tok_s > 0
    text = project.cli("plan", "--model-config", str(cfg), "--quant", "int4_awq", "--target", target, "--backend",
                       "edgellm", "--max-seq", "2048", "--max-input", "1024").stdout
    assert f"  visual          {v.weights / 1e9 + v.activations / 1e9:.2f} GB" in text
    assert f"  ViT          ~{v.vit_ms:.0f} ms for an image of 512 tokens (+-4%" in text
    assert f"  TTFT+image   ~{v.ttft_ms:.0f} ms" in text
    if target == "orin-nano-8gb" and repo != "Qwen/Qwen3-VL-2B-Instruct":     # 7-8B with a tower: not in 8 GB
        assert proc.returncode == 1 and f"visual engine {v.weights / 1e9 + v.activations / 1e9:.2f} GB" in proc.stderr
        return
    # Edge-LLM builds it: the language model's engine, then the visual engine at the plan's profile
    assert proc.returncode == 0, proc.stderr
    assert [a[0] for a in out.device_build_commands] == ["llm_build", "visual_build"]
    assert out.device_build_commands[0][2] == "onnx/llm" and out.device_build_commands[1][2] == "onnx/visual"


def test_the_vit_grows_with_the_image_and_is_faster_on_a_bigger_board():
    small, large = plan(visual=VisualLimits(4, 1024, 256)), plan(visual=VisualLimits(4, 1024, 1000))
    assert small.visual.vit_ms < large.visual.vit_ms
    assert plan(target="agx-orin-64gb").visual.vit_ms > plan(target="agx-thor").visual.vit_ms


def test_fp8_tower_on_thor_halves_its_matrices_and_is_refused_on_orin():
    fp16, fp8 = plan(), plan(visual_precision="fp8")
    t = known_shape("Qwen/Qwen3-VL-2B-Instruct").tower
    matrices = t.depth * t.block_linear_params() + t.merger_linear_params()
    assert fp16.visual.weights - fp8.visual.weights == matrices
    assert fp8.visual.vit_error_band is None and fp16.visual.vit_error_band is not None
    said = " ".join(plan(target="agx-orin-64gb", visual_precision="fp8").refused)
    assert "quantization.visual = 'fp8': a FP8 (E4M3) tower needs SM >= 8.9" in said and "Use 'fp16'" in said


@pytest.mark.parametrize("limits, expect", [
    (VisualLimits(4, 1024, 2048), "max_image_tokens_per_image 2048 must lie within min_image_tokens..max_image_"
                                  "tokens (4..1024), as visual_build requires"),
    (VisualLimits(0, 1024, 512), "min_image_tokens 0 and max_image_tokens 1024 must satisfy 1 <= min <= max"),
    (VisualLimits(4, 2048, 1023), "an image of max_image_tokens_per_image 1023 tokens (with its 2 wrapping tokens) "
                                  "leaves no room for text in max_input_len 1024: raise build.max_input_len above "
                                  "1025"),
])
def test_visual_build_profiles_it_would_refuse_are_refused_in_the_plan(limits, expect):
    said = " ".join(plan(visual=limits).refused)
    assert "build.visual: " + expect in said, said


def test_an_image_that_exactly_leaves_one_text_token_fits():
    """The edge: per-image tokens + the 2 wrapping tokens = max_input_len - 1 is accepted, one more is not."""
    assert not [r for r in plan(visual=VisualLimits(4, 2048, 1021)).refused if "build.visual" in r]
    assert [r for r in plan(visual=VisualLimits(4, 2048, 1022)).refused if "leaves no room" in r]


def test_internvl_profiles_are_whole_tiles():
    import transformers
    raw = {**transformers.InternVLConfig().to_dict(), "architectures": ["InternVLForConditionalGeneration"]}
    from pipeline.plan.shapes import shape_from_config
    shape = shape_from_config(raw)
    limits = default_limits(shape, 4096)
    assert limits.max_image_tokens % 256 == 0 and limits.min_image_tokens == 256
    p = make_plan(PlanRequest(shape=shape, model_label="i", weights="int4_awq", kv_cache="fp16",
                              target=get_target("agx-thor"), limits=BuildLimits.of(2, 4096, 8192), backend="edgellm",
                              visual=VisualLimits(100, 1024, 512)))
    assert "must be multiples of 256 for InternVL" in " ".join(p.refused)


def test_a_text_model_with_a_visual_profile_is_refused_naming_the_table():
    p = make_plan(PlanRequest(shape=known_shape("Qwen/Qwen3-0.6B"), model_label="q", weights="int4_awq",
                              kv_cache="fp16", target=get_target("agx-thor"), limits=BuildLimits.of(2, 512, 1024),
                              visual=VisualLimits(4, 1024, 512)))
    assert p.visual is None and "build.visual sets an image-token profile, but the model has no visual tower" in \
        " ".join(p.refused)
    assert plan("Qwen/Qwen3-0.6B").visual is None and plan("Qwen/Qwen3-0.6B").memory.visual == 0


def test_default_profile_is_visual_builds_own_where_it_fits_and_shrinks_for_a_short_prompt():
    shape = known_shape("Qwen/Qwen3-VL-2B-Instruct")
    assert default_limits(shape, 2048) == VisualLimits(4, 1024, 512)
    small = default_limits(shape, 256)
    assert small.max_image_tokens_per_image == 256 - 64 - 2 and not small.problems()


def test_visual_build_commands_are_edgellms_and_pass_its_checks():
    limits, visual = BuildLimits.of(2, 1024, 2048), VisualLimits(8, 2048, 1000)
    argvs = EDGELLM.build_commands(limits, None, visual)
    assert argvs[0][:3] == ["llm_build", "--onnxDir", "onnx/llm"]
    assert argvs[1] == ["visual_build", "--onnxDir", "onnx/visual", "--engineDir", "engine", "--minImageTokens", "8",
                        "--maxImageTokens", "2048", "--maxImageTokensPerImage", "1000"]
    assert all(EDGELLM.check_argv(a) == [] for a in argvs)
    assert EDGELLM.command_problems(limits, None, argvs, visual) == []
    # a tampered profile, a flag visual_build does not have, a missing one
    bad = [argvs[0], [*argvs[1][:-1], "4000"]]
    assert "max_image_tokens_per_image 4000 must lie within" in " ".join(EDGELLM.command_problems(
        limits, None, bad, visual))
    assert EDGELLM.check_argv([*argvs[1], "--maxBatchSize", "2"])
    assert "visual_build needs --maxImageTokensPerImage" in EDGELLM.check_argv(argvs[1][:-2])
    # the plan's commands differ from what the kit says: refused
    other = EDGELLM.build_commands(limits, None, VisualLimits(8, 2048, 999))
    assert "not the commands this version makes" in " ".join(EDGELLM.command_problems(limits, None, other, visual))
    # a text model keeps its one command from onnx/
    assert EDGELLM.build_commands(limits, None) == [EDGELLM.build_commands(limits, None, None)[0]]
    assert EDGELLM.build_commands(limits, None)[0][2] == "onnx"


def test_recipe_visual_fields_are_checked_and_fill_from_the_defaults(project, tmp_path):
    from pipeline.recipe import VisualSettings, load_recipe, visual_limits
    src = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace("[build]", "[build.visual]\nmax_image_tokens = 0\nmax_images = 3\n\n[build]")
                   .replace('weights = ', 'visual = "int4"\nweights = '))
    from pipeline.errors import InputError
    with pytest.raises(InputError) as e:
        load_recipe(str(bad))
    text = str(e.value)
    assert "build.visual.max_image_tokens = 0" in text and "build.visual.max_images" in text
    assert "quantization.visual = 'int4'" in text or 'quantization.visual = "int4"' in text
    shape = known_shape("Qwen/Qwen3-VL-2B-Instruct")
    assert visual_limits(VisualSettings(), shape, BuildLimits.of(1, 2048, 4096)) is None
    assert visual_limits(VisualSettings(max_image_tokens_per_image=700), shape, BuildLimits.of(1, 2048, 4096)) == \
        VisualLimits(4, 1024, 700)


def test_a_validation_image_past_the_profile_is_refused_by_the_plan_at_the_goldens_own_count():
    """red-circle (150x130) and flag-stripes (180x110) through Qwen3-VL's processor held to the profile: 72 and 77
    tokens, as the goldens count them (tests/workstation/test_vlm_build.py: their mean 74). A profile of 72 takes
    the first and refuses the second; 77 takes both; the refusal names the image, its count and what to do."""
    from pipeline.images import BUILTIN_IMAGES
    from pipeline.plan.parts.tower import image_refusals
    shape = known_shape("Qwen/Qwen3-VL-2B-Instruct")
    sized = [(f"builtin:{n}", BUILTIN_IMAGES[n].height, BUILTIN_IMAGES[n].width)
             for n in ("red-circle", "flag-stripes")]
    assert image_refusals(shape, VisualLimits(4, 1024, 77), sized) == []
    (one,) = image_refusals(shape, VisualLimits(4, 1024, 72), sized)
    assert one == ("validation.images: builtin:flag-stripes (180x110 pixels) becomes 77 image tokens through the "
                   "model's processor, more than build.visual.max_image_tokens_per_image = 72 takes: raise it to at "
                   "least 77, or use a larger or smaller image")
    assert len(image_refusals(shape, VisualLimits(4, 1024, 71), sized)) == 2


def test_a_recipe_whose_images_the_goldens_would_refuse_is_refused_before_any_work(tmp_path):
    """The shipped tiny multimodal Qwen3.5 recipe with a 64-token profile: its plan (read from the builtin's config,
    before any fetch, calibration or export) refuses both images; the shipped 96 plans."""
    from pipeline.recipe import config_for, load_recipe, plan_recipe
    src = (REPO / "recipes" / "tiny-qwen3_5-vl.toml").read_text()
    assert "max_image_tokens_per_image = 96" in src
    small = tmp_path / "small.toml"
    small.write_text(src.replace("max_image_tokens_per_image = 96", "max_image_tokens_per_image = 64"))
    for path, refused in ((REPO / "recipes" / "tiny-qwen3_5-vl.toml", 0), (small, 2)):
        recipe = load_recipe(str(path))
        config, source = config_for(recipe, recipe.model)
        p = plan_recipe(recipe, "orin-nano-8gb", config, source)
        said = [r for r in p.refused if r.startswith("validation.images")]
        assert len(said) == refused and p.ok == (refused == 0), p.refused
    assert "builtin:red-circle (150x130 pixels) becomes 72 image tokens" in said[0]

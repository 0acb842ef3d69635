"""`doit build` of the repository's tiny vision-language recipe, offline on the CPU: a kit carrying both ONNX trees,
the images and goldens asked with them; the device half builds both engines and validates the image prompts through
the runtime (doubles); `serve` answers the openai client's image chat as the goldens say."""

import base64
import io
import json
import subprocess
import sys

import pytest
from conftest import REPO, Project, built_vs_engine, device, stage_dir

from pipeline import contract
from pipeline.images import BUILTIN_IMAGES
from pipeline.workstation.visual_check import MAX_RELATIVE_ERROR_FP8, MIN_COSINE_FP8
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of
from tests.serving import Served, health, trickling_image_host

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3-vl-thor"
FAMILIES = rows_of(__file__)


FP8_TOWER = "fp8-tower"
ORIN = "tiny-qwen2.5-vl-orin-nano-jp72"      # the other tower design (window attention, sectioned RoPE) on Orin
INTERNVL = "tiny-internvl3-thor"            # the tiled tower: no multimodal RoPE, 256 tokens a tile


def _kit(project, recipe, target):
    return project.artifacts / recipe / "kit" / f"{recipe}@{target}"


def _stage(project, name, recipe=RECIPE):
    """A recipe's current output of one stage (its link under artifacts/<recipe>/)."""
    return stage_dir(project, recipe, name)


@pytest.fixture(scope="module")
def project_built(tmp_path_factory):
    """The module's four vision-language recipes built by one `doit build` (one process: the libraries are imported
    once, and the two Qwen3-VL recipes share their fetch): the repository's tiny Qwen3-VL, Qwen2.5-VL and InternVL3
    recipes, and the Qwen3-VL one with `quantization.visual = "fp8"` (Edge-LLM's --visual_quantization fp8) beside an
    INT4-AWQ language model (whose pre-quant scale search must leave the tower alone) and an FP16 KV cache.
    (project, the build's output)."""
    project = Project(tmp_path_factory.mktemp("vlm") / "proj")
    for recipe in (RECIPE, ORIN, INTERNVL):
        (project.recipes / f"{recipe}.toml").write_text((REPO / "recipes" / f"{recipe}.toml").read_text())
    text = (REPO / "recipes" / f"{RECIPE}.toml").read_text().replace(
        'weights = "fp8"\nkv_cache = "fp8"', 'weights = "int4_awq"\nkv_cache = "fp16"\nvisual = "fp8"')
    assert 'visual = "fp8"' in text
    (project.recipes / f"{FP8_TOWER}.toml").write_text(text)
    proc = project.doit("build", f"recipe={RECIPE},{FP8_TOWER},{ORIN},{INTERNVL}", timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project, proc.stdout


@pytest.fixture(scope="module")
def built(project_built):
    project, stdout = project_built
    return project, _kit(project, RECIPE, "agx-thor"), stdout


def _built(project_built, recipe: str, target: str):
    """The family suite's view of one of the module's recipes: (project, {target: kit}, the build's output)."""
    project, stdout = project_built
    return project, {target: _kit(project, recipe, target)}, stdout


@pytest.fixture(scope="module")
def built_qwen3_vl(project_built):
    return _built(project_built, RECIPE, "agx-thor")


@pytest.fixture(scope="module")
def built_qwen2_5_vl(project_built):
    return _built(project_built, ORIN, "orin-nano-8gb")


@pytest.fixture(scope="module")
def built_internvl(project_built):
    return _built(project_built, INTERNVL, "agx-thor")


@pytest.fixture(scope="module")
def fp8_tower(project_built, tmp_path_factory):
    """The FP8-tower kit through the device half on the recorded Thor."""
    project, _ = project_built
    tmp = tmp_path_factory.mktemp("fp8-tower")
    return project, tmp, device(project, _kit(project, FP8_TOWER, "agx-thor"), tmp / "device", board="agx-thor-jp72")


def test_an_fp8_tower_is_calibrated_with_images_exported_in_e4m3_and_checked_against_its_scales(fp8_tower):
    """The tower's linears (not its patch embedding or position table) calibrated with image prompts; the exporter
    reads them as E4M3 weights with per-tensor scales and writes FP8 Q/DQ; the independent check runs that graph
    against transformers' tower with the same scales."""
    import onnx

    project, _, _ = fp8_tower
    quant = json.loads((_stage(project, "quantize", FP8_TOWER) / "quantize.json").read_text())
    assert quant["visual"] == "fp8" and quant["calibration_images"] > 0
    visual = json.loads((_stage(project, "export", FP8_TOWER) / "stage.json").read_text())["export"]["visual"]
    assert visual["precision"] == "fp8" and visual["images"] == len(BUILTIN_IMAGES)
    assert visual["cosine"] >= MIN_COSINE_FP8 and visual["max_relative_error"] <= MAX_RELATIVE_ERROR_FP8
    graph = onnx.load(str(_stage(project, "export", FP8_TOWER) / "onnx" / "visual" / "model.onnx"),
                      load_external_data=False)
    q = [n for n in graph.graph.node if n.op_type == "QuantizeLinear"]
    fp8 = {a.i for n in q for a in n.attribute if a.name == "output_dtype"} | {
        i.data_type for i in graph.graph.initializer if i.data_type == onnx.TensorProto.FLOAT8E4M3FN}
    assert onnx.TensorProto.FLOAT8E4M3FN in fp8
    # one input Q/DQ per tower linear: each block's qkv, proj, fc1, fc2 and the merger's and DeepStack mergers'
    # fc1, fc2; none for the patch embedding (a convolution) or the position table
    config = _stage(project, "fetch", FP8_TOWER) / "model" / "config.json"
    vision = json.loads(config.read_text())["vision_config"]
    linears = 4 * vision["depth"] + 2 * (1 + len(vision["deepstack_visual_indexes"]))
    assert len(q) == linears and quant["tower_quantizers"] == 2 * linears     # a weight and an input quantizer each
    # every Q/DQ scale per tensor, in FP16 (FP8Linear's export)
    scales = {n.input[1] for n in graph.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    held = {i.name: i for i in graph.graph.initializer}
    assert scales and all(held[s].data_type == onnx.TensorProto.FLOAT16 and not held[s].dims
                          for s in scales if s in held)


def test_the_fp8_towers_check_fails_a_graph_that_lost_its_activation_quantization(fp8_tower, tmp_path):
    """The check's FP8 bounds tell the exported graph from one whose tower linears take their inputs unquantized
    (each input QuantizeLinear -> DequantizeLinear pair removed), against the same tower checkpoint."""
    import onnx

    from pipeline.errors import PipelineError
    from pipeline.images import open_image
    from pipeline.workstation.state import load_quantized
    from pipeline.workstation.visual_check import check_tower
    from pipeline.workstation.visual_export import tower_fp8_tensors, write_tower_checkpoint

    project, _, _ = fp8_tower
    model_dir = _stage(project, "fetch", FP8_TOWER) / "model"
    model = load_quantized(model_dir, _stage(project, "quantize", FP8_TOWER), "cpu").half()
    write_tower_checkpoint(model_dir, tmp_path / "tower", "qwen3_vl", tower_fp8_tensors(model, "qwen3_vl"))
    exported = _stage(project, "export", FP8_TOWER) / "onnx" / "visual" / "model.onnx"
    images = [open_image(BUILTIN_IMAGES["red-circle"].png())]
    assert check_tower(exported, tmp_path / "tower", "qwen3_vl", images).precision == "fp8"

    graph = onnx.load(str(exported))
    nodes = {n.output[0]: n for n in graph.graph.node}
    bypass = {}     # an input DequantizeLinear's output -> the tensor its QuantizeLinear read
    for n in graph.graph.node:
        if n.op_type == "DequantizeLinear" and nodes.get(n.input[0]) is not None \
                and nodes[n.input[0]].op_type == "QuantizeLinear":
            bypass[n.output[0]] = nodes[n.input[0]].input[0]
    assert bypass
    for n in graph.graph.node:
        n.input[:] = [bypass.get(i, i) for i in n.input]
    (tmp_path / "lost").mkdir()
    onnx.save(graph, str(tmp_path / "lost" / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    with pytest.raises(PipelineError, match=r"disagrees with the checkpoint's .* cosine 0\.99[0-9]+ \(at least "
                                            r"0\.9995\)"):
        check_tower(tmp_path / "lost" / "model.onnx", tmp_path / "tower", "qwen3_vl", images)


def test_an_fp8_tower_kit_builds_and_validates_on_thor_through_the_runtime(fp8_tower):
    """The device half on the FP8 tower's kit: visual_build, then llm_inference answers every golden, the image ones
    through the FP8 graph (the runtime double runs its Q/DQ as ONNX specifies them)."""
    _, tmp, proc = fp8_tower
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report_dir,) = (tmp / "device" / "out").glob("*.report")
    report = contract.Report.load(report_dir / contract.REPORT_JSON)
    assert report.ok and [p.agreement for p in report.prompts] == [1.0, 1.0, 1.0]


def test_the_kit_carries_both_graphs_the_images_and_the_image_goldens(built):
    project, kit, stdout = built
    assert "package  tiny-qwen3-vl-thor: tiny-qwen3-vl-thor@agx-thor" in stdout
    export = _stage(project, "export")
    for graph in ("onnx/llm/model.onnx", "onnx/visual/model.onnx", "onnx/visual/preprocessor_config.json"):
        assert (export / graph).is_file(), graph
    manifest = json.loads((export / "stage.json").read_text())
    visual = manifest["export"]["visual"]
    assert visual["design"] == "qwen3_vl" and visual["images"] == len(BUILTIN_IMAGES)
    assert visual["max_relative_error"] < 5e-3 and visual["cosine"] > 0.9999
    goldens = contract.Goldens.load(_stage(project, "goldens") / contract.GOLDENS)
    asked = [(p.image, p.image_tokens) for p in goldens.prompts]
    assert asked == [("images/red-circle.png", 72), ("images/flag-stripes.png", 77), (None, 0)]
    assert (_stage(project, "goldens") / "images" / "red-circle.png").read_bytes() == \
        BUILTIN_IMAGES["red-circle"].png()
    accuracy = contract.AccuracyReport.load(_stage(project, "accuracy") / contract.ACCURACY_JSON)
    assert accuracy.image_prompts == 2 and 0.0 <= accuracy.image_top1_agreement <= 1.0
    assert f"{accuracy.image_top1_agreement:.1%} on the 2 image prompts" in stdout
    plan = contract.Plan.load(_stage(project, "plan") / contract.PLAN)
    assert [a[0] for a in plan.device_build_commands] == ["llm_build", "visual_build"]
    assert plan.visual is not None and plan.visual.limits.max_image_tokens_per_image == 128


def _tower(project, recipe):
    """(the recipe's fetched model, its export's onnx/visual, the stage's visual record, the tower's shape)."""
    from pipeline.plan.shapes import load_shape
    src = _stage(project, "fetch", recipe) / "model"
    export = _stage(project, "export", recipe)
    visual = json.loads((export / "stage.json").read_text())["export"]["visual"]
    return src, export / "onnx" / "visual", visual, load_shape(src).tower


@pytest.mark.parametrize("recipe", [RECIPE, ORIN, INTERNVL])
def test_each_exported_tower_computes_what_transformers_computes_on_every_builtin_image(project_built, recipe):
    """The three tower designs through Edge-LLM's exporter: the graph the build device's visual_build reads, and the
    export stage's own check (the ONNX in ONNX's reference evaluator against transformers' tower, on every builtin
    image) within FP16's error."""
    src, onnx_dir, visual, tower = _tower(project_built[0], recipe)
    graph = visual["onnx"]
    assert visual["design"] == tower.design.name and visual["precision"] == "fp16"
    assert graph["inputs"] == list(tower.design.graph_inputs)
    assert graph["outputs"] == ["output", *[f"deepstack_features_{i}" for i in range(tower.deepstack)]]
    assert graph["custom_ops"] == ["trt_edgellm:ViTAttentionPlugin"]
    assert sorted(p.name for p in onnx_dir.iterdir()) == ["config.json", "model.onnx", "model.onnx.data",
                                                          "preprocessor_config.json"]
    # the processor's settings travel as the checkpoint has them (Edge-LLM's runtime preprocesses with them)
    assert json.loads((onnx_dir / "preprocessor_config.json").read_text()) == json.loads(
        (src / "preprocessor_config.json").read_text())
    assert visual["images"] == len(BUILTIN_IMAGES)
    assert visual["max_relative_error"] < 5e-3 and visual["cosine"] > 0.99999


def test_the_tower_export_is_byte_for_byte_reproducible(project_built, tmp_path):
    """Exporting the build's tower again gives the same bytes."""
    from pipeline.workstation.visual_export import export_visual
    src, first, _, tower = _tower(project_built[0], RECIPE)
    export_visual(src, tmp_path, tmp_path / "visual", tower.design, tower.deepstack)
    for f in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "visual" / f).read_bytes() == (first / f).read_bytes(), f
    # the exporter's output is moved out; the checkpoint it read stays for the numerical check (export_tower
    # removes it after the check)
    assert (tmp_path / "tower-checkpoint" / "model.safetensors").is_file()
    assert not (tmp_path / "edgellm-visual").exists()


def test_a_tampered_tower_weight_is_caught_by_the_check(project_built, tmp_path):
    """The merger's last matrix with one column scaled: the independent check names the disagreement, its size."""
    import onnx
    from onnx import numpy_helper
    from PIL import Image

    from pipeline.errors import PipelineError
    from pipeline.workstation.visual_check import MAX_RELATIVE_ERROR, check_tower
    src, onnx_dir, _, tower = _tower(project_built[0], ORIN)
    model = onnx.load(str(onnx_dir / "model.onnx"))
    merger = [i for i in model.graph.initializer if "merger" in i.name and i.dims and len(i.dims) == 2][-1]
    w = numpy_helper.to_array(merger).copy()
    w[:, 0] *= 3
    merger.CopyFrom(numpy_helper.from_array(w, merger.name))
    bad = tmp_path / "visual"
    bad.mkdir()
    onnx.save(model, str(bad / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    image = Image.open(io.BytesIO(BUILTIN_IMAGES["red-circle"].png())).convert("RGB")
    with pytest.raises(PipelineError, match=r"disagrees with the checkpoint's on the recipe's images: largest "
                                            r"difference .* of the reference's scale \(at most 0.02\)"):
        check_tower(bad / "model.onnx", src, tower.design, [image])
    assert MAX_RELATIVE_ERROR == 0.02


@pytest.mark.parametrize("recipe, kv, deepstack", [(RECIPE, "fp8", 2), (FP8_TOWER, "fp16", 2), (ORIN, "fp16", 0),
                                                     (INTERNVL, "fp16", 0)])
def test_each_language_model_the_build_exported_is_the_recipes_with_its_towers_features(
        project_built, tmp_path, recipe, kv, deepstack):
    """The language model each export wrote takes the KV cache its recipe asks and the tower's DeepStack features
    where the tower has them. Its agreement with the calibrated model through the runtime double is the family
    suite's for the shipped recipes; for the FP8-tower variant (the tower left alone by the language model's
    calibration: text and image prompts) it is checked here."""
    project, _ = project_built
    export = _stage(project, "export", recipe)
    if recipe == FP8_TOWER:
        r = built_vs_engine(project, recipe, tmp_path, kv)
        assert r["top1_tie_aware"] == 1.0 and r["logit_cosine_min"] > 0.9999, r
    cfg = json.loads((export / "onnx" / "llm" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["kv_cache_dtype"] == kv
    assert cfg.get("num_deepstack_features", 0) == deepstack     # Qwen3-VL's first layers take the tower's extras


@pytest.fixture(scope="module")
def built_orin(project_built):
    project, _ = project_built
    return project, _kit(project, ORIN, "orin-nano-8gb")


@pytest.fixture(scope="module")
def validated_internvl(project_built, tmp_path_factory):
    """The InternVL3 kit built and run through `pipeline device` on the recorded Thor."""
    project, _ = project_built
    kit = _kit(project, INTERNVL, "agx-thor")
    tmp = tmp_path_factory.mktemp("device-internvl")
    return tmp, device(project, kit, tmp, board="agx-thor-jp72")


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    """`pipeline device` on the kit, on the recorded Thor, once for the module: (its directory, the process)."""
    project, kit, _ = built
    tmp = tmp_path_factory.mktemp("device")
    return tmp, device(project, kit, tmp, board="agx-thor-jp72", LLM_BUILD_DOUBLE_RECORD=str(tmp / "b.jsonl"))


@pytest.fixture(scope="module")
def validated_orin(built_orin, tmp_path_factory):
    """`pipeline device` on the Qwen2.5-VL kit, on the recorded-shape Orin Nano with JetPack 7.2."""
    project, kit = built_orin
    tmp = tmp_path_factory.mktemp("device-orin")
    return tmp, device(project, kit, tmp, board="orin-nano-8gb-jp72", LLM_BUILD_DOUBLE_RECORD=str(tmp / "b.jsonl"))


@pytest.fixture(scope="module")
def validated_qwen3_vl(validated):
    return {"agx-thor": validated}


@pytest.fixture(scope="module")
def validated_orin_by_target(validated_orin):
    return {"orin-nano-8gb": validated_orin}


@pytest.fixture(scope="module")
def validated_internvl_by_target(validated_internvl):
    return {"agx-thor": validated_internvl}


def test_an_internvl3_kit_validates_its_tiled_images_through_the_runtime(validated_internvl):
    """The second tower design (the family suite checks every golden through the runtime): whole 256-token tiles,
    image features into a Qwen2 language model with plain RoPE, the ViT timed."""
    tmp_path, proc = validated_internvl
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (report_dir,) = (tmp_path / "out").glob("*.report")
    report = contract.Report.load(report_dir / contract.REPORT_JSON)
    assert report.measured.image_tokens == 256 and report.measured.vit_ms > 0


def test_the_orin_on_jetpack_7_2_builds_and_validates_a_qwen2_5_vl_kit(validated_orin):
    """The window-attention tower and Qwen2.5-VL's sectioned multimodal RoPE, INT4-AWQ on SM 8.7 with an FP16 tower:
    both engines built with the plan's flags (every golden answered through the runtime: the family suite), ViT
    time reported."""
    tmp_path, proc = validated_orin
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list((tmp_path / "out").glob("*@orin-nano-8gb-sm87-trt10.16.*"))
    argvs = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [a[0] for a in argvs] == ["llm_build", "visual_build"]
    assert argvs[1][argvs[1].index("--maxImageTokensPerImage") + 1] == "64"
    (report_dir,) = (tmp_path / "out").glob("*.report")
    report = contract.Report.load(report_dir / contract.REPORT_JSON)
    assert report.measured.vit_ms > 0 and report.predicted.vit_ms > 0


def test_the_device_builds_both_engines_and_validates_the_image_prompts_through_the_runtime(validated):
    """On the recorded Thor: llm_build, then visual_build with the plan's image profile (the doubles take the tools'
    own flags); llm_inference asked with the kit's images (content items naming them) and --multimodalEngineDir
    answers every golden (the runtime double runs the visual ONNX and feeds its features, DeepStack and multimodal
    RoPE as the runtime does); the report has the ViT time next to the plan's at the images' size; a bundle is
    signed."""
    tmp_path, proc = validated
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argvs = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [a[0] for a in argvs] == ["llm_build", "visual_build"]
    visual = argvs[1]
    assert visual[visual.index("--onnxDir") + 1] == "onnx/visual"
    assert [visual[visual.index(f) + 1] for f in ("--minImageTokens", "--maxImageTokens",
                                                  "--maxImageTokensPerImage")] == ["4", "1024", "128"]
    engine = tmp_path / "work" / "engine"
    assert (engine / "visual" / "visual.engine").is_file() and (engine / "llm.engine").is_file()
    assert json.loads((engine / "visual" / "config.json").read_text())["builder_config"] == {
        "min_image_tokens": 4, "max_image_tokens": 1024, "max_image_tokens_per_image": 128}
    asked = json.loads((tmp_path / "work" / "inference-input.json").read_text())["requests"][0]["messages"][0]
    assert asked["content"][0]["type"] == "image" and asked["content"][0]["image"].endswith("images/red-circle.png")
    (report_dir,) = (tmp_path / "out").glob("*.report")
    report = contract.Report.load(report_dir / contract.REPORT_JSON)
    assert report.ok and [p.agreement for p in report.prompts] == [1.0, 1.0, 1.0]
    assert [p.vit_ms is not None for p in report.prompts] == [True, True, False]
    assert report.measured.image_tokens == round((72 + 77) / 2) and report.measured.vit_ms > 0
    assert report.predicted.vit_ms is not None and report.predicted.vit_ms > 0
    assert "ViT, 74-token images" in (report_dir / contract.REPORT_MD).read_text()
    assert list((tmp_path / "out").glob("*-trt*"))        # the signed bundle


def _double_first_step(engine_dir, kit_dir, golden, variant):
    """The runtime double's first-step log-probabilities for a golden asked with its image: as the runtime feeds
    the engine ("runtime"), with text positions for the image tokens ("1-D"), or with the image's features zeroed
    ("no image")."""
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(REPO / "tests" / "doubles" / "python"))
    from edgellm_engine import PAGE, ImageInputs, load_engine
    from edgellm_visual import VisualEngine, mrope_positions

    engine, visual = load_engine(engine_dir, "llm.engine", "config.json"), VisualEngine(engine_dir / "visual")
    pad = PreTrainedTokenizerFast(tokenizer_file=str(engine_dir / "tokenizer.json")).convert_tokens_to_ids(
        visual.placeholder)
    enc = visual.encode([str(kit_dir / golden.image)])
    positions, offset = mrope_positions(golden.input_ids, pad, enc.grids) if visual.geometry else (None, 0)
    image = {"runtime": ImageInputs(pad, enc.embeds, enc.deepstack, positions, offset),
             "1-D": ImageInputs(pad, enc.embeds, enc.deepstack, None, 0),
             "no image": ImageInputs(pad, enc.embeds * 0, [d * 0 for d in enc.deepstack], positions, offset)}[variant]
    pages = -(-len(golden.input_ids) // PAGE)
    pools = engine.new_pools(pages)
    table = np.stack([np.arange(pages), np.arange(pages)])[None].astype(np.int32)
    logits = engine.step(list(golden.input_ids), 0, pools, table, image).astype(np.float64)[:engine.cfg["vocab_size"]]
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


@pytest.fixture(scope="module")
def validated_fp8_tower(fp8_tower):
    _, tmp, proc = fp8_tower
    return tmp / "device", proc


@pytest.mark.parametrize("which", ["validated", "validated_orin", "validated_internvl", "validated_fp8_tower"])
def test_the_runtime_double_computes_the_image_goldens_and_tells_a_wrong_image_feed(which, request):
    """The device check is only as good as the double: its first step agrees with the goldens' log-probabilities
    (FP8 / INT4 and FP16 against the calibrated model's), and feeding the image tokens text positions or dropping
    the image's features changes the top token."""
    import numpy as np

    tmp_path, proc = request.getfixturevalue(which)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "work"
    goldens = contract.Goldens.load(work / "kit" / contract.GOLDENS)
    for golden in [g for g in goldens.prompts if g.image]:
        ids = [int(i) for i, _ in golden.top_logprobs[0]]
        want = np.array([v for _, v in golden.top_logprobs[0]])
        ours = {v: _double_first_step(work / "engine", work / "kit", golden, v) for v in ("runtime", "1-D", "no image")}
        off = {v: float(np.abs(lp[ids] - want).max()) for v, lp in ours.items()}
        assert int(ours["runtime"].argmax()) == ids[0] and off["runtime"] < 0.3, off
        assert off["no image"] > 3 * off["runtime"], off
        if which != "validated_internvl":       # InternVL's language model has no multimodal RoPE
            assert off["1-D"] > 3 * off["runtime"], off


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _first_step(choice) -> list[float]:
    return [t.logprob for t in choice.logprobs.content[0].top_logprobs]


def test_serve_answers_an_openai_client_chat_with_an_image_as_the_goldens_say(built, tmp_path):
    """The image goldens' own prompts and images, sent as the openai client sends an image (a data URL part): the
    same answer, the same prompt tokens (image tokens counted by the family's token math), the same first-step
    log-probabilities. The image decides them: the first prompt asked with the other image gets other ones."""
    from openai import BadRequestError, OpenAI
    project, _, _ = built
    stage = _stage(project, "goldens")
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    asked = [p for p in goldens.prompts if p.image]
    s = Served([RECIPE], project.env, REPO, tmp_path / "server.log")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)

        def ask(prompt, image, **kw):
            return client.chat.completions.create(
                model=RECIPE, temperature=0, logprobs=True, top_logprobs=len(asked[0].top_logprobs[0]), **kw,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(image)}},
                                                       {"type": "text", "text": prompt}]}])
        for p in asked:
            r = ask(p.prompt, (stage / p.image).read_bytes(), max_tokens=len(p.output_ids))
            assert r.choices[0].message.content == p.text
            assert r.usage.prompt_tokens == len(p.input_ids) and r.usage.completion_tokens == len(p.output_ids)
            assert _first_step(r.choices[0]) == pytest.approx([v for _, v in p.top_logprobs[0]], abs=2e-4)
        swapped = ask(asked[0].prompt, (stage / asked[1].image).read_bytes(), max_tokens=1)
        assert _first_step(swapped.choices[0]) != pytest.approx([v for _, v in asked[0].top_logprobs[0]], abs=2e-4)

        # Open WebUI's upload: the text, then the image, in a later turn of a chat, streamed
        image = BUILTIN_IMAGES["checkerboard"].png()
        chunks = list(client.chat.completions.create(model=RECIPE, stream=True, max_tokens=4, temperature=0,
                                                     stream_options={"include_usage": True}, messages=[
            {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": _data_url(image)}}]}]))
        assert chunks[-1].usage.completion_tokens == 4
        from pipeline.families.visual import QWEN3_VL
        from pipeline.serve.images import held
        tokens = held(QWEN3_VL, 128).image_tokens(BUILTIN_IMAGES["checkerboard"].height,
                                                  BUILTIN_IMAGES["checkerboard"].width)
        assert chunks[-1].usage.prompt_tokens > tokens

        # `bench` sends the image with every request (a chat): the server's own token count comes back
        (tmp_path / "c.png").write_bytes(image)
        b = subprocess.run([sys.executable, "-m", "pipeline", "bench", s.url, "--image", str(tmp_path / "c.png"),
                            "--concurrency", "1", "--requests", "2", "--max-tokens", "3", "--json",
                            str(tmp_path / "b.json")], env=project.env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
        assert b.returncode == 0, b.stderr
        assert f"2 requests of 3 tokens per level, each with {tmp_path / 'c.png'}" in b.stdout
        (run,) = json.loads((tmp_path / "b.json").read_text())["runs"]
        assert run["requests"] == 2 and run["tok_s"] == pytest.approx(6 / run["seconds"], abs=0.02)
        (tmp_path / "c.gif").write_bytes(b"GIF89a" + bytes(30))
        bad = subprocess.run([sys.executable, "-m", "pipeline", "bench", s.url, "--image", str(tmp_path / "c.gif")],
                             env=project.env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "c.gif: is not a PNG, JPEG or WebP image" in bad.stderr
        assert "Traceback" not in bad.stderr

        with pytest.raises(BadRequestError, match=r"messages\[0\].content\[0\].image_url: the image is not a PNG, "
                                                  r"JPEG or WebP image") as e:
            client.chat.completions.create(model=RECIPE, max_tokens=1, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,R0lGODlhAQABAAAAACw="}}]}])
        assert e.value.body["param"] == "messages[0].content[0].image_url"
    finally:
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_image_hosts_that_trickle_cost_their_requests_the_deadline_and_block_no_other_request(built, tmp_path):
    """#66: two requests whose allowed image host trickles a byte every 0.2 s held both preparation slots forever,
    and every request with an image, tools or a long prompt then hung while /health said ok. Now: /health says the
    slots are saturated, a plain chat is answered meanwhile, an image chat waits PREPARE_WAIT_S for a slot and gets a
    503 with Retry-After, and the trickling requests end at the fetch deadline with a 400 naming the part."""
    import contextlib
    import threading
    import time
    import urllib.error
    import urllib.request

    from pipeline.serve.app import PREPARE_WAIT_S, TOKENIZER_THREADS
    from pipeline.serve.images import FETCH_DEADLINE_S
    project, _, _ = built
    hosts = contextlib.ExitStack()
    slow_url = hosts.enter_context(trickling_image_host())
    s = Served([RECIPE, "--allow-image-urls", "127.0.0.1"], project.env, REPO, tmp_path / "server.log")

    def post(image_url: str | None, out: list) -> None:
        content: list = [{"type": "text", "text": "What is it?"}]
        if image_url:
            content.append({"type": "image_url", "image_url": {"url": image_url}})
        body = json.dumps({"model": RECIPE, "max_tokens": 2, "messages": [{"role": "user", "content": content}]})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(urllib.request.Request(s.url + "/v1/chat/completions", body.encode(), {
                    "Content-Type": "application/json"}), timeout=120) as r:
                out.append((r.status, json.loads(r.read()), r.headers, time.monotonic() - t0))
        except urllib.error.HTTPError as e:
            out.append((e.code, json.loads(e.read()), e.headers, time.monotonic() - t0))
    try:
        slow: list = []
        held = [threading.Thread(target=post, args=(slow_url, slow)) for _ in range(TOKENIZER_THREADS)]
        for t in held:
            t.start()
        deadline = time.monotonic() + 10
        while health(s.url)[1].get("preparing") != TOKENIZER_THREADS and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health(s.url)[1] == {"status": "ok", "preparing": TOKENIZER_THREADS, "saturated": True}
        plain: list = []
        post(None, plain)
        assert plain[0][0] == 200 and plain[0][3] < 5, plain         # a plain chat: not behind the held slots
        waited: list = []
        post(_data_url(BUILTIN_IMAGES["checkerboard"].png()), waited)
        status, err, headers, took = waited[0]
        assert (status, headers.get("Retry-After"), err["error"]["code"]) == (503, "2", "preparation_busy"), waited
        assert PREPARE_WAIT_S - 0.5 < took < PREPARE_WAIT_S + 5
        for t in held:
            t.join(timeout=FETCH_DEADLINE_S + 30)
        assert [(r[0], r[1]["error"]["code"], r[1]["error"]["param"]) for r in slow] == \
            [(400, "image_fetch_timeout", "messages[0].content[1].image_url")] * TOKENIZER_THREADS, slow
        assert all(FETCH_DEADLINE_S - 0.5 < r[3] < FETCH_DEADLINE_S + 10 for r in slow), slow
        assert health(s.url)[1] == {"status": "ok", "preparing": 0, "saturated": False}
        again: list = []
        post(_data_url(BUILTIN_IMAGES["checkerboard"].png()), again)
        assert again[0][0] == 200, again                             # the slots are free again
    finally:
        hosts.close()
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()

"""The visual tower through Edge-LLM 0.11's own exporter, then run in ONNX's reference evaluator against transformers'
tower on the builtin images: for the three tower designs, from tiny models shrunk from real configs."""

import io
import json
import shutil

import pytest
from PIL import Image

from pipeline.errors import PipelineError
from pipeline.images import BUILTIN_IMAGES
from pipeline.plan.shapes import load_shape
from pipeline.workstation.visual_check import MAX_RELATIVE_ERROR, check_tower
from pipeline.workstation.visual_export import GRAPH_INPUTS, export_visual, write_tower_checkpoint
from tests.workstation.test_export import builtin  # noqa: F401  (fixture)

VLMS = ["tiny-qwen3-vl", "tiny-qwen2.5-vl", "tiny-internvl3"]


def images(*names):
    return [Image.open(io.BytesIO(BUILTIN_IMAGES[n].png())).convert("RGB") for n in names or BUILTIN_IMAGES]


@pytest.fixture(scope="session")
def exported(builtin, tmp_path_factory):  # noqa: F811
    """Each tiny VLM's tower exported once: (model dir, onnx dir, graph, tower shape)."""
    made = {}

    def get(name):
        if name not in made:
            src = builtin(name)
            tower = load_shape(src).tower
            work = tmp_path_factory.mktemp(f"visual-{name}")
            graph = export_visual(src, work, work / "visual", tower.design, tower.deepstack)
            made[name] = src, work / "visual", graph, tower
        return made[name]
    return get


@pytest.mark.parametrize("name", VLMS)
def test_the_exported_tower_computes_what_transformers_computes_on_every_builtin_image(exported, name):
    src, onnx_dir, graph, tower = exported(name)
    assert graph["inputs"] == list(GRAPH_INPUTS[tower.design])
    assert graph["outputs"] == ["output", *[f"deepstack_features_{i}" for i in range(tower.deepstack)]]
    assert graph["custom_ops"] == ["trt_edgellm:ViTAttentionPlugin"]
    assert sorted(p.name for p in onnx_dir.iterdir()) == ["config.json", "model.onnx", "model.onnx.data",
                                                          "preprocessor_config.json"]
    # the processor's settings travel as the checkpoint has them (Edge-LLM's runtime preprocesses with them)
    assert json.loads((onnx_dir / "preprocessor_config.json").read_text()) == json.loads(
        (src / "preprocessor_config.json").read_text())
    agreement = check_tower(onnx_dir / "model.onnx", src, tower.design, images())
    assert agreement.images == len(BUILTIN_IMAGES)
    assert agreement.max_relative_error < 5e-3 and agreement.cosine > 0.99999


def test_the_export_is_byte_for_byte_reproducible(exported, tmp_path):
    """A second export of the tower the session already exported gives the same bytes."""
    src, first, _, tower = exported("tiny-qwen3-vl")
    export_visual(src, tmp_path, tmp_path / "visual", tower.design, tower.deepstack)
    for f in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "visual" / f).read_bytes() == (first / f).read_bytes(), f
    # the exporter's output is moved out; the checkpoint it read stays for the numerical check (export_tower
    # removes it after the check)
    assert (tmp_path / "tower-checkpoint" / "model.safetensors").is_file()
    assert not (tmp_path / "edgellm-visual").exists()


def test_a_tampered_weight_is_caught_by_the_check(exported, tmp_path):
    """The merger's last matrix with one column scaled: the independent check names the disagreement, its size."""
    import onnx
    from onnx import numpy_helper
    src, onnx_dir, _, tower = exported("tiny-qwen2.5-vl")
    model = onnx.load(str(onnx_dir / "model.onnx"))
    merger = [i for i in model.graph.initializer if "merger" in i.name and i.dims and len(i.dims) == 2][-1]
    w = numpy_helper.to_array(merger).copy()
    w[:, 0] *= 3
    merger.CopyFrom(numpy_helper.from_array(w, merger.name))
    bad = tmp_path / "visual"
    bad.mkdir()
    onnx.save(model, str(bad / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    with pytest.raises(PipelineError, match=r"disagrees with the checkpoint's on the recipe's images: largest "
                                            r"difference .* of the reference's scale \(at most 0.02\)"):
        check_tower(bad / "model.onnx", src, tower.design, images("red-circle"))
    assert MAX_RELATIVE_ERROR == 0.02


def test_the_exporter_reads_only_the_towers_tensors_in_fp16_and_no_remote_code(builtin, tmp_path):  # noqa: F811
    import torch
    from safetensors import safe_open
    src = tmp_path / "src"
    shutil.copytree(builtin("tiny-internvl3"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "evil.Model"}}))
    n = write_tower_checkpoint(src, tmp_path / "tower", "internvl")
    with safe_open(str(tmp_path / "tower" / "model.safetensors"), "pt") as fh:
        keys = list(fh.keys())
        assert len(keys) == n and all(fh.get_tensor(k).dtype == torch.float16 for k in keys)
    assert all(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in keys)
    assert "auto_map" not in json.loads((tmp_path / "tower" / "config.json").read_text())


def test_a_checkpoint_without_its_processor_or_tower_is_one_clear_error(builtin, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    shutil.copytree(builtin("tiny-qwen3-vl"), src)
    (src / "preprocessor_config.json").unlink()
    with pytest.raises(PipelineError, match=r"no preprocessor_config.json: the image processor's settings"):
        write_tower_checkpoint(src, tmp_path / "t1", "qwen3_vl")
    with pytest.raises(PipelineError, match=r"no visual tower tensors \(named \[model.\]vision_tower"):
        write_tower_checkpoint(src, tmp_path / "t2", "internvl")


def test_quantizing_a_vlm_leaves_its_tower_exactly_as_the_checkpoint_has_it(builtin, tmp_path):  # noqa: F811
    import torch
    from safetensors import safe_open

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.state import load_quantized
    from pipeline.workstation.visual_check import tower_module
    from tests.workstation.test_export import CAL
    src = builtin("tiny-qwen3-vl")
    quantize(src, tmp_path, "int4_awq", "fp16", 64, CAL, ".")
    model = load_quantized(src, tmp_path, "cpu")
    tower = {n: m for n, m in model.named_modules() if n.startswith("model.visual.")}
    quantizers = [n for n, m in tower.items() if n.endswith("_quantizer") and getattr(m, "is_enabled", False)]
    assert tower and quantizers == []
    assert any(getattr(m, "is_enabled", False) for n, m in model.named_modules() if "language_model" in n)
    params = dict(model.named_parameters())
    with safe_open(str(src / "model.safetensors"), "pt") as fh:
        for key in fh.keys():
            if tower_module(key, "qwen3_vl"):
                assert torch.equal(params[key].float(), fh.get_tensor(key).half().float()), key

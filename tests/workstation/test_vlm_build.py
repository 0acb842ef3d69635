"""`doit build` of the repository's tiny vision-language recipe, offline on the CPU: a kit carrying both ONNX trees,
the images and goldens asked with them; the device half verifies it and then refuses, saying it cannot check the
visual engine yet (issue 39)."""

import json

import pytest
from conftest import REPO, Project, device

from pipeline import contract
from pipeline.images import BUILTIN_IMAGES

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3-vl-thor"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("vlm") / "proj")
    (project.recipes / f"{RECIPE}.toml").write_text((REPO / "recipes" / f"{RECIPE}.toml").read_text())
    proc = project.doit("build", f"recipe={RECIPE}", timeout=900)
    return project, project.artifacts / RECIPE / "kit" / f"{RECIPE}@agx-thor", proc.stdout


def _stage(project, name):
    (d,) = [p for p in (project.artifacts / "stages" / name).iterdir() if (p / "stage.json").is_file()]
    return d


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


def test_the_device_verifies_the_kit_and_refuses_to_use_an_unchecked_visual_engine(built, tmp_path):
    project, kit, _ = built
    proc = device(project, kit, tmp_path, board="agx-thor-jp72")
    assert proc.returncode != 0
    assert "unpacked and verified" in proc.stdout + proc.stderr
    assert "2 of the kit's validation prompts are asked with an image" in proc.stderr
    assert "cannot check the visual engine" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

"""`doit build` of the tiny multimodal Qwen3.5 recipe, offline on the CPU: a hybrid decoder (gated delta-net layers
beside gated attention, interleaved multimodal RoPE over a quarter of each head) and Qwen3-VL's tower without
DeepStack. Through the family suite (tests/conformance.py): the device half on the recorded Orin Nano (JetPack 7.2)
builds both engines and the runtime double answers every image golden, the delta-net state carried from the image
prefill into decode; `serve` answers an openai client's image chats as the goldens say; the runtime double runs the
exported language model along the calibrated model's answer. Here: what the hybrid tower kit holds, and what the
device's double needs to tell a wrong image feed."""

import numpy as np
import pytest
from conftest import REPO, Project, device

from pipeline import contract
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of
from tests.workstation.test_vlm_build import _double_first_step

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3_5-vl"
TARGET = "orin-nano-8gb"
FAMILIES = rows_of(__file__)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("hybrid-vlm") / "proj")
    (project.recipes / f"{RECIPE}.toml").write_text((REPO / "recipes" / f"{RECIPE}.toml").read_text())
    proc = project.doit("build", f"recipe={RECIPE}", timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project, project.artifacts / RECIPE / "kit" / f"{RECIPE}@{TARGET}", proc.stdout


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kit, _ = built
    tmp = tmp_path_factory.mktemp("device")
    return tmp, device(project, kit, tmp, board="orin-nano-8gb-jp72")


@pytest.fixture(scope="module")
def built_by_target(built):
    project, kit, stdout = built
    return project, {TARGET: kit}, stdout


@pytest.fixture(scope="module")
def validated_by_target(validated):
    return {TARGET: validated}


def test_the_kit_holds_a_hybrid_language_model_and_a_tower_without_deepstack(built):
    """The build says what it made: INT4-AWQ with the delta-nets' b/a projections kept FP16, an FP16 tower beside
    it; the language graph takes no DeepStack features and has one gated_delta_net plugin per delta-net layer; the
    visual graph gives the merged features alone."""
    import json

    import onnx
    project, kit, stdout = built
    assert f"quantize {RECIPE}: int4_awq (KV fp16) on cpu, 512 calibration tokens and 10 image prompts; kept FP16: " \
           "in_proj_b, in_proj_a" in stdout, stdout
    assert f"export   {RECIPE}: int4_awq ONNX for SM 87, fp16 visual tower" in stdout, stdout
    export = (project.artifacts / RECIPE / "export").resolve()
    llm = onnx.load(str(next(export.rglob("llm/model.onnx"))), load_external_data=False)
    assert not [i.name for i in llm.graph.input if i.name.startswith("deepstack")]
    assert sum(n.op_type == "gated_delta_net" for n in llm.graph.node) == 3
    assert [i.name for i in llm.graph.input if i.name.startswith("recurrent_state_")] == \
        [f"recurrent_state_{i}" for i in range(3)]
    visual = onnx.load(str(next(export.rglob("visual/model.onnx"))), load_external_data=False)
    assert [o.name for o in visual.graph.output] == ["output"]
    cfg = json.loads(next(export.rglob("llm/config.json")).read_text())
    assert cfg["rope_scaling"]["mrope_section"] == [3, 3, 2] and cfg["rope_scaling"]["mrope_interleaved"] is True
    assert kit.is_dir() and list(kit.iterdir())


def test_the_device_times_the_tower_on_the_image_goldens(validated):
    """Every golden answered through the hybrid runtime is the family suite's; the report times the ViT on the
    image goldens alone, at their mean token count."""
    tmp_path, proc = validated
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report_dir,) = (tmp_path / "out").glob("*.report")
    report = contract.Report.load(report_dir / contract.REPORT_JSON)
    assert [p.vit_ms is not None for p in report.prompts] == [True, True, False]
    assert report.measured.image_tokens == round((72 + 77) / 2) and report.measured.vit_ms > 0


def test_the_double_needs_the_images_features_and_their_multimodal_positions(validated):
    """The check is only as good as the double: its first step agrees with the goldens' log-probabilities, and
    giving the image tokens text positions or zeroing the image's features changes them several times as much."""
    tmp_path, proc = validated
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp_path / "work"
    goldens = contract.Goldens.load(work / "kit" / contract.GOLDENS)
    for golden in [g for g in goldens.prompts if g.image][:1]:     # the double's delta-nets are slow Python loops
        ids = [int(i) for i, _ in golden.top_logprobs[0]]
        want = np.array([v for _, v in golden.top_logprobs[0]])
        ours = {v: _double_first_step(work / "engine", work / "kit", golden, v) for v in ("runtime", "1-D", "no image")}
        off = {v: float(np.abs(lp[ids] - want).max()) for v, lp in ours.items()}
        assert int(ours["runtime"].argmax()) == ids[0] and off["runtime"] < 0.3, off
        assert off["no image"] > 3 * off["runtime"] and off["1-D"] > 3 * off["runtime"], off

"""`doit build` of the tiny twin of Qwen3-TTS's 1.7B layout, offline on the CPU: its code predictor is narrower than
its talker, so every row the talker hands it goes through small_to_mtp_projection first. The export writes the
projection beside the code predictor's graph (Edge-LLM 0.11's exporter) and it is checked against the checkpoint; the
reference applies it (the official implementation's codes: test_synthesis_reference.py); the device builds the three
engines and the runtime double applies it too, so the engines speak the reference's codes on the recorded Thor."""

import json
import shutil

import numpy as np
import pytest
from conftest import device_on_boards, stage_dir

from pipeline import contract
from pipeline.errors import PipelineError
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]
RECIPE = "tiny-qwen3-tts-1.7b"
FAMILIES = rows_of(__file__)
TARGET, BOARD = "agx-thor", "agx-thor-jp72"
TALKER, PREDICTOR = 96, 64          # the twin's widths (tinytts.py), as 2048 and 1024 in the 1.7B


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import build_shipped_recipe
    return build_shipped_recipe(tmp_path_factory.mktemp("tts-1.7b") / "proj", RECIPE, [TARGET])


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, {TARGET: BOARD}, tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def code_predictor(built):
    return stage_dir(built[0], RECIPE, "export") / "onnx" / "code_predictor"


def test_the_projection_is_exported_beside_the_code_predictor_as_the_checkpoint_has_it(built, code_predictor):
    import onnx
    from safetensors.numpy import load_file
    project, _, out = built
    assert "Code2Wav against the reference: cosine 0.9999" in out, out[-3000:]
    projection = load_file(str(code_predictor / "small_to_mtp_projection.safetensors"))
    assert {k: v.shape for k, v in projection.items()} == {"weight": (PREDICTOR, TALKER), "bias": (PREDICTOR,)}
    model = stage_dir(project, RECIPE, "fetch") / "model"
    weights = load_file(str(model / "model.safetensors"))
    np.testing.assert_array_equal(projection["weight"],
                                  weights["talker.code_predictor.small_to_mtp_projection.weight"])
    embeddings = load_file(str(code_predictor / "codec_embeddings.safetensors"))
    assert len(embeddings) == 15 and {v.shape for v in embeddings.values()} == {(2048, TALKER)}
    graph = onnx.load(str(code_predictor / "model.onnx"), load_external_data=False)
    rows = next(i for i in graph.graph.input if i.name == "inputs_embeds")
    assert rows.type.tensor_type.shape.dim[-1].dim_value == PREDICTOR
    # the plan counts the projection and the talker-wide embeddings in the code predictor's memory
    plan = contract.Plan.load(stage_dir(project, RECIPE, "plan") / "plan.json")
    assert plan.speech is not None and plan.speech.memory["code predictor"] > 15 * 2048 * (TALKER + PREDICTOR) * 2


def test_a_projection_that_is_not_the_checkpoint_s_or_is_missing_is_refused(built, code_predictor, tmp_path):
    from safetensors.numpy import load_file, save_file

    from pipeline.workstation.synthesis_export import check_code_predictor_inputs
    model = stage_dir(built[0], RECIPE, "fetch") / "model"
    config = json.loads((model / "config.json").read_text())
    check_code_predictor_inputs(code_predictor, model, config)      # the export's own passes
    bad = tmp_path / "code_predictor"
    shutil.copytree(code_predictor, bad)
    projection = load_file(str(bad / "small_to_mtp_projection.safetensors"))
    projection["bias"] = projection["bias"].copy()
    projection["bias"][7] += np.float32(2.0 ** -20)     # one value off by less than FP16 could even say
    save_file(projection, str(bad / "small_to_mtp_projection.safetensors"))
    with pytest.raises(PipelineError, match=r"small_to_mtp_projection.safetensors: its bias \(\[64\] torch.float32\) "
                       r"is not the checkpoint's talker.code_predictor.small_to_mtp_projection.bias"):
        check_code_predictor_inputs(bad, model, config)
    (bad / "small_to_mtp_projection.safetensors").unlink()
    with pytest.raises(PipelineError, match=r"no small_to_mtp_projection.safetensors: the code predictor \(64 wide\) "
                       r"cannot read the talker's rows \(96 wide\) without it"):
        check_code_predictor_inputs(bad, model, config)


def test_the_device_speaks_the_reference_codes_through_the_projection(validated):
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = contract.Report.load(next(tmp.glob("**/*.report")) / contract.REPORT_JSON)
    codes = [c for c in report.checks if c.check.startswith("speech codes")]
    assert report.ok and [c.measured for c in codes] == [1.0, 1.0]
    # the first text's fourth frame takes a near tie of the code predictor (a float32 margin of 0.0004, below what
    # FP16 resolves); the second is spoken code for code, all 12 frames, through the projection
    assert "frame 3 took the reference's near tie at codebook 6" in codes[0].check
    assert codes[1].check.endswith("before the first that differs") and codes[1].by is None
    engine = next((tmp / "work").glob("**/engine/code_predictor"))
    assert (engine / "small_to_mtp_projection.safetensors").is_file()   # the builder carries it beside the engine


def test_a_kit_whose_projection_was_changed_speaks_other_codes_and_fails(built, tmp_path):
    """The projection's weights negated in the kit (and the kit re-signed, so it verifies): the engines are built and
    run, and their codes are not the goldens'."""
    from conftest import device, resigned
    from safetensors.numpy import load_file, save_file
    project, kits, _ = built

    def negate(content):
        path = next(content.glob("**/code_predictor/small_to_mtp_projection.safetensors"))
        tensors = load_file(str(path))
        save_file({k: -v for k, v in tensors.items()}, str(path))
    kit = resigned(project, kits[TARGET], tmp_path, negate)
    proc = device(project, kit, tmp_path / "run", board=BOARD)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed: speech codes of 'Hello from the Jetson.' (serena, auto)" in proc.stdout + proc.stderr

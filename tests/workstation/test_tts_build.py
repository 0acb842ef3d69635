"""`doit build` of the repository's tiny text-to-speech recipe, offline on the CPU: a kit carrying Qwen3-TTS's three
graphs as Edge-LLM's exporter writes them, the reference's codes and waveforms of the recipe's texts; the device half
builds the three engines as Edge-LLM's TTS guide builds them and validates each text through qwen3_tts_inference
(doubles: the exported graphs run on the recorded Thor)."""

import json

import pytest
from conftest import device, device_on_boards, resigned, stage_dir

from pipeline import contract
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3-tts"
FAMILIES = rows_of(__file__)
TARGET, BOARD = "agx-thor", "agx-thor-jp72"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import build_shipped_recipe
    return build_shipped_recipe(tmp_path_factory.mktemp("tts") / "proj", RECIPE, [TARGET])


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, {TARGET: BOARD}, tmp_path_factory.mktemp)


def test_the_kit_carries_the_three_graphs_and_the_reference_speech(built):
    project, kits, out = built
    assert "Code2Wav against the reference: cosine 0.99999" in out, out[-3000:]
    assert "the reference spoke the texts in 24 codec frames" in out
    export = json.loads((stage_dir(project, RECIPE, "export") / "stage.json").read_text())["export"]
    synthesis = export["synthesis"]
    assert synthesis["code_groups"] == 16 and synthesis["samples_per_frame"] == 1920 and "vivian" in \
        synthesis["speakers"]
    plan = contract.Plan.load(stage_dir(project, RECIPE, "plan") / "plan.json")
    assert plan.memory is None and plan.speech is not None and plan.speech.model_type == "qwen3_tts"
    assert plan.device_build_commands == [
        ["llm_build", "--onnxDir", "onnx/llm", "--engineDir", "engine/talker", "--maxInputLen", "128",
         "--maxKVCacheCapacity", "256", "--maxBatchSize", "1"],
        ["llm_build", "--onnxDir", "onnx/code_predictor", "--engineDir", "engine/code_predictor", "--maxInputLen",
         "128", "--maxKVCacheCapacity", "256", "--maxBatchSize", "1"],
        ["audio_build", "--onnxDir", "onnx/code2wav", "--engineDir", "engine"]]
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    assert goldens.prompts == [] and goldens.synthesis is not None
    spoken = goldens.synthesis.utterances
    assert [(u.text, u.speaker, u.language, len(u.codes)) for u in spoken] == \
        [("Hello from the Jetson.", "serena", "auto", 12), ("Front left.", "serena", "auto", 12)]
    accuracy = json.loads((stage_dir(project, RECIPE, "accuracy") / contract.ACCURACY_JSON).read_text())
    # the FP16 grid against float32 along the reference's 24 frames: the twin keeps every codebook-0 choice
    assert accuracy["tokens"] == 24 and accuracy["top1_agreement"] == 1.0 and accuracy["logit_cosine"] > 0.9999


def test_the_device_builds_three_engines_and_speaks_the_reference(validated):
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp / "work"
    for engine in ("talker/llm.engine", "code_predictor/llm.engine", "code2wav/code2wav.engine"):
        assert next(work.glob(f"**/engine/{engine}"), None) is not None, engine
    report = contract.Report.load(next(tmp.glob("**/*.report")) / contract.REPORT_JSON)
    assert report.ok
    codes = [c for c in report.checks if c.check.startswith("speech codes")]
    assert [c.measured for c in codes] == [1.0, 1.0]
    cosines = [c.measured for c in report.checks if c.check.startswith("speech waveform")]
    assert len(cosines) == 2 and all(c >= 0.99 for c in cosines)
    bundles = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    assert [b.name for b in bundles] == ["tiny-qwen3-tts@agx-thor-sm110-trt10.16.0.72"]


def test_an_engine_that_speaks_another_code_fails_the_kit(built, tmp_path):
    project, kits, _ = built
    proc = device(project, kits[TARGET], tmp_path, board=BOARD, TTS_DOUBLE_WRONG_FRAME="5")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed: speech codes of 'Hello from the Jetson.' (serena, auto): reference frames before the first that " \
           "differs; frame 4 differs: required >= 1.0, measured 0.3333" in proc.stdout + proc.stderr


def test_a_kit_whose_reference_waveform_was_swapped_is_refused(built, tmp_path):
    """The goldens name each waveform by its sha256: one rewritten in the kit (and re-signed) is not used."""
    project, kits, _ = built

    def swap(content):
        first = content / "audio" / "tts-0.wav"
        second = content / "audio" / "tts-1.wav"
        first.write_bytes(second.read_bytes())
    kit = resigned(project, kits[TARGET], tmp_path, swap)
    proc = device(project, kit, tmp_path / "run", board=BOARD)
    assert proc.returncode != 0
    assert "audio/tts-0.wav: not the reference waveform goldens.json names" in proc.stdout + proc.stderr

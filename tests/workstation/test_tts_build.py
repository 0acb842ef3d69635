"""`doit build` of the repository's tiny text-to-speech recipe, offline on the CPU: a kit carrying Qwen3-TTS's three
graphs as Edge-LLM's exporter writes them, the reference's codes and waveforms of the recipe's texts; the device half
builds the three engines as Edge-LLM's TTS guide builds them and validates each text through qwen3_tts_inference
(doubles: the exported graphs run on the recorded Thor)."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
from conftest import REPO, device, device_on_boards, resigned, stage_dir

from pipeline import contract
from pipeline.errors import PipelineError
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]
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
    # the recipe's min_token_agreement (its default) is the share of frames the engines must give; FP16's tie margin
    assert (goldens.synthesis.min_code_agreement, goldens.synthesis.tie_margin, goldens.synthesis.eos_code) == \
        (0.9, 0.03, 2150)
    spoken = goldens.synthesis.utterances
    assert [(u.text, u.speaker, u.language, len(u.codes)) for u in spoken] == \
        [("Hello from the Jetson.", "serena", "auto", 12), ("Front left.", "serena", "auto", 12)]
    accuracy = json.loads((stage_dir(project, RECIPE, "accuracy") / contract.ACCURACY_JSON).read_text())
    # the FP16 grid against float32 along the reference's 24 frames: the twin keeps every codebook-0 choice
    assert accuracy["tokens"] == 24 and accuracy["top1_agreement"] == 1.0 and accuracy["logit_cosine"] > 0.9999


def _heard_here(model_dir, recipe, recordings, language="en"):
    """The transcriber recipe's checkpoint hearing (what, WAV) recordings by its kind's own path, here."""
    from pipeline.recipe import load_recipe
    from pipeline.workstation.round_trip import TranscriberCheckpoint, transcribe
    return transcribe(TranscriberCheckpoint(load_recipe(str(recipe)), model_dir), recordings, language)


def _round_trip_of(project, recipe):
    goldens = contract.Goldens.load(stage_dir(project, recipe, "goldens") / contract.GOLDENS)
    assert goldens.synthesis is not None and goldens.synthesis.round_trip is not None
    return goldens.synthesis, goldens.synthesis.round_trip


@pytest.mark.parametrize("transcriber", ["tiny-qwen3-asr", "tiny-nemotron-asr", "tiny-gemma4-audio"])
def test_the_reference_speech_is_heard_back_by_the_transcriber_recipe_s_checkpoint(built, transcriber):
    """The goldens' round trip: the transcriber recipe's fetched checkpoint (a decoder with an audio encoder asked as
    Qwen3-ASR or as Gemma 4 is asked, or an RNN-T) hears the kit's own reference WAVs at 16 kHz, scored against the
    texts; the same checkpoint, asked here, hears those WAVs the same, and hears the speech set's real speech as its
    words (a transcriber, not noise)."""
    import hashlib

    from pipeline.audio import read_wav
    from pipeline.device.round_trip import heard_as_the_board_hears
    from pipeline.transcripts import error_rate
    from pipeline.workstation.speech_set import read_speech_set
    project, _, out = built
    recipe = RECIPE
    if transcriber != "tiny-qwen3-asr":     # the same speaker heard by another kind: a recipe beside it naming it
        recipe = f"{RECIPE}-heard-by-{transcriber}"
        (project.recipes / f"{transcriber}.toml").write_text((REPO / "recipes" / f"{transcriber}.toml").read_text())
        (project.recipes / f"{recipe}.toml").write_text((project.recipes / f"{RECIPE}.toml").read_text().replace(
            'transcriber = "tiny-qwen3-asr"', f'transcriber = "{transcriber}"'))
        out = project.doit("build", f"recipe={recipe}", timeout=900).stdout
    check, trip = _round_trip_of(project, recipe)
    assert (trip.transcriber, trip.model, trip.language, trip.max_error_rate) == (transcriber, transcriber, "en", 1.5)
    goldens_dir = stage_dir(project, recipe, "goldens")
    model_dir = stage_dir(project, transcriber, "fetch") / "model"
    recordings = []
    for u in check.utterances:
        data = (goldens_dir / u.recording).read_bytes()
        assert hashlib.sha256(data).hexdigest() == u.recording_sha256      # the kit's reference, as it carries it
        recordings.append((u.text, heard_as_the_board_hears(read_wav(data).samples, check.sample_rate)))
    heard = _heard_here(model_dir, project.recipes / f"{transcriber}.toml", recordings)
    assert trip.heard == heard and len(heard) == 2
    r = error_rate([(u.text, h) for u, h in zip(check.utterances, heard, strict=True)], "en")
    assert (trip.rate.metric, trip.rate.rate, trip.rate.low, trip.rate.high, trip.rate.utterances) == \
        ("wer", round(r.rate, 4), round(r.interval[0], 4), round(r.interval[1], 4), 2)
    # the twin speaks noise, which the Gemma 4 twin hears as the phrase it knows best ("front left": right, by chance,
    # for the second text): WER 66.7% there, 100% for the others
    assert trip.rate.rate == {"tiny-gemma4-audio": 0.6667}.get(transcriber, 1.0), trip
    assert f"{transcriber}'s checkpoint hears the reference's speech at WER {trip.rate.rate:.1%}" in out
    speech = read_speech_set("builtin:alsa-channels", str(project.recipes / f"{transcriber}.toml"), "set").utterances
    assert _heard_here(model_dir, project.recipes / f"{transcriber}.toml",
                       [(u.name, u.wav) for u in speech[:2]]) == [u.transcript.lower() for u in speech[:2]]


def test_speech_its_transcriber_hears_past_the_limit_is_not_signed(built):
    """The limit at its edge: the measured rate signs, a ten-thousandth under it is refused before anything is
    signed, with the figure and what to do; accept-quality=1 signs it, saying so."""
    project, _, _ = built
    _, trip = _round_trip_of(project, RECIPE)
    text = (project.recipes / f"{RECIPE}.toml").read_text()
    assert "max_error_rate = 1.5\n" in text

    def build(name, limit, *args):
        (project.recipes / f"{name}.toml").write_text(text.replace("max_error_rate = 1.5\n",
                                                                   f"max_error_rate = {limit}\n"))
        return project.doit("build", f"recipe={name}", *args, check=False, timeout=900)
    at = build(f"{RECIPE}-at", trip.rate.rate)
    assert at.returncode == 0, at.stderr[-2000:]
    under = build(f"{RECIPE}-under", round(trip.rate.rate - 0.0001, 4))
    assert under.returncode != 0
    assert f"{RECIPE}-under.toml: fp16 misses the recipe's speech gate: tiny-qwen3-asr's checkpoint hears the " \
           f"reference's speech at WER {trip.rate.rate:.1%}" in under.stderr and "limit 99.99%)" in under.stderr \
        and "more than validation.round_trip.max_error_rate; nothing was signed" in under.stderr, under.stderr
    assert "listen to the goldens' audio/tts-*.wav" in under.stderr
    assert not (project.artifacts / f"{RECIPE}-under" / "kit").exists()
    signed = project.doit("build", f"recipe={RECIPE}-under", "accept-quality=1", timeout=900)
    assert "signed anyway (accept_quality): fp16 misses the recipe's speech gate" in signed.stdout


def test_a_second_build_is_a_no_op(built):
    """The plan before the fetch reads the builtin's own Code2Wav config, the one the fetched model has: the plan after
    the fetch is the same, so nothing downstream of it is made again."""
    import re
    project, kits, _ = built
    manifest = (kits[TARGET] / "MANIFEST.json").read_bytes()
    out = project.doit("build", f"recipe={RECIPE}", timeout=600).stdout
    assert not re.search(r"^(fetch|quantize|export|goldens|accuracy|package) +tiny-qwen3-tts", out, re.M), out
    assert (kits[TARGET] / "MANIFEST.json").read_bytes() == manifest


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
           "differs; frame 4 differs: required >= 0.9, measured 0.3333" in proc.stdout + proc.stderr


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


# ------------------------------------------------------------------- the export, the runtime and the gate, up close
# (on the build above: its fetched model, its export stage's graphs, the engines the device run built from them)
DOUBLES = REPO / "tests" / "doubles" / "bin"


def _env() -> dict:
    import os
    return dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{DOUBLES}:{os.environ['PATH']}", PYTHONPATH=str(REPO))


@pytest.fixture(scope="module")
def exported(built):
    """(a directory holding the fetched model as `model` and the export's graphs as `onnx`, the export's record)"""
    project = built[0]
    export = stage_dir(project, RECIPE, "export")
    record = contract.SynthesisExport.from_part(json.loads((export / "stage.json").read_text())["export"]["synthesis"],
                                                "stage.json")
    root = export.parent / "tts-up-close"
    root.mkdir(exist_ok=True)
    for name, target in (("model", stage_dir(project, RECIPE, "fetch") / "model"), ("onnx", export / "onnx")):
        if not (root / name).exists():
            (root / name).symlink_to(target)
    return root, record


@pytest.fixture(scope="module")
def engines(validated):
    """The three engines the device run built (the doubles' llm_build and audio_build, as the TTS guide builds)."""
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "work" / "engine"


@pytest.fixture(scope="module")
def reference(exported):
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    return ReferenceSynthesis(exported[0] / "model")


def test_the_export_is_edge_llm_s_tts_layout_checked(exported):
    root, record = exported
    onnx_dir = root / "onnx"
    for part, files in (("llm", ("text_embedding.safetensors", "text_projection.safetensors", "embedding.safetensors",
                                 "tokenizer.json")),
                        ("code_predictor", ("codec_embeddings.safetensors", "lm_heads.safetensors")),
                        ("code2wav", ("config.json",))):
        assert (onnx_dir / part / "model.onnx").is_file() and (onnx_dir / part / "model.onnx.data").is_file()
        assert all((onnx_dir / part / f).is_file() for f in files), part
    assert record.talker is not None and "trt_edgellm:AttentionPlugin" in record.talker.custom_ops
    assert record.code_predictor is not None and {"lm_heads", "lm_head_idx"} <= set(record.code_predictor.inputs)
    assert record.code2wav is not None and record.code2wav.inputs == ["codes"] and record.code2wav.custom_ops == []
    assert (record.code_groups, record.sample_rate, record.samples_per_frame) == (16, 24000, 1920)
    assert "vivian" in record.speakers and "english" in record.languages
    assert record.code2wav_frames == [1, 5, 13] and 0 < record.code2wav_max_error < 0.01
    assert record.code2wav_cosine > 0.9999
    talker = json.loads((onnx_dir / "llm" / "config.json").read_text())
    assert talker["codec_eos_token_id"] == 2150 and talker["speaker_id"]["dylan"] == 2878
    assert json.loads((onnx_dir / "code2wav" / "config.json").read_text())["model_type"] == "qwen3_tts_code2wav"
    # the kit's copy of the record leaves out the graph listings
    from pipeline.contract import ExportRecord
    kit = ExportRecord(None, None, synthesis=record).for_kit().synthesis
    assert kit is not None and kit.talker is None and kit.code2wav_cosine == record.code2wav_cosine


def test_a_code2wav_graph_computing_something_else_is_refused(exported, reference, tmp_path):
    """The decoder's last convolution (to one channel) with its weights' signs flipped at random."""
    import onnx
    from onnx import numpy_helper

    from pipeline.workstation.synthesis_export import check_code2wav
    model = onnx.load(str(exported[0] / "onnx" / "code2wav" / "model.onnx"))
    weights = {t.name: t for t in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "Conv"][-1]
    tensor = weights[last.input[1]]
    values = numpy_helper.to_array(tensor)
    assert values.shape[0] == 1         # out channels: the waveform's one
    values = values * np.random.default_rng(0).choice([-1, 1], values.shape).astype(values.dtype)
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(PipelineError, match=r"the Code2Wav graph's waveform has a cosine of .* with the reference"):
        check_code2wav(tmp_path / "model.onnx", reference)
    # the same weights NaN: refused too, never compared through
    tensor.CopyFrom(numpy_helper.from_array(np.full_like(values, np.nan), tensor.name))
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(PipelineError, match=r"the Code2Wav graph's waveform of 1 frames holds a value that is not "
                       r"finite"):
        check_code2wav(tmp_path / "model.onnx", reference)


def test_the_engines_speak_the_reference_codes(engines, reference, tmp_path):
    from pipeline.runtime.synthesis import SynthesisSampling, Utterance, speak
    from pipeline.workstation.synthesis_reference import Sampling, voice_of
    # voices the goldens do not use (they speak in the first preset voice, language auto): a language, a dialect
    asked = [Utterance("Hello there, edge.", "vivian", "english"), Utterance("Front left.", "dylan", "auto")]
    spoken = speak(engines, asked, SynthesisSampling(max_audio_length=10), tmp_path / "run", 16, 600, env=_env())
    for u, s in zip(asked, spoken, strict=True):
        want = reference.codes(u.text, voice_of(reference.talker_config, u.speaker, u.language), Sampling(10))
        np.testing.assert_array_equal(np.asarray(s.codes), want, err_msg=u.text)
        assert (s.sample_rate, s.samples) == (24000, 10 * 1920)
        assert s.wav[:4] == b"RIFF" and len(s.wav) == 44 + 2 * s.samples
    # streamed in chunks of 4 frames: the same codes, each chunk vocoded alone
    streamed = speak(engines, asked[:1], SynthesisSampling(max_audio_length=10), tmp_path / "stream", 16, 600,
                     chunk_frames=4, env=_env())[0]
    assert streamed.codes == spoken[0].codes and streamed.samples == spoken[0].samples


def test_what_the_runtime_writes_is_checked_before_it_is_used(engines, tmp_path):
    from pipeline.runtime.rvq import read_codes
    from pipeline.runtime.synthesis import SynthesisSampling, Utterance, speak
    bad = tmp_path / "bad.safetensors"
    for data, why in ((b"\x01", "shorter than a safetensors header"),
                      ((2**40).to_bytes(8, "little"), "a header of 1099511627776 bytes"),
                      (len(b'{"__metadata__": {}}').to_bytes(8, "little") + b'{"__metadata__": {}}',
                       "0 tensors where one is written"),
                      (len(b'{"a": 1}').to_bytes(8, "little") + b'{"a": 1}', "tensor a is None, not an integer")):
        bad.write_bytes(data)
        with pytest.raises(PipelineError, match=why):
            read_codes(bad, 16, 100)
    from safetensors.numpy import save_file
    save_file({"rvq_codes": np.zeros((3, 8), np.int32)}, str(bad))
    with pytest.raises(PipelineError, match=r"shape \[3, 8\], not \[frames <= 100, 16\]"):
        read_codes(bad, 16, 100)
    save_file({"rvq_codes": np.zeros((3, 16), np.float32)}, str(bad))
    with pytest.raises(PipelineError, match="is F32, not an integer type"):
        read_codes(bad, 16, 100)
    # a runtime that fails, and one whose output names a file outside its run directory
    with pytest.raises(PipelineError, match="qwen3_tts_inference failed .*unknown speaker 'nobody'"):
        speak(engines, [Utterance("Hi.", "nobody")], SynthesisSampling(max_audio_length=2), tmp_path / "a", 16, 600,
              env=_env())
    fake = tmp_path / "bin"
    fake.mkdir()
    (tmp_path / "secret.wav").write_bytes(b"RIFF")
    script = fake / "qwen3_tts_inference"
    script.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --outputFile ] && out=$2; shift; done\n"
                      f"echo '{{\"responses\": [{{\"request_idx\": 0, \"audio_file\": \"{tmp_path}/secret.wav\", "
                      f"\"rvq_file\": \"x\"}}]}}' > $out\n")
    script.chmod(0o755)
    env = dict(_env(), PATH=f"{fake}:{_env()['PATH']}")
    with pytest.raises(PipelineError, match="secret.wav is not a file the runtime wrote under"):
        speak(engines, [Utterance("Hi.", "ryan")], SynthesisSampling(max_audio_length=2), tmp_path / "b", 16, 600,
              env=env)
    shutil.rmtree(fake)


# ------------------------------------------------------------------------------------------------- the TTS gate
# (the engines against the goldens: the device run above; its edges here)
def test_the_gate_s_edges():
    from array import array

    from pipeline import contract
    from pipeline.device.synthesis import agreement, checks, level, measure
    assert agreement([[1], [2], [3]], [[1], [2], [3]]) == (1.0, None, None)
    assert agreement([[1], [2], [3]], [[1], [9], [3]]) == (1 / 3, 1, None)
    assert agreement([[1], [2]], [[1], [2], [3]]) == (1.0, 2, None)      # spoke on past the reference's end
    assert agreement([[1], [2], [3]], [[1]]) == (1 / 3, 1, None)          # stopped before it
    # near ties: the engine's first differing code is the reference's runner-up there (or EOS, by id)
    tie, eos_tie = contract.SpokenTie(1, 1, 7, 0.01), contract.SpokenTie(2, 0, 2150, 0.02)
    assert agreement([[1, 5], [2, 6], [3, 4]], [[1, 5], [2, 7], [9, 9]], [tie]) == (1.0, 1, tie)
    assert agreement([[1, 5], [2, 6], [3, 4]], [[1, 5], [2, 8]], [tie]) == (1 / 3, 1, None)   # another code
    assert agreement([[1, 5], [2, 6], [3, 4]], [[1, 5], [3, 7]], [tie]) == (1 / 3, 1, None)   # another codebook
    assert agreement([[1, 5], [2, 6], [3, 4]], [[1, 5], [2, 6]], [eos_tie], 2150) == (1.0, 2, eos_tie)
    assert agreement([[1, 5], [2, 6], [3, 4]], [[1, 5], [2, 6]], [eos_tie], None) == (2 / 3, 2, None)
    went_on = contract.SpokenTie(2, 0, 4, 0.01)       # the reference said EOS after two frames; code 4 was within
    assert agreement([[1, 5], [2, 6]], [[1, 5], [2, 6], [4, 0]], [went_on], 2150) == (1.0, 2, went_on)
    assert level(array("h", [32767, 0, 0, 0])) == (pytest.approx(32767 / 32768 / 2), 0.25)
    golden = contract.SpokenGolden("x", "ryan", "auto", [[1, 2]], "audio/tts-0.wav", "0" * 64, 0.25)
    check = contract.SynthesisCheck([golden], 4, 24000, 2, min_code_agreement=1.0)
    loud = array("h", [8192, -8192])        # RMS 0.25: the reference's
    assert all(c.ok for c in checks(check, [measure("x", [[1, 2]], loud, loud)]))
    # RMS at exactly half / twice the reference's passes; just past it fails; silence and clipping fail
    for samples, ok in ((array("h", [4096, -4096]), True), (array("h", [4095, -4095]), False),
                        (array("h", [16384, -16384]), True), (array("h", [16385, -16385]), False),
                        (array("h", [0, 0]), False), (array("h", [32767, -32767]), False)):
        got = {c.check.split(":")[0].split(" of ")[0]: c.ok
               for c in checks(check, [measure("x", [[1, 2]], samples, loud)])}
        assert got["speech level"] is ok, samples
    wrong_length = checks(check, [measure("x", [[1, 2]], array("h", [8192, -8192, 0]), loud)])
    assert [c.ok for c in wrong_length if c.check.startswith("speech samples")] == [False]
    # the same codes with a waveform of the opposite sign: the cosine check fails
    flipped = checks(check, [measure("x", [[1, 2]], array("h", [-8192, 8192]), loud)])
    assert [(c.ok, c.measured) for c in flipped if c.check.startswith("speech waveform")] == [(False, -1.0)]
    # a near tie taken: the codes pass, compared up to there, and the waveform (another from there on) is not compared
    tied = contract.SpokenGolden("x", "ryan", "auto", [[1, 2], [3, 4]], "audio/tts-0.wav", "0" * 64, 0.25,
                                 [contract.SpokenTie(1, 1, 5, 0.0004)])
    check = contract.SynthesisCheck([tied], 4, 24000, 1, tie_margin=0.03, eos_code=2150)
    said = {c.check: c.ok for c in checks(check, [measure("x", [[1, 2], [3, 5]], array("h", [8192, -8192]), loud)])}
    assert said == {"speech codes of 'x' (ryan, auto): reference frames before the first that differs; frame 1 took "
                    "the reference's near tie at codebook 1 (0.0004 below its choice: at most 0.03), compared up to "
                    "there": True,
                    "speech samples of 'x' (ryan, auto): 1 a frame of its 2 frames": True,
                    "speech level of 'x' (ryan, auto): RMS within 2.0x of the reference's 0.2500, above silence "
                    "(0.001), at most 1% clipped (has 0.00%)": True}
    other = checks(check, [measure("x", [[1, 2], [3, 6]], array("h", [8192, -8192]), loud)])
    assert [(c.ok, c.measured) for c in other if c.check.startswith("speech codes")] == [(False, 0.5)]
    # at min_code_agreement 0.5: a first difference at frame 1 of 2 passes, and so does stopping there (EOS where
    # the reference spoke on); speaking on past the reference's end never does
    half = contract.SynthesisCheck([dataclasses.replace(tied, near_ties=[])], 4, 24000, 1, min_code_agreement=0.5)
    for spoken, ok in (([[1, 2], [3, 6]], True), ([[1, 2]], True), ([[1, 2], [3, 4], [5, 5]], False)):
        got = [c for c in checks(half, [measure("x", spoken, array("h", [8192, -8192] * len(spoken)), loud)])
               if c.check.startswith("speech codes")]
        assert [c.ok for c in got] == [ok], (spoken, got)


# ------------------------------------------------------------------------------------ /v1/audio/speech on the board
# the signed bundle the device run made, served on the recorded Thor through Edge-LLM's TTSRuntime (the runtime
# double computes the three engines); the workstation's reference serve is the conformance suite's
@pytest.fixture(scope="module")
def served_bundle(built, validated, tmp_path_factory):
    from conftest import board_copy, device_command

    from tests.serving import Served
    project, kits, _ = built
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    here = tmp_path_factory.mktemp("tts-serve")
    _, env = device_command(project, kits[TARGET], here / "dev", board=BOARD)
    root = board_copy(here, BOARD)
    s = Served([str(bundle), "--root", str(root), "--work", str(here / "serve"), "--pubkey",
                str(project.root / "home" / "signing.pub"), "--max-queue", "0"], env, here, here / "server.log")
    yield s, contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    s.stop()
    assert "Traceback" not in (here / "server.log").read_text()


GREEDY = {"talker_top_k": 1, "repetition_penalty": 1.0}      # the goldens' decoding


def _speech_client(s):
    from openai import OpenAI
    return OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)


def test_the_board_speaks_the_goldens_through_the_openai_sdk(served_bundle, reference):
    from pipeline.audio import read_wav
    from pipeline.device.synthesis import cosine
    from pipeline.workstation.synthesis_gate import pcm16
    s, goldens = served_bundle
    model, spoken = f"{RECIPE}@{TARGET}", goldens.synthesis
    client = _speech_client(s)
    assert "engine ready: tiny-qwen3-tts@agx-thor (edgellm)" in s.log.read_text()
    card = client.models.retrieve(model).model_extra["speech"]
    assert card["default_voice"] == "serena" and "vivian" in card["voices"] and card["sample_rate"] == 24000
    for u in spoken.utterances:       # one chunk: the engines' waveform of the goldens' codes, FP16 against float32
        r = client.audio.speech.create(model=model, voice=u.speaker, input=u.text, response_format="wav",
                                       extra_body={**GREEDY, "max_audio_length": spoken.max_frames,
                                                   "codec_chunk_frames": spoken.max_frames})
        heard = read_wav(r.content)
        golden = pcm16(reference.waveform(np.asarray(u.codes)))
        assert (heard.rate, len(heard.samples)) == (24000, len(u.codes) * 1920)
        assert cosine(heard.samples, golden) > 0.999, u.text
    # streamed pcm, 4 frames a chunk: each chunk vocoded alone, as the runtime streams it
    u = spoken.utterances[0]
    with client.audio.speech.with_streaming_response.create(
            model=model, voice=u.speaker, input=u.text, response_format="pcm",
            extra_body={**GREEDY, "max_audio_length": spoken.max_frames, "codec_chunk_frames": 4}) as r:
        assert r.headers["x-sample-rate"] == "24000" and r.headers["content-type"] == "audio/pcm"
        pcm = b"".join(r.iter_bytes())
    codes = np.asarray(u.codes)
    chunked = np.concatenate([reference.waveform(codes[i:i + 4]) for i in range(0, len(codes), 4)])
    from array import array
    assert len(pcm) == 2 * len(chunked) and cosine(array("h", pcm), pcm16(chunked)) > 0.999


def test_open_webui_reads_aloud_and_lists_the_voices(served_bundle):
    """Open WebUI's read-aloud (routers/audio.py speech: the browser's {"input", "voice"} with its TTS_MODEL and its
    admin's additional parameters (TTS_OPENAI_PARAMS) added, POSTed to {TTS_OPENAI_API_BASE_URL}/audio/speech; the
    answer saved and played as a file) and its voice list (GET {base}/audio/voices, {"voices": [{"id", "name"}]},
    asked without a key). The additional parameters bound the utterance to 8 frames here: the random twin speaks on to
    its 256-frame budget, which the runtime double takes a minute and a half to compute."""
    import urllib.request
    s, goldens = served_bundle
    with urllib.request.urlopen(s.url + "/v1/audio/voices", timeout=30) as r:
        voices = json.loads(r.read())["voices"]
    assert {"id": "serena", "name": "serena"} in voices and len(voices) == 9
    with urllib.request.urlopen(s.url + "/v1/audio/models", timeout=30) as r:
        assert json.loads(r.read()) == {"models": [{"id": f"{RECIPE}@{TARGET}"}]}
    body = json.dumps({"input": "Read this aloud.", "voice": "serena", "model": f"{RECIPE}@{TARGET}",
                       **{"max_audio_length": 8}}).encode()
    req = urllib.request.Request(s.url + "/v1/audio/speech", body, {"Content-Type": "application/json",
                                                                    "Authorization": "Bearer none"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read()
        assert r.headers["Content-Type"] == "audio/wav"
    from pipeline.audio import read_wav
    heard = read_wav(data)
    assert heard.rate == 24000 and 2 * 1920 <= len(heard.samples) <= 8 * 1920 and len(heard.samples) % 1920 == 0


def test_speech_requests_are_checked_before_anything_is_spoken(served_bundle):
    import httpx
    s, _ = served_bundle
    model = f"{RECIPE}@{TARGET}"
    bad = [({"input": "x" * 4097}, "input is 4097 characters; at most 4096"),
           ({"input": "  "}, "input must be the text to speak"),
           ({"input": "Hi.", "voice": "alloy"}, "voice 'alloy' is not one of this model's: aiden, dylan"),
           ({"input": "Hi.", "voice": 7}, "voice must be a voice's name"),
           ({"input": "Hi.", "speed": 1.5}, "speed: only 1.0 is served"),
           ({"input": "Hi.", "response_format": "mp3"}, "response_format 'mp3' needs an audio encoder"),
           ({"input": "Hi.", "response_format": "ogg"}, "response_format must be one of wav, pcm"),
           ({"input": "Hi.", "stream_format": "sse"}, "stream_format \"sse\" sends pcm deltas"),
           ({"input": "Hi.", "instructions": "cheerful"}, "takes no voice description"),
           ({"input": "Hi.", "max_audio_length": 0}, "max_audio_length must be within 1 and 65536"),
           ({"input": "Hi.", "max_audio_length": 257}, "max_audio_length 257 is past the 256 frames"),
           ({"input": "Hi.", "talker_temperature": "hot"}, "talker_temperature must be a number"),
           ({"input": "Hi.", "talker_top_k": 1.5}, "talker_top_k must be an integer"),
           ({"input": "Hi.", "sample_rate": 16000}, "unknown field 'sample_rate'"),
           ({"input": "word " * 300}, "tokens; the engines speak at most 244 at once")]
    with httpx.Client(base_url=s.url, timeout=60) as c:
        for extra, says in bad:
            r = c.post("/v1/audio/speech", json={"model": model, **extra})
            assert r.status_code == 400 and says in r.json()["error"]["message"], (extra, r.text)
        r = c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "is a text-to-speech model: POST its text to /v1/audio/speech" in r.text
        r = c.post("/v1/audio/speech", content=b'{"input": "Hi."', headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        # NaN is no JSON a client sends, but Python's parser would take it
        r = c.post("/v1/audio/speech", content=b'{"input": "Hi.", "talker_temperature": NaN}',
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text


def test_a_speaking_board_queues_one_refuses_the_next_and_frees_a_client_that_left(served_bundle):
    """max_batch_size 1 speaking, --max-queue 0: a second request while one streams is a 429; the first's client
    leaving mid-stream cancels its utterance in the runtime, and the board speaks the next."""
    import httpx
    s, _ = served_bundle
    model = f"{RECIPE}@{TARGET}"
    long = {"model": model, "input": "A long answer.", "response_format": "pcm", "max_audio_length": 200,
            "codec_chunk_frames": 1, **GREEDY}      # greedy, the twin speaks all 200 frames (it meets no EOS)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        with c.stream("POST", "/v1/audio/speech", json=long) as first:
            assert first.status_code == 200
            chunks = first.iter_bytes()     # held: a dropped iterator closes the response (a client that left)
            next(chunks)                    # speaking now
            r = c.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "max_audio_length": 2})
            assert r.status_code == 429 and "the server is busy" in r.json()["error"]["message"]
        m = s.drained(timeout=30)
        assert m["jetson_llm_requests_running"] == 0
        r = c.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "max_audio_length": 2, **GREEDY})
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        # SSE: pcm deltas, then done with its usage
        r = c.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "max_audio_length": 3, **GREEDY,
                                             "response_format": "pcm", "stream_format": "sse",
                                             "codec_chunk_frames": 1})
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
        import base64
        assert sum(len(base64.b64decode(e["audio"])) for e in events[:3]) == 3 * 1920 * 2
        assert events[-1]["usage"]["output_tokens"] == 3 * 1920


def _install(project, kit, tmp_path, bundles, *args):
    """`python -m pipeline install BUNDLES... ARGS` on a copy of the recorded Thor: (process, env, board)."""
    import subprocess

    from conftest import board_copy, device_command

    from tests.zygote import warm_python
    tmp_path.mkdir(parents=True, exist_ok=True)
    _, env = device_command(project, kit, tmp_path / "dev", board=BOARD)
    root = board_copy(tmp_path, BOARD)
    done = subprocess.run([warm_python(), "-m", "pipeline", "install", *map(str, bundles), "--root", str(root),
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--pubkey",
                           str(project.root / "home" / "signing.pub"), "--load-requests", "0", *args],
                          env=dict(env, FAKE_BOARD_ROOT=str(root)), capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    return done, env, root


def test_the_bundle_installs_on_an_identical_thor_and_its_install_is_served(built, validated, tmp_path):
    """`install` (what a fleet's boards run) validates the unpacked bundle's three engines on the goldens as `device`
    did, and `serve` of the install directory speaks from what it installed."""
    from tests.serving import Served
    project, kits, _ = built
    tmp, proc = validated[TARGET]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    done, env, root = _install(project, kits[TARGET], tmp_path, [bundle])
    key = str(project.root / "home" / "signing.pub")
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = (tmp_path / "out").glob("*.report")
    installed = json.loads((report / "report.json").read_text())
    codes = [c for c in installed["checks"] if c["check"].startswith("speech codes")]
    assert len(codes) == 2 and all(c["ok"] and c["measured"] == 1.0 for c in codes), installed["checks"]
    s = Served([str(tmp_path / "work"), "--root", str(root), "--work", str(tmp_path / "serve"), "--pubkey", key],
               env, tmp_path, tmp_path / "server.log")
    try:
        r = _speech_client(s).audio.speech.create(model=f"{RECIPE}@{TARGET}", voice="ryan", input="Hi.",
                                                  extra_body={"max_audio_length": 2})
        assert r.content[:4] == b"RIFF" and len(r.content) == 44 + 2 * 2 * 1920
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------- the round trip
@pytest.fixture(scope="module")
def transcriber(built, tmp_path_factory):
    """The repository's tiny Qwen3-ASR recipe built for this Thor in the same project, and the bundle `device` made
    of it on the recorded board: the speech-to-text engine the round trip hears the speech with."""
    project = built[0]
    text = (REPO / "recipes" / "tiny-qwen3-asr.toml").read_text()
    assert 'targets = ["orin-nano-8gb"]' in text
    (project.recipes / "tiny-qwen3-asr.toml").write_text(text.replace('targets = ["orin-nano-8gb"]',
                                                                      'targets = ["agx-thor"]'))
    project.doit("build", "recipe=tiny-qwen3-asr", timeout=900)
    kit = project.artifacts / "tiny-qwen3-asr" / "kit" / "tiny-qwen3-asr@agx-thor"
    tmp = tmp_path_factory.mktemp("asr-thor")
    proc = device(project, kit, tmp, board=BOARD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    return bundle


def test_the_round_trip_hears_the_engines_speech_as_it_hears_the_reference_s(built, validated, transcriber,
                                                                             tmp_path):
    """`device --transcriber`: the ASR bundle verified and gated here, each text's two waveforms heard at 16 kHz and
    scored against the text; the engines' rate within 0.1 of the reference's (the twins hear noise the same way)."""
    project, kits, _ = built
    proc = device(project, kits[TARGET], tmp_path, board=BOARD, args=["--transcriber", str(transcriber)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"transcriber {transcriber.name}: verified and unpacked" in proc.stderr
    report = contract.Report.load(next(tmp_path.glob("out/*.report")) / contract.REPORT_JSON)
    trips = [c for c in report.checks if c.check.startswith("speech round trip of")]
    assert len(trips) == 2 and all(c.ok for c in trips), trips
    assert all(f"WER of {transcriber.name}'s transcript" in c.check for c in trips)
    # beside them, the workstation's figure the kit carries
    _, trip = _round_trip_of(project, RECIPE)
    assert f"on the workstation, tiny-qwen3-asr's checkpoint hears the reference's speech at WER " \
           f"{trip.rate.rate:.1%}" in "\n".join(report.notes)
    heard = sorted((tmp_path / "work" / "round-trip").glob("*.wav"))
    from pipeline.audio import read_wav
    assert [p.name for p in heard] == ["engines-0.wav", "engines-1.wav", "reference-0.wav", "reference-1.wav"]
    assert all(read_wav(p.read_bytes()).rate == 16000 for p in heard)
    assert len(read_wav(heard[0].read_bytes()).samples) == 12 * 1920 * 2 // 3      # 24 kHz as 16 kHz
    # without a transcriber the report says the round trip was not measured
    tmp, _ = validated[TARGET]
    plain = contract.Report.load(next(tmp.glob("out/*.report")) / contract.REPORT_JSON)
    assert not [c for c in plain.checks if "round trip" in c.check]
    assert any("the round trip was not measured: give `device --transcriber BUNDLE`" in n for n in plain.notes)


def test_an_install_hears_its_speech_back_through_a_transcriber(built, validated, transcriber, tmp_path):
    """`install --transcriber` (a fleet board installing the bundle): the round trip `device --transcriber` runs, in
    the install's report; the transcriber's unpacked copy is removed once it has heard. Given with a bundle that is
    not text to speech, or with a set, it is refused and nothing is installed."""
    project, kits, _ = built
    tmp, _ = validated[TARGET]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    done, _, _ = _install(project, kits[TARGET], tmp_path / "tts", [bundle], "--transcriber", transcriber)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"transcriber {transcriber.name}: verified and unpacked" in done.stderr
    report = contract.Report.load(next((tmp_path / "tts" / "out").glob("*.report")) / contract.REPORT_JSON)
    trips = [c for c in report.checks if c.check.startswith("speech round trip of")]
    assert len(trips) == 2 and all(c.ok for c in trips) and report.ok, trips
    assert not any("the round trip was not measured" in n for n in report.notes)
    work = tmp_path / "tts" / "work"
    assert (work / "bundle").is_dir() and not (work / "transcriber").exists()
    # the speech-to-text bundle itself given a transcriber: refused, nothing installed
    done, _, _ = _install(project, kits[TARGET], tmp_path / "asr", [transcriber], "--transcriber", transcriber)
    assert done.returncode == 2 and f"{transcriber.name} is not a text-to-speech bundle" in done.stderr, done.stderr
    assert not (tmp_path / "asr" / "work" / "bundle").exists()
    assert not (tmp_path / "asr" / "work" / "transcriber").exists()
    done, _, _ = _install(project, kits[TARGET], tmp_path / "set", [bundle, transcriber], "--transcriber",
                          transcriber)
    assert done.returncode == 2 and "a set is installed without a round trip" in done.stderr, done.stderr


def test_a_transcriber_that_is_not_a_speech_to_text_bundle_is_refused_before_any_build(built, validated, tmp_path):
    project, kits, _ = built
    tmp, _ = validated[TARGET]
    (tts_bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    proc = device(project, kits[TARGET], tmp_path, board=BOARD, args=["--transcriber", str(tts_bundle)])
    assert proc.returncode == 2
    assert "tiny-qwen3-tts@agx-thor is not a speech-to-text bundle (it has no audio engine)" in proc.stderr
    assert not (tmp_path / "work" / "engine").exists()


def test_the_round_trip_check_s_edge():
    from pipeline.device.round_trip import checks
    golden = contract.SpokenGolden("one two three", "ryan", "auto", [[1]], "audio/tts-0.wav", "0" * 64, 0.25)
    check = contract.SynthesisCheck([golden], 4, 24000, 1920)
    base = contract.SpokenResult("one two three", [[1]], 1920, 0.25, 0.0, 1.0, "one two", "one two three", "wer")

    def measured(engines: float, reference: float) -> contract.Check:
        import dataclasses
        (c,) = checks(check, [dataclasses.replace(base, error_rate=engines, reference_error_rate=reference)], "asr")
        return c
    assert measured(0.4, 0.3).ok and measured(0.4, 0.3).required == "<= 0.4"      # exactly 0.1 worse: passes
    assert not measured(0.4001, 0.3).ok and measured(0.4001, 0.3).by == 0.0001
    assert checks(check, [base], "asr") == []       # no transcriber: no check

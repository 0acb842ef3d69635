"""Speech models at plan time. Qwen3-ASR, in either hub layout, is planned: its audio encoder's engine beside the
decoder in the memory plan, the longest recording against max_input_len, and its speed as a transcriber (first token,
real-time factor) against the published row of the model. Nemotron-3.5-ASR and Qwen3-TTS are refused as decoders in
one problem that says what they are (each has its own plan: tests/shared/test_synthesis_plan.py,
test_transducer_plan.py)."""

import json
import re

import pytest

from pipeline.contract import BuildLimits
from pipeline.errors import InputError
from pipeline.families.audio import QWEN3_ASR_AUDIO
from pipeline.plan.parts.audio import DEFAULT_MAX_SECONDS, AudioEncoder
from pipeline.plan.parts.audio_speed import TRANSCRIPT_TOKENS_PER_SECOND, load_rows
from pipeline.plan.perf import fit_data
from pipeline.plan.planner import make_plan
from pipeline.plan.prediction import ttft_ms
from pipeline.plan.request import PlanRequest
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target

PROMPT_TOKENS, ANSWER_TOKENS = QWEN3_ASR_AUDIO.prompt_tokens, QWEN3_ASR_AUDIO.answer_tokens

AUDIO = {"d_model": 896, "encoder_layers": 18, "encoder_attention_heads": 14, "encoder_ffn_dim": 3584,
         "output_dim": 1024, "num_mel_bins": 128, "downsample_hidden_size": 480, "n_window": 50,
         "n_window_infer": 800}
TEXT = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 65536,
        "tie_word_embeddings": True}
IDS = {"audio_token_id": 151676, "audio_start_token_id": 151669, "audio_end_token_id": 151670}
ORIGINAL = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
            "thinker_config": {"audio_config": AUDIO, "text_config": TEXT, **IDS}}
NATIVE = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr", "audio_config": AUDIO,
          "text_config": TEXT, "tie_word_embeddings": True, **IDS}
# transformers' own count of the 0.6B's encoder (tests/workstation/test_audio_family.py)
ENCODER_PARAMS = 186_376_192
REFUSED = {
    "nemotron-asr": ({"architectures": ["Nemotron3_5AsrForRNNT"], "model_type": "nemotron3_5_asr"},
                     "Nemotron-3.5-ASR"),
    "qwen3-tts": ({"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
                   "talker_config": {"hidden_size": 1024}}, "Qwen3-TTS"),
}


def encoder(shape) -> AudioEncoder:
    (part,) = [p for p in shape.parts if isinstance(p, AudioEncoder)]
    return part


def plan(config=NATIVE, max_input_len=512, seconds=None, target="orin-nano-8gb", weights="int4_awq",
         label="Qwen/Qwen3-ASR-0.6B"):
    return make_plan(PlanRequest(shape=shape_from_config(config), model_label=label, weights=weights,
                                 kv_cache="fp16", target=get_target(target), backend="edgellm",
                                 limits=BuildLimits.of(2, max_input_len, 1024), audio_max_seconds=seconds))


@pytest.mark.parametrize("which", sorted(REFUSED))
def test_a_speech_model_not_planned_yet_is_one_problem_naming_what_it_is(which):
    config, name = REFUSED[which]
    with pytest.raises(InputError) as e:
        shape_from_config(config, "model/config.json")
    (problem,) = e.value.problems
    assert (problem.file, problem.field, problem.value) == ("model/config.json", "model_type", config["model_type"])
    assert problem.message.startswith(f"{name} is a speech model (")
    # built through its own path (families/audio.py SPEECH_MODELS): the decoder planner is not it
    assert problem.message.endswith("not a decoder: `python -m pipeline plan` plans it and `doit build` builds its "
                                    "kit through their own path; what asked for its decoder takes decoders only"), \
        problem.message


def test_both_qwen3_asr_layouts_are_one_model_to_the_planner():
    original, native = shape_from_config(ORIGINAL), shape_from_config(NATIVE)
    assert original == native
    part = encoder(native)
    assert part.shape.params == ENCODER_PARAMS
    assert (part.audio_tokens(30), part.audio_tokens(1), part.audio_tokens(0.5)) == (390, 13, 7)
    # the decoder is the Qwen3-0.6B's: its parameters as the dense planner counts them, the encoder beside it
    assert native.hidden_size == 1024 and native.num_layers == 28 and native.tie_word_embeddings


def test_a_damaged_audio_config_names_the_field():
    broken = json.loads(json.dumps(NATIVE))
    broken["audio_config"]["output_dim"] = 2048
    broken["audio_config"]["n_window_infer"] = 850
    with pytest.raises(InputError) as e:
        shape_from_config(broken, "m/config.json")
    fields = {p.field: p.message for p in e.value.problems}
    assert "the language model's hidden_size (1024)" in fields["audio_config.output_dim"]
    assert "2 x n_window = 100 frames" in fields["audio_config.n_window_infer"]
    huge = json.loads(json.dumps(NATIVE))
    huge["audio_config"]["encoder_layers"] = 10**30
    huge["audio_config"]["d_model"] = True
    with pytest.raises(InputError) as e:
        shape_from_config(huge, "m/config.json")
    assert [(p.field, p.message) for p in e.value.problems] == [
        ("audio_config.encoder_layers", "must be a positive integer up to 1048576"),
        ("audio_config.d_model", "must be a positive integer up to 1048576")]
    assert e.value.problems[0].value == "100000000000... (31 digits)"
    with pytest.raises(InputError) as e:
        shape_from_config({**ORIGINAL, "thinker_config": {"text_config": TEXT}}, "m/config.json")
    assert [p.field for p in e.value.problems] == ["thinker_config.audio_config"]


def test_the_memory_plan_counts_the_encoders_weights_and_activations():
    p = plan()
    a, m = p.audio, p.memory
    assert p.ok and a.max_seconds == DEFAULT_MAX_SECONDS == 30 and a.audio_tokens == 390
    assert a.params == ENCODER_PARAMS and a.weights == 2 * ENCODER_PARAMS
    # one layer's scores (FP32) and probabilities (FP16) over 390 tokens for 14 heads, beside the first convolution's
    # output (30 chunks x 480 channels x 64 x 50, FP16), which is larger than a block's tensors; and 64 MiB scratch
    assert a.activations == 14 * 390 * 390 * 6 + 30 * 480 * 64 * 50 * 2 + 64 * 2**20
    assert m.audio == a.weights + a.activations
    assert m.total == m.weights + m.embedding + m.lm_head + m.kv_cache + m.activations + m.runtime_overhead + m.audio


def test_a_recording_longer_than_the_input_holds_is_refused_at_the_edge():
    assert plan(max_input_len=390 + PROMPT_TOKENS).ok
    short = plan(max_input_len=390 + PROMPT_TOKENS - 1)
    (reason,) = short.refused
    assert reason == ("a 30-second recording is 390 audio tokens, 405 with the transcription prompt, more than "
                      "max_input_len 404: raise build.max_input_len to at least 405, or take recordings of at most "
                      "29 seconds")
    assert plan(max_input_len=404, seconds=29).ok


def test_the_rtf_is_encoder_prefill_and_the_transcripts_decode_over_the_clip():
    p = plan()
    a = p.audio
    clip, transcript = 10, round(TRANSCRIPT_TOKENS_PER_SECOND * 10)
    assert a.clip_seconds == clip and a.transcript_tokens == transcript == 35
    prefill = ttft_ms(shape_from_config(NATIVE), "int4_awq", "orin-nano-8gb", PROMPT_TOKENS + 130,
                      p.prediction.power_mode, fit_data())
    first = a.encoder_ms_by_seconds["10"] + prefill
    assert a.first_token_ms == pytest.approx(first, abs=0.1)
    rtf = (first + 1000 * (ANSWER_TOKENS + transcript) / p.predicted_decode_tok_s) / (1000 * clip)
    assert a.rtf == pytest.approx(rtf, abs=2e-3) and 0 < a.rtf < 1
    # a longer clip spreads the fixed costs: its RTF is lower; the encoder's work grows faster than the length (every
    # token is scored against the whole request), its time less (the fit's fixed cost per run)
    assert a.rtf_by_seconds["5"] > a.rtf_by_seconds["10"] > a.rtf_by_seconds["30"]
    part = encoder(shape_from_config(NATIVE))
    assert part.flops(30) / part.flops(10) > 3
    assert a.encoder_ms_by_seconds["10"] < a.encoder_ms_by_seconds["30"] < 3 * a.encoder_ms_by_seconds["10"]


def test_the_published_row_is_quoted_with_the_error_and_its_absence_said():
    p = plan()
    (row,) = [r for r in load_rows() if r.model == "Qwen/Qwen3-ASR-0.6B" and r.target == "orin-nano-8gb"]
    (line,) = p.audio.published
    assert line.startswith(f"RTF {row.value:g} (") and row.source in line
    ratio = float(re.search(r"the published figure is ([\d.]+)x the prediction", line).group(1))
    assert ratio == pytest.approx(row.value / p.audio.rtf, rel=0.05)
    thor = plan(target="agx-thor", weights="nvfp4")
    assert thor.audio.published == ["none of Qwen/Qwen3-ASR-0.6B on agx-thor (there are on orin-nano-8gb): the "
                                    "speed is a prediction only"]


def test_an_audio_setting_on_a_text_model_is_refused():
    text = {"architectures": ["Qwen3ForCausalLM"], **TEXT}
    p = plan(config=text, seconds=30, label="Qwen/Qwen3-0.6B")
    assert p.audio is None and p.memory.audio == 0
    assert "build.audio sets the longest recording, but the model has no audio encoder" in " ".join(p.refused)


def test_the_recipes_plan_prints_the_encoder_and_the_speed(project):
    r = project.cli("plan", "qwen3-asr-0.6b-orin-nano-jp72", repo_recipes=True)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  audio +0\.54 GB$", r.stdout, re.M)
    assert "  audio        qwen3-asr-aut encoder, 186M params in fp16: weights 0.37 GB" in r.stdout
    assert re.search(r"^  speech       a 10 s clip: encoder ~[\d.]+ ms .*first token ~\d+ ms, RTF ~0\.0\d\d", r.stdout,
                     re.M)
    assert "published    RTF 1.2 (" in r.stdout and "not built yet" not in r.stdout
    plan = json.loads(project.cli("plan", "qwen3-asr-0.6b-orin-nano-jp72", "--json", repo_recipes=True).stdout)
    # audio_build's profile: a second of mel frames to the recipe's 30 s (--maxTimeSteps in 10 ms frames)
    assert plan["device_build_commands"][-1] == ["audio_build", "--onnxDir", "onnx/audio", "--engineDir", "engine",
                                                 "--minTimeSteps", "100", "--maxTimeSteps", "3000"]
    assert plan["device_build_commands"][0][:3] == ["llm_build", "--onnxDir", "onnx/llm"]


def test_each_speech_models_row_names_functions_that_exist():
    """families/audio.py SPEECH_MODELS: every stage's "module:function" imports and is callable (a typo there would
    surface only when that model's stage runs)."""
    import dataclasses

    from pipeline.families.audio import SPEECH_MODELS, SpeechModel
    steps = [f.name for f in dataclasses.fields(SpeechModel) if f.name not in ("name", "what", "exported")]
    assert steps == ["check_checkpoint", "export_graphs", "make_goldens", "measure_accuracy", "transcribe"]
    for row in SPEECH_MODELS.values():
        for step in steps:
            if getattr(row, step) is not None:      # transcribe: only a model that transcribes
                assert callable(row.stage(step)), (row.name, step)
    assert [r.name for r in SPEECH_MODELS.values() if r.transcribe is not None] == ["Nemotron-3.5-ASR"]

"""Text to speech at plan time (pipeline/plan/synthesis.py, synthesis_plan.py): Qwen3-TTS's parts counted as TensorRT
Edge-LLM 0.11 builds them (its own modules, built on the meta device, are the reference for every parameter count),
its memory on the target, its speed as a speaker (a frame = one talker step + a code-predictor walk) against the
published rows, and the refusals at their edges; `plan` prints it from a recipe or a model directory."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from pipeline.errors import InputError, PipelineError
from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
from pipeline.plan.perf import known_model_configs
from pipeline.plan.prediction import step_s
from pipeline.plan.synthesis import CODE2WAV_DEFAULTS, STREAM_FRAMES, prompt_tokens, synthesis_shape
from pipeline.plan.synthesis_plan import plan_synthesis
from pipeline.plan.targets import get_target
from tests.serving import REPO

MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
CONFIG = known_model_configs()[MODEL]


def params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_code2wav_is_counted_as_edgellm_builds_it():
    from tensorrt_edgellm.models.qwen3_tts.modeling_qwen3_tts_code2wav import (
        Qwen3TTSCode2WavConfig,
        Qwen3TTSCode2WavDecoder,
    )
    for overrides in ({}, {"hidden_size": 1024, "intermediate_size": 3072, "head_dim": None}):
        config = dict(CODE2WAV_DEFAULTS, **overrides)
        with torch.device("meta"):
            reference = Qwen3TTSCode2WavDecoder(Qwen3TTSCode2WavConfig.from_dict(config))
        shape = synthesis_shape(CONFIG, "config.json", {k: v for k, v in config.items() if v is not None})
        assert shape.code2wav.params == params(reference), overrides
        assert shape.code2wav.samples_per_frame == reference.total_upsample == 1920
    assert shape.frame_rate == 12.5


def test_the_talker_and_code_predictor_are_counted_as_edgellm_calibrates_them():
    """Edge-LLM's calibration model of Qwen3-TTS mirrors the checkpoint's keys (talker.model, text_projection,
    codec_head, code_predictor): each part's parameters, and the 0.6B release's weights in BF16 beside its
    model.safetensors of 1.83 GB (a third-party reader's figure; the Base release's, with its ~9M-parameter
    speaker encoder that CustomVoice lacks)."""
    from tensorrt_edgellm.quantization.models.qwen3_tts.modeling_qwen3_tts import _Talker
    raw = copy.deepcopy(CONFIG["talker_config"])
    for part in (raw, raw["code_predictor_config"]):
        part.update(rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=32768)
    with torch.device("meta"):
        talker = _Talker(raw)
    shape = synthesis_shape(CONFIG, "config.json")
    plan = plan_synthesis(shape, MODEL, "fp16", "fp16", "agx-thor", 30)
    text = params(talker.model.text_embedding) + params(talker.text_projection)
    decoder = params(talker) - text - params(talker.code_predictor)
    assert plan.memory["text embedding and projection"] == 2 * text
    assert plan.memory["talker"] == 2 * decoder
    assert plan.memory["code predictor"] == 2 * params(talker.code_predictor)
    weights = sum(plan.memory[k] for k in ("talker", "text embedding and projection", "code predictor"))
    assert abs(weights - 1.83e9) / 1.83e9 < 0.02, weights


def test_the_1_7b_is_counted_with_its_projection_and_talker_wide_codec_embeddings():
    """The 1.7B's code predictor (1024 wide) under a 2048-wide talker: its codec embeddings are the talker's width
    and small_to_mtp_projection feeds it (workstation/synthesis_model.py completes Edge-LLM's calibration model with
    both); each part counted as those modules have it. In FP16 it does not fit the 8 GB Orin Nano, and would speak
    slower than real time there: the plan refuses it, naming the memory."""
    from pipeline.workstation.synthesis_model import PROJECTION, build
    name = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    config = copy.deepcopy(known_model_configs()[name])
    for part in (config["talker_config"], config["talker_config"]["code_predictor_config"]):
        part.update(rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=32768)
    with torch.device("meta"):
        talker = build(config).talker
    cp = talker.code_predictor
    assert tuple(getattr(cp, PROJECTION).weight.shape) == (1024, 2048)
    assert tuple(cp.model.codec_embedding[0].weight.shape) == (2048, 2048)
    shape = synthesis_shape(known_model_configs()[name], "config.json")
    plan = plan_synthesis(shape, name, "fp16", "fp16", "agx-thor", 30)
    text = params(talker.model.text_embedding) + params(talker.text_projection)
    assert plan.memory["text embedding and projection"] == 2 * text
    assert plan.memory["talker"] == 2 * (params(talker) - text - params(cp))
    assert plan.memory["code predictor"] == 2 * params(cp)
    assert plan.refused == [] and plan.published[0].startswith("rtf ") and "of Qwen/Qwen3-TTS-12Hz-1.7B-Base" in \
        plan.published[0]
    small = plan_synthesis(shape, name, "fp16", "fp16", "orin-nano-8gb", 30)
    assert small.refused[0].startswith(f"needs {small.total / 1e9:.2f} GB, more than the 5.20 GB usable on Jetson "
                                       "Orin Nano 8GB") and small.rtf is not None and small.rtf > 1


def test_a_frame_is_one_talker_step_and_a_code_predictor_walk():
    shape = synthesis_shape(CONFIG, "config.json")
    target = get_target("orin-nano-8gb")
    fmt, kv = WEIGHT_FORMATS["int4_awq"], KV_FORMATS["fp16"]
    plan = plan_synthesis(shape, MODEL, "int4_awq", "fp16", target.id, 30, 128)
    prompt, frames = prompt_tokens(10), 125
    mode = target.default_power_mode
    talker = step_s(shape.talker, fmt, 128, kv, target, mode, prompt + frames // 2, 1, "tensorrt")
    walk = 15 * step_s(shape.code_predictor, fmt, 128, kv, target, mode, 8, 1, "tensorrt")
    assert plan.step_ms == round(1000 * (talker + walk), 2)
    assert 0 < plan.rtf < 1 and plan.first_ms > STREAM_FRAMES * plan.step_ms
    fp16 = plan_synthesis(shape, MODEL, "fp16", "fp16", target.id, 30)
    assert fp16.step_ms > plan.step_ms and fp16.memory["talker"] > 3 * plan.memory["talker"]
    # the code predictor's down_proj stays FP16 in every format (Edge-LLM's FP16Linear)
    down = 5 * 3072 * 1024 * 2
    assert plan.memory["code predictor"] > down + 15 * 2048 * 1024 * 4


def test_the_plan_is_checked_against_the_published_rows_of_its_base_release():
    shape = synthesis_shape(CONFIG, "config.json")
    plan = plan_synthesis(shape, MODEL, "fp16", "fp16", "agx-thor", 30)
    rtf, first = plan.published
    assert rtf.startswith(f"rtf {plan.rtf:.3g} predicted, 0.667 published of Qwen/Qwen3-TTS-12Hz-0.6B-Base (")
    assert rtf.endswith(f"the published figure is {0.667 / plan.rtf:.2g}x the prediction")
    assert first.startswith(f"first_audio_ms {plan.first_ms:.3g} ms predicted, 505 ms published of ")
    nano = plan_synthesis(shape, MODEL, "fp16", "fp16", "orin-nano-8gb", 30)
    assert nano.published == [f"none of {MODEL} on orin-nano-8gb (there are on agx-orin-64gb, agx-thor): the "
                               "speed is a prediction only"]


def test_an_utterance_longer_than_the_engine_or_the_board_is_refused_at_its_edge():
    shape = synthesis_shape(CONFIG, "config.json")
    need = prompt_tokens(30) + 375
    fits = plan_synthesis(shape, MODEL, "fp16", "fp16", "orin-nano-8gb", 30, max_seq_len=need)
    assert fits.refused == [] and fits.total < fits.usable     # Edge-LLM 0.11 builds it: nothing refuses it
    short = plan_synthesis(shape, MODEL, "fp16", "fp16", "orin-nano-8gb", 30, max_seq_len=need - 1)
    assert short.refused[0] == (f"an utterance of 30 s is about {prompt_tokens(30)} prompt tokens and 375 codec "
                                f"frames, more than max_seq_len {need - 1}: raise build.max_seq_len to at least "
                                f"{need}, or lower build.audio.max_seconds")
    with pytest.raises(PipelineError, match="no backend named trtllm-0.12 plans a text-to-speech model"):
        plan_synthesis(shape, MODEL, "fp16", "fp16", "orin-nano-8gb", 30, backend="trtllm-0.12")
    # Edge-LLM 0.11 builds the talker in FP16 only (its TTS guide): another format is refused first, saying so
    awq = plan_synthesis(shape, MODEL, "int4_awq", "fp16", "orin-nano-8gb", 30, 128, max_seq_len=need)
    assert awq.refused[0] == ("weights 'int4_awq': Edge-LLM 0.11 builds Qwen3-TTS's talker in FP16 only (its TTS "
                              "guide: quantized talker checkpoints are not supported yet; only the code predictor "
                              "takes FP8 or NVFP4); set quantization.weights to 'fp16'")
    hour = plan_synthesis(shape, MODEL, "fp16", "fp16", "orin-nano-8gb", 3600)
    assert hour.total > hour.usable and hour.refused[0].startswith(f"needs {hour.total / 1e9:.2f} GB, more than the ")


def test_a_damaged_config_is_every_problem_at_once():
    bad = copy.deepcopy(CONFIG)
    bad["talker_config"]["num_code_groups"] = "16"
    bad["talker_config"]["code_predictor_config"]["vocab_size"] = -1
    with pytest.raises(InputError) as e:
        synthesis_shape(bad, "m/config.json", {"upsample_rates": [8, 0]})
    fields = sorted((p.file, p.field, repr(p.value)) for p in e.value.problems)
    assert fields == [("m/config.json", "talker_config.code_predictor_config.vocab_size", "-1"),
                      ("m/config.json", "talker_config.num_code_groups", "'16'"),
                      ("m/config.json: speech_tokenizer/config.json", "decoder_config.upsample_rates", "[8, 0]")]
    for rates in ([2] * 9, [2, True], []):       # a stage list no Code2Wav has: refused before any arithmetic
        with pytest.raises(InputError) as e:
            synthesis_shape(CONFIG, "m/config.json", {"upsample_rates": rates})
        assert [(p.field, p.value) for p in e.value.problems] == [("decoder_config.upsample_rates", rates)]
    with pytest.raises(InputError) as e:
        synthesis_shape({"model_type": "qwen3_tts"}, "m/config.json")
    assert [(p.field, p.value) for p in e.value.problems] == [("talker_config", None)]


def test_plan_prints_it_from_a_recipe_and_from_a_model_directory(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", "qwen3-tts-0.6b-thor"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "refused" not in out.stdout + out.stderr, out.stderr
    assert "published: rtf " in out.stdout and "the published figure is " in out.stdout
    assert "Traceback" not in out.stderr
    model = tmp_path / "model"
    (model / "speech_tokenizer").mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    wider = dict(CODE2WAV_DEFAULTS, hidden_size=1024, intermediate_size=3072, head_dim=64)
    (model / "speech_tokenizer" / "config.json").write_text(json.dumps({"decoder_config": wider}))
    run = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--model-config", str(model), "--quant", "fp16",
                          "--target", "orin-nano-8gb", "--json"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    own = synthesis_shape(CONFIG, "c", wider).code2wav.params
    assert plan["format"] == "jetson-speech-plan/1" and plan["memory"]["code2wav"] == 2 * own
    assert own > synthesis_shape(CONFIG, "c").code2wav.params


@pytest.mark.parametrize("recipe, kind", [("qwen3-tts-0.6b-thor", "qwen3_tts"),
                                          ("nemotron-3.5-asr-orin-nano-jp72", "nemotron3_5_asr")])
def test_compare_refuses_a_speech_model_before_fetching_it(tmp_path, recipe, kind):
    import os
    out = subprocess.run([sys.executable, "-m", "pipeline", "compare", recipe], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PIPELINE_ARTIFACTS=str(tmp_path / "artifacts")))
    assert out.returncode == 2 and f"is a {kind} speech model: compare quantizes and measures decoders' weight " \
        "formats, and this version builds a speech model in the one format its backend takes" \
        in out.stderr, out.stderr
    assert f"hint: python -m pipeline plan {recipe} gives its memory and speed" in out.stderr
    assert not (tmp_path / "artifacts").exists() and "Traceback" not in out.stderr

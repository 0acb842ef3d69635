"""Nemotron-3.5-ASR at plan time (pipeline/plan/transducer.py): an RNN-T counted part by part against transformers'
own model (the checkpoint's keys) and against TensorRT Edge-LLM 0.11's encoder (what it exports, biases and all), its
encoder's FLOPs against a count of that module's run, its speed as encoder + one step a frame or a token, and the
refusals at their edges; `plan` prints it from a recipe."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch

from pipeline.errors import InputError
from pipeline.plan.parts.audio_speed import TRANSCRIPT_TOKENS_PER_SECOND
from pipeline.plan.perf import known_model_configs
from pipeline.plan.speech_plan import CLIP_SECONDS, vit_ms
from pipeline.plan.targets import get_target
from pipeline.plan.transducer import DEFAULTS, ENCODER_DEFAULTS, ENCODER_FLAGS, plan_transducer, transducer_shape
from tests.serving import REPO

MODEL = "nvidia/nemotron-3.5-asr-streaming-0.6b"
CONFIG = known_model_configs()[MODEL]
TINY = {"model_type": "nemotron3_5_asr", "vocab_size": 100, "blank_token_id": 99, "decoder_hidden_size": 64,
        "num_decoder_layers": 2, "num_prompts": 16, "prompt_intermediate_size": 96, "default_prompt_id": 3,
        "encoder_config": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "intermediate_size": 512, "conv_kernel_size": 9, "subsampling_factor": 8,
                           "subsampling_conv_channels": 32, "num_mel_bins": 80, "subsampling_conv_kernel_size": 3,
                           "subsampling_conv_stride": 2, "sliding_window": 71, "default_num_lookahead_tokens": 13}}


def transformers_model(config: dict):
    from transformers import Nemotron3_5AsrConfig, Nemotron3_5AsrForRNNT
    with torch.device("meta"):
        return Nemotron3_5AsrForRNNT(Nemotron3_5AsrConfig(**copy.deepcopy(config)))


def split(model) -> tuple[int, int]:
    """(the encoder with its prompt fusion and projection, the prediction network and the joint)"""
    step = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("decoder.", "joint.")))
    return sum(p.numel() for p in model.parameters()) - step, step


def test_the_defaults_are_transformers():
    from transformers import Nemotron3_5AsrConfig
    c = Nemotron3_5AsrConfig()
    assert {k: getattr(c, k) for k in DEFAULTS} == DEFAULTS
    assert {k: getattr(c.encoder_config, k) for k in {**ENCODER_DEFAULTS, **ENCODER_FLAGS}} == \
        {**ENCODER_DEFAULTS, **ENCODER_FLAGS}


@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("config", [TINY, CONFIG], ids=["tiny", "0.6b"])
def test_each_part_is_counted_as_the_checkpoint_holds_it(config, biases):
    config = copy.deepcopy(config)
    config["encoder_config"].update(attention_bias=biases, convolution_bias=biases)
    shape = transducer_shape(config, "config.json")
    assert (shape.encoder_params, shape.step_params) == split(transformers_model(config))


def test_the_encoder_is_what_edgellm_exports_and_its_flops_are_what_it_computes():
    from tensorrt_edgellm.models.nemotron3_5_asr.modeling_nemotron3_5_asr_audio import Nemotron3_5AsrAudioModel
    from torch.utils.flop_counter import FlopCounterMode
    config = copy.deepcopy(TINY)
    config["encoder_config"].update(attention_bias=False, convolution_bias=False)      # as Edge-LLM builds it
    shape = transducer_shape(config, "config.json")
    model = Nemotron3_5AsrAudioModel(config).eval()
    assert shape.encoder_params == sum(p.numel() for p in model.parameters())
    for seconds in (8, 30):
        with FlopCounterMode(display=False) as counted, torch.no_grad():
            frames = model(torch.zeros(1, 100 * seconds, 80), torch.tensor([3]))
        assert frames.shape[1] == round(shape.frames_per_second * seconds) + 1     # its causal stem: one more
        assert abs(shape.encoder_flops(seconds) / counted.get_total_flops() - 1) < 0.05, seconds


def test_a_transcription_is_the_encoder_and_a_step_a_frame_or_token():
    shape = transducer_shape(CONFIG, "config.json")
    plan = plan_transducer(shape, MODEL, "fp16", "orin-nano-8gb", 30)
    from pipeline.plan.perf import fit_data
    target = get_target("orin-nano-8gb")
    encoder = vit_ms(target, shape.encoder_flops(CLIP_SECONDS), fit_data())
    steps = (12.5 + TRANSCRIPT_TOKENS_PER_SECOND) * CLIP_SECONDS
    assert plan.rate == 12.5
    assert plan.rtf == round((encoder + steps * plan.step_ms) / (1000 * CLIP_SECONDS), 3)
    assert plan.first_ms == round(encoder + plan.step_ms, 1)
    assert plan.memory["encoder (FP16)"] == 2 * shape.encoder_params
    assert plan.published == [f"none of {MODEL} on orin-nano-8gb: the speed is a prediction only"]


def test_a_quantized_format_and_a_recording_past_the_board_are_refused_at_their_edge():
    shape = transducer_shape(CONFIG, "config.json")
    assert plan_transducer(shape, MODEL, "int4_awq", "orin-nano-8gb", 30).refused[0] == (
        "weights 'int4_awq': Edge-LLM 0.11 exports its encoder and RNN-T step in FP16 only (audio_build's graphs); "
        "set quantization.weights to 'fp16'")
    usable = get_target("orin-nano-8gb").usable_bytes
    seconds = next(s for s in range(60, 3600, 1) if plan_transducer(shape, MODEL, "fp16", "orin-nano-8gb", s).total
                   > usable)
    inside = plan_transducer(shape, MODEL, "fp16", "orin-nano-8gb", seconds - 1)
    past = plan_transducer(shape, MODEL, "fp16", "orin-nano-8gb", seconds)
    assert inside.total <= usable and inside.refused == []
    assert past.refused[0].startswith(f"needs {past.total / 1e9:.2f} GB, more than the {usable / 1e9:.2f} GB usable")
    assert "lower build.audio.max_seconds" in past.refused[0]


def test_a_damaged_config_is_every_problem_at_once():
    bad = copy.deepcopy(CONFIG)
    bad["decoder_hidden_size"] = 0
    bad["encoder_config"].update(subsampling_factor=6, attention_bias="no")
    with pytest.raises(InputError) as e:
        transducer_shape(bad, "m/config.json")
    assert sorted((p.field, repr(p.value)) for p in e.value.problems) == [
        ("decoder_hidden_size", "0"), ("encoder_config.attention_bias", "'no'"),
        ("encoder_config.subsampling_factor", "6")]


def test_plan_prints_it_from_a_recipe():
    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", "nemotron-3.5-asr-orin-nano-jp72"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "refused" not in out.stderr, out.stderr
    assert "speech to text (an RNN-T" in out.stdout and "RTF " in out.stdout
    assert dataclasses.is_dataclass(plan_transducer(transducer_shape(CONFIG, "c"), MODEL, "fp16", "agx-thor", 30))

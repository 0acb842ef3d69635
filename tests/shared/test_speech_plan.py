"""A speech model's config.json (Qwen3-ASR in either hub layout, Nemotron-3.5-ASR, Qwen3-TTS) is refused by the planner
in one problem that says what the model is and where it does export, before any text field is asked for."""

import json

import pytest

from pipeline.errors import InputError
from pipeline.plan.shapes import shape_from_config

AUDIO = {"d_model": 896, "encoder_layers": 18, "encoder_attention_heads": 14, "encoder_ffn_dim": 3584,
         "output_dim": 1024}
TEXT = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "intermediate_size": 3072, "vocab_size": 151936}
CONFIGS = {
    "qwen3-asr": {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
                  "thinker_config": {"audio_config": AUDIO, "text_config": TEXT}},
    "qwen3-asr-hf": {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
                     "audio_config": AUDIO, "text_config": TEXT},
    "nemotron-asr": {"architectures": ["Nemotron3_5AsrForRNNT"], "model_type": "nemotron3_5_asr"},
    "qwen3-tts": {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
                  "talker_config": {"hidden_size": 1024}},
}
NAMES = {"qwen3-asr": "Qwen3-ASR", "qwen3-asr-hf": "Qwen3-ASR", "nemotron-asr": "Nemotron-3.5-ASR",
         "qwen3-tts": "Qwen3-TTS"}


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_a_speech_model_is_one_problem_naming_what_it_is(which):
    with pytest.raises(InputError) as e:
        shape_from_config(CONFIGS[which], "model/config.json")
    (problem,) = e.value.problems
    assert (problem.file, problem.field, problem.value) == ("model/config.json", "model_type",
                                                            CONFIGS[which]["model_type"])
    assert problem.message.startswith(f"{NAMES[which]} is a speech model (")
    assert "does not plan or build speech kits yet" in problem.message and "tensorrt-edgellm-export" in \
        problem.message


def test_the_cli_plan_of_a_speech_model_says_so_in_one_line(project, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIGS["qwen3-asr"]))
    r = project.cli("plan", "--model-config", str(cfg), "--quant", "int4_awq", "--target", "orin-nano-8gb",
                    "--backend", "edgellm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "1 problem(s)" in r.stderr and "model_type = 'qwen3_asr': Qwen3-ASR is a speech model" in r.stderr

"""The Qwen3-TTS twin and the reference synthesis loop (pipeline/workstation/tinytts.py, synthesis_reference.py)
against Qwen3-TTS's official implementation (qwen-tts 0.1.1, run in its own process: tests/official_qwen_tts.py):
the same codes frame for frame for every way a request opens the codec side (a language, a dialect speaker, auto,
no speaker), with and without a repetition penalty, through an EOS; Edge-LLM's Code2Wav against the official
12 Hz tokenizer decoder; the twin's files where the real checkpoint has them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.official_qwen_tts import run as official

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    from pipeline.workstation.fetch import fetch_builtin
    out = tmp_path_factory.mktemp("tts") / "model"
    fetch_builtin("tiny-qwen3-tts", out)
    return out


DECODED = (1, 7, 40)        # Code2Wav compared on these many frames of seeded codes


def _decoded_frames() -> list:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 2048, (n, 16)).tolist() for n in DECODED]


@pytest.fixture(scope="module")
def theirs(twin, tmp_path_factory):
    """The official implementation's codes of REQUESTS (12 frames each) and its decoding of _decoded_frames(), in one
    process of its own."""
    return official(twin, {"generate": [{"text": t, "speaker": s, "language": lang, "max_frames": 12,
                                         "repetition_penalty": p} for t, s, lang, p in REQUESTS],
                           "decode": _decoded_frames()}, tmp_path_factory.mktemp("official") / "out.npz")


@pytest.fixture(scope="module")
def reference(twin):
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    return ReferenceSynthesis(twin)


REQUESTS = [  # (text, speaker, language, repetition penalty)
    ("Hello there, edge.", "vivian", "english", 1.0),
    ("Front left.", "dylan", "chinese", 1.3),       # a dialect speaker: its dialect's language id
    ("A b", "ryan", "auto", 1.05),                  # auto: the nothink opening, no language id
    ("x", None, "auto", 1.0),                       # no speaker token; a one-token text (no trailing text)
]


def _ours(reference, requests, max_frames):
    from pipeline.workstation.synthesis_reference import Sampling, voice_of
    return [reference.codes(text, voice_of(reference.talker_config, speaker, language),
                            Sampling(max_frames, repetition_penalty=penalty))
            for text, speaker, language, penalty in requests]


def _official_generate(model_dir, requests, max_frames, out):
    got = official(model_dir, {"generate": [{"text": t, "speaker": s, "language": lang, "max_frames": max_frames,
                                             "repetition_penalty": p} for t, s, lang, p in requests]}, out)
    return [got[f"generate_{i}"] for i in range(len(requests))]


def test_the_twin_is_written_in_the_hub_layout_with_the_real_protocol_ids(twin):
    config = json.loads((twin / "config.json").read_text())
    talker = config["talker_config"]
    assert (config["model_type"], config["tts_model_type"], config["tokenizer_type"]) == \
        ("qwen3_tts", "custom_voice", "qwen3_tts_tokenizer_12hz")
    assert (talker["codec_pad_id"], talker["codec_bos_id"], talker["codec_eos_token_id"], talker["codec_think_id"],
            talker["codec_nothink_id"], talker["codec_think_bos_id"], talker["codec_think_eos_id"]) == \
        (2148, 2149, 2150, 2154, 2155, 2156, 2157)
    assert talker["spk_id"]["vivian"] == 3065 and talker["spk_is_dialect"]["dylan"] == "beijing_dialect"
    assert talker["codec_language_id"]["english"] == 2050 and talker["vocab_size"] == 3072
    assert talker["num_code_groups"] == talker["code_predictor_config"]["num_code_groups"] == 16
    from safetensors import safe_open
    with safe_open(str(twin / "model.safetensors"), "np") as fh:
        names = list(fh.keys())
        assert fh.get_slice("talker.codec_head.weight").get_shape() == [3072, 64]
        assert fh.get_slice("talker.model.text_embedding.weight").get_shape() == [talker["text_vocab_size"], 48]
    assert all(n.startswith("talker.") for n in names) and "talker.code_predictor.lm_head.14.weight" in names
    speech = json.loads((twin / "speech_tokenizer" / "config.json").read_text())
    assert speech["decoder_config"]["upsample_rates"] == [8, 5, 4, 3]
    # the text side's ids are the tiny tokenizer's tokens in the real ones' places
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(str(twin))
    ids = tok("<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[:2] == [config["im_start_token_id"], config["assistant_token_id"]]
    assert ids[-5:-3] == [config["im_end_token_id"], ids[2]] and ids[-3:] == ids[:3]


def test_the_reference_loop_makes_the_official_codes(reference, theirs):
    ours = _ours(reference, REQUESTS, 12)
    for i, ((text, *_), a) in enumerate(zip(REQUESTS, ours, strict=True)):
        b = theirs[f"generate_{i}"]
        assert a.shape == b.shape == (12, 16), text      # the random twin never says EOS: max_frames frames
        assert a.dtype == np.int64
        np.testing.assert_array_equal(a, b, err_msg=text)
    # the voices open the codec side differently: the same text spoken by two of them differs
    assert not np.array_equal(*_ours(reference, [("Hi.", "vivian", "english", 1.0), ("Hi.", "ryan", "english", 1.0)],
                                     3))


def test_both_stop_at_the_same_frame_on_eos(twin, reference, tmp_path):
    """A twin whose codec head's EOS row is thrice the row of a code it chose at frame 3: EOS wins there or earlier
    (never before frame 2, where it is masked), and the official generate stops at the same frame."""
    from safetensors.torch import load_file, save_file

    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    eos_twin = tmp_path / "eos"
    shutil.copytree(twin, eos_twin)
    text = ("Front left.", "vivian", "english", 1.0)
    chosen = int(_ours(reference, [text], 4)[0][3, 0])
    weights = load_file(str(eos_twin / "model.safetensors"))
    weights["talker.codec_head.weight"][2150] = 3 * weights["talker.codec_head.weight"][chosen]
    save_file(weights, str(eos_twin / "model.safetensors"), metadata={"format": "pt"})
    ours = _ours(ReferenceSynthesis(eos_twin), [text], 12)[0]
    theirs = _official_generate(eos_twin, [text], 12, tmp_path / "out.npz")[0]
    assert 2 <= len(ours) <= 3
    np.testing.assert_array_equal(ours, theirs)


def test_edge_llm_code2wav_computes_the_official_decoder(reference, theirs):
    for i, codes in enumerate(_decoded_frames()):
        ours = reference.waveform(np.asarray(codes))
        assert ours.shape == theirs[f"decode_{i}"].shape == (1920 * len(codes),)
        assert ours.dtype == np.float32 and 0.05 < np.abs(ours).max() <= 1.0   # not silence, clamped
        np.testing.assert_allclose(ours, theirs[f"decode_{i}"], atol=1e-5)
    assert reference.waveform(np.zeros((0, 16), np.int64)).shape == (0,)


def test_a_voice_is_resolved_by_name_as_the_official_generate_does(reference):
    from pipeline.workstation.synthesis_reference import Voice, voice_of
    talker = reference.talker_config
    assert voice_of(talker, "Vivian", "English") == Voice(3065, 2050)
    assert voice_of(talker, "eric", "auto") == Voice(2875, 2062)        # Sichuan dialect
    assert voice_of(talker, "eric", "english") == Voice(2875, 2050)
    assert voice_of(talker, None, "auto") == Voice(None, None)
    with pytest.raises(KeyError, match="speaker 'nobody' is not one of the model's: aiden, dylan, eric"):
        voice_of(talker, "nobody", "english")
    with pytest.raises(KeyError, match="language 'klingon' is not one of the model's: auto, beijing_dialect"):
        voice_of(talker, "ryan", "klingon")


def test_a_checkpoint_that_is_not_what_its_config_says_is_refused_naming_the_tensor(twin, tmp_path):
    """The fetch's check of a Qwen3-TTS checkpoint (workstation/synthesis_checkpoint.py), before any stage uses it."""
    from safetensors.torch import load_file, save_file

    from pipeline.errors import PipelineError
    from pipeline.workstation.synthesis_checkpoint import check_synthesis_checkpoint
    config = json.loads((twin / "config.json").read_text())
    check_synthesis_checkpoint(twin, config, "recipe.toml")     # the twin itself passes
    bad = tmp_path / "bad"
    shutil.copytree(twin, bad)
    weights = load_file(str(bad / "model.safetensors"))
    weights["talker.codec_head.weight"] = weights["talker.codec_head.weight"][:100].contiguous()
    del weights["talker.model.norm.weight"]
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(PipelineError, match=r"recipe.toml: the weights in .*bad are not the model its config "
                       r"describes: no talker.model.norm.weight; talker.codec_head.weight is \[100, 64\], its "
                       r"config makes \[3072, 64\]"):
        check_synthesis_checkpoint(bad, config, "recipe.toml")
    shutil.rmtree(bad / "speech_tokenizer")
    with pytest.raises(PipelineError, match="has no speech_tokenizer/config.json"):
        check_synthesis_checkpoint(bad, config, "recipe.toml")


def test_a_model_without_a_preset_voice_or_whose_weights_are_not_its_config_s_is_refused(twin, tmp_path):
    from pipeline.errors import PipelineError
    from pipeline.workstation.synthesis_gate import golden_speaker
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    config = json.loads((twin / "config.json").read_text())
    assert golden_speaker(config["talker_config"], twin) == "serena"
    with pytest.raises(PipelineError, match=r"m: the model has no preset voice \(talker_config.spk_id\): a Base"):
        golden_speaker({"spk_id": {}}, Path("m"))
    # the 0.6B twin's weights under a config whose talker is wider than its code predictor (the 1.7B's layout): its
    # projection is missing and every talker tensor is the wrong width
    wide = tmp_path / "wide"
    shutil.copytree(twin, wide)
    config["talker_config"]["hidden_size"] = 128
    (wide / "config.json").write_text(json.dumps(config))
    with pytest.raises(PipelineError, match=r"wide/config.json: the weights in .*wide are not the model its config "
                       r"describes: no talker.code_predictor.small_to_mtp_projection.bias \(and 1 more\); "
                       r"talker.code_predictor.model.codec_embedding.0.weight is \[2048, 64\], its config makes "
                       r"\[2048, 128\]"):
        ReferenceSynthesis(wide)


@pytest.fixture(scope="module")
def twin_1_7b(tmp_path_factory) -> Path:
    from pipeline.workstation.fetch import fetch_builtin
    out = tmp_path_factory.mktemp("tts-1.7b") / "model"
    fetch_builtin("tiny-qwen3-tts-1.7b", out)
    return out


def test_the_reference_loop_makes_the_official_codes_through_the_1_7b_s_projection(twin_1_7b, tmp_path):
    """The 1.7B's layout (a code predictor narrower than its talker, fed through small_to_mtp_projection): the
    reference and the official generate choose the same codes, frame for frame, for every way a request opens."""
    from pipeline.workstation.synthesis_model import PROJECTION
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    reference = ReferenceSynthesis(twin_1_7b)
    cp = reference.model.talker.code_predictor
    assert tuple(getattr(cp, PROJECTION).weight.shape) == (64, 96)
    ours = _ours(reference, REQUESTS, 12)
    theirs = _official_generate(twin_1_7b, REQUESTS, 12, tmp_path / "out.npz")
    for (text, *_), a, b in zip(REQUESTS, ours, theirs, strict=True):
        assert a.shape == b.shape == (12, 16), text
        np.testing.assert_array_equal(a, b, err_msg=text)


def test_a_reference_that_speaks_nan_makes_no_goldens(twin, tmp_path):
    """Code2Wav's codebooks with a NaN row: the waveform is not finite, and the goldens stage refuses it rather than
    writing a WAV of it (NaN never compares its way through the gate)."""
    from safetensors.torch import load_file, save_file

    from pipeline.errors import PipelineError
    from pipeline.workstation.synthesis_gate import synthesis_check
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    nan = tmp_path / "nan"
    shutil.copytree(twin, nan)
    weights = load_file(str(nan / "speech_tokenizer" / "model.safetensors"))
    (name,) = [k for k in weights if k.endswith("rvq_first.vq.layers.0._codebook.embedding_sum")]
    weights[name][:] = float("nan")
    save_file(weights, str(nan / "speech_tokenizer" / "model.safetensors"))
    with pytest.raises(PipelineError, match="the reference waveform of 'Hi.' holds a value that is not finite"):
        synthesis_check(ReferenceSynthesis(nan), ["Hi."], "ryan", "auto", 3, tmp_path / "out", 0.03)
    assert not (tmp_path / "out" / "audio" / "tts-0.wav").exists()

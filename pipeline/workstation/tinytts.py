"""Builtin tiny text-to-speech models: Qwen3-TTS-12Hz-0.6B-CustomVoice's config with its widths and depths shrunk and
everything its generation reads kept as the hub's config.json has it: the codec vocabulary (3072) and its control ids
(codec pad/bos/eos 2148-2150, think/nothink 2154-2157), the nine preset speakers' ids and dialects, the languages'
codec ids, the text-side ids (tts pad/bos/eos 151671-151673, im_start 151644, assistant 77091: here the tiny
tokenizer's own ids of the same tokens), 16 code groups of 2048 codes, the talker's interleaved multimodal RoPE
(sections scaled with the head) and its speech tokenizer's decoder (Code2Wav: 16 quantizers, one semantic, upsampling
8 x 5 x 4 x 3 after 2 x 2: 1920 samples a frame at 24 kHz, 12.5 frames a second).

Written in the layout the hub publishes it in, the one TensorRT Edge-LLM 0.11's exporter reads: config.json (model
type qwen3_tts, the talker and its code predictor under talker_config), model.safetensors holding only `talker.*`
tensors (the CustomVoice checkpoint has no speaker encoder), the text tokenizer, and speech_tokenizer/ with its
config.json (decoder_config) and the decoder's tensors under `decoder.`. transformers 5.14 has no Qwen3-TTS; the
tensors are made by the modules Edge-LLM itself loads them into (its calibration model mirrors the checkpoint's keys,
its Code2Wav decoder the speech tokenizer's), so a key or shape the real checkpoint would not have fails here.

The weights are random (seeded): the twin's audio is noise. Its figures say the exported graphs and the engine compute
what the reference does, never how the real model speaks.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

# The real checkpoint's tokens around a request's text (its processor renders
# "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"); the tts_* embed the talker's text side
ROLE_TOKENS = ("<|im_start|>", "assistant", "<|im_end|>")
TTS_TOKENS = ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")

# Qwen3-TTS-12Hz-0.6B-CustomVoice's talker_config as the hub has it, less its sizes (pipeline/data/model_configs.toml
# holds those): the protocol ids, speakers and languages its generation reads
CUSTOM_VOICE_TALKER = dict(
    vocab_size=3072, num_code_groups=16, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000,
    attention_bias=False, use_sliding_window=False, max_position_embeddings=32768, position_id_per_seconds=13,
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
    codec_think_bos_id=2156, codec_think_eos_id=2157,
    codec_language_id={"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                       "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
                       "beijing_dialect": 2074, "sichuan_dialect": 2062},
    spk_id={"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878},
    spk_is_dialect={"serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
                    "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"})

# the twins' code predictor (64 wide, heads of 32) and Code2Wav (32 wide, with the real codebooks and rates)
TINY_PREDICTOR = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, vocab_size=2048, rms_norm_eps=1e-6, rope_theta=1000000,
                      max_position_embeddings=65536, hidden_act="silu", attention_bias=False)
TINY_CODE2WAV = dict(codebook_size=2048, codebook_dim=32, hidden_size=32, latent_dim=32, num_attention_heads=2,
                     num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=2, num_quantizers=16,
                     num_semantic_quantizers=1, sliding_window=72, max_position_embeddings=8000, rope_theta=10000.0,
                     rms_norm_eps=1e-5, layer_scale_initial_scale=0.01, attention_bias=False, hidden_act="silu",
                     upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64)

TTS_BUILTINS: dict[str, dict] = {
    # Qwen3-TTS-12Hz-0.6B-CustomVoice shrunk: a 2-layer talker and code predictor 64 wide (heads of 32: the RoPE
    # sections [24, 20, 20] of a 128-wide head become [6, 5, 5]); Code2Wav 32 wide with its real codebooks and rates
    "tiny-qwen3-tts": dict(
        architecture="Qwen3TTSForConditionalGeneration", tts_model_type="custom_voice",
        talker=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, text_hidden_size=48,
                    rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": True}),
        code_predictor=TINY_PREDICTOR,
        code2wav=TINY_CODE2WAV,
        seed=0),
    # Qwen3-TTS-12Hz-1.7B-CustomVoice shrunk: its code predictor narrower than its talker as the 1.7B's is (1024
    # against 2048, here 64 against 96), so its codec embeddings are the talker's width and
    # talker.code_predictor.small_to_mtp_projection carries them into the code predictor's (synthesis_model.py);
    # the text side as wide as the talker (2048 and 2048 in the 1.7B); MLPs three times their width, as the 1.7B's
    "tiny-qwen3-tts-1.7b": dict(
        architecture="Qwen3TTSForConditionalGeneration", tts_model_type="custom_voice",
        talker=dict(hidden_size=96, intermediate_size=288, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, text_hidden_size=96,
                    rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": True}),
        code_predictor=dict(TINY_PREDICTOR, intermediate_size=192),
        code2wav=TINY_CODE2WAV,
        seed=1),
}

SAMPLE_RATE = 24_000        # the 12 Hz speech tokenizer's output rate


def _tokenizer(vocab_size: int):
    from pipeline.workstation.tinytrain import train_tokenizer
    tok = train_tokenizer(vocab_size)
    tok.add_special_tokens([ROLE_TOKENS[0], ROLE_TOKENS[2], *TTS_TOKENS])
    tok.add_tokens([ROLE_TOKENS[1]])       # one token, as in Qwen's vocabulary (77091), and not special: it decodes
    return tok


def build_config(name: str, tok) -> dict:
    """config.json of TTS builtin `name` for the trained tokenizer `tok` (its ids in the real config's places)."""
    spec = TTS_BUILTINS[name]
    ids = {t: tok.token_to_id(t) for t in (*ROLE_TOKENS, *TTS_TOKENS)}
    talker = dict(copy.deepcopy(CUSTOM_VOICE_TALKER), **copy.deepcopy(spec["talker"]),
                  text_vocab_size=tok.get_vocab_size())
    talker["code_predictor_config"] = dict(spec["code_predictor"], num_code_groups=talker["num_code_groups"])
    return {"architectures": [spec["architecture"]], "model_type": "qwen3_tts",
            "tts_model_type": spec["tts_model_type"], "tts_model_size": "tiny",
            "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "im_start_token_id": ids["<|im_start|>"], "im_end_token_id": ids["<|im_end|>"],
            "assistant_token_id": ids["assistant"], "tts_pad_token_id": ids["<tts_pad>"],
            "tts_bos_token_id": ids["<tts_text_bos>"], "tts_eos_token_id": ids["<tts_text_eod>"],
            "talker_config": talker}


def speech_tokenizer_config(name: str) -> dict:
    """speech_tokenizer/config.json: the 12 Hz tokenizer's rates and its decoder's config (what Code2Wav reads)."""
    return {"model_type": "qwen3_tts_tokenizer_12hz", "input_sample_rate": SAMPLE_RATE,
            "output_sample_rate": SAMPLE_RATE, "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
            "decoder_config": copy.deepcopy(TTS_BUILTINS[name]["code2wav"])}


def builtin_config(name: str, spec) -> dict:
    """The config.json TTS builtin `name` is written with (the plan reads it before the fetch makes the model)."""
    return build_config(name, _tokenizer(spec.vocab_size))


def materialize(name: str, spec, out_dir: Path, progress=None) -> None:
    """Write TTS builtin `name` (spec: tinymodel.Builtin, its `extra` one of TTS_BUILTINS) into out_dir."""
    import torch
    from safetensors.torch import save_file
    from tensorrt_edgellm.models.qwen3_tts.modeling_qwen3_tts_code2wav import (
        Qwen3TTSCode2WavConfig,
        Qwen3TTSCode2WavDecoder,
    )
    from transformers import PreTrainedTokenizerFast

    from pipeline.workstation.synthesis_model import build

    out_dir.mkdir(parents=True, exist_ok=True)
    tts = TTS_BUILTINS[name]
    tok = _tokenizer(spec.vocab_size)
    config = build_config(name, tok)
    torch.manual_seed(tts["seed"])
    model = build(config).float()
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.save_pretrained(out_dir)
    decoder = Qwen3TTSCode2WavDecoder(Qwen3TTSCode2WavConfig.from_dict(tts["code2wav"]))
    with torch.no_grad():       # the codebooks start at zero (EMA sums): codes would all decode to silence
        for module in decoder.modules():
            if hasattr(module, "embedding_sum"):
                module.embedding_sum.normal_()
    speech = out_dir / "speech_tokenizer"
    speech.mkdir(exist_ok=True)
    save_file({f"decoder.{k}": v.detach().contiguous() for k, v in decoder.state_dict().items()},
              str(speech / "model.safetensors"), metadata={"format": "pt"})
    (speech / "config.json").write_text(json.dumps(speech_tokenizer_config(name), indent=2) + "\n")
    if progress:
        progress(1, 1, 0.0)

"""Qwen3-ASR's audio side as data (pipeline/families/audio.py) against transformers' own implementation: the audio
tokens of a recording, the encoder's parameters at the published 0.6B and 1.7B sizes (built on the meta device, no
memory), and both hub layouts' configs located."""

import pytest
import torch
from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
from transformers.models.qwen3_asr.modeling_qwen3_asr import _get_feat_extract_output_lengths

from pipeline.families.audio import QWEN3_ASR_AUDIO, AudioEncoderShape, located

# the published models' audio encoders and language models (Qwen/Qwen3-ASR-0.6B and -1.7B config.json)
SIZES = {
    "0.6B": (dict(d_model=896, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584, output_dim=1024),
             dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936)),
    "1.7B": (dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096, output_dim=2048),
             dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936)),
}


def shape_of(audio: dict) -> AudioEncoderShape:
    return AudioEncoderShape(mel_bins=audio.get("num_mel_bins", 128), layers=audio["encoder_layers"],
                             width=audio["d_model"], heads=audio["encoder_attention_heads"],
                             ffn=audio["encoder_ffn_dim"], out=audio["output_dim"],
                             conv_channels=audio.get("downsample_hidden_size", 480),
                             n_window=audio.get("n_window", 50), n_window_infer=audio.get("n_window_infer", 800))


@pytest.mark.parametrize("seconds", [0.05, 0.5, 1.0, 1.01, 2.37, 10.0, 29.99, 300.0])
def test_audio_tokens_are_what_transformers_computes_for_the_recording(seconds):
    frames = QWEN3_ASR_AUDIO.frames(seconds)
    assert frames == int(seconds * 16000) // 160
    expected = int(_get_feat_extract_output_lengths(torch.tensor(frames), 50))
    assert QWEN3_ASR_AUDIO.audio_tokens(seconds, 50) == expected
    assert QWEN3_ASR_AUDIO.tokens_per_second(50) == 13.0


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_encoders_parameters_are_transformers_own_count_at_the_published_sizes(size):
    audio, text = SIZES[size]
    config = Qwen3ASRConfig(audio_config=dict(audio), text_config=dict(text))
    with torch.device("meta"):
        model = Qwen3ASRForConditionalGeneration(config)
    counted = sum(p.numel() for n, p in model.named_parameters() if "audio_tower" in n or "multi_modal_projector" in n)
    assert shape_of(audio).params == counted
    # what the model cards say of the encoders: ~0.18B beside the 0.6B's decoder, ~0.3B beside the 1.7B's
    assert {"0.6B": 0.15e9, "1.7B": 0.28e9}[size] < counted < {"0.6B": 0.21e9, "1.7B": 0.33e9}[size]


def test_both_hub_layouts_are_located_and_the_original_one_first():
    original = {"architectures": ["Qwen3ASRForConditionalGeneration"],
                "thinker_config": {"audio_config": {"d_model": 896}, "text_config": {"hidden_size": 1024}}}
    native = {"architectures": ["Qwen3ASRForConditionalGeneration"], "audio_config": {"d_model": 896},
              "text_config": {"hidden_size": 1024}}
    assert located(original, QWEN3_ASR_AUDIO.config_paths) == ("thinker_config.audio_config", {"d_model": 896})
    assert located(native, QWEN3_ASR_AUDIO.config_paths) == ("audio_config", {"d_model": 896})
    assert located(native, QWEN3_ASR_AUDIO.text_paths) == ("text_config", {"hidden_size": 1024})
    assert located({"thinker_config": "damaged"}, QWEN3_ASR_AUDIO.config_paths) is None


def test_the_encoders_flops_per_token_are_what_torch_counts_for_one_attention_window():
    """A small encoder (its real layer kinds, small widths) run on one full window of 8 one-second chunks: torch's
    FLOP counter over the forward, per audio token, equals the design's count."""
    from torch.utils.flop_counter import FlopCounterMode
    audio = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=96, output_dim=48,
                 downsample_hidden_size=16, num_mel_bins=128, n_window=50, n_window_infer=800)
    config = Qwen3ASRConfig(audio_config=dict(audio), text_config=dict(
        hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=24, vocab_size=300))
    # eager attention: its two matrix products are what the counter sees (CPU SDPA's fused op is not counted)
    config._attn_implementation = config.audio_config._attn_implementation = "eager"
    model = Qwen3ASRForConditionalGeneration(config).eval()
    features = torch.randn(1, 128, 800)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = model.get_audio_features(features, torch.ones(1, 800, dtype=torch.long))
    hidden = out.pooler_output if hasattr(out, "pooler_output") and out.pooler_output is not None else out
    tokens = QWEN3_ASR_AUDIO.audio_tokens(8.0, 50)
    assert tokens == 104 and hidden.reshape(-1, 48).shape[0] == tokens
    assert counter.get_total_flops() / tokens == pytest.approx(shape_of(audio).flops_per_token(), rel=1e-9)


def test_the_exported_graphs_flops_are_what_torch_counts_in_edgellms_own_encoder():
    """Edge-LLM 0.11's encoder (the module it exports as audio/model.onnx) scores every token of the request against
    every other under a mask: torch's FLOP counter over its forward on four one-second chunks equals the plan's
    count with every token attending to all 52 (plan/parts/audio.py AudioEncoder.flops)."""
    from tensorrt_edgellm import config as edgellm_config
    from tensorrt_edgellm.models.qwen3_asr.modeling_qwen3_asr_audio import QwenAudioEncoder
    from torch.utils.flop_counter import FlopCounterMode
    model_config = edgellm_config.ModelConfig(
        model_type="qwen3", hidden_size=48, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, head_dim=24, rms_norm_eps=1e-6, vocab_size=300, rope_theta=1e6,
        max_position_embeddings=128, default_attention_scale=1.0)
    audio = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=96, output_dim=48,
                 downsample_hidden_size=16, num_mel_bins=128, n_window=50, n_window_infer=800)
    encoder = QwenAudioEncoder(num_mel_bins=128, d_model=64, num_layers=2, num_heads=4, ffn_dim=96, output_dim=48,
                               downsample_hidden=16, attention_scale=0.25, model_config=model_config).half().eval()
    chunks = 4
    tokens = QWEN3_ASR_AUDIO.audio_tokens(chunks, 50)
    assert tokens == 52
    # the runtime's inputs: the chunks' mel frames, each valid token's (chunk, step), the additive mask
    index = torch.stack([torch.arange(tokens) // 13, torch.arange(tokens) % 13], 1)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = encoder(torch.randn(chunks, 128, 100).half(), index, torch.zeros(tokens, tokens).half())
    assert out.shape == (tokens, 48)
    assert counter.get_total_flops() == tokens * shape_of(audio).flops_per_token(attended=tokens)


def test_the_thinker_layouts_names_are_transformers_and_edgellms_own():
    """Every tensor transformers' Qwen3-ASR holds has one name in the original (thinker) layout, mapped back to itself
    (families/layouts.py); the encoder's thinker names, its projection inside it, are the parameters of Edge-LLM's
    encoder module, which its exporter loads under `thinker.audio_tower.`."""
    from tensorrt_edgellm import config as edgellm_config
    from tensorrt_edgellm.models.qwen3_asr.modeling_qwen3_asr_audio import QwenAudioEncoder

    from pipeline.families.layouts import QWEN3_ASR_THINKER_NAMES, hub_layout, rename
    audio, text = SIZES["0.6B"]
    small_audio = {**audio, "encoder_layers": 2}
    config = Qwen3ASRConfig(audio_config=dict(small_audio), text_config={**text, "num_hidden_layers": 2},
                            tie_word_embeddings=False)
    with torch.device("meta"):
        native = set(Qwen3ASRForConditionalGeneration(config).state_dict())
    thinker = {rename(n, QWEN3_ASR_THINKER_NAMES, to_native=False): n for n in native}
    assert None not in thinker and len(thinker) == len(native)
    layout = hub_layout({"architectures": ["Qwen3ASRForConditionalGeneration"], "thinker_config": {}})
    assert all(layout.tensors(t) == [(n, 0, 1)] for t, n in thinker.items())
    model_config = edgellm_config.ModelConfig(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=8,
        intermediate_size=3072, head_dim=128, rms_norm_eps=1e-6, vocab_size=300, rope_theta=1e6,
        max_position_embeddings=128, default_attention_scale=1.0)
    with torch.device("meta"):
        edgellm = QwenAudioEncoder(num_mel_bins=128, d_model=896, num_layers=2, num_heads=14, ffn_dim=3584,
                                   output_dim=1024, downsample_hidden=480, attention_scale=1 / 8,
                                   model_config=model_config)
    expected = {f"thinker.audio_tower.{n}" for n, _ in edgellm.named_parameters()}
    assert {t for t in thinker if t.startswith("thinker.audio_tower.")} == expected
    assert {t for t in thinker if not t.startswith("thinker.audio_tower.")} == \
        {t for t in thinker if t.startswith(("thinker.model.", "thinker.lm_head."))}

"""A tiny Qwen3-ASR (the published 0.6B's config, shrunk: its layer kinds, mel bins and attention windows kept) exported
through Edge-LLM 0.11's own audio exporter from the -hf layout transformers saves (pipeline/workstation/audio_export.py
writes the thinker layout it reads), and the graph checked against transformers on recordings that end mid-chunk and
cross an attention window (pipeline/workstation/audio_check.py)."""

import json

import numpy as np
import pytest
import torch

from pipeline.errors import PipelineError
from pipeline.workstation.audio_check import check_encoder, graph_feeds
from pipeline.workstation.audio_export import export_audio

AUDIO = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=48,
             downsample_hidden_size=16, num_mel_bins=128, n_window=50, n_window_infer=800)
TEXT = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            head_dim=24, vocab_size=512, max_position_embeddings=4096)
FRAMES = (37, 100, 1013)        # under a chunk; exactly one; ten chunks and a bit: two attention windows


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
    root = tmp_path_factory.mktemp("asr")
    torch.manual_seed(0)
    model = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(audio_config=dict(AUDIO), text_config=dict(TEXT),
                                                            audio_token_id=500)).eval()
    model.save_pretrained(root / "hf")
    graph = export_audio(root / "hf", root / "edgellm-input", root / "onnx")
    for p in model.parameters():        # the weights as the FP16 graph holds them
        p.data = p.data.half().float()
    return graph, model


def recordings() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((128, n)) * 0.5).astype(np.float32) for n in FRAMES]


def test_the_exported_encoder_is_transformers_on_recordings_across_chunks_and_windows(exported):
    graph, model = exported
    agreement = check_encoder(graph, model, recordings())
    assert agreement.recordings == 3
    assert agreement.max_relative_error < 5e-3 and agreement.cosine > 0.99999
    config = json.loads((graph.parent / "config.json").read_text())
    assert config["model_type"] == "qwen3_asr_thinker" and config["audio_token_id"] == 500
    assert config["audio_config"]["n_window_infer"] == 800


def test_the_runtime_inputs_are_chunks_tokens_and_window_masks():
    feeds = graph_feeds(np.ones((128, 1013), np.float32), 50, 800)
    assert feeds["padded_feature"].shape == (11, 128, 100) and feeds["padded_feature"].dtype == np.float16
    assert feeds["padded_feature"][10, :, 13:].max() == 0 and feeds["padded_feature"][10, :, :13].min() == 1
    index = feeds["padded_mask_after_cnn_indices"]
    # ten whole chunks of 13 tokens and what the convolutions leave of 13 frames (2)
    assert index.shape == (132, 2) and index[-1].tolist() == [10, 1] and index[129].tolist() == [9, 12]
    mask = feeds["attention_mask"]
    assert mask.shape == (132, 132) and mask[103, 0] == 0 and np.isneginf(mask[104, 103]) and mask[131, 104] == 0


def test_a_graph_that_computes_otherwise_is_refused(exported):
    graph, model = exported
    with torch.no_grad():
        model.model.audio_tower.ln_post.bias.add_(0.05)
    try:
        with pytest.raises(PipelineError, match="the exported audio encoder disagrees with the checkpoint's"):
            check_encoder(graph, model, recordings()[:1])
    finally:
        with torch.no_grad():
            model.model.audio_tower.ln_post.bias.sub_(0.05)


def test_a_checkpoint_in_the_original_thinker_layout_is_rewritten_as_transformers_loads_it(exported, tmp_path):
    """The fetch's rewrite (workstation/hub_layouts.py) of Qwen3-ASR's original layout: the thinker config and tensor
    names become the native ones, and transformers loads every tensor of it unchanged."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3ASRForConditionalGeneration

    from pipeline.families.layouts import QWEN3_ASR_THINKER_NAMES, rename, thinker_config
    from pipeline.workstation.hub_layouts import convert
    hf = exported[0].parents[2] / "hf"
    native = load_file(str(hf / "model.safetensors"))
    original = tmp_path / "original"
    original.mkdir()
    save_file({rename(k, QWEN3_ASR_THINKER_NAMES, to_native=False): v for k, v in native.items()},
              str(original / "model.safetensors"), metadata={"format": "pt"})
    (original / "config.json").write_text(json.dumps(thinker_config(json.loads((hf / "config.json").read_text()))))
    assert convert(original, "hf:Qwen/Qwen3-ASR-0.6B").startswith("Qwen3-ASR's original layout")
    config = json.loads((original / "config.json").read_text())
    assert "thinker_config" not in config and config["audio_config"]["d_model"] == 64
    assert config["audio_token_id"] == 500 and config["text_config"]["hidden_size"] == 48
    rewritten = load_file(str(original / "model.safetensors"))
    assert rewritten.keys() == native.keys()
    assert all(torch.equal(rewritten[k], native[k]) for k in native)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(original)
    assert all(torch.equal(model.state_dict()[k], native[k]) for k in native)

"""Builtin tiny vision-language models: each a real model's config shrunk (layers, widths), its tower's design kept
(patch and merge sizes, DeepStack layers, window attention, tiles), its processor's real settings, and a tokenizer
trained here with the image placeholder tokens the family's chat template places. The language model is briefly
trained on the shipped corpus as the text builtins are (tinymodel.py); the tower keeps its random weights (the
export, the independent check and the goldens compare numerics, which random weights exercise as well as trained
ones).
"""

from __future__ import annotations

from pathlib import Path

# The placeholder tokens of each family and how its chat template writes an image (content part {"type": "image"});
# the processor side (families/visual.py) expands the middle token to the image's count.
QWEN_IMAGE = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
INTERNVL_IMAGE = ("<img>", "<IMG_CONTEXT>", "</img>")


def chat_template(image: tuple[str, str, str], kinds: tuple[str, ...] = ("image", "image_url")) -> str:
    """The text builtins' template (tinymodel.CHAT_TEMPLATE's chat part) with content parts: text as written, an
    image (a content part of one of `kinds`: a recording for a speech model) as its three placeholder tokens (the
    middle one once: the processor repeats it)."""
    start, pad, end = image
    part = ("{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] in " + repr(kinds) + " %}"
            f"{start}{pad}{end}{{% endif %}}")
    return ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}" + part + "{% endfor %}{% endif %}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6)
# mrope: the rotary half of a 16-wide head (8) split over time, height and width, as Qwen's [24, 20, 20] splits 64
_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}
_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]

VLM_BUILTINS: dict[str, dict] = {
    # Qwen3-VL-2B shrunk: 16-pixel patches merged 2 x 2, a 48 x 48 position table, DeepStack features from two
    # blocks, interleaved mrope; its processor's settings (mean and std 0.5; 65,536 .. 16,777,216 pixels).
    "tiny-qwen3-vl": dict(
        architecture="Qwen3VLForConditionalGeneration", image=QWEN_IMAGE, processor="Qwen2VLImageProcessorPil",
        text=dict(_TEXT, head_dim=16, rope_parameters=dict(_MROPE, mrope_interleaved=True), tie_word_embeddings=True),
        vision=dict(depth=3, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
                    temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=2304,
                    deepstack_visual_indexes=[0, 1]),
        processor_config=dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                              image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 65536, "longest_edge": 16777216})),
    # Qwen3.5-0.8B as the hub has it (multimodal), shrunk: tiny-qwen3_5's hybrid decoder (three gated delta-net layers
    # to one gated attention layer, delta-net heads 128 wide as Edge-LLM's kernel takes them) with interleaved mrope
    # over its rotated quarter of each head (the hub's rope_parameters: mrope_section [11, 11, 10] of 64 rotated
    # dimensions; here [3, 3, 2] of 16, at base 10,000 rather than the hub's 10,000,000, under which 8 frequencies
    # barely turn and a wrong image position would go unseen by the checks); Qwen3-VL's tower without DeepStack
    # (transformers' Qwen3_5VisionModel, Edge-LLM's qwen3_5 visual model) and Qwen3-VL's processor (transformers
    # maps qwen3_5 to Qwen3VLProcessor).
    "tiny-qwen3_5-vl": dict(
        architecture="Qwen3_5ForConditionalGeneration", image=QWEN_IMAGE, processor="Qwen2VLImageProcessorPil",
        train_steps=100,        # as tiny-qwen3_5 (transformers' delta-net runs its slow torch path on the CPU)
        text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                  layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=2048,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                   "mrope_section": [3, 3, 2], "mrope_interleaved": True},
                  tie_word_embeddings=True, rms_norm_eps=1e-6),
        vision=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
                    temporal_patch_size=2, out_hidden_size=128, num_position_embeddings=2304),
        processor_config=dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                              image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 65536, "longest_edge": 16777216})),
    # Qwen2.5-VL-3B shrunk: 14-pixel patches, 112-pixel attention windows but in two of four blocks; CLIP's mean/std.
    "tiny-qwen2.5-vl": dict(
        architecture="Qwen2_5_VLForConditionalGeneration", image=QWEN_IMAGE, processor="Qwen2VLImageProcessorPil",
        published="flat",           # written as the hub has Qwen2.5-VL (workstation/tinyhub.py)
        text=dict(_TEXT, rope_parameters=dict(_MROPE), tie_word_embeddings=True),
        vision=dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=4, patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1, 3], out_hidden_size=64),
        processor_config=dict(patch_size=14, merge_size=2, temporal_patch_size=2, image_mean=_CLIP_MEAN,
                              image_std=_CLIP_STD, size={"shortest_edge": 3136, "longest_edge": 12845056})),
    # InternVL3-1B (-hf) shrunk: 448-pixel tiles in 14-pixel patches, pixel shuffle 0.5 to 256 tokens a tile, up to
    # 12 tiles and a thumbnail; ImageNet's mean/std.
    "tiny-internvl3": dict(
        architecture="InternVLForConditionalGeneration", image=INTERNVL_IMAGE, processor="GotOcr2ImageProcessorPil",
        published="internvl_chat",  # written as InternVL3's original repositories have it (workstation/tinyhub.py)
        text=dict(_TEXT, model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                  tie_word_embeddings=False),
        vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    image_size=[448, 448], patch_size=[14, 14]),
        processor_config=dict(size={"height": 448, "width": 448}, crop_to_patches=True, min_patches=1,
                              max_patches=12, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])),
}


def build_config(spec: dict, vocab: int, image_ids: tuple[int, int, int]):
    """The transformers config of a tiny VLM: the language model's vocabulary is the trained tokenizer's."""
    import transformers

    from pipeline.families import family
    fam = family(spec["architecture"])
    assert fam is not None and fam.visual is not None
    start, pad, end = image_ids
    extra = dict(image_token_id=pad) if spec["image"] is INTERNVL_IMAGE else \
        dict(image_token_id=pad, vision_start_token_id=start, vision_end_token_id=end, video_token_id=pad)
    text = dict(spec["text"], vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    # tied as the language model says, at the top level too (as the real checkpoints have it: transformers 5 ties by
    # the top-level flag, Edge-LLM by the text config's)
    return getattr(transformers, fam.transformers_config)(text_config=text, vision_config=dict(spec["vision"]),
                                                         architectures=[spec["architecture"]],
                                                         tie_word_embeddings=text["tie_word_embeddings"], **extra)


def _tokenizer(spec, vlm: dict):
    from pipeline.workstation.tinytrain import train_tokenizer
    tok = train_tokenizer(spec.vocab_size)
    tok.add_special_tokens(list(vlm["image"]))
    ids = tuple(tok.token_to_id(t) for t in vlm["image"])
    return tok, (ids[0], ids[1], ids[2])


def builtin_config(name: str, spec) -> dict:
    """The config.json VLM builtin `name` is written with (the plan reads it before the fetch makes the model)."""
    from pipeline.workstation.tinyhub import published_config
    vlm = VLM_BUILTINS[name]
    tok, ids = _tokenizer(spec, vlm)
    saved = {**build_config(vlm, tok.get_vocab_size(), ids).to_dict(), "architectures": [vlm["architecture"]]}
    return published_config(vlm, saved)


def materialize(name: str, spec, out_dir: Path, progress=None) -> None:
    """Write VLM builtin `name` (spec: tinymodel.Builtin, its `extra` one of VLM_BUILTINS) into out_dir: weights,
    config, tokenizer with its image tokens, chat template, and the processor's preprocessor_config.json."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from pipeline.workstation.tinyhub import write_published
    from pipeline.workstation.tinytrain import train

    vlm = VLM_BUILTINS[name]
    tok, ids = _tokenizer(spec, vlm)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.chat_template = chat_template(vlm["image"])
    config = build_config(vlm, tok.get_vocab_size(), ids)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, vlm["architecture"])(config).float()
    train(model, fast, spec.train_steps, spec.seed, progress)
    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir, safe_serialization=True)
    fast.save_pretrained(out_dir)
    getattr(transformers, vlm["processor"])(**vlm["processor_config"]).save_pretrained(out_dir)
    write_published(vlm, out_dir)       # in the layout the hub publishes the real model in

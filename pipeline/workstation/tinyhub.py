"""The builtin tiny vision-language models written in the layout the hub publishes their real models in, so that their
recipes take every reader of that layout through the whole pipeline (the tiny model is made with transformers 5's
native classes, then written out as the hub has the real one):

  flat            Qwen2.5-VL 3B / 7B: transformers 4's config.json, the language model's fields at the top level
                  beside vision_config, RoPE as rope_scaling type "mrope" (Family.flat_text_config), with exactly
                  the published file's keys; its tensors as transformers 5 saves them, which are the hub's names;
  internvl_chat   InternVL3's original repositories (families/layouts.py): InternVLChatModel with llm_config and
                  InternViT's vision_config under their own names, the auto_map to its own code, InternViT's q/k/v
                  as one qkv tensor, the projector as mlp1, and no processor file (its preprocessing is its code).
                  The fetch rewrites it in the native layout (workstation/hub_layouts.py).
"""

from __future__ import annotations

import json
from pathlib import Path

FLAT_TOP = ("architectures", "attention_dropout", "bos_token_id", "eos_token_id", "vision_start_token_id",
            "vision_end_token_id", "vision_token_id", "image_token_id", "video_token_id", "hidden_act", "hidden_size",
            "initializer_range", "intermediate_size", "max_position_embeddings", "max_window_layers", "model_type",
            "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_theta",
            "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache",
            "use_sliding_window", "vision_config", "rope_scaling", "vocab_size")
FLAT_VISION = ("depth", "hidden_act", "hidden_size", "intermediate_size", "num_heads", "in_chans", "out_hidden_size",
               "patch_size", "spatial_merge_size", "spatial_patch_size", "window_size", "fullatt_block_indexes",
               "tokens_per_second", "temporal_patch_size")
# InternVL3-1B's config.json (OpenGVLab/InternVL3-1B: its InternVLChatConfig, as its model card's code reads it)
CHAT_AUTO_MAP = {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
                 "AutoModel": "modeling_internvl_chat.InternVLChatModel",
                 "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel"}
CHAT_TEXT = ("attention_dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
             "intermediate_size", "max_position_embeddings", "max_window_layers", "num_attention_heads",
             "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "sliding_window", "tie_word_embeddings",
             "use_cache", "use_sliding_window", "vocab_size")
def published_config(vlm: dict, saved: dict) -> dict:
    """The builtin's config.json (transformers 5's `saved`) in the layout its real model is published in."""
    layout = vlm.get("published")
    if layout == "flat":
        return _flat(saved)
    if layout == "internvl_chat":
        return _internvl_chat(saved)
    return saved


def write_published(vlm: dict, out_dir: Path) -> None:
    """Rewrite a saved builtin in the layout its real model is published in (config, and the tensors' names)."""
    layout = vlm.get("published")
    if layout is None:
        return
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(published_config(vlm, json.loads(config_path.read_text())), indent=2) + "\n")
    if layout == "internvl_chat":
        _chat_tensors(out_dir / "model.safetensors")
        (out_dir / "preprocessor_config.json").unlink()


def _flat(config: dict) -> dict:
    text, vision = config["text_config"], config["vision_config"]
    rope = text.get("rope_parameters") or {}
    values = {**text, **config, "vision_token_id": config["image_token_id"], "torch_dtype": "float32",
              "rope_theta": rope["rope_theta"],
              "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
              "vision_config": {k: {**vision, "in_chans": vision["in_channels"],
                                    "spatial_patch_size": vision["patch_size"]}[k] for k in FLAT_VISION}}
    return {k: values[k] for k in FLAT_TOP}


def _internvl_chat(config: dict) -> dict:
    text, vision = config["text_config"], config["vision_config"]
    rope = text.get("rope_parameters") or {}
    llm = {**{k: text[k] for k in CHAT_TEXT if k in text}, "architectures": ["Qwen2ForCausalLM"],
           "model_type": "qwen2", "rope_theta": rope.get("rope_theta", 1000000.0), "rope_scaling": None,
           "torch_dtype": "float32", "use_bfloat16": False}
    size, patch = vision["image_size"], vision["patch_size"]
    vc = {"architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": vision["hidden_size"],
          "intermediate_size": vision["intermediate_size"], "num_hidden_layers": vision["num_hidden_layers"],
          "num_attention_heads": vision["num_attention_heads"], "num_channels": vision["num_channels"],
          "image_size": size[0] if isinstance(size, list) else size,
          "patch_size": patch[0] if isinstance(patch, list) else patch, "qkv_bias": vision["attention_bias"],
          "qk_normalization": vision["use_qk_norm"], "norm_type": vision["norm_type"],
          "layer_norm_eps": vision["layer_norm_eps"], "hidden_act": vision["hidden_act"],
          "attention_dropout": 0.0, "dropout": 0.0, "drop_path_rate": 0.0, "initializer_factor": 1.0,
          "initializer_range": vision["initializer_range"], "torch_dtype": "float32", "use_bfloat16": False,
          "use_flash_attn": False}
    return {"architectures": ["InternVLChatModel"], "auto_map": CHAT_AUTO_MAP, "model_type": "internvl_chat",
            "downsample_ratio": config["downsample_ratio"], "dynamic_image_size": True,
            "force_image_size": vc["image_size"], "hidden_size": text["hidden_size"], "llm_config": llm,
            "vision_config": vc, "max_dynamic_patch": 12, "min_dynamic_patch": 1, "ps_version": "v2",
            "select_layer": config.get("vision_feature_layer", -1), "template": "internvl2_5",
            "tie_word_embeddings": config.get("tie_word_embeddings", False), "torch_dtype": "float32",
            "transformers_version": None, "use_backbone_lora": 0, "use_llm_lora": 0, "use_thumbnail": True}


def _chat_tensors(path: Path) -> None:
    """The native tensors under InternVL's chat names (families/layouts.py: the pairs the fetch reads back), q, k
    and v concatenated into InternViT's qkv."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.families.layouts import INTERNVL_CHAT_NAMES, qkv_part, rename
    out: dict = {}
    fused: dict[str, list] = {}
    for name, tensor in load_file(str(path)).items():
        part = qkv_part(name)
        if part is not None:
            fused.setdefault(part[0], [None] * 3)[part[1]] = tensor
            continue
        chat = rename(name, INTERNVL_CHAT_NAMES, to_native=False)
        assert chat is not None, name       # every tensor of the native tiny model has a chat name
        out[chat] = tensor
    for name, parts in fused.items():
        out[name] = torch.cat(parts).contiguous()
    save_file(out, str(path), metadata={"format": "pt"})

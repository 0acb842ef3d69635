"""Checkpoint layouts the hub publishes for a family under other names than transformers 5 implements it, mapped onto
the native ones without running the checkpoint's own code (as Nemotron-H's auto_map is never run).

InternVL3 and 3.5's original repositories (OpenGVLab/InternVL3-1B ... 38B) are `InternVLChatModel`, model_type
`internvl_chat`, with remote code: the language model's config in `llm_config` (a Qwen2 for InternVL3), InternViT's in
`vision_config` under its own key names, its attention's q/k/v as one `qkv` tensor, the projector as `mlp1`. The
"-hf" conversions transformers publishes (convert_internvl_weights_to_hf.py) are the native `internvl` layout this
pipeline builds. A `HubLayout` maps the config (here, for planning: standard library only) and names the tensor
renames; pipeline/workstation/hub_layouts.py rewrites a fetched checkpoint with them, so that every stage after the
fetch reads the native layout. Edge-LLM 0.11 itself reads either (its export takes `internvl_chat` too).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import InputError, Problem

INTERNVL_CHAT = "InternVLChatModel"
INTERNVL_NATIVE = "InternVLForConditionalGeneration"
# the language models the native class builds from a chat checkpoint's llm_config (InternVL3: Qwen2.5; the 2.5 series'
# InternLM2 language models have no native transformers class)
CHAT_LANGUAGE_MODELS = {"Qwen2ForCausalLM": "qwen2"}
# llm_config / vision_config keys that only the checkpoint's own code reads (transformers' conversion drops them)
DROPPED = {"_name_or_path", "_attn_implementation_autoset", "auto_map", "architectures", "use_bfloat16",
           "use_flash_attn", "drop_path_rate", "torch_dtype", "transformers_version", "model_type", "bias",
           "laux_allreduce", "moe_coeff_ratio", "moe_output_scale", "noisy_gate_policy", "use_residual", "use_moe",
           "use_rts", "use_weighted_residual", "moe_config", "capacity_factor", "eval_capacity_factor"}
VISION_RENAMES = {"qkv_bias": "attention_bias", "qk_normalization": "use_qk_norm",
                  "attention_probs_dropout_prob": "attention_dropout"}
# InternVL's image preprocessing (its build_transform and dynamic_preprocess): ImageNet's mean and std
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# chat tensor name -> native, by pattern, in order (the first that matches); `qkv` is split into q/k/v
_VISION = [(r"^vision_model\.embeddings\.class_embedding$", "vision_tower.embeddings.cls_token"),
           (r"^vision_model\.embeddings\.position_embedding$", "vision_tower.embeddings.position_embeddings"),
           (r"^vision_model\.embeddings\.patch_embedding\.(weight|bias)$",
            r"vision_tower.embeddings.patch_embeddings.projection.\1"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.attn\.proj\.(weight|bias)$",
            r"vision_tower.encoder.layer.\1.attention.projection_layer.\2"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.attn\.(q_norm|k_norm)\.(weight|bias)$",
            r"vision_tower.encoder.layer.\1.attention.\2.\3"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$",
            r"vision_tower.encoder.layer.\1.mlp.\2.\3"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.norm1\.(weight|bias)$",
            r"vision_tower.encoder.layer.\1.layernorm_before.\2"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.norm2\.(weight|bias)$",
            r"vision_tower.encoder.layer.\1.layernorm_after.\2"),
           (r"^vision_model\.encoder\.layers\.(\d+)\.ls([12])$", r"vision_tower.encoder.layer.\1.lambda_\2"),
           (r"^mlp1\.0\.(weight|bias)$", r"multi_modal_projector.layer_norm.\1"),
           (r"^mlp1\.1\.(weight|bias)$", r"multi_modal_projector.linear_1.\1"),
           (r"^mlp1\.3\.(weight|bias)$", r"multi_modal_projector.linear_2.\1"),
           (r"^(language_model\..+)$", r"\1")]
QKV = re.compile(r"^vision_model\.encoder\.layers\.(\d+)\.attn\.qkv\.(weight|bias)$")


@dataclass(frozen=True)
class HubLayout:
    """A published layout of a family under other names (the module docstring says which)."""
    architecture: str                   # what the hub's config.json names
    native: str                         # the family's native architecture
    config: Callable[[dict, str], dict]     # the native config.json of one in this layout (InputError where it cannot)
    tensors: Callable[[str], list[tuple[str, int, int]]]    # a tensor's native (name, part, of parts); [] unknown
    description: str


def _internvl_chat_config(config: dict, source: str) -> dict:
    problems: list[Problem] = []

    def section(key: str) -> dict:
        value = config.get(key)
        if not isinstance(value, dict):
            problems.append(Problem(source, key, value, "must hold InternVL's sub-config (its chat layout keeps it "
                                    "there)", "use the checkpoint's own config.json"))
            return {}
        return value

    llm, vision = section("llm_config"), section("vision_config")
    archs = llm.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if llm and arch not in CHAT_LANGUAGE_MODELS:
        problems.append(Problem(source, "llm_config.architectures", archs, "a language model transformers' native "
                                "InternVL class does not build", f"InternVL3's ({', '.join(CHAT_LANGUAGE_MODELS)}); "
                                "or its -hf conversion"))
    if config.get("ps_version", "v2") != "v2":
        problems.append(Problem(source, "ps_version", config.get("ps_version"), "is not the pixel shuffle InternVL3 "
                                "and the native class use (v2)", "use an InternVL3 / 3.5 checkpoint"))
    if config.get("use_thumbnail", True) is not True:
        problems.append(Problem(source, "use_thumbnail", config.get("use_thumbnail"), "the native processor (and "
                                "Edge-LLM's runtime) add a thumbnail tile", "use the checkpoint as published"))
    if problems:
        raise InputError(problems)
    text = {k: v for k, v in llm.items() if k not in DROPPED}
    text["model_type"] = CHAT_LANGUAGE_MODELS[str(arch)]
    sub = {VISION_RENAMES.get(k, k): v for k, v in vision.items() if k not in DROPPED}
    for key in ("image_size", "patch_size"):
        if isinstance(sub.get(key), int):
            sub[key] = [sub[key], sub[key]]
    sub.update(model_type="internvl_vision", use_absolute_position_embeddings=True)
    size = config.get("force_image_size") or (sub.get("image_size") or [448])[0]
    patch = (sub.get("patch_size") or [14])[0]
    ratio = config.get("downsample_ratio", 0.5)
    native = {"architectures": [INTERNVL_NATIVE], "model_type": "internvl", "text_config": text, "vision_config": sub,
              "downsample_ratio": ratio, "vision_feature_layer": config.get("select_layer", -1),
              "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
              "image_seq_length": int((size // patch) ** 2 * ratio * ratio),
              "tie_word_embeddings": bool(llm.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))}
    return native


def _internvl_chat_tensor(name: str) -> list[tuple[str, int, int]]:
    m = QKV.match(name)
    if m:
        base = f"vision_tower.encoder.layer.{m[1]}.attention"
        return [(f"{base}.{p}_proj.{m[2]}", i, 3) for i, p in enumerate("qkv")]
    for pattern, target in _VISION:
        if re.match(pattern, name):
            return [(re.sub(pattern, target, name), 0, 1)]
    return []


LAYOUTS = (HubLayout(INTERNVL_CHAT, INTERNVL_NATIVE, _internvl_chat_config, _internvl_chat_tensor,
                     "InternVL's chat layout (InternVLChatModel: llm_config, InternViT's names, qkv fused, mlp1)"),)


def hub_layout(config: dict) -> HubLayout | None:
    """The layout a config.json is in, where it is one of these (None: a native one, or unknown)."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    arch = archs[0] if isinstance(archs, list) and archs else None
    return next((layout for layout in LAYOUTS if layout.architecture == arch), None)


def native_config(config: dict, source: str) -> dict:
    """The config in its family's native layout (itself where it is one)."""
    layout = hub_layout(config)
    return layout.config(config, source) if layout is not None else config

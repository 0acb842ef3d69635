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

# InternVL's chat tensor names and the native ones, one pair each ({i}: a block, {p}: weight or bias, {rest}: the
# rest of the name): the fetch reads them one way (workstation/hub_layouts.py), the builtin twin is written the other
# (workstation/tinyhub.py). InternViT's fused qkv is CHAT_QKV, split into NATIVE_QKV's q, k and v (in that order).
INTERNVL_CHAT_NAMES = (
    ("vision_model.embeddings.class_embedding", "vision_tower.embeddings.cls_token"),
    ("vision_model.embeddings.position_embedding", "vision_tower.embeddings.position_embeddings"),
    ("vision_model.embeddings.patch_embedding.{p}", "vision_tower.embeddings.patch_embeddings.projection.{p}"),
    ("vision_model.encoder.layers.{i}.attn.proj.{p}", "vision_tower.encoder.layer.{i}.attention.projection_layer.{p}"),
    ("vision_model.encoder.layers.{i}.attn.q_norm.{p}", "vision_tower.encoder.layer.{i}.attention.q_norm.{p}"),
    ("vision_model.encoder.layers.{i}.attn.k_norm.{p}", "vision_tower.encoder.layer.{i}.attention.k_norm.{p}"),
    ("vision_model.encoder.layers.{i}.mlp.fc1.{p}", "vision_tower.encoder.layer.{i}.mlp.fc1.{p}"),
    ("vision_model.encoder.layers.{i}.mlp.fc2.{p}", "vision_tower.encoder.layer.{i}.mlp.fc2.{p}"),
    ("vision_model.encoder.layers.{i}.norm1.{p}", "vision_tower.encoder.layer.{i}.layernorm_before.{p}"),
    ("vision_model.encoder.layers.{i}.norm2.{p}", "vision_tower.encoder.layer.{i}.layernorm_after.{p}"),
    ("vision_model.encoder.layers.{i}.ls1", "vision_tower.encoder.layer.{i}.lambda_1"),
    ("vision_model.encoder.layers.{i}.ls2", "vision_tower.encoder.layer.{i}.lambda_2"),
    ("mlp1.0.{p}", "multi_modal_projector.layer_norm.{p}"),
    ("mlp1.1.{p}", "multi_modal_projector.linear_1.{p}"),
    ("mlp1.3.{p}", "multi_modal_projector.linear_2.{p}"),
    ("language_model.{rest}", "language_model.{rest}"))
CHAT_QKV = "vision_model.encoder.layers.{i}.attn.qkv.{p}"
NATIVE_QKV = tuple(f"vision_tower.encoder.layer.{{i}}.attention.{x}_proj.{{p}}" for x in "qkv")
_FIELDS = {"i": r"\d+", "p": "weight|bias", "rest": ".+"}


def _pattern(template: str) -> re.Pattern:
    out = re.escape(template)
    for field, allowed in _FIELDS.items():
        out = out.replace(re.escape("{" + field + "}"), f"(?P<{field}>{allowed})")
    return re.compile(f"^{out}$")


def rename(name: str, pairs: tuple[tuple[str, str], ...], to_native: bool = True) -> str | None:
    """`name` under the other layout of `pairs` ((chat, native) templates), or None where no pair names it."""
    for pair in pairs:
        source, target = pair if to_native else pair[::-1]
        m = _pattern(source).match(name)
        if m:
            return target.format(**m.groupdict())
    return None


@dataclass(frozen=True)
class HubLayout:
    """A published layout of a family under other names (the module docstring says which)."""
    architecture: str                   # what the hub's config.json names
    native: str                         # the family's native architecture
    config: Callable[[dict, str], dict]     # the native config.json of one in this layout (InputError where it cannot)
    tensors: Callable[[str], list[tuple[str, int, int]]]    # a tensor's native (name, part, of parts); [] unknown
    description: str
    # a top-level key only this layout's config.json has (where it names the same architecture as the native one)
    marker: str | None = None

    def matches(self, config: dict) -> bool:
        archs = config.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs else None
        return arch == self.architecture and (self.marker is None or self.marker in config)


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


def qkv_part(name: str) -> tuple[str, int] | None:
    """A native q/k/v projection's fused chat name and its place in it (0, 1, 2), else None."""
    for part, template in enumerate(NATIVE_QKV):
        m = _pattern(template).match(name)
        if m:
            return CHAT_QKV.format(**m.groupdict()), part
    return None


def _internvl_chat_tensor(name: str) -> list[tuple[str, int, int]]:
    m = _pattern(CHAT_QKV).match(name)
    if m:
        return [(t.format(**m.groupdict()), part, 3) for part, t in enumerate(NATIVE_QKV)]
    native = rename(name, INTERNVL_CHAT_NAMES)
    return [(native, 0, 1)] if native is not None else []


QWEN3_ASR = "Qwen3ASRForConditionalGeneration"
# the thinker's keys beside its two configs that the native config keeps at the top level
THINKER_TOKEN_IDS = ("audio_token_id", "audio_start_token_id", "audio_end_token_id")
# Qwen3-ASR's thinker tensor names and the native ones (the projection first: the encoder's pair would take it)
QWEN3_ASR_THINKER_NAMES = (
    ("thinker.audio_tower.proj1.{p}", "model.multi_modal_projector.linear_1.{p}"),
    ("thinker.audio_tower.proj2.{p}", "model.multi_modal_projector.linear_2.{p}"),
    ("thinker.audio_tower.{rest}", "model.audio_tower.{rest}"),
    ("thinker.model.{rest}", "model.language_model.{rest}"),
    ("thinker.lm_head.{p}", "lm_head.{p}"))


def _qwen3_asr_thinker_config(config: dict, source: str) -> dict:
    thinker = config.get("thinker_config")
    problems = []
    if not isinstance(thinker, dict):
        problems.append(Problem(source, "thinker_config", thinker, "must hold Qwen3-ASR's audio_config and "
                                "text_config (its original layout keeps them there)", "use the checkpoint's own "
                                "config.json"))
    else:
        problems += [Problem(source, f"thinker_config.{key}", thinker.get(key), "must hold Qwen3-ASR's "
                             f"{key.split('_')[0]} model's config", "use the checkpoint's own config.json")
                     for key in ("audio_config", "text_config") if not isinstance(thinker.get(key), dict)]
    if problems or not isinstance(thinker, dict):
        raise InputError(problems)
    audio = {k: v for k, v in thinker["audio_config"].items() if k not in DROPPED}
    audio["model_type"] = "qwen3_asr_encoder"
    text = {k: v for k, v in thinker["text_config"].items() if k not in DROPPED}
    text["model_type"] = "qwen3"
    native = {"architectures": [QWEN3_ASR], "model_type": "qwen3_asr", "audio_config": audio, "text_config": text,
              "tie_word_embeddings": bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)))}
    native |= {k: thinker[k] for k in THINKER_TOKEN_IDS if isinstance(thinker.get(k), int)}
    return native


def thinker_config(native: dict) -> dict:
    """The inverse of _qwen3_asr_thinker_config: a native (-hf) Qwen3-ASR config.json in the original thinker layout
    (what Edge-LLM's exporter reads: workstation/audio_export.py)."""
    thinker = {"audio_config": native["audio_config"], "text_config": native["text_config"]}
    thinker |= {k: native[k] for k in THINKER_TOKEN_IDS if isinstance(native.get(k), int)}
    return {"architectures": native["architectures"], "model_type": "qwen3_asr", "thinker_config": thinker}


def _qwen3_asr_thinker_tensor(name: str) -> list[tuple[str, int, int]]:
    native = rename(name, QWEN3_ASR_THINKER_NAMES)
    return [(native, 0, 1)] if native is not None else []


LAYOUTS = (HubLayout(INTERNVL_CHAT, INTERNVL_NATIVE, _internvl_chat_config, _internvl_chat_tensor,
                     "InternVL's chat layout (InternVLChatModel: llm_config, InternViT's names, qkv fused, mlp1)"),
           HubLayout(QWEN3_ASR, QWEN3_ASR, _qwen3_asr_thinker_config, _qwen3_asr_thinker_tensor,
                     "Qwen3-ASR's original layout (thinker_config; thinker.model, thinker.audio_tower with its "
                     "proj1/proj2)",
                     marker="thinker_config"))


def hub_layout(config: dict) -> HubLayout | None:
    """The layout a config.json is in, where it is one of these (None: a native one, or unknown)."""
    if not isinstance(config, dict):
        return None
    return next((layout for layout in LAYOUTS if layout.matches(config)), None)


def native_config(config: dict, source: str) -> dict:
    """The config in its family's native layout (itself where it is one)."""
    layout = hub_layout(config)
    return layout.config(config, source) if layout is not None else config

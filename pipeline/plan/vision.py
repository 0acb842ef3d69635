"""A vision-language model's visual tower as the planner counts it: its weights, the work of one image and the
activations of the largest image profile, read from the checkpoint's `vision_config`.

Edge-LLM 0.11 exports the tower as visual/model.onnx (FP16; FP8 on SM89+ with --visual_quantization fp8) and
visual_build makes one engine with one optimization profile over image tokens (plan/vision_time.py times it). The
tower's layers, as transformers 5 builds them (and Edge-LLM's models/<family>/modeling_*_visual.py exports them):

    Qwen2.5-VL   patch conv (no bias); per block RMSNorm x2, qkv + proj (bias), SwiGLU gate/up/down (bias); window
                 attention (window_size pixels square) except fullatt_block_indexes; merger RMSNorm, 4h -> 4h -> out.
    Qwen3-VL     patch conv (bias) + learned position table; per block LayerNorm x2, qkv + proj (bias), GELU fc1/fc2
                 (bias); full attention per image; merger LayerNorm(h), 4h -> 4h -> out, and one more merger
                 (LayerNorm(4h)) per DeepStack layer, whose outputs feed the LLM's first layers.
    InternVL3    448-pixel tiles; patch conv (bias), class token, position table; per block LayerNorm x2, q/k/v/o,
                 layer scales, GELU fc1/fc2 (bias); full attention per tile; projector LayerNorm(4h), 4h -> text
                 hidden -> text hidden, on the pixel-shuffled tokens.

Attention is counted as its two matrix products (QK^T and AV: 4 x hidden FLOPs per pair of patches that attend to each
other); the ViT runs it through a fused kernel (Edge-LLM's ViTAttentionPlugin), so no score matrix is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import Problem
from pipeline.families import family
from pipeline.families.visual import PatchMerger, Tiles, VisualTower

BOUND = 2**20       # a real tower's dimension is far below this; past it the config is damaged or crafted


@dataclass(frozen=True)
class TowerShape:
    design: str                     # "qwen2_5_vl" | "qwen3_vl" | "internvl"
    tokens: VisualTower             # how an image becomes tokens (families/visual.py)
    depth: int
    hidden: int
    intermediate: int
    heads: int
    out_hidden: int                 # the language model's hidden size the merger projects to
    in_channels: int = 3
    temporal_patch: int = 1         # Qwen towers take frames in pairs: a still image is its frame twice
    window_patches: int = 0         # Qwen2.5-VL: patches per attention window (0: every block attends to the image)
    full_blocks: int = 0            # Qwen2.5-VL: blocks that attend to the whole image
    deepstack: int = 0              # Qwen3-VL: extra mergers feeding the LLM's first layers
    position_table: int = 0         # learned position embeddings (rows)
    qkv_bias: bool = True           # InternViT: attention_bias (its output projection always has one)

    @property
    def merge_area(self) -> int:
        """Patches per image token (merge x merge, or the pixel shuffle's 1 / scale^2)."""
        t = self.tokens
        return t.merge * t.merge if isinstance(t, PatchMerger) else round(1 / (t.scale * t.scale))

    @property
    def patch(self) -> int:
        return self.tokens.patch

    def block_linear_params(self) -> int:
        """Weights of one block's matrices (applied to every patch)."""
        h, i = self.hidden, self.intermediate
        mlp = 3 * h * i if self.design == "qwen2_5_vl" else 2 * h * i
        return 4 * h * h + mlp

    def merger_linear_params(self) -> int:
        """Weights of the merger (applied to every image token), DeepStack mergers included."""
        m = self.hidden * self.merge_area
        if self.design == "internvl":
            return m * self.out_hidden + self.out_hidden * self.out_hidden
        return (1 + self.deepstack) * (m * m + m * self.out_hidden)

    def params(self) -> int:
        """Every weight of the tower, the small ones (norms, biases, embeddings) included."""
        h, i, m, out = self.hidden, self.intermediate, self.hidden * self.merge_area, self.out_hidden
        conv = self.in_channels * self.temporal_patch * self.patch * self.patch * h
        if self.design == "qwen2_5_vl":
            block_small = 2 * h + 4 * h + 2 * i + h          # RMSNorm x2; qkv + proj biases; gate/up/down biases
            merger_small = h + m + out                      # ln_q; the two biases
            small = self.depth * block_small + merger_small
        elif self.design == "qwen3_vl":
            block_small = 4 * h + 4 * h + i + h             # LayerNorm x2; qkv + proj biases; fc1/fc2 biases
            small = h + self.position_table * h + self.depth * block_small + (2 * h + m + out) \
                + self.deepstack * (2 * m + m + out)
        else:
            qkv = 3 * h if self.qkv_bias else 0
            block_small = 4 * h + qkv + h + 2 * h + i + h   # LayerNorm x2; q/k/v, o biases; layer scales; fc biases
            small = h + h + self.position_table * h + self.depth * block_small + 2 * m + 2 * out
        return conv + self.depth * self.block_linear_params() + self.merger_linear_params() + small

    def flops(self, patches: int, images: int = 1) -> float:
        """One forward pass over `images` images of `patches` patches each (tiles: `patches` per tile, `images`
        tiles)."""
        n = patches * images
        linear = 2.0 * self.block_linear_params() * n * self.depth \
            + 2.0 * self.merger_linear_params() * n / self.merge_area
        if self.window_patches:
            span = self.full_blocks * patches + (self.depth - self.full_blocks) * min(self.window_patches, patches)
        else:
            span = self.depth * patches
        return linear + 4.0 * self.hidden * n * span

    def activation_bytes(self, max_patches: int, dtype_bytes: int = 2) -> int:
        """The largest block's live tensors at the profile's largest input: the residual stream, the normed input,
        q/k/v and the attention output, and the MLP's hidden layer (TensorRT reuses them block to block)."""
        mlp = (2 if self.design == "qwen2_5_vl" else 1) * self.intermediate
        return max_patches * (6 * self.hidden + mlp) * dtype_bytes


# Qwen3.5's tower is Qwen3-VL's without DeepStack (Edge-LLM 0.11: models/qwen3_5/modeling_qwen3_5_visual.py reuses
# its Qwen3-VL classes with deepstack_visual_indexes = []): the same graph inputs, processor and check
DESIGNS = {"Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl", "Qwen3VLForConditionalGeneration": "qwen3_vl",
           "Qwen3_5ForConditionalGeneration": "qwen3_vl", "Qwen3_5MoeForConditionalGeneration": "qwen3_vl",
           "InternVLForConditionalGeneration": "internvl"}


def tower_from_config(arch: str, config: dict, source: str, problems: list[Problem]) -> TowerShape | None:
    """The tower of a vision-language checkpoint (None for a text model); problems collect every odd field."""
    fam = family(arch)
    if fam is None or fam.visual is None:
        return None
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        problems.append(Problem(source, "vision_config", vc, f"must hold the visual tower's config ({fam.name} "
                                "keeps it there)", "use the model's own config.json"))
        return None
    design = DESIGNS[arch]

    def need(key: str, default: int | None = None, where: dict = vc, prefix: str = "vision_config.") -> int:
        value = where.get(key, default)
        if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:      # InternVL's [h, w] pairs
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= BOUND:
            problems.append(Problem(source, prefix + key, value, f"must be a positive integer up to {BOUND}",
                                    "use the model's own config.json, as transformers saved it"))
            return 1
        return value

    depth = need("num_hidden_layers" if design == "internvl" else "depth")
    hidden = need("hidden_size")
    heads = need("num_attention_heads" if design == "internvl" else "num_heads")
    inter = need("intermediate_size")
    tokens = fam.visual
    if isinstance(tokens, PatchMerger) and need("patch_size") != tokens.patch:
        problems.append(Problem(source, "vision_config.patch_size", vc.get("patch_size"),
                                f"is not {fam.name}'s {tokens.patch}", "use the model's own config.json"))
    if isinstance(tokens, Tiles) and (need("image_size") != tokens.tile or need("patch_size") != tokens.patch):
        problems.append(Problem(source, "vision_config.image_size", vc.get("image_size"),
                                f"{fam.name} tiles are {tokens.tile} pixels in {tokens.patch}-pixel patches",
                                "use the model's own config.json"))

    def tower(**rest: Any) -> TowerShape:
        return TowerShape(design, tokens, depth, hidden, inter, heads, **rest)

    if isinstance(tokens, Tiles):
        text = config.get("text_config")
        grid = tokens.tile // tokens.patch
        return tower(out_hidden=need("hidden_size", where=text if isinstance(text, dict) else {},
                                     prefix="text_config."),
                     in_channels=need("num_channels", 3), position_table=grid * grid + 1,
                     qkv_bias=vc.get("attention_bias") is True)
    def blocks(key: str) -> list:
        """A list of block indexes (full-attention blocks, DeepStack layers), each below depth."""
        value = vc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(b, int) and 0 <= b < depth for b in value):
            problems.append(Problem(source, f"vision_config.{key}", value,
                                    f"must list block indexes below depth ({depth})", "use the model's own config"))
            return []
        return value

    out = need("out_hidden_size")
    temporal = need("temporal_patch_size", 2)
    channels = need("in_chans" if "in_chans" in vc else "in_channels", 3)
    if design == "qwen2_5_vl":
        window = need("window_size", 112)
        return tower(out_hidden=out, in_channels=channels, temporal_patch=temporal,
                     window_patches=(window // tokens.patch) ** 2, full_blocks=len(blocks("fullatt_block_indexes")))
    return tower(out_hidden=out, in_channels=channels, temporal_patch=temporal,
                 deepstack=len(blocks("deepstack_visual_indexes")),
                 position_table=need("num_position_embeddings", 2304))

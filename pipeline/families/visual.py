"""A vision-language model's image side, as data: how many tokens an image of a given size becomes in the language
model's sequence, for the two tower designs Edge-LLM 0.11 exports (its `visual/` ONNX, built on the board by
`visual_build`). The counts are what the model's own processor makes (preprocessor_config.json), which is what
Edge-LLM's C++ runtime reads beside the visual engine (its exporter copies the processor config there:
tensorrt_edgellm/scripts/export.py, "the C++ runtime expects preprocessor_config.json").

    Qwen2.5-VL, Qwen3-VL (Cosmos-Reason2)   native resolution: the image resized to a multiple of patch x merge
        (smart_resize: the aspect kept, its pixel count clamped to [min_pixels, max_pixels]), cut into patch x patch
        patches, merge x merge of them merged into one token; <|vision_start|> <|image_pad|> x N <|vision_end|>.
        Qwen2.5-VL: patch 14, merge 2, pixels 56*56 .. 28*28*1280 (its processor's defaults);
        Qwen3-VL: patch 16, merge 2, pixels 65,536 .. 16,777,216 (its checkpoints' "size"; Edge-LLM's exporter
        saves the same for the Qwen3-VL tower it exports for Alpamayo).
        Edge-LLM: tensorrt_edgellm/models/qwen2_5_vl/modeling_qwen2_5_vl_visual.py (window attention, 2x2 merger),
        models/qwen3_vl/modeling_qwen3_vl_visual.py.
    InternVL3   tiles: the image cut into tile x tile crops on the grid (columns x rows, min..max tiles) whose aspect
        is closest to the image's, plus a thumbnail when there is more than one; each tile a fixed
        (tile / patch)^2 x scale^2 tokens (448 / 14, pixel shuffle 0.5: 256); <img> <IMG_CONTEXT> x N </img>.
        Edge-LLM: tensorrt_edgellm/models/internvl3/modeling_internvl3_visual.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class PatchMerger:
    """Qwen's native-resolution tower: patches of `patch` pixels, merge x merge of them per token."""
    patch: int
    merge: int
    min_pixels: int
    max_pixels: int
    wrap_tokens: int = 2        # <|vision_start|> ... <|vision_end|>
    placeholder: str = "<|image_pad|>"     # the token the chat template places once and the processor repeats

    @property
    def factor(self) -> int:
        return self.patch * self.merge

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The image's size after the processor's resize (transformers' smart_resize)."""
        if height < 1 or width < 1 or max(height, width) / min(height, width) > 200:
            raise ValueError(f"an image of {width}x{height} pixels: the aspect ratio must be below 200")
        f = self.factor
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return h, w

    def patches(self, height: int, width: int) -> int:
        """The patches the tower computes on (its sequence: what its time and activations scale with)."""
        h, w = self.resized(height, width)
        return (h // self.patch) * (w // self.patch)

    def image_tokens(self, height: int, width: int) -> int:
        """The placeholder tokens the image takes in the language model's sequence (the wrapping ones not counted)."""
        h, w = self.resized(height, width)
        return (h // self.factor) * (w // self.factor)

    def max_image_tokens(self) -> int:
        return self.max_pixels // (self.factor * self.factor)


@dataclass(frozen=True)
class Tiles:
    """InternVL's tiled tower: tile x tile crops, `per_tile` tokens each."""
    tile: int
    patch: int
    scale: float                # pixel shuffle (downsample_ratio): tokens per tile = (tile / patch)^2 x scale^2
    min_tiles: int = 1
    max_tiles: int = 12
    thumbnail: bool = True
    wrap_tokens: int = 2        # <img> ... </img>
    placeholder: str = "<IMG_CONTEXT>"     # the token the chat template places once and the processor repeats

    @property
    def per_tile(self) -> int:
        return int((self.tile // self.patch) ** 2 * self.scale ** 2)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(columns, rows): the arrangement of min..max tiles whose aspect is closest to the image's; on a tie the
        one with more tiles, while the image covers more than half of it (transformers' get_optimal_tiled_canvas,
        InternVL's dynamic_preprocess)."""
        if height < 1 or width < 1:
            raise ValueError(f"an image of {width}x{height} pixels")
        # in transformers' order (columns, then rows, then stably by count): it decides ties
        arrangements = sorted([(c, r) for c in range(1, self.max_tiles + 1) for r in range(1, self.max_tiles + 1)
                               if self.min_tiles <= c * r <= self.max_tiles], key=lambda g: g[0] * g[1])
        aspect, area = width / height, width * height
        best, best_diff = (1, 1), float("inf")
        for c, r in arrangements:
            diff = abs(aspect - c / r)
            if diff < best_diff:
                best, best_diff = (c, r), diff
            elif diff == best_diff and area > 0.5 * self.tile * self.tile * c * r:
                best = (c, r)
        return best

    def crops(self, height: int, width: int) -> int:
        c, r = self.grid(height, width)
        return c * r + (1 if self.thumbnail and c * r > 1 else 0)

    def patches(self, height: int, width: int) -> int:
        return self.crops(height, width) * (self.tile // self.patch) ** 2

    def image_tokens(self, height: int, width: int) -> int:
        return self.crops(height, width) * self.per_tile

    def max_image_tokens(self) -> int:
        return (self.max_tiles + (1 if self.thumbnail and self.max_tiles > 1 else 0)) * self.per_tile


VisualTower = PatchMerger | Tiles

QWEN2_5_VL = PatchMerger(patch=14, merge=2, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
QWEN3_VL = PatchMerger(patch=16, merge=2, min_pixels=65_536, max_pixels=16_777_216)
INTERNVL3 = Tiles(tile=448, patch=14, scale=0.5)


@dataclass(frozen=True)
class TowerDesign:
    """One visual tower design, as data: how its images become tokens, what its checkpoint and config call things,
    what its exported graph takes, and the counts its weights are made of (plan/parts/tower.py sizes a checkpoint's
    tower from them; the workstation exports and checks it by them). The layers each design has are in
    plan/parts/tower.py's docstring."""
    name: str                       # recorded in plans and kits (what the plan table prints); never compared
    tokens: VisualTower             # how an image becomes tokens
    processor: str                  # transformers' PIL image processor (no torchvision: the workstation's torch
                                    # is CPU-only, torchvision's wheels pull a CUDA build)
    modules: tuple[str, ...]        # the tower's modules in the checkpoint (<module>.* or model.<module>.*)
    graph_inputs: tuple[str, ...]   # the inputs of Edge-LLM's exported visual/model.onnx
    depth_key: str = "depth"        # vision_config's block count and head count
    heads_key: str = "num_heads"
    mlp_matrices: int = 2           # per block: fc1/fc2 (GELU) = 2, gate/up/down (SwiGLU) = 3
    block_norms: int = 4            # norm parameters per block per hidden channel: LayerNorm x2 = 4, RMSNorm x2 = 2
    layer_scales: bool = False      # two per-channel layer scales per block (InternViT)
    qkv_bias_key: str | None = None     # vision_config's key for the q/k/v biases (None: always there)
    patch_bias: bool = True         # the patch embedding's bias
    class_token: bool = False
    position_key: str | None = None     # a learned position table's rows (Tiles: one per patch of a tile, + class)
    position_default: int = 0
    window: bool = False            # window attention (window_size, fullatt_block_indexes)
    deepstack: bool = False         # DeepStack mergers (deepstack_visual_indexes) feeding the LLM's first layers
    merger_norm: int = 2            # the merger's norm: LayerNorm = 2 parameters per channel, RMSNorm = 1
    projector: bool = False         # merged tokens -> text hidden -> text hidden (InternVL), else -> merged -> out

    @property
    def tiled(self) -> bool:
        """Images cut into fixed tiles (InternVL), not merged patches at native resolution (Qwen)."""
        return isinstance(self.tokens, Tiles)


# Edge-LLM: tensorrt_edgellm/models/qwen2_5_vl/modeling_qwen2_5_vl_visual.py
QWEN2_5_VL_TOWER = TowerDesign(
    "qwen2_5_vl", QWEN2_5_VL, "Qwen2VLImageProcessorPil", ("visual",),
    ("input", "rotary_pos_emb", "cu_seqlens", "cu_window_seqlens", "window_index", "reverse_window_index",
     "max_seqlen_carrier"), mlp_matrices=3, block_norms=2, patch_bias=False, window=True, merger_norm=1)
# models/qwen3_vl/modeling_qwen3_vl_visual.py; Qwen3.5's tower is this one without DeepStack (its
# modeling_qwen3_5_visual.py reuses these classes with deepstack_visual_indexes = []): the same graph inputs,
# processor and check
QWEN3_VL_TOWER = TowerDesign(
    "qwen3_vl", QWEN3_VL, "Qwen2VLImageProcessorPil", ("visual",),
    ("input", "rotary_pos_emb", "cu_seqlens", "fast_pos_embed_idx", "fast_pos_embed_weight", "max_seqlen_carrier"),
    position_key="num_position_embeddings", position_default=2304, deepstack=True)
# models/internvl3/modeling_internvl3_visual.py
INTERNVL3_TOWER = TowerDesign(
    "internvl", INTERNVL3, "GotOcr2ImageProcessorPil", ("vision_tower", "multi_modal_projector"), ("input",),
    depth_key="num_hidden_layers", heads_key="num_attention_heads", layer_scales=True,
    qkv_bias_key="attention_bias", class_token=True, projector=True)



def held(tower: VisualTower, per_image: int) -> VisualTower:
    """The tower's token math bounded as Edge-LLM's runtime bounds an image (at most per_image tokens; the goldens'
    processor is held the same way): Qwen's max_pixels = per_image x (patch x merge)^2 (min_pixels not above it);
    InternVL's tiles at most per_image / tokens-per-tile - 1, one kept for the thumbnail."""
    if isinstance(tower, PatchMerger):
        most = min(tower.max_pixels, per_image * tower.factor * tower.factor)
        return replace(tower, min_pixels=min(tower.min_pixels, most), max_pixels=most)
    return replace(tower, max_tiles=max(1, min(tower.max_tiles, per_image // tower.per_tile - 1)))


def expand_one(ids: list[int], placeholder: int, count: int) -> list[int]:
    """A prompt asked with one image: its ids with the placeholder the chat template placed once repeated `count`
    times (as the processor does). The goldens build their prompts with it, and the server checks the goldens
    with it."""
    if ids.count(placeholder) != 1:
        raise PipelineError(f"the chat template placed {ids.count(placeholder)} image placeholders for one image",
                            "use the model's own chat template")
    i = ids.index(placeholder)
    return ids[:i] + [placeholder] * count + ids[i + 1:]

TOWER_DESIGNS = {d.name: d for d in (QWEN2_5_VL_TOWER, QWEN3_VL_TOWER, INTERNVL3_TOWER)}


def tower_design(design: TowerDesign | str) -> TowerDesign:
    """A tower design, or the design a plan or a kit records by name (VisualPlan.design, an engine's config)."""
    if isinstance(design, TowerDesign):
        return design
    found = TOWER_DESIGNS.get(design)
    if found is None:
        raise PipelineError(f"unknown visual tower design {design!r} (known: {', '.join(TOWER_DESIGNS)})",
                            "rebuild the kit with this version of the pipeline")
    return found

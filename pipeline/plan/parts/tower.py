"""A vision-language model's visual tower as the planner counts it: its weights, the work of one image and the
activations of the largest image profile, read from the checkpoint's `vision_config`.

Edge-LLM 0.11 exports the tower as visual/model.onnx (FP16; FP8 on SM89+ with --visual_quantization fp8) and
visual_build makes one engine with one optimization profile over image tokens (tower_speed.py times it, tower_plan.py
plans it). The family's TowerDesign (families/visual.py) holds the counts each design's layers are made of; the
designs, as transformers 5 builds them (and Edge-LLM's models/<family>/modeling_*_visual.py exports them):

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
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pipeline.errors import Problem
from pipeline.families.visual import PatchMerger, Tiles, TowerDesign, VisualTower, held
from pipeline.plan.parts.base import ConfigReader, Part

if TYPE_CHECKING:
    from pipeline.contract import BuildLimits, Plan, VisualLimits, VisualPlan
    from pipeline.plan.targets import TargetProfile

BOUND = 2**20       # a real tower's dimension is far below this; past it the config is damaged or crafted


@dataclass(frozen=True)
class TowerShape(Part):
    design: TowerDesign             # the family's tower design (families/visual.py)
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

    adjective: ClassVar[str] = "vision-language"
    called: ClassVar[str] = "visual tower"
    prequantized_taken: ClassVar[tuple[tuple[str, str], ...] | None] = ()
    modules: ClassVar[tuple[str, ...]] = (
        "pipeline.plan.parts.tower_speed", "pipeline.plan.parts.tower_check",
        "pipeline.workstation.visual_export", "pipeline.workstation.visual_check", "pipeline.workstation.tinyvlm",
        "pipeline.workstation.image_prompts", "pipeline.workstation.image_calibration", "pipeline.serve.images")

    @classmethod
    def from_config(cls, r: ConfigReader) -> TowerShape | None:
        fam = r.family
        if fam.visual is None:
            return None
        return tower_from_config(fam.visual, fam.name, r.whole, r.source, r)

    @property
    def tokens(self) -> VisualTower:
        """How an image becomes tokens (families/visual.py)."""
        return self.design.tokens

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
        return 4 * h * h + self.design.mlp_matrices * h * i

    def _merger_width(self) -> int:
        """The merger's first linear's output: the merged width, or the text hidden size (a projector)."""
        return self.out_hidden if self.design.projector else self.hidden * self.merge_area

    def merger_linear_params(self) -> int:
        """Weights of the merger (applied to every image token), DeepStack mergers included."""
        m, w = self.hidden * self.merge_area, self._merger_width()
        return (1 + self.deepstack) * (m * w + w * self.out_hidden)

    def params(self) -> int:
        """Every weight of the tower, the small ones (norms, biases, embeddings) included."""
        d, h, i, m, out = self.design, self.hidden, self.intermediate, self.hidden * self.merge_area, self.out_hidden
        conv = self.in_channels * self.temporal_patch * self.patch * self.patch * h
        # per block: its norms; q/k/v (where they have biases) and output biases; layer scales; the MLP's biases
        block_small = d.block_norms * h + (3 * h if self.qkv_bias else 0) + h + (2 * h if d.layer_scales else 0) \
            + (d.mlp_matrices - 1) * i + h
        # the merger: its norm (on each patch, or a projector's on the merged token) and its two biases; a DeepStack
        # merger's LayerNorm is on the merged token
        merger_small = d.merger_norm * (m if d.projector else h) + self._merger_width() + out
        small = (h if d.patch_bias else 0) + (h if d.class_token else 0) + self.position_table * h \
            + self.depth * block_small + merger_small + self.deepstack * (2 * m + m + out)
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
        q/k/v and the attention output, and the MLP's hidden layer(s) (TensorRT reuses them block to block)."""
        mlp = (self.design.mlp_matrices - 1) * self.intermediate
        return max_patches * (6 * self.hidden + mlp) * dtype_bytes

    # -- the part's protocol (plan/parts/base.py)
    def visual_plan(self, target: TargetProfile, build: BuildLimits, limits: VisualLimits | None, precision: str,
                    refused: list[str], fit: dict | None) -> VisualPlan:
        return plan_tower(self, target, build, limits, precision, refused, fit)

    def default_visual_limits(self, max_input_len: int) -> VisualLimits:
        return limits_for(self, max_input_len)

    @classmethod
    def plan_lines(cls, plan: Plan) -> list[str]:
        from pipeline.plan.targets import gb
        v = plan.visual
        if v is None:
            return []
        lim = v.limits
        out = [f"  visual       {v.design} tower, {v.params / 1e6:.0f}M params in {v.precision}: weights "
               f"{gb(v.weights)}, activations {gb(v.activations)} at {lim.max_image_tokens} image tokens",
               f"  images       {lim.min_image_tokens}..{lim.max_image_tokens} image tokens a request, at most "
               f"{lim.max_image_tokens_per_image} an image (visual_build's profile); visual_build peak "
               f"{gb(v.build_peak)}, after llm_build"]
        if v.vit_ms is not None:
            band = f"+-{v.vit_error_band:.0%}, the ViT fit's leave-one-out median error" \
                if v.vit_error_band is not None \
                else f"no published {v.precision} ViT row: the FP16 fit at the {v.precision} tensor peak"
            out.append(f"  ViT          ~{v.vit_ms:.0f} ms for an image of {v.image_tokens} tokens ({band})")
        if v.ttft_ms is not None and plan.prediction is not None:
            out.append(f"  TTFT+image   ~{v.ttft_ms:.0f} ms: that image's ViT + the prefill of a "
                       f"{plan.prediction.ttft_input_tokens}-token prompt holding it")
        return out


def tower_from_config(design: TowerDesign, name: str, config: dict, source: str, r: ConfigReader
                      ) -> TowerShape | None:
    """The tower of a vision-language checkpoint (`config`: its whole config.json); r.problems collect every odd
    field."""
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        r.problems.append(Problem(source, "vision_config", vc, f"must hold the visual tower's config ({name} "
                                  "keeps it there)", "use the model's own config.json"))
        return None

    def need(key: str, default: int | None = None, where: dict = vc, prefix: str = "vision_config.") -> int:
        value = where.get(key, default)
        if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:      # InternVL's [h, w] pairs
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= BOUND:
            r.problems.append(Problem(source, prefix + key, value, f"must be a positive integer up to {BOUND}",
                                      "use the model's own config.json, as transformers saved it"))
            return 1
        return value

    depth = need(design.depth_key)
    hidden = need("hidden_size")
    heads = need(design.heads_key)
    inter = need("intermediate_size")
    if hidden % heads:
        r.problems.append(Problem(source, f"vision_config.{design.heads_key}", heads,
                                  f"does not divide the tower's hidden_size {hidden} into heads",
                                  "use the model's own config.json"))
    tokens = design.tokens
    if isinstance(tokens, PatchMerger) and need("patch_size") != tokens.patch:
        r.problems.append(Problem(source, "vision_config.patch_size", vc.get("patch_size"),
                                  f"is not {name}'s {tokens.patch}", "use the model's own config.json"))
    if isinstance(tokens, Tiles) and (need("image_size") != tokens.tile or need("patch_size") != tokens.patch):
        r.problems.append(Problem(source, "vision_config.image_size", vc.get("image_size"),
                                  f"{name} tiles are {tokens.tile} pixels in {tokens.patch}-pixel patches",
                                  "use the model's own config.json"))

    def tower(**rest: Any) -> TowerShape:
        qkv_bias = vc.get(design.qkv_bias_key) is True if design.qkv_bias_key else True
        return TowerShape(design, depth, hidden, inter, heads, qkv_bias=qkv_bias, **rest)

    if isinstance(tokens, Tiles):
        text = config.get("text_config")
        grid = tokens.tile // tokens.patch
        return tower(out_hidden=need("hidden_size", where=text if isinstance(text, dict) else {},
                                     prefix="text_config."),
                     in_channels=need("num_channels", 3), position_table=grid * grid + (1 if design.class_token
                                                                                         else 0))

    def blocks(key: str) -> list:
        """A list of block indexes (full-attention blocks, DeepStack layers), each below depth."""
        value = vc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(b, int) and 0 <= b < depth for b in value):
            r.problems.append(Problem(source, f"vision_config.{key}", value,
                                      f"must list block indexes below depth ({depth})", "use the model's own config"))
            return []
        return value

    out = need("out_hidden_size")
    language = r.dims.get("hidden_size")
    if isinstance(language, int) and out != language:
        r.problems.append(Problem(source, "vision_config.out_hidden_size", out,
                                  f"is not the language model's hidden_size {language}: the merger's output is "
                                  "what the language model reads in place of each image token",
                                  "use the model's own config.json"))
    temporal = need("temporal_patch_size", 2)
    channels = need("in_chans" if "in_chans" in vc else "in_channels", 3)
    rest: dict[str, Any] = dict(out_hidden=out, in_channels=channels, temporal_patch=temporal)
    if design.window:
        window = need("window_size", 112)
        rest.update(window_patches=(window // tokens.patch) ** 2, full_blocks=len(blocks("fullatt_block_indexes")))
    if design.deepstack:
        rest.update(deepstack=len(blocks("deepstack_visual_indexes")))
    if design.position_key:
        rest.update(position_table=need(design.position_key, design.position_default))
    return tower(**rest)


# ------------------------------------------------------------------------------------------- the visual engine's plan
# The profile bounds what the runtime accepts: Edge-LLM's C++ preprocessor resizes each image to at most
# max_image_tokens_per_image tokens (its Qwen runner reads min/max image tokens per image from the engine's config;
# InternVL's grid search takes max tiles = per-image tokens / 256 - 1, keeping one for the thumbnail:
# cpp/multimodal/*, computeBestBlockGridForResize), so the language model must take that many image tokens plus its
# text in one prompt of max_input_len.
INTERNVL_BLOCK = 256    # visual_build: InternVL (and Phi-4-MM) profiles are whole 256-token tiles
WORKSPACE = 64 * 2**20  # cuBLAS / TensorRT scratch beside the tower's activations


class WithTower(Protocol):
    """A model shape (plan/shapes.py ModelShape) as the functions below read it."""
    @property
    def tower(self) -> TowerShape | None: ...


def limits_for(tower: TowerShape, max_input_len: int) -> VisualLimits:
    """visual_build's own defaults (min 4, max 1024, 512 per image) where they fit the prompt, else the largest
    per-image profile that leaves a quarter of max_input_len for text; InternVL's in whole tiles."""
    from pipeline.contract import VisualLimits
    tokens = tower.tokens
    room = max_input_len - max_input_len // 4 - tokens.wrap_tokens
    if isinstance(tokens, Tiles):
        per_image = max(1, min(tokens.max_image_tokens(), room) // INTERNVL_BLOCK) * INTERNVL_BLOCK
        return VisualLimits(INTERNVL_BLOCK, per_image, per_image)
    per_image = max(4, min(512, room))
    return VisualLimits(4, max(1024, per_image), per_image)


def default_limits(shape: WithTower, max_input_len: int) -> VisualLimits:
    assert shape.tower is not None
    return limits_for(shape.tower, max_input_len)


def limit_problems(tower: TowerShape, limits: VisualLimits, build: BuildLimits) -> list[str]:
    """visual_build's own checks, its InternVL rule, and whether the largest image fits the language model's
    prompt."""
    tokens = tower.tokens
    out = limits.problems()
    if isinstance(tokens, Tiles) and (limits.min_image_tokens % INTERNVL_BLOCK or
                                      limits.max_image_tokens % INTERNVL_BLOCK):
        out.append(f"min_image_tokens {limits.min_image_tokens} and max_image_tokens {limits.max_image_tokens} "
                   f"must be multiples of {INTERNVL_BLOCK} for InternVL: visual_build builds its profile in whole "
                   f"{tokens.tile}-pixel tiles of {INTERNVL_BLOCK} tokens")
    if isinstance(tokens, PatchMerger) and limits.max_image_tokens_per_image > tokens.max_image_tokens():
        out.append(f"max_image_tokens_per_image {limits.max_image_tokens_per_image} is more than the model's "
                   f"processor ever makes of one image ({tokens.max_image_tokens()}: max_pixels {tokens.max_pixels})")
    need = limits.max_image_tokens_per_image + tokens.wrap_tokens
    if need >= build.max_input_len:
        out.append(f"an image of max_image_tokens_per_image {limits.max_image_tokens_per_image} tokens (with its "
                   f"{tokens.wrap_tokens} wrapping tokens) leaves no room for text in max_input_len "
                   f"{build.max_input_len}: raise build.max_input_len above {need} or lower "
                   "build.visual.max_image_tokens_per_image")
    return out


def image_refusals(shape: WithTower, limits: VisualLimits, images: list[tuple[str, int, int]]) -> list[str]:
    """The validation images the goldens stage would refuse, said by the plan, before calibration and export: each
    image's tokens through the family's processor held to the profile (as the goldens hold the checkpoint's own
    processor: image_prompts.held_processor) against max_image_tokens_per_image. images: (the recipe's reference,
    height, width). A checkpoint whose processor bounds differ from its family's is still checked by the goldens."""
    assert shape.tower is not None
    per_image = limits.max_image_tokens_per_image
    tokens = held(shape.tower.tokens, per_image)
    out = []
    for ref, height, width in images:
        try:
            count = tokens.image_tokens(height, width)
        except ValueError as exc:
            out.append(f"validation.images: {ref}: {exc}")
            continue
        if count > per_image:
            out.append(f"validation.images: {ref} ({width}x{height} pixels) becomes {count} image tokens through the "
                       f"model's processor, more than build.visual.max_image_tokens_per_image = {per_image} takes: "
                       f"raise it to at least {count}, or use a larger or smaller image")
    return out


def plan_tower(tower: TowerShape, target: TargetProfile, build: BuildLimits, limits: VisualLimits | None,
               precision: str, refused: list[str], fit_data: dict | None) -> VisualPlan:
    """The visual engine's plan: its profile (the defaults unless given), weights, activations, build peak and the
    ViT's time; what visual_build or the target would refuse goes to `refused`."""
    from pipeline.backends.edgellm import build_memory
    from pipeline.contract import VisualPlan
    from pipeline.formats import UNQUANTIZED, WEIGHT_FORMATS

    limits = limits or limits_for(tower, build.max_input_len)
    refused += [f"build.visual: {p}" for p in limit_problems(tower, limits, build)]
    fmt = WEIGHT_FORMATS[precision]
    if fmt.min_sm > target.sm_float:
        refused.append(f"quantization.visual = {precision!r}: a {fmt.label} tower needs SM >= {fmt.min_sm} (Edge-LLM's "
                       f"--visual_quantization); {target.id} is SM {target.sm}. Use {UNQUANTIZED.name!r} on this "
                       "target.")
    matrices = tower.depth * tower.block_linear_params() + tower.merger_linear_params()
    weights = int(matrices * fmt.bits) // 8 + (tower.params() - matrices) * 2
    activations = tower.activation_bytes(limits.max_image_tokens * tower.merge_area) + WORKSPACE
    build_peak = build_memory(weights, activations, 0).peak
    per_image = limits.max_image_tokens_per_image
    vision = (fit_data or {}).get("vision")
    vit = vit_ms(tower, target.id, per_image, vision, fmt.math)
    # at smaller images too: the device compares its measured ViT time at the test image's size
    steps = {n for n in (16, 64, 256, 1024, 4096) if limits.min_image_tokens <= n < per_image}
    sizes = sorted(steps | {limits.min_image_tokens, per_image})
    by_tokens = {str(n): round(ms, 2) for n in sizes
                 if (ms := vit_ms(tower, target.id, n, vision, fmt.math)) is not None}
    return VisualPlan(design=tower.design.name, precision=precision, params=tower.params(), weights=weights,
                      activations=activations, build_peak=build_peak, limits=limits, image_tokens=per_image,
                      vit_ms=None if vit is None else round(vit, 1), vit_ms_by_image_tokens=by_tokens or None,
                      # the fit saw FP16 towers only: an FP8 one is timed at the FP8 peak without an error band
                      vit_error_band=vision["loo_median_abs_error"] if vision and fmt is UNQUANTIZED else None)


# ------------------------------------------------------------------------------------------------ the ViT's time
# vit_s(image) = tower FLOPs(patches of the image) / (efficiency x tensor TFLOPS) + fixed_s, the constants fitted per
# board family to Edge-LLM's published ViT times (tower_speed.py)
@dataclass(frozen=True)
class VitConstants:
    efficiency: float
    fixed_s: float

    def ms(self, peak_s: float) -> float:
        return 1000 * (peak_s / self.efficiency + self.fixed_s)


def vit_class(target_id: str) -> str:
    from pipeline.plan.targets import get_target
    return get_target(target_id).family


def constants_for(classes: dict[str, VitConstants], target_id: str) -> VitConstants:
    return classes.get(vit_class(target_id), classes["all"])


def peak_seconds(tower: TowerShape, target_id: str, image_tokens: int, math: str = "fp16") -> float:
    """The image's ViT seconds at 100% of the board's tensor peak at `math`."""
    from pipeline.plan.targets import get_target
    tflops = get_target(target_id).tensor_tflops[math]
    return tower.flops(image_tokens * tower.merge_area) / (tflops * 1e12)


def vit_ms(tower: TowerShape, target_id: str, image_tokens: int, fit_data: dict | None,
           math: str = "fp16") -> float | None:
    """One image of `image_tokens` tokens through the tower (None without a fit or the board's peak)."""
    from pipeline.plan.targets import get_target
    if fit_data is None or not get_target(target_id).tensor_tflops.get(math):
        return None
    classes = {k: VitConstants(v["efficiency"], v["fixed_s"]) for k, v in fit_data["classes"].items()}
    return constants_for(classes, target_id).ms(peak_seconds(tower, target_id, image_tokens, math))


def predict_vit_ms(shape: WithTower, target_id: str, image_tokens: int, fit_data: dict | None,
                   math: str = "fp16") -> float | None:
    """vit_ms of a model's tower (None for a model without one)."""
    return None if shape.tower is None else vit_ms(shape.tower, target_id, image_tokens, fit_data, math)

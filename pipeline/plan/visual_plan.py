"""A vision-language model's visual engine in the plan: its image-token profile (visual_build's limits), its
weights and activations on the board, its build peak, and the ViT's time for the largest image the profile takes.

The profile bounds what the runtime accepts: Edge-LLM's C++ preprocessor resizes each image to at most
max_image_tokens_per_image tokens (its Qwen runner reads min/max image tokens per image from the engine's config;
InternVL's grid search takes max tiles = per-image tokens / 256 - 1, keeping one for the thumbnail:
cpp/multimodal/*, computeBestBlockGridForResize), so the language model must take that many image tokens plus its
text in one prompt of max_input_len.
"""

from __future__ import annotations

from pipeline.contract import BuildLimits, VisualLimits, VisualPlan
from pipeline.families.visual import PatchMerger, Tiles, held
from pipeline.plan.formats import UNQUANTIZED, WEIGHT_FORMATS
from pipeline.plan.shapes import ModelShape
from pipeline.plan.targets import TargetProfile

INTERNVL_BLOCK = 256    # visual_build: InternVL (and Phi-4-MM) profiles are whole 256-token tiles
WORKSPACE = 64 * 2**20  # cuBLAS / TensorRT scratch beside the tower's activations


def default_limits(shape: ModelShape, max_input_len: int) -> VisualLimits:
    """visual_build's own defaults (min 4, max 1024, 512 per image) where they fit the prompt, else the largest
    per-image profile that leaves a quarter of max_input_len for text; InternVL's in whole tiles."""
    assert shape.tower is not None
    tokens = shape.tower.tokens
    room = max_input_len - max_input_len // 4 - tokens.wrap_tokens
    if isinstance(tokens, Tiles):
        per_image = max(1, min(tokens.max_image_tokens(), room) // INTERNVL_BLOCK) * INTERNVL_BLOCK
        return VisualLimits(INTERNVL_BLOCK, per_image, per_image)
    per_image = max(4, min(512, room))
    return VisualLimits(4, max(1024, per_image), per_image)


def limit_problems(shape: ModelShape, limits: VisualLimits, build: BuildLimits) -> list[str]:
    """visual_build's own checks, its InternVL rule, and whether the largest image fits the language model's
    prompt."""
    assert shape.tower is not None
    tokens = shape.tower.tokens
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



def image_refusals(shape: ModelShape, limits: VisualLimits, images: list[tuple[str, int, int]]) -> list[str]:
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


def plan_visual(shape: ModelShape, target: TargetProfile, build: BuildLimits, limits: VisualLimits | None,
                precision: str, refused: list[str], fit_data: dict | None) -> VisualPlan | None:
    """The visual engine's plan (None for a text model; visual limits given for one are refused)."""
    from pipeline.backends.edgellm import build_memory
    from pipeline.plan.vision_time import predict_vit_ms

    tower = shape.tower
    if tower is None:
        if limits is not None:
            refused.append("build.visual sets an image-token profile, but the model has no visual tower: remove "
                           "[build.visual] or use a vision-language model")
        return None
    limits = limits or default_limits(shape, build.max_input_len)
    refused += [f"build.visual: {p}" for p in limit_problems(shape, limits, build)]
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
    vit = predict_vit_ms(shape, target.id, per_image, vision, fmt.math)
    # at smaller images too: the device compares its measured ViT time at the test image's size
    steps = {n for n in (16, 64, 256, 1024, 4096) if limits.min_image_tokens <= n < per_image}
    sizes = sorted(steps | {limits.min_image_tokens, per_image})
    by_tokens = {str(n): round(ms, 2) for n in sizes
                 if (ms := predict_vit_ms(shape, target.id, n, vision, fmt.math)) is not None}
    return VisualPlan(design=tower.design, precision=precision, params=tower.params(), weights=weights,
                      activations=activations, build_peak=build_peak, limits=limits, image_tokens=per_image,
                      vit_ms=None if vit is None else round(vit, 1), vit_ms_by_image_tokens=by_tokens or None,
                      # the fit saw FP16 towers only: an FP8 one is timed at the FP8 peak without an error band
                      vit_error_band=vision["loo_median_abs_error"] if vision and fmt is UNQUANTIZED else None)

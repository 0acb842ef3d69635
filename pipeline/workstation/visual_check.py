"""The independent check of an exported visual tower: its ONNX run in ONNX's reference evaluator, on the recipe's
images, against the transformers tower on the same pixels, before anything is signed.

The standard ops run as ONNX specifies them (matrix products accumulated in float32, as tensor cores do); Edge-LLM's
one custom op, trt_edgellm::ViTAttentionPlugin, runs as written here from its published interface (0.11's
onnx/onnx_custom_schemas.py and models/ops.py: q, k, v [T, H, D] FP16 with RoPE already applied, softmax attention
scaled by `attention_scale` within each cu_seqlens segment, no mask beyond that). The graph's other inputs are what
Edge-LLM's runtime computes from the image's patch grid, and transformers computes the same for its own tower:
rotary positions (row and column of each patch in merge-window order), the bilinear position-table lookup, window
order (Qwen2.5-VL), segment boundaries (transformers.vision_utils). The reference is the transformers tower in
float32 with the weights rounded to FP16, so the difference measured is the export's and FP16 arithmetic's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.families.visual import TowerDesign, tower_design
from pipeline.workstation.onnx_reference import tower_ops

# an FP16 graph against the float32 reference with the same (FP16) weights: the largest difference relative to the
# reference's largest magnitude, and the cosine over all features. Measured on the tiny towers: 8e-4 and 0.9999996.
MAX_RELATIVE_ERROR = 0.02
MIN_COSINE = 0.999
# An FP8 graph against the reference with the same E4M3 weights and scales: FP16 arithmetic moves some activations
# across an E4M3 rounding boundary (one E4M3 step is 6-12% of a value), and that alone is the difference. Measured
# on the tiny Qwen3-VL tower (15 outputs): the graph 2.7-5.0e-2 and cosine 0.99971-0.99986; the reference against
# itself with each quantized input first rounded to FP16 (nothing else changed) 2.5-4.0e-2 and 0.99985-0.99994.
# The reference without its input quantization, against itself with it (what a graph that lost its input Q/DQ
# would show): 0.99907-0.99936. The cosine bound sits between the two.
MAX_RELATIVE_ERROR_FP8 = 0.1
MIN_COSINE_FP8 = 0.9995


def image_processor(model_dir: Path, design: TowerDesign | str):
    """The checkpoint's image processor (its preprocessor_config.json), as the goldens and this check run it: the
    design's PIL implementation (families/visual.py)."""
    design = tower_design(design)
    import transformers
    return getattr(transformers, design.processor).from_pretrained(str(model_dir))


def tower_module(key: str, design: TowerDesign | str) -> tuple[str, str] | None:
    """(module, the tensor's name within it) of a checkpoint tensor of the tower, else None. Checkpoints name their
    tensors <module>.* or model.<module>.*: transformers 5 saves each family in its hub layout (Qwen2.5-VL and InternVL
    -hf without "model.", Qwen3-VL with it)."""
    design = tower_design(design)
    for name in design.modules:
        for prefix in (f"{name}.", f"model.{name}."):
            if key.startswith(prefix):
                return name, key[len(prefix):]
    return None


# the config each tower module (TowerDesign.modules, model.model.<name>) is built from: the vision config or
# the whole model's
MODULE_CONFIG = {"visual": "vision_config", "vision_tower": "vision_config", "multi_modal_projector": None}


FP8_MAX = 448.0        # E4M3's largest finite value: ONNX's QuantizeLinear saturates there (saturate=1, its default)
SCALES = (".weight_scale", ".input_scale")      # a quantized linear's per-tensor FP8 scales (ModelOpt's unified format)


def fp8_round(x, scale):
    """x through E4M3 at `scale`, as QuantizeLinear (saturating) then DequantizeLinear compute it, in float32."""
    import torch
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale


def load_tower(model_dir: Path, design: TowerDesign | str):
    """The checkpoint's model with only its tower built and loaded (weights FP16-rounded, held in float32); the
    language model stays on the meta device, never allocated. A tower checkpoint with FP8 linears (E4M3 weights and
    per-tensor weight_scale / input_scale, as ModelOpt writes them and Edge-LLM's FP8Linear reads them) gets those
    numerics: each weight dequantized with its FP16 scale, each input through E4M3 at its FP16 scale."""
    design = tower_design(design)
    import torch
    import transformers
    from safetensors import safe_open

    config = transformers.AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    tensors: dict[str, dict] = {name: {} for name in design.modules}
    scales: dict[str, dict] = {name: {} for name in design.modules}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as fh:
            for key in fh.keys():
                where = tower_module(key, design)
                if where:
                    t = fh.get_tensor(key)
                    (scales if where[1].endswith(SCALES) else tensors)[where[0]][where[1]] = t
    for name in design.modules:
        meta, sub = getattr(model.model, name), MODULE_CONFIG[name]
        module = type(meta)(getattr(config, sub) if sub else config).float().eval()
        held = {k: _fp16_held(k, t, scales[name]) for k, t in tensors[name].items()}
        missing, unexpected = module.load_state_dict(held, strict=False)
        if missing or unexpected:
            raise PipelineError(f"{model_dir}: the tower's weights do not match its config ({len(missing)} missing, "
                                f"{len(unexpected)} unexpected, e.g. {(missing or unexpected)[0]})",
                                "use the model's own checkpoint: config and weights of one revision")
        for key, scale in scales[name].items():
            if key.endswith(".input_scale"):
                s = scale.to(torch.float16).to(torch.float32)
                module.get_submodule(key[:-len(".input_scale")]).register_forward_pre_hook(
                    lambda _m, args, s=s: (fp8_round(args[0], s), *args[1:]))
        setattr(model.model, name, module)
    return model.eval()


def _fp16_held(key: str, t, scales: dict):
    """A tower tensor as the engine holds it, in float32: FP16-rounded; an E4M3 weight times its FP16 scale, the
    product rounded to FP16 (DequantizeLinear's output type)."""
    import torch
    if t.dtype == torch.float8_e4m3fn:
        scale = scales.get(key[:-len("weight")] + "weight_scale")
        if scale is None:
            raise PipelineError(f"{key}: an FP8 weight without its weight_scale",
                                "this is a bug in the tower checkpoint; please report it with the recipe")
        return (t.to(torch.float32) * scale.to(torch.float16).to(torch.float32)).to(torch.float16).to(torch.float32)
    return t.to(torch.float16).to(torch.float32)


@dataclass(frozen=True)
class TowerGeometry:
    """What the visual graph's position inputs are made from, read from the vision config (as Edge-LLM's runtime
    reads its visual engine's config.json): no weights."""
    merge: int
    head_dim: int
    grid_per_side: int = 0      # Qwen3-VL: the learned position grid's side (sqrt of num_position_embeddings)
    window_size: int = 0        # Qwen2.5-VL: window attention
    patch_size: int = 0

    @classmethod
    def of(cls, vision: dict) -> TowerGeometry:
        return cls(merge=int(vision.get("spatial_merge_size", 2)),
                   head_dim=int(vision["hidden_size"]) // int(vision["num_heads"]),
                   grid_per_side=int(int(vision.get("num_position_embeddings", 0)) ** 0.5),
                   window_size=int(vision.get("window_size", 0)), patch_size=int(vision.get("patch_size", 0)))

    def rotary(self, position_ids) -> np.ndarray:
        """The ViT's 2-D rotary angles per patch (transformers' VisionRotaryEmbedding over head_dim / 2, theta
        10,000: height then width)."""
        dim = self.head_dim // 2
        inv = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        pos = np.asarray(position_ids, dtype=np.float32)
        return (pos[..., None] * inv).reshape(pos.shape[0], -1).astype(np.float32)


def onnx_feeds(design: TowerDesign | str, geometry: TowerGeometry, pixel_values, grid_thw) -> dict:
    """The visual graph's inputs for one batch of images, as Edge-LLM's runtime feeds them: the position table's
    bilinear lookup where the design's graph takes one (Qwen3-VL), else window order (Qwen2.5-VL)."""
    design = tower_design(design)
    from transformers import vision_utils as vu
    merge = geometry.merge
    cu = vu.get_vision_cu_seqlens(grid_thw).numpy().astype(np.int32)
    rot = geometry.rotary(vu.get_vision_position_ids(grid_thw, merge).numpy()).reshape(pixel_values.shape[0], -1)
    feeds = {"input": pixel_values.numpy().astype(np.float16), "rotary_pos_emb": rot, "cu_seqlens": cu,
             "max_seqlen_carrier": np.zeros(int(np.diff(cu).max()), np.int32)}
    if "fast_pos_embed_idx" in design.graph_inputs:
        idx, w = vu.get_vision_bilinear_indices_and_weights(grid_thw, num_grid_per_side=geometry.grid_per_side,
                                                             spatial_merge_size=merge)
        feeds.update(fast_pos_embed_idx=idx.numpy().astype(np.int64), fast_pos_embed_weight=w.numpy().astype(
            np.float16))
    else:
        window, cu_window = vu.get_vision_window_index(grid_thw, spatial_merge_size=merge,
                                                       window_size=geometry.window_size,
                                                       patch_size=geometry.patch_size)
        index = window.numpy().astype(np.int64)
        feeds.update(window_index=index, reverse_window_index=np.argsort(index).astype(np.int64),
                     cu_window_seqlens=np.asarray(cu_window, dtype=np.int32))
    return feeds


def image_feeds(design: TowerDesign | str, geometry: TowerGeometry | None, inputs) -> dict:
    """The visual graph's inputs for what the processor made of the images (a tiled tower: the tiles alone)."""
    design = tower_design(design)
    if design.tiled or geometry is None:
        return {"input": inputs["pixel_values"].numpy().astype(np.float16)}
    return onnx_feeds(design, geometry, inputs["pixel_values"], inputs["image_grid_thw"])


@dataclass(frozen=True)
class TowerAgreement:
    images: int
    max_relative_error: float       # largest |onnx - reference| over the reference's largest |value|, all outputs
    cosine: float                   # the lowest over the outputs
    precision: str = "fp16"         # the tower's linears (the bounds differ: see MAX_RELATIVE_ERROR_FP8)

    def problems(self) -> list[str]:
        from pipeline.formats import TOWER_FP8
        fp8 = self.precision == TOWER_FP8
        most, least = (MAX_RELATIVE_ERROR_FP8, MIN_COSINE_FP8) if fp8 else (MAX_RELATIVE_ERROR, MIN_COSINE)
        out = []
        if not self.max_relative_error <= most:
            out.append(f"largest difference {self.max_relative_error:.2e} of the reference's scale (at most {most})")
        if not self.cosine >= least:
            out.append(f"cosine {self.cosine:.6f} (at least {least})")
        return out


def reference_outputs(design: TowerDesign | str, model, inputs: dict) -> list[np.ndarray]:
    design = tower_design(design)
    import torch
    with torch.no_grad():
        if design.tiled:
            feats = model.model.get_image_features(pixel_values=inputs["pixel_values"].float(),
                                                   vision_feature_layer=model.config.vision_feature_layer,
                                                   vision_feature_select_strategy=model.config.
                                                   vision_feature_select_strategy)
            feats = getattr(feats, "pooler_output", feats)
            return [torch.cat(list(feats)).reshape(-1, feats[0].shape[-1]).numpy()]
        out = model.model.visual(inputs["pixel_values"].float(), grid_thw=inputs["image_grid_thw"])
        return [out.pooler_output.numpy(), *[d.numpy() for d in getattr(out, "deepstack_features", None) or []]]


def tower_precision(checkpoint: Path) -> str:
    """fp8 where the tower checkpoint says its linears are (write_tower_checkpoint's hf_quant_config.json)."""
    return "fp8" if (checkpoint / "hf_quant_config.json").is_file() else "fp16"


def check_tower(onnx_path: Path, model_dir: Path, design: TowerDesign | str, images: list) -> TowerAgreement:
    """Each image through the exported graph and through transformers (model_dir: the checkpoint the exporter read);
    raises naming the difference when they disagree beyond what the tower's precision explains."""
    design = tower_design(design)
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = load_tower(model_dir, design)
    processor = image_processor(model_dir, design)
    session = ReferenceEvaluator(onnx.load(str(onnx_path)), new_ops=tower_ops())
    worst, cosine = 0.0, 1.0
    vision = model.config.vision_config.to_dict()
    geometry = None if design.tiled else TowerGeometry.of(vision)
    for image in images:
        inputs = processor(images=[image], return_tensors="pt")
        got = session.run(None, image_feeds(design, geometry, inputs))
        for ours, ref in zip(got, reference_outputs(design, model, inputs), strict=True):
            ours = ours.astype(np.float32).reshape(ref.shape)
            worst = max(worst, float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-6)))
            cosine = min(cosine, float((ours * ref).sum() / max(np.linalg.norm(ours) * np.linalg.norm(ref), 1e-12)))
    agreement = TowerAgreement(len(images), worst, cosine, tower_precision(model_dir))
    if agreement.problems():
        raise PipelineError(f"{onnx_path}: the exported visual tower disagrees with the checkpoint's on the recipe's "
                            f"images: {'; '.join(agreement.problems())}",
                            "this is a bug in the Edge-LLM visual export path; please report it with the recipe")
    return agreement

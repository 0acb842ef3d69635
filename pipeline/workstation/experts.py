"""Mixture-of-experts layers on the workstation: which experts calibration reached, and their unified export.

transformers 5 keeps a layer's experts as two 3-D parameters (`experts.gate_up_proj` [E, 2I, H], or `experts.up_proj`
[E, I, H] for Nemotron-H's relu2 experts, and `experts.down_proj` [E, H, I]); ModelOpt 0.47 wraps them as
`_QuantFusedExperts` (`_QuantNonGatedFusedExperts`): one weight quantizer per expert and one input quantizer
per projection shared by every expert, and its unified export writes the hub's per-expert tensors
(`mlp.experts.{j}.{gate,up,down}_proj.*`), the layout Edge-LLM's qwen3_moe loader reads.

Three things about those experts are ours to know:
  * coverage: how many calibration tokens the router sent to each expert. An expert no token reached has
    activation statistics from none of its own inputs; where its numerics depend on them (an input quantizer with
    a calibrated scale: FP8 experts) the calibration is refused unless the recipe accepts it
    (quantization.uncalibrated_experts). INT4 experts are weight-only and NVFP4 experts run with a fixed scale
    (below): for them the coverage is reported only.
  * NVFP4 experts' inputs: Edge-LLM 0.11's loader gives its Nvfp4MoePlugin an input global scale of 1.0 for both
    GEMMs (input_global_scale and down_input_scale set to ones: "activation scales stay 1.0"), whatever was
    calibrated. The calibrated model is pinned to that (amax 6 x 448, a global scale of exactly 1) so that the
    goldens are the numerics the engine computes; those experts' numerics then depend on no calibration token.
  * export: ModelOpt 0.47's unified export averages the experts' AWQ pre-quant scales through a helper that indexes
    the experts as a list (`len(module.experts)`), which the fused container is not. The fused wrapper's input
    quantizers are already one per projection for all experts, so there is nothing to average: the helper is told
    so for fused containers only, for the length of the export.
    Its per-expert split also slices each expert's block amax out of the fused one ([2I, G] -> [I, G] for gate and
    up) but leaves the quantizer's `_amax_shape_for_export` at the fused shape, so INT4's export reshaped the gate's
    [I, G] scales to [2I, G/2] and failed (IndexError in pack_int4_in_uint8). The export shape is set to the slice's
    rows where it disagrees with the weight it exports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# the first projection of a fused expert container: gate and up fused (SwiGLU, GeGLU experts), or up alone (Nemotron-H's
# relu2 experts; ModelOpt 0.47 wraps those as _QuantNonGatedFusedExperts, its quantizers named after up_proj)
FIRST_PROJECTIONS = ("gate_up_proj", "up_proj")


def _first_projection(module) -> str | None:
    down = getattr(module, "down_proj", None)
    if getattr(down, "dim", lambda: 0)() != 3:
        return None
    return next((a for a in FIRST_PROJECTIONS if getattr(getattr(module, a, None), "dim", lambda: 0)() == 3), None)


def fused_experts(module) -> bool:
    """A transformers 5 fused expert container (3-D gate_up_proj or up_proj, and down_proj)."""
    return _first_projection(module) is not None


@dataclass(frozen=True)
class MoeBlock:
    """One MoE block as transformers 5 builds it: a router beside a fused expert container. The router returns
    (scores, weights, indices); what its scores are decides whether routing ties can be read from them."""
    name: str
    router: Any
    experts: Any
    top_k: int
    first_proj: str             # FIRST_PROJECTIONS
    # "logits": the indices are the top-k of the scores (Qwen3-MoE, Qwen3.5-MoE); "probabilities": of their
    # softmax, each scaled per expert after (Gemma 4's router); "biased": chosen by the sigmoid plus a score
    # correction bias, not by the scores alone (Nemotron-H's)
    scores: str

    @property
    def count(self) -> int:
        return int(getattr(self.experts, "num_experts", 0) or getattr(self.experts, self.first_proj).shape[0])


def _router_of(module) -> tuple[Any, int] | None:
    for attr in ("gate", "router"):
        r = getattr(module, attr, None)
        top_k = getattr(r, "top_k", None) or getattr(getattr(r, "config", None), "top_k_experts", None)
        if r is not None and top_k:
            return r, int(top_k)
    return None


def moe_blocks(model) -> list[MoeBlock]:
    """Every MoE block: a module holding fused experts beside its router (`gate` of an MLP or a Nemotron-H mixer,
    `router` of a Gemma 4 decoder layer)."""
    out = []
    for name, m in model.named_modules():
        experts = getattr(m, "experts", None)
        first = _first_projection(experts) if experts is not None else None
        found = _router_of(m) if first is not None else None
        if found is None:
            continue
        router, top_k = found
        scores = "biased" if hasattr(router, "e_score_correction_bias") else \
            "probabilities" if hasattr(router, "per_expert_scale") else "logits"
        out.append(MoeBlock(name, router, experts, top_k, str(first), scores))
    return out


@dataclass(frozen=True)
class ExpertCoverage:
    """Calibration tokens routed to each expert of each MoE block (top-k routing as the model runs it)."""
    tokens: dict[str, list[int]]            # block name -> tokens per expert

    @property
    def experts(self) -> int:
        return sum(len(v) for v in self.tokens.values())

    def unreached(self) -> list[str]:
        """`<block>.experts.<j>` for every expert no calibration token reached."""
        return [f"{name}.experts.{j}" for name, counts in self.tokens.items() for j, n in enumerate(counts) if n == 0]

    def least(self) -> int:
        return min((n for counts in self.tokens.values() for n in counts), default=0)

    def as_record(self) -> dict:
        return {"experts": self.experts, "unreached": self.unreached(), "least_tokens": self.least()}


@contextlib.contextmanager
def count_routed_tokens(model) -> Iterator[dict[str, list[int]]]:
    """Count, while the block is open, the tokens each router sends to each of its experts. Read from the router's
    own output (transformers 5's TopKRouter returns logits, scores, indices), so it counts what the model ran."""
    import torch

    counts: dict[str, list[int]] = {}
    handles = []
    for block in moe_blocks(model):
        name, n = block.name, block.count
        counts[name] = [0] * n

        def hook(_module, _inputs, output, name=name, n=n):
            indices = output[2] if isinstance(output, tuple) and len(output) >= 3 else None
            if indices is None:
                return
            seen = torch.bincount(indices.detach().reshape(-1).cpu(), minlength=n).tolist()
            counts[name] = [a + b for a, b in zip(counts[name], seen, strict=True)]
        handles.append(block.router.register_forward_hook(hook))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


NVFP4_UNIT_AMAX = 6.0 * 448.0      # E2M1's largest value x E4M3's: the amax whose NVFP4 global scale is 1


def pin_nvfp4_expert_inputs(model) -> int:
    """Every MoE block's NVFP4 expert input quantizers set to a global scale of 1.0, as Edge-LLM's Nvfp4MoePlugin
    runs them (the module docstring says why). Returns how many were set."""
    import torch

    pinned = 0
    for block in moe_blocks(model):
        for attr in (f"{block.first_proj}_input_quantizer", "down_proj_input_quantizer"):
            q = getattr(block.experts, attr, None)
            if q is not None and getattr(q, "is_enabled", False) and getattr(q, "num_bits", None) == (2, 1):
                # on the experts' device: a restored checkpoint's input quantizers have no amax yet (no data ran)
                q.amax = torch.tensor(NVFP4_UNIT_AMAX, dtype=torch.float32,
                                      device=block.experts.down_proj.device)
                pinned += 1
    return pinned


def activation_dependent(model) -> bool:
    """Whether any expert's numerics depend on calibrated activations (an enabled shared input quantizer)."""
    for block in moe_blocks(model):
        for attr in (f"{block.first_proj}_input_quantizer", "down_proj_input_quantizer"):
            q = getattr(block.experts, attr, None)
            if q is not None and getattr(q, "is_enabled", False):
                return True
    return False


def refuse_unreached(model, coverage: ExpertCoverage, recipe_file: str) -> None:
    """The calibration's refusal where an expert no token reached has numerics that depend on calibrated inputs."""
    from pipeline.errors import PipelineError

    unreached = coverage.unreached()
    if unreached and activation_dependent(model):
        raise PipelineError(f"{recipe_file}: calibration reached {coverage.experts - len(unreached)} of "
                            f"{coverage.experts} experts; {len(unreached)} saw no calibration token (e.g. "
                            f"{', '.join(unreached[:3])}), and their inputs are quantized with scales calibrated "
                            "on other experts' tokens only",
                            "raise quantization.calibration.samples (or use a calibration text closer to the "
                            "deployment's), or set quantization.uncalibrated_experts = \"accept\"")


@contextlib.contextmanager
def unified_export_of_fused_experts() -> Iterator[None]:
    """ModelOpt 0.47's export_hf_checkpoint, taught that fused experts need no pre-quant scale averaging (the module
    docstring says why). Other MoE layouts keep ModelOpt's own path."""
    from modelopt.torch.export import unified_export_hf

    original_list, original_export = unified_export_hf.get_experts_list, unified_export_hf._export_quantized_weight

    def experts_list(module, model_type):
        if fused_experts(getattr(module, "experts", None)):
            return []
        return original_list(module, model_type)

    def export_weight(module, dtype, *args, **kwargs):
        q, w = getattr(module, "weight_quantizer", None), getattr(module, "weight", None)
        shape = getattr(q, "_amax_shape_for_export", None)
        if q is not None and shape is not None and w is not None and w.dim() == 2 and shape[0] != w.shape[0]:
            q._amax_shape_for_export = (w.shape[0], -1)
        return original_export(module, dtype, *args, **kwargs)

    unified_export_hf.get_experts_list = experts_list
    unified_export_hf._export_quantized_weight = export_weight
    try:
        yield
    finally:
        unified_export_hf.get_experts_list = original_list
        unified_export_hf._export_quantized_weight = original_export

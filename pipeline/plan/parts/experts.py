"""Routed experts (mixture-of-experts): a decoder whose MLP, in some or all layers, is `count` experts of which each
token reaches `active` (Qwen3-MoE), beside the layer's dense MLP (Gemma 4 26B-A4B), or as a hybrid's MoE blocks
(Nemotron 3 Nano 30B-A3B, Qwen3.5-MoE). Where the config keeps them is the family's `MoeLayout`
(families/kinds.py); what they cost to read and route per decode step is fitted in plan/parts/experts_speed.py.

A decode step reads the model's dense parts and, of each MoE layer, only the experts its tokens reach (`touched`:
`active` for one token, the expected number of distinct experts for a batch, routing taken as independent), plus a
fixed cost per MoE layer and step (routing, top-k, the expert dispatch of Edge-LLM's MoE plugins): `layer_s` fitted
per board family and row precision (key "thor-nvfp4", ...); a key without a row borrows the same precision on another
board family, else the largest fitted cost, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pipeline.plan.buildmem import EXTERNAL_INT4_MOE
from pipeline.plan.parts.base import MLP_MODULE, MLP_NAMES, ConfigReader, Core, Layer, Part

if TYPE_CHECKING:
    from pipeline.families.kinds import Family, MoeLayout, Support

EXPERT_ROWS = "experts."        # the name prefix of the routed experts' linears
INTERMEDIATE_MOST = 2**22


@dataclass(frozen=True)
class Experts(Part):
    """A mixture-of-experts decoder's routed experts (families/kinds.py MoeLayout says where its config keeps them)."""
    count: int                  # routed experts in each MoE layer
    active: int                 # experts each token is routed to
    intermediate: int           # each expert's MLP width
    layer_ids: tuple[int, ...]  # the MoE layers (the others have the dense MLP, intermediate_size wide)
    shared_intermediate: int = 0    # a shared expert every token passes through (0: none)
    gated: bool = True          # gate/up/down; False: up/down (Nemotron-H's relu2 experts)
    router_bias: bool = False   # a per-expert score correction beside the router (Nemotron-H)
    shared_gate: bool = False   # the shared expert's own gate, Linear(hidden, 1) (Qwen3.5-MoE)
    beside_mlp: bool = False    # the experts sit beside the layer's dense MLP (Gemma 4), not in its place
    # where the checkpoint keeps the router and experts, checked at fetch; None: not checked there (a hybrid's MoE
    # blocks, whose hub and transformers layouts differ: their build checks them)
    tensors: MoeLayout | None = None

    adjective: ClassVar[str] = "mixture-of-experts"
    called: ClassVar[str] = "routed experts"
    # ModelOpt NVFP4 (NVIDIA's own checkpoints: Nemotron 3 Nano 30B-A3B): its experts restored per expert on a CUDA
    # GPU (workstation/restore.py); other formats' experts are quantized here from the unquantized model
    prequantized_taken: ClassVar[tuple[tuple[str, str], ...] | None] = (("modelopt", "NVFP4"),)
    own_speed_fit: ClassVar[bool] = True
    modules: ClassVar[tuple[str, ...]] = ("pipeline.plan.parts.experts_speed", "pipeline.workstation.experts")

    @classmethod
    def from_config(cls, r: ConfigReader) -> Experts | None:
        fam, config = r.family, r.config
        given = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
        hybrid_experts = fam.hybrid.experts if fam.hybrid is not None else None
        if given and fam.moe is None and fam.hybrid is None:    # a hybrid's MoE: its blocks (the hybrid part)
            r.problem("num_experts", given, f"a mixture-of-experts config, and {fam.name} is a dense family here",
                      "use the model's own config.json (its architectures name its MoE class)")
        if fam.moe is not None and fam.moe.enabled(config):
            return _read(fam.moe, r, fam.moe.moe_layers(config, r.dims["num_layers"]), tensors=fam.moe)
        routed = next((ids for p in r.built if (ids := p.routed_layers())), ())
        if hybrid_experts is not None and routed:
            assert fam.hybrid is not None
            return _read(hybrid_experts, r, routed, gated=fam.hybrid.gated_mlp, tensors=None)
        return None

    @property
    def layers(self) -> int:
        return len(self.layer_ids)

    def mlp(self, hidden: int, width: int) -> list[tuple[str, int, int]]:
        """One expert's (or the shared expert's) linears at this width."""
        return ([("gate_proj", hidden, width)] if self.gated else []) + [("up_proj", hidden, width),
                                                                         ("down_proj", width, hidden)]

    def touched(self, tokens: int) -> float:
        """Expected distinct experts of one MoE layer that `tokens` tokens routed independently reach: what a
        batched decode step (or a prompt) reads of the layer's experts. One token: exactly `active`."""
        if tokens <= 1:
            return float(self.active)
        return self.count * (1.0 - (1.0 - self.active / self.count) ** tokens)

    # -- the layers: an MoE layer's dense MLP is its experts (unless they sit beside it)
    def edit_layers(self, core: Core, layers: list[Layer]) -> list[Layer]:
        if self.beside_mlp:
            return layers
        routed = set(self.layer_ids)
        return [Layer(tuple(r for r in layer.rows if not (r[0] == MLP_MODULE and r[1] in MLP_NAMES)),
                      layer.kv_width, layer.attends) if n in routed else layer for n, layer in enumerate(layers)]

    def model_rows(self, core: Core, tokens: int | None) -> list[tuple[str, int, int, float]]:
        """The routed experts' gate/up/down rows (all of them, or those `tokens` tokens reach) and the shared
        expert's."""
        experts = self.count if tokens is None else self.touched(tokens)
        out = [(f"{EXPERT_ROWS}{n}", i, o, self.layers * experts) for n, i, o in self.mlp(core.hidden_size,
                                                                                         self.intermediate)]
        if self.shared_intermediate:
            out += [(f"shared_expert.{n}", i, o, float(self.layers))
                    for n, i, o in self.mlp(core.hidden_size, self.shared_intermediate)]
        return out

    def small_params(self, core: Core, counted: int) -> int:
        """Each MoE layer's router (and score correction), and the shared expert's gate: FP16 whatever the format
        (ModelOpt leaves routers unquantized)."""
        h = core.hidden_size
        return counted + self.layers * (self.count * (h + (1 if self.router_bias else 0))
                                        + (h if self.shared_gate else 0))

    # -- speed (plan/parts/experts_speed.py fits layer_s)
    def decode_s(self, core: Core, weights: str, target: str, batch: int, fit: dict) -> float:
        return self.layers * (layer_cost(weights_key(target, weights), routing_costs(fit))[0] or 0.0)

    def speed_notes(self, target: str, weights: str, fit: dict) -> list[str]:
        note = layer_cost(weights_key(target, weights), routing_costs(fit))[1]
        return [f"decode: {note}"] if note else []

    def decode_band(self, fit: dict) -> float | None:
        return (fit.get("moe") or {}).get("loo_median_abs_error")

    def ttft_band(self, fit: dict) -> float | None:
        # the dense prefill fit's error on the published MoE prefill rows, which it never saw
        return (fit.get("moe") or {}).get("prefill_median_abs_error")

    # -- refusals and checks
    def refusals(self, support: Support, weights: str, backend_name: str, family: Family) -> list[str]:
        if support.expert_formats and weights not in support.expert_formats:
            why = f" ({support.expert_formats_why})" if support.expert_formats_why else ""
            return [f"{backend_name} builds {family.name}'s routed experts only as "
                    f"{', '.join(support.expert_formats)}{why}"]
        return []

    def unbuilt(self, support: Support) -> str | None:
        return support.experts_not_built

    def expected_tensors(self, core: Core, base: str) -> dict[str, tuple[int, ...]]:
        """Each MoE layer's router and experts, as the hub names them."""
        m = self.tensors
        if m is None:
            return {}
        h, w = core.hidden_size, self.intermediate
        want: dict[str, tuple[int, ...]] = {}
        for n in self.layer_ids:
            want[m.router.format(layer=n).replace("model.", base, 1)] = (self.count, h)
            if m.fused_tensors:       # [experts, 2 x width, hidden] and [experts, hidden, width]
                gate_up, down = (t.format(layer=n).replace("model.", base, 1) for t in m.fused_tensors)
                want |= {gate_up: (self.count, 2 * w, h), down: (self.count, h, w)}
            else:
                for x in range(self.count):
                    want |= {m.expert_tensors.format(layer=n, expert=x, proj=proj).replace("model.", base, 1): dims
                             for proj, dims in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w)))}
        return want

    def externalizable(self) -> tuple[str, ...]:
        return (EXTERNAL_INT4_MOE,)

    def externalizable_rows(self) -> tuple[str, ...]:
        return (EXPERT_ROWS,)

    def plugin_rows(self) -> tuple[str, ...]:
        return (EXPERT_ROWS,)       # the format's MoE plugin (Int4MoePlugin, Nvfp4MoePlugin, Fp16MoePlugin)

    def indexed_modules(self) -> dict[str, int]:
        return {"experts": self.count}

    def keeps_dense_ffn(self, core: Core) -> bool:
        # every layer an MoE layer (Qwen3-30B-A3B): Edge-LLM's export then writes no int4_ffn file
        return self.layers < core.num_layers


def _read(m: MoeLayout, r: ConfigReader, layer_ids: tuple[int, ...], gated: bool = True,
          tensors: MoeLayout | None = None) -> Experts:
    """The routed experts a family's MoeLayout says where to find (layer_ids: its MoE layers)."""
    count, active = r.need(m.count_key(r.config), 4096), r.need(m.active_key(r.config), 4096)
    if active > count:
        r.problem(m.active_key(r.config), active, f"more experts per token than the {count} there are",
                  "use the model's own config.json, as transformers saved it")
    shared = r.need(m.shared_intermediate, INTERMEDIATE_MOST) \
        if m.shared_intermediate and r.config.get(m.shared_intermediate) else 0
    width = r.need(m.intermediate, INTERMEDIATE_MOST)
    return Experts(count=count, active=min(active, count), intermediate=width, layer_ids=layer_ids,
                   shared_intermediate=shared, gated=gated, router_bias=m.score_correction,
                   shared_gate=m.shared_gate and shared > 0, beside_mlp=m.beside_mlp, tensors=tensors)


# ------------------------------------------------------------------------------------------- the fitted routing cost
def key_of(target: str, precision: str) -> str:
    """The fit's key: board family and row precision (pipeline/formats.py ROW_PRECISIONS)."""
    from pipeline.plan.targets import get_target
    return f"{get_target(target).family}-{precision}"


def weights_key(target: str, weights: str) -> str:
    """The key a weight format is priced by: its decode class's."""
    from pipeline.formats import WEIGHT_FORMATS
    return key_of(target, WEIGHT_FORMATS[weights].decode_class)


def routing_costs(fit: dict) -> dict[str, float]:
    """The fitted layer_s per key (perf_fit.json's \"moe\")."""
    return (fit.get("moe") or {}).get("layer_s") or {}


def layer_cost(key: str, fitted: dict[str, float]) -> tuple[float | None, str | None]:
    """(the cost per MoE layer and step for a key, a note where it is borrowed); None: nothing fitted."""
    if key in fitted:
        return fitted[key], None
    precision = key.split("-", 1)[1]
    same = sorted((k, v) for k, v in fitted.items() if k.endswith(f"-{precision}"))
    if same:
        return same[0][1], (f"no published MoE row for {key}: its routing cost is {same[0][0]}'s "
                            f"({same[0][1] * 1e6:.0f} us per MoE layer)")
    if fitted:
        k, v = max(fitted.items(), key=lambda kv: kv[1])
        return v, f"no published MoE row for {key}: its routing cost is the largest fitted, {k}'s ({v * 1e6:.0f} us " \
                  "per MoE layer)"
    return None, None

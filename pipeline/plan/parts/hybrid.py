"""Hybrid recurrent decoders: Qwen3.5 (gated delta-net layers beside attention) and Nemotron-H (Mamba-2 blocks beside
attention and MLP blocks). Which layer is what comes from the config's own list (families/kinds.py HybridLayout);
what each kind holds is counted here: its linears, its small tensors, and the state a recurrent layer keeps for
every sequence instead of a KV cache that grows with the context.

The state is sized as TensorRT Edge-LLM allocates it (its sources, read from a public snapshot of the repository:
cpp/runtime/mambaCacheManager.h, cpp/plugins/gatedDeltaNet/gatedDeltaNetPlugin.{h,cpp}, cpp/plugins/mamba/
mambaPlugin.h): for every recurrent layer a resident pool of `max_batch_size` slots, each a recurrent state
[heads, head_dim, state] and a rolling conv state [conv_dim, kernel] in FP16. The gated delta-net plugin keeps its
state in FP32 ([hv, k, v]), the Mamba plugin in FP16 ([nheads, dim, dstate]). On Blackwell (SM 10.x / 11.0: Thor)
the gated delta-net prefill also takes a workspace of one more FP32 state per slot, shared by the layers.
Standard library only (the device plans on Python 3.10 without torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pipeline.errors import Problem
from pipeline.families.kinds import ATTENTION, GATED_DELTA_NET, MAMBA2, MLP, MOE, RECURRENT, HybridLayout
from pipeline.formats import INT4_V2_ALIGN
from pipeline.plan.parts.base import ConfigReader, Core, Layer, Part

if TYPE_CHECKING:
    from pipeline.families.kinds import Family, Support
    from pipeline.formats import WeightFormat

STATE_BYTES = {GATED_DELTA_NET: 4, MAMBA2: 2}       # per element of the recurrent state (the plugins' dtypes)
CONV_STATE_BYTES = 2
GDN_HEAD_DIM = 128          # Edge-LLM's gated delta-net kernel is built for k = v = 128 only (canImplement)
BLACKWELL_SM = 10.0         # from this SM on, the gated delta-net prefill keeps an FP32 state scratch per slot
MOST = 2**20                # bound of any recurrent dimension read from a config


@dataclass(frozen=True)
class Recurrent:
    """A hybrid model's recurrent layers (all of one kind) and what one of them holds."""
    kind: str                                   # GATED_DELTA_NET | MAMBA2
    layer_ids: tuple[int, ...]
    heads: int                                  # state heads (gated delta-net: value heads; Mamba-2: its heads)
    head_dim: int                               # gated delta-net: the key head width; Mamba-2: its head width
    state: int                                  # gated delta-net: the value head width; Mamba-2: ssm_state_size
    conv_dim: int                               # channels of its causal conv1d
    conv_kernel: int
    linears: tuple[tuple[str, int, int], ...]   # one layer's projections (name, in, out)
    small_params: int                           # one layer's conv filter (and bias), decay, dt bias, skip, norm

    @property
    def state_bytes_per_layer(self) -> int:
        """One sequence's slot in one layer: the recurrent state and the conv state."""
        return self.heads * self.head_dim * self.state * STATE_BYTES[self.kind] + \
            self.conv_dim * self.conv_kernel * CONV_STATE_BYTES

    def bytes_per_sequence(self) -> int:
        return self.state_bytes_per_layer * len(self.layer_ids)

    def flops_per_token(self) -> float:
        """One token through one layer's recurrence: decay, rank-1 update and readout of the state (~4 per
        element); the projections are counted with the linears."""
        return 4.0 * self.heads * self.head_dim * self.state

    def prefill_workspace(self, max_batch_size: int, sm: float) -> int:
        """The gated delta-net prefill's FP32 state scratch on Blackwell (one per slot, layers share it)."""
        if self.kind != GATED_DELTA_NET or sm < BLACKWELL_SM or not self.layer_ids:
            return 0
        return max_batch_size * self.heads * self.head_dim * self.state * 4


@dataclass(frozen=True)
class Hybrid(Part):
    """Each layer's kind and what the non-recurrent ones hold."""
    blocks: tuple[str, ...]
    recurrent: Recurrent
    mlp_width: int
    gated_mlp: bool
    mlp_in_every_layer: bool
    attention_gate: bool        # q_proj also projects the attention output's gate
    qk_norm: bool
    norms_per_layer: int
    moe_in_every_layer: bool = False    # each layer's MLP is an MoE block (Qwen3.5-MoE)
    # each kind's module in a layer, as the checkpoint names it (the layout's prefixes)
    prefixes: tuple[tuple[str, str], ...] = ((GATED_DELTA_NET, "linear_attn."), (ATTENTION, "self_attn."),
                                             (MLP, "mlp."))

    adjective: ClassVar[str] = "hybrid recurrent"
    called: ClassVar[str] = "recurrent layers"
    own_speed_fit: ClassVar[bool] = True
    modules: ClassVar[tuple[str, ...]] = ("pipeline.plan.parts.hybrid_speed", "pipeline.workstation.edgellm_hybrid")

    @classmethod
    def from_config(cls, r: ConfigReader) -> Hybrid | None:
        layout = r.family.hybrid
        if layout is None:
            return None
        return hybrid_from_config(layout, r.config, r.dims, r.prefix, r.source, r.problems, r.family.qk_norm)

    @property
    def attention_layers(self) -> int:
        return sum(1 for b in self.blocks if b == ATTENTION)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The MoE blocks (their experts: ModelShape.experts): the list's MoE entries, or every layer's MLP."""
        if self.moe_in_every_layer:
            return tuple(range(len(self.blocks)))
        return tuple(i for i, b in enumerate(self.blocks) if b == MOE)

    def layer_linears(self, hidden: int, q_size: int, kv_size: int) -> list[list[tuple[str, str, int, int]]]:
        """Each layer's quantizable linears as (the kind whose module holds it, name, in, out): its mixer's (an MLP
        block: none) and its MLP's where it has one. An MoE block's experts are ModelShape's (none here)."""
        mlp = [("gate_proj", hidden, self.mlp_width)] if self.gated_mlp else []
        mlp += [("up_proj", hidden, self.mlp_width), ("down_proj", self.mlp_width, hidden)]
        attention = [("q_proj", hidden, q_size * (2 if self.attention_gate else 1)), ("k_proj", hidden, kv_size),
                     ("v_proj", hidden, kv_size), ("o_proj", q_size, hidden)]
        out = []
        for kind in self.blocks:
            own = attention if kind == ATTENTION else list(self.recurrent.linears) if kind in RECURRENT else []
            out.append([(kind, *row) for row in own]
                       + [(MLP, *row) for row in mlp if kind == MLP or self.mlp_in_every_layer])
        return out

    def linears(self, hidden: int, q_size: int, kv_size: int) -> list[tuple[str, int, int, float]]:
        """(name, in, out, copies) of every quantizable linear, equal rows merged."""
        rows: dict[tuple[str, int, int], float] = {}
        for layer in self.layer_linears(hidden, q_size, kv_size):
            for _, name, i, o in layer:
                rows[(name, i, o)] = rows.get((name, i, o), 0.0) + 1.0
        return [(n, i, o, c) for (n, i, o), c in rows.items()]

    def own_small_params(self, hidden: int, head_dim: int) -> int:
        """Every layer's norms, the recurrent layers' small tensors and the attention layers' q/k norms."""
        total = len(self.blocks) * self.norms_per_layer * hidden
        total += len(self.recurrent.layer_ids) * self.recurrent.small_params
        return total + (self.attention_layers * 2 * head_dim if self.qk_norm else 0)

    # -- the part's protocol (plan/parts/base.py)
    def routed_layers(self) -> tuple[int, ...]:
        return self.moe_layers

    def edit_layers(self, core: Core, layers: list[Layer]) -> list[Layer]:
        """Its own layers: each block's mixer (attention or recurrent) and MLP, under the layout's module names."""
        prefix = dict(self.prefixes)
        return [Layer(tuple((prefix[kind], name, i, o) for kind, name, i, o in rows),
                      core.kv_size if block == ATTENTION else 0, block == ATTENTION)
                for block, rows in zip(self.blocks, self.layer_linears(core.hidden_size, core.q_size, core.kv_size),
                                       strict=True)]

    def kept_fp16(self, core: Core, fmt: WeightFormat, kept: tuple[str, ...]) -> tuple[str, ...]:
        """Its INT4 linears whose width is not a multiple of 64 stay FP16 too: Edge-LLM 0.11's quantizer keeps those
        FP16 (its INT4 GEMM plugin V2 packs 64 x 64 tiles), and its hybrids are built as its quantizer makes them.
        (A dense model's misaligned linears take the V1 plugin instead: edgellm_export.int4_plugin_version.)"""
        if not fmt.edgellm_int4_plugin:
            return kept
        misaligned = {name for name, i, o, _ in core.linears() if i % INT4_V2_ALIGN or o % INT4_V2_ALIGN}
        return kept + tuple(sorted(misaligned - set(kept)))

    def small_params(self, core: Core, counted: int) -> int:
        """Counted layer by layer (its layers differ): replaces the uniform decoder's count."""
        return self.own_small_params(core.hidden_size, core.head_dim)

    def state_bytes(self, sequences: int) -> int:
        return self.recurrent.bytes_per_sequence() * sequences

    def workspace_bytes(self, max_batch_size: int, sm: float) -> int:
        return self.recurrent.prefill_workspace(max_batch_size, sm)

    def prefill_flops_per_token(self) -> float:
        return self.recurrent.flops_per_token() * len(self.recurrent.layer_ids)

    @property
    def units(self) -> float:
        """Recurrent layers x state elements of each: what the fitted constants multiply (hybrid_speed.py)."""
        r = self.recurrent
        return len(r.layer_ids) * r.heads * r.head_dim * r.state

    def decode_s(self, core: Core, weights: str, target: str, batch: int, fit: dict) -> float:
        return batch * self.units * cost("decode_s", target, self.recurrent.kind, fit.get("hybrid") or {})[0]

    def prefill_ms(self, core: Core, target: str, tokens: int, fit: dict) -> float:
        return 1000 * self.units * tokens * cost("prefill_s", target, self.recurrent.kind, fit.get("hybrid") or {})[0]

    def speed_notes(self, target: str, weights: str, fit: dict) -> list[str]:
        notes = ((what, cost(which, target, self.recurrent.kind, fit.get("hybrid") or {})[1])
                 for which, what in (("decode_s", "decode"), ("prefill_s", "TTFT")))
        return [f"{what}: {note}" for what, note in notes if note]

    def _band(self, fit: dict, which: str) -> float | None:
        """The hybrid fit's leave-one-out error for this model's recurrent kind (hybrid_speed.py)."""
        return (((fit.get("hybrid") or {}).get("bands") or {}).get(self.recurrent.kind) or {}).get(which)

    def decode_band(self, fit: dict) -> float | None:
        return self._band(fit, "decode_loo_median_abs_error")

    def ttft_band(self, fit: dict) -> float | None:
        return self._band(fit, "ttft_loo_median_abs_error")

    def refusals(self, support: Support, weights: str, backend_name: str, family: Family) -> list[str]:
        r, want = self.recurrent, support.recurrent_head_dim
        if want is None or not r.layer_ids or r.kind != GATED_DELTA_NET or (r.head_dim, r.state) == (want, want):
            return []
        return [f"{backend_name} cannot build this {family.name} checkpoint: its gated delta-net kernel is built for "
                f"key and value heads of {want} only, and this model's are {r.head_dim} and {r.state} "
                "(linear_key_head_dim, linear_value_head_dim)"]


# ------------------------------------------------------------------------------------ the fitted recurrent cost
# (plan/parts/hybrid_speed.py fits it: its docstring says how)
MIN_ROWS = 2        # published rows of a recurrent kind before its constants are fitted


def key_of(target: str, kind: str) -> str:
    return f"{target}:{kind}"


def cost(which: str, target: str, kind: str, fitted: dict[str, dict[str, float]]) -> tuple[float, str | None]:
    """(the constant for this board and kind, a note where it is borrowed or missing)."""
    from pipeline.plan.targets import get_target
    table = fitted.get(which) or {}
    key = key_of(target, kind)
    if key in table:
        return table[key], None
    family = get_target(target).family
    same = [(v, k) for k, v in table.items() if k.endswith(f":{kind}") and get_target(k.split(":")[0]).family == family]
    what = "decode" if which == "decode_s" else "prefill"
    if same:
        v, k = max(same)
        return v, f"no published {kind} row for {target}: its recurrent {what} cost is {k.split(':')[0]}'s"
    return 0.0, f"no {kind} cost is fitted for a {family} board (fewer than {MIN_ROWS} published {kind} rows): its " \
                f"recurrent layers' {what} is priced by bytes and FLOPs alone"


def _blocks(layout: HybridLayout, config: dict, layers: int, prefix: str, source: str, problems: list[Problem]
            ) -> tuple[str, list[str]] | None:
    """(the key read, each layer's kind) from the config's list, legacy pattern or attention interval; None after a
    problem."""
    key = next((k for k in layout.types if config.get(k) is not None), None)
    if key is None and layout.interval and (layout.pattern is None or layout.pattern not in config):
        n = config.get(layout.interval, layout.interval_default)
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096):
            problems.append(Problem(source, prefix + layout.interval, n, "must be a positive integer (every n-th "
                                    "layer attends)", "use the model's own config.json"))
            return None
        return layout.interval, [layout.recurrent if (i + 1) % n else ATTENTION for i in range(layers)]
    if key is None and layout.pattern and isinstance(config.get(layout.pattern), str):
        chars, pattern = dict(layout.pattern_chars), config[layout.pattern]
        odd = sorted({c for c in pattern if c not in chars})
        if not pattern or odd or len(pattern) > 4096:
            problems.append(Problem(source, prefix + layout.pattern, pattern[:80], "must give one layer per character "
                                    f"({', '.join(f'{c} {k}' for c, k in layout.pattern_chars)})"
                                    + (f"; {''.join(odd[:5])!r} is none of them" if odd else ""),
                                    "use the model's own config.json"))
            return None
        return layout.pattern, [chars[c] for c in pattern]
    names = config.get(key) if key else None
    where = key or layout.types[0]
    if not isinstance(names, list) or not names or len(names) > 4096 or \
            not all(isinstance(n, str) and layout.kind_of(n) for n in names):
        shown: object = [n for n in names if not (isinstance(n, str) and layout.kind_of(n))][:3] \
            if isinstance(names, list) else names
        problems.append(Problem(source, prefix + where, shown or names,
                                "must list each layer's kind (" + ", ".join(n for n, _ in layout.names) + ")",
                                "use the model's own config.json, as transformers saved it"))
        return None
    return where, [str(layout.kind_of(n)) for n in names]


def hybrid_from_config(layout: HybridLayout, config: dict, shape: dict, prefix: str, source: str,
                       problems: list[Problem], qk_norm: bool) -> Hybrid | None:
    """The hybrid layout of a family's config (`shape`: the dimensions shapes.py read, num_layers from the list where
    the config has no num_hidden_layers); every odd field reported, None then."""
    found = _blocks(layout, config, shape["num_layers"], prefix, source, problems)
    if found is None:
        return None
    key, blocks = found
    if len(blocks) != shape["num_layers"]:
        problems.append(Problem(source, prefix + key, f"{len(blocks)} layers", f"must describe num_hidden_layers = "
                                f"{shape['num_layers']} layers", "use the model's own config.json"))
        return None
    if (MOE in blocks or layout.moe_in_every_layer) and layout.experts is None:
        problems.append(Problem(source, prefix + key, MOE, "MoE blocks, which this family's layout has none of",
                                "use the model's own config.json"))
        return None
    shape["num_layers"] = len(blocks)

    def dim(*keys: str, default: int | None = None, low: int = 1) -> int:
        for k in keys:
            value = config.get(k)
            if value is not None:
                if isinstance(value, int) and not isinstance(value, bool) and low <= value <= MOST:
                    return value
                problems.append(Problem(source, prefix + k, value, f"must be an integer from {low} to {MOST}",
                                        "use the model's own config.json"))
                return 1
        if default is not None:
            return default
        problems.append(Problem(source, prefix + keys[0], None, "is missing: the recurrent layers' size needs it",
                                "use the model's own config.json"))
        return 1
    hidden = shape["hidden_size"]
    ids = tuple(i for i, b in enumerate(blocks) if b in RECURRENT)
    if layout.recurrent == GATED_DELTA_NET:
        kh, vh = dim("linear_num_key_heads"), dim("linear_num_value_heads")
        kd, vd, kernel = dim("linear_key_head_dim"), dim("linear_value_head_dim"), dim("linear_conv_kernel_dim")
        if vh % kh:
            problems.append(Problem(source, prefix + "linear_num_value_heads", vh, f"must be a multiple of "
                                    f"linear_num_key_heads ({kh})", "use the model's own config.json"))
        key_dim, value_dim = kh * kd, vh * vd
        conv = 2 * key_dim + value_dim
        recurrent = Recurrent(GATED_DELTA_NET, ids, vh, kd, vd, conv, kernel,
                              (("in_proj_qkv", hidden, conv), ("in_proj_z", hidden, value_dim),
                               ("in_proj_b", hidden, vh), ("in_proj_a", hidden, vh), ("out_proj", value_dim, hidden)),
                              conv * kernel + 2 * vh + vd)
    else:
        heads, hd = dim("mamba_num_heads"), dim("mamba_head_dim")
        state, groups = dim("ssm_state_size"), dim("n_groups", "mamba_n_groups", default=1)
        kernel = dim("conv_kernel", "mamba_d_conv", default=4)
        inner = heads * hd
        conv = inner + 2 * groups * state
        bias = config.get("use_conv_bias", config.get("mamba_conv_bias", True)) is not False
        proj = 2 * inner + 2 * groups * state + heads
        small = conv * kernel + (conv if bias else 0) + 3 * heads + inner
        if config.get("mamba_proj_bias") is True:
            small += proj + hidden
        recurrent = Recurrent(MAMBA2, ids, heads, hd, state, conv, kernel,
                              (("in_proj", hidden, proj), ("out_proj", inner, hidden)), small)
    return Hybrid(blocks=tuple(blocks), recurrent=recurrent, mlp_width=shape["intermediate_size"],
                  gated_mlp=layout.gated_mlp, mlp_in_every_layer=layout.mlp_in_every_layer,
                  attention_gate=layout.attention_output_gate, qk_norm=qk_norm,
                  norms_per_layer=layout.norms_per_layer, moe_in_every_layer=layout.moe_in_every_layer,
                  prefixes=layout.prefixes)


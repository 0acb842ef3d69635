"""The shape of a decoder-only transformer, read from a Hugging Face config.json: what the planner needs to count."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError, Problem
from pipeline.families import ModelFeatures, family, features_of, known
from pipeline.plan.formats import INT4_V2_ALIGN

if TYPE_CHECKING:
    from pipeline.plan.formats import WeightFormat
    from pipeline.plan.hybrid import Hybrid
    from pipeline.plan.vision import TowerShape


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts decoder's routed experts (families/kinds.py MoeLayout says where its config keeps them)."""
    count: int                  # routed experts in each MoE layer
    active: int                 # experts each token is routed to
    intermediate: int           # each expert's MLP width
    layer_ids: tuple[int, ...]  # the MoE layers (the others have the dense MLP, intermediate_size wide)
    shared_intermediate: int = 0    # a shared expert every token passes through (0: none)
    gated: bool = True          # gate/up/down; False: up/down (Nemotron-H's relu2 experts)
    router_bias: bool = False   # a per-expert score correction beside the router (Nemotron-H)
    shared_gate: bool = False   # the shared expert's own gate, Linear(hidden, 1) (Qwen3.5-MoE)

    def mlp(self, hidden: int, width: int) -> list[tuple[str, int, int]]:
        """One expert's (or the shared expert's) linears at this width."""
        return ([("gate_proj", hidden, width)] if self.gated else []) + [("up_proj", hidden, width),
                                                                         ("down_proj", width, hidden)]

    @property
    def layers(self) -> int:
        return len(self.layer_ids)

    def touched(self, tokens: int) -> float:
        """Expected distinct experts of one MoE layer that `tokens` tokens routed independently reach: what a
        batched decode step (or a prompt) reads of the layer's experts. One token: exactly `active`."""
        if tokens <= 1:
            return float(self.active)
        return self.count * (1.0 - (1.0 - self.active / self.count) ** tokens)


@dataclass(frozen=True)
class LayerGeometry:
    """One decoder layer of a family whose layers differ (families/kinds.py LayerLayout: Gemma 4)."""
    head_dim: int
    kv_heads: int
    own_kv: bool                # projects and caches its own K/V (a KV-shared layer reads an earlier layer's)
    v_proj: bool                # has a value projection (a K = V layer uses its key as the value)
    mlp: int                    # its MLP's width
    window: int | None = None   # a sliding-window layer's window


@dataclass(frozen=True)
class PerLayerInputs:
    """Per-layer input embeddings (Gemma 4 E2B / E4B): a table of `vocab` rows of layers x width, gathered per token
    outside the engine, and the projections that mix it into each layer."""
    vocab: int
    width: int


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    features: ModelFeatures = ModelFeatures()     # what the checkpoint uses of its family's features
    tower: TowerShape | None = None               # a vision-language model's visual tower (plan/vision.py)
    experts: Experts | None = None                # a mixture-of-experts model's routed experts
    geometry: tuple[LayerGeometry, ...] = ()      # layers that differ from each other, one each (else uniform)
    per_layer_inputs: PerLayerInputs | None = None
    fp16_at_4bit: tuple[str, ...] = ()            # linears its family keeps FP16 in 4-bit formats (Family)
    hybrid: Hybrid | None = None                  # layers of different kinds, recurrent ones among them

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_linears(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of the quantizable linears of one decoder layer."""
        h, i = self.hidden_size, self.intermediate_size
        return [("q_proj", h, self.q_size), ("k_proj", h, self.kv_size), ("v_proj", h, self.kv_size),
                ("o_proj", self.q_size, h), ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)]

    def kept_fp16(self, fmt: WeightFormat) -> tuple[str, ...]:
        """The linears that stay FP16 in this format (Family.fp16_at_4bit, in a 4-bit format). A hybrid's INT4
        linears whose width is not a multiple of 64 too: Edge-LLM 0.11's quantizer keeps those FP16 (its INT4 GEMM
        plugin V2 packs 64 x 64 tiles), and its hybrids are built as its quantizer makes them. (A dense model's
        misaligned linears take the V1 plugin instead: edgellm_export.int4_plugin_version.)"""
        if fmt.bits > 4 or fmt.unquantized:
            return ()
        if self.hybrid is None or not fmt.edgellm_int4_plugin:
            return self.fp16_at_4bit
        misaligned = {name for name, i, o, _ in self.linears() if i % INT4_V2_ALIGN or o % INT4_V2_ALIGN}
        return self.fp16_at_4bit + tuple(sorted(misaligned - set(self.fp16_at_4bit)))

    def quantized_linears(self, fmt: WeightFormat) -> int:
        """How many linears of the decoder the format quantizes (every copy; those kept FP16 left out)."""
        if fmt.unquantized:
            return 0
        kept = self.kept_fp16(fmt)
        return round(sum(copies for name, _, _, copies in self.linears() if name not in kept))

    def quantized_input_dims(self, fmt: WeightFormat | None = None) -> list[int]:
        """The input widths the format's groups must divide (with `fmt`: of the linears it quantizes)."""
        kept = self.kept_fp16(fmt) if fmt is not None else ()
        return sorted({inp for name, inp, _, _ in self.linears() if name not in kept})

    def linears(self, tokens: int | None = None) -> list[tuple[str, int, int, float]]:
        """(name, in_features, out_features, copies in the whole decoder) of every quantizable linear. An MoE layer
        has its attention, `count` experts (gate/up/down, `intermediate` wide) and its shared expert (Gemma 4: its
        experts beside the layer's own MLP, which the geometry holds). tokens: count
        only the experts that many tokens reach (Experts.touched: a decode step of a batch, a prompt); None: all of
        them (what is stored)."""
        if self.geometry:
            return self._geometry_linears() + self._expert_linears(tokens)
        if self.hybrid is not None:
            return self.hybrid.linears(self.hidden_size, self.q_size, self.kv_size) + self._expert_linears(tokens) \
                + self._shared_expert_linears()
        e = self.experts
        if e is None:
            return [(n, i, o, float(self.num_layers)) for n, i, o in self.layer_linears()]
        attention = [x for x in self.layer_linears() if x[0] in ("q_proj", "k_proj", "v_proj", "o_proj")]
        dense = [x for x in self.layer_linears() if x not in attention]
        out = [(n, i, o, float(self.num_layers)) for n, i, o in attention]
        out += [(n, i, o, float(self.num_layers - e.layers)) for n, i, o in dense if self.num_layers > e.layers]
        return out + self._expert_linears(tokens) + self._shared_expert_linears()

    def _shared_expert_linears(self) -> list[tuple[str, int, int, float]]:
        e = self.experts
        if e is None or not e.shared_intermediate:
            return []
        return [(f"shared_expert.{n}", i, o, float(e.layers)) for n, i, o in e.mlp(self.hidden_size,
                                                                                  e.shared_intermediate)]

    def _expert_linears(self, tokens: int | None) -> list[tuple[str, int, int, float]]:
        """The routed experts' gate/up/down rows (all of them, or those `tokens` tokens reach); none for a dense
        model."""
        e = self.experts
        if e is None:
            return []
        experts = e.count if tokens is None else e.touched(tokens)
        return [(f"experts.{n}", i, o, e.layers * experts) for n, i, o in e.mlp(self.hidden_size, e.intermediate)]

    def _geometry_linears(self) -> list[tuple[str, int, int, float]]:
        """Every layer's own linears (a KV-shared layer has no K/V projections, a K = V layer no V projection), the
        per-layer input projections, as (name, in, out, copies) with equal rows merged."""
        h = self.hidden_size
        rows: dict[tuple[str, int, int], float] = {}
        ple = self.per_layer_inputs

        def add(name: str, i: int, o: int, n: float = 1.0) -> None:
            rows[(name, i, o)] = rows.get((name, i, o), 0.0) + n
        for g in self.geometry:
            q, kv = self.num_heads * g.head_dim, g.kv_heads * g.head_dim
            add("q_proj", h, q)
            if g.own_kv:
                add("k_proj", h, kv)
                if g.v_proj:
                    add("v_proj", h, kv)
            add("o_proj", q, h)
            add("gate_proj", h, g.mlp)
            add("up_proj", h, g.mlp)
            add("down_proj", g.mlp, h)
            if ple:
                add("per_layer_input_gate", h, ple.width)
                add("per_layer_projection", ple.width, h)
        if ple:
            add("per_layer_model_projection", h, self.num_layers * ple.width)
        return [(n, i, o, c) for (n, i, o), c in rows.items()]

    @property
    def per_layer_table_params(self) -> int:
        """The per-layer input embedding table (outside the engine, like the token embedding)."""
        ple = self.per_layer_inputs
        return ple.vocab * self.num_layers * ple.width if ple else 0

    @property
    def linear_params(self) -> int:
        """Every quantizable weight (an MoE model: all its experts)."""
        return int(sum(i * o * n for _, i, o, n in self.linears()))

    def active_linear_params(self, tokens: int = 1) -> float:
        """The quantizable weights `tokens` tokens read or compute with: an MoE model's experts they reach."""
        return sum(i * o * n for _, i, o, n in self.linears(tokens))

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights, biases and an MoE layer's router (on average over the layers): kept in fp16 whatever the
        format (ModelOpt leaves routers unquantized)."""
        bias = (self.q_size + 2 * self.kv_size) if self.attention_bias else 0
        router = self.experts.count * self.hidden_size * self.experts.layers // self.num_layers if self.experts else 0
        return 2 * self.hidden_size + bias + router

    @property
    def small_params(self) -> int:
        """Every layer's small tensors (a hybrid's counted layer by layer)."""
        if self.hybrid is not None:
            e = self.experts        # its MoE blocks' routers (and their score corrections)
            routers = e.layers * (e.count * (self.hidden_size + (1 if e.router_bias else 0))
                                  + (self.hidden_size if e.shared_gate else 0)) if e else 0
            return self.hybrid.small_params(self.hidden_size, self.head_dim) + routers
        return self.num_layers * self.small_params_per_layer

    @property
    def attention_layers(self) -> int:
        """The layers that attend over the context (a hybrid's others keep a fixed-size state)."""
        return self.hybrid.attention_layers if self.hybrid is not None else self.num_layers

    def recurrent_state_bytes(self, sequences: int = 1) -> int:
        """The recurrent layers' state for `sequences` resident slots (hybrid/Recurrent: as Edge-LLM holds it)."""
        return self.hybrid.recurrent.bytes_per_sequence() * sequences if self.hybrid is not None else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.linear_params + self.small_params + self.hidden_size
                + self.embedding_params + self.per_layer_table_params + lm_head)

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V for one token across all layers (of layers that differ: those with their own K/V, each at its
        width; a sliding-window layer counted at full length, an upper bound: Edge-LLM bounds its pool to the window
        with an FP16 KV cache)."""
        if self.geometry:
            return 2 * sum(g.kv_heads * g.head_dim for g in self.geometry if g.own_kv) * bytes_per_element
        return 2 * self.attention_layers * self.kv_size * bytes_per_element

    def sequence_read_bytes(self, bytes_per_element: int, context: int) -> int:
        """What one sequence adds to a decode step's reads: its KV cache of `context` tokens and, for a hybrid, its
        recurrent state, read and written back whole (twice)."""
        return self.kv_bytes_per_token(bytes_per_element) * context + 2 * self.recurrent_state_bytes()


# Bounds of a real decoder's config: a field past them is damaged or crafted (and would overflow the planner's
# arithmetic: JSON integers have no size)
BOUNDS = {"hidden_size": 2**20, "num_hidden_layers": 4096, "num_attention_heads": 4096, "num_key_value_heads": 4096,
          "head_dim": 4096, "intermediate_size": 2**22, "vocab_size": 2**24, "max_position_embeddings": 2**24}
MAX_CONFIG_BYTES = 16 * 2**20


def _int_field(config: dict, key: str, most: int, problems: list[Problem], source: str, prefix: str, low: int = 1,
               default=None, fallback: int = 1) -> int:
    """config[key] (default where absent) as an integer from `low` to `most`. Anything else is a problem naming the
    field (a huge number shown shortened), and `fallback` stands in so that the other fields are still checked."""
    value = config.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= most:
        return value
    shown = value if not isinstance(value, int) or value < 10**12 else f"{str(value)[:12]}... " \
        f"({len(str(value))} digits)"
    what = f"a positive integer up to {most}" if low == 1 else f"an integer from {low} to {most}"
    problems.append(Problem(source, prefix + key, shown, f"must be {what}",
                            "use the model's own config.json, as transformers saved it"))
    return fallback


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """Validate and read the fields the planner needs; every missing or odd field is reported at once."""
    if not isinstance(config, dict):
        raise InputError([Problem(source, "(file)", None, f"is a JSON {type(config).__name__}, not a config object",
                                  "pass a model's config.json")])
    problems: list[Problem] = []
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        problems.append(Problem(source, "architectures", archs, "must be a list of architecture names",
                                'e.g. ["LlamaForCausalLM"], as transformers writes it'))
        archs = []
    archs = archs or []
    arch = archs[0] if archs else config.get("model_type", "?")
    fam = family(arch) if isinstance(arch, str) else None
    if fam is None:
        problems.append(Problem(source, "architectures", archs, "not a model family this pipeline knows",
                                f"known families: {', '.join(known())} (README: Model families)"))
    prefix, tower = "", None
    if fam is not None and fam.visual is not None:
        from pipeline.plan.vision import tower_from_config
        tower = tower_from_config(arch, config, source, problems)
    if fam is not None and fam.text_config:     # a vision-language model: its language model's own config
        inner = config.get(fam.text_config)
        if not isinstance(inner, dict):
            problems.append(Problem(source, fam.text_config, inner, f"must hold the language model's config "
                                    f"({fam.name} keeps it there)", "use the model's own config.json"))
            raise InputError(problems)
        config, prefix = inner, f"{fam.text_config}."
    experts_given = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
    if experts_given and fam is not None and fam.moe is None and fam.hybrid is None:    # a hybrid's MoE: its blocks
        problems.append(Problem(source, prefix + "num_experts", experts_given, f"a mixture-of-experts config, and "
                                f"{fam.name} is a dense family here", "use the model's own config.json (its "
                                "architectures name its MoE class)"))

    def need_int(key: str, default=None) -> int:
        return _int_field(config, key, BOUNDS[key], problems, source, prefix, default=default)

    hybrid_layout = fam.hybrid if fam is not None else None
    listed = None       # a hybrid's layer list, whose length is its layer count where the config has no other
    if hybrid_layout is not None:
        listed = next((config[k] for k in (*hybrid_layout.types, hybrid_layout.pattern or "") if k in config), None)
    hidden = need_int("hidden_size")
    heads = need_int("num_attention_heads")
    head_keys = hybrid_layout.head_dim_keys if hybrid_layout is not None else ("head_dim",)
    head_key = next((k for k in head_keys if config.get(k) is not None), "head_dim")
    shape = dict(
        hidden_size=hidden, num_heads=heads,
        num_layers=need_int("num_hidden_layers", len(listed) if isinstance(listed, (list, str)) else None),
        num_kv_heads=need_int("num_key_value_heads", heads),
        head_dim=_int_field(config, head_key, BOUNDS["head_dim"], problems, source, prefix,
                            default=config.get(head_key) or hidden // max(heads, 1)),
        # a hybrid whose every MLP is an MoE block has no dense MLP width (Qwen3.5-MoE's configs carry none)
        intermediate_size=0 if hybrid_layout is not None and hybrid_layout.moe_in_every_layer and
        config.get("intermediate_size") is None else need_int("intermediate_size"), vocab_size=need_int("vocab_size"),
        max_position_embeddings=need_int("max_position_embeddings", 2048),
    )
    experts = None
    if fam is not None and fam.moe is not None and fam.moe.enabled(config):
        experts = _experts(fam.moe, config, fam.moe.moe_layers(config, shape["num_layers"]), prefix, source, problems)
    geometry: tuple[LayerGeometry, ...] = ()
    per_layer: PerLayerInputs | None = None
    if fam is not None and fam.layers is not None:
        geometry, per_layer = _layer_geometry(fam.layers, config, shape, prefix, source, problems)
    hybrid = None
    if hybrid_layout is not None and fam is not None:
        from pipeline.plan.hybrid import hybrid_from_config
        hybrid = hybrid_from_config(hybrid_layout, config, shape, prefix, source, problems, fam.qk_norm)
        if hybrid is not None and hybrid.moe_layers and hybrid_layout.experts is not None:
            # its MoE blocks: the list's MoE entries, experts of the family's MLP, a score correction per expert
            experts = _experts(hybrid_layout.experts, config, hybrid.moe_layers, prefix, source, problems,
                               gated=hybrid_layout.gated_mlp)
    heads, kv = shape["num_heads"], shape["num_kv_heads"]
    if not problems and (kv > heads or heads % kv):
        problems.append(Problem(source, prefix + "num_key_value_heads", kv, f"must divide num_attention_heads "
                                f"({heads}): grouped-query attention shares each K/V head among a whole number of "
                                "query heads",
                                "use the model's own config.json, as transformers saved it"))
    if problems:
        raise InputError(problems)
    assert fam is not None
    features = features_of(config, fam)
    return ModelShape(architecture=arch, tie_word_embeddings=features.tied_embeddings,
                      attention_bias=features.attention_bias, features=features, tower=tower, experts=experts,
                      geometry=geometry, per_layer_inputs=per_layer, fp16_at_4bit=fam.fp16_at_4bit, hybrid=hybrid,
                      **shape)


def _experts(m, config: dict, layer_ids: tuple[int, ...], prefix: str, source: str, problems: list[Problem],
             gated: bool = True) -> Experts:
    """The routed experts a family's MoeLayout says where to find (layer_ids: its MoE layers)."""
    def need(key: str, most: int) -> int:
        return _int_field(config, key, most, problems, source, prefix)
    count, active = need(m.count_key(config), 4096), need(m.active_key(config), 4096)
    if active > count:
        problems.append(Problem(source, prefix + m.active_key(config), active, f"more experts per token than the "
                                f"{count} there are", "use the model's own config.json, as transformers saved it"))
    shared = need(m.shared_intermediate, BOUNDS["intermediate_size"]) \
        if m.shared_intermediate and config.get(m.shared_intermediate) else 0
    width = need(m.intermediate, BOUNDS["intermediate_size"])
    return Experts(count=count, active=min(active, count), intermediate=width, layer_ids=layer_ids,
                   shared_intermediate=shared, gated=gated, router_bias=m.score_correction,
                   shared_gate=m.shared_gate and shared > 0)


def _layer_geometry(layout, config: dict, shape: dict, prefix: str, source: str, problems: list[Problem]
                    ) -> tuple[tuple[LayerGeometry, ...], PerLayerInputs | None]:
    """Each layer's geometry from a LayerLayout family's config (Gemma 4), every odd field reported."""
    layers = shape["num_layers"]

    def opt_int(key: str, most: int) -> int:
        """An optional count: absent or null is 0."""
        if config.get(key) is None:
            return 0
        return _int_field(config, key, most, problems, source, prefix, low=0, fallback=0)
    types = config.get(layout.types)
    if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
        problems.append(Problem(source, prefix + layout.types, types, f"must list one attention type per layer "
                                f"({layers})", "use the model's own config.json, as transformers saved it"))
        return (), None
    shared = opt_int(layout.kv_shared, layers)
    width = opt_int(layout.per_layer_width, BOUNDS["hidden_size"])
    full_dim = opt_int(layout.global_head_dim, BOUNDS["head_dim"]) or shape["head_dim"]
    full_kv = opt_int(layout.global_kv_heads, BOUNDS["num_key_value_heads"]) or shape["num_kv_heads"]
    window = opt_int(layout.window, BOUNDS["max_position_embeddings"]) or None
    wide = bool(config.get(layout.double_wide))
    out = []
    for i, kind in enumerate(types):
        full, kv_shared = kind == layout.full, i >= layers - shared
        out.append(LayerGeometry(head_dim=full_dim if full else shape["head_dim"],
                                 kv_heads=full_kv if full else shape["num_kv_heads"], own_kv=not kv_shared,
                                 v_proj=not (full and bool(config.get(layout.k_eq_v))),
                                 mlp=shape["intermediate_size"] * (2 if wide and kv_shared else 1),
                                 window=None if full else window))
    vocab = opt_int(layout.per_layer_vocab, BOUNDS["vocab_size"]) or shape["vocab_size"]
    return tuple(out), (PerLayerInputs(vocab, width) if width else None)


def load_config(path: Path, hint: str = "pass a model's config.json") -> dict:
    """A model's config.json as a JSON object: read bounded (a regular file, or a link to one), valid, an object;
    anything else is one error naming the file."""
    from pipeline.errors import PipelineError
    from pipeline.files import read_json_file
    try:
        config = read_json_file(path, MAX_CONFIG_BYTES, "config", hint)
    except PipelineError as exc:
        raise InputError([Problem(str(path), "(file)", None, exc.message.split(f"{path}: ", 1)[-1], hint)]) from None
    if not isinstance(config, dict):
        raise InputError([Problem(str(path), "(file)", None, f"is a JSON {type(config).__name__}, not a config object",
                                  hint)])
    return config


def load_shape(path: str | Path) -> ModelShape:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return shape_from_config(load_config(path), str(path))

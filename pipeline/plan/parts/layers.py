"""Decoders whose layers differ from each other (Gemma 4, families/kinds.py LayerLayout): each layer's attention type
(sliding window or full, full layers with their own head width and K/V heads, some with K = V), the last layers that
reuse an earlier layer's K/V (no K/V projections of their own; MLPs twice as wide where the config says so), and
per-layer input embeddings (a second table, gathered per token outside the engine, mixed into every layer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.plan.parts.base import ATTENTION_MODULE, MLP_MODULE, ConfigReader, Core, Layer, Part

HIDDEN_MOST, HEAD_MOST, KV_MOST, VOCAB_MOST, POSITIONS_MOST = 2**20, 4096, 4096, 2**24, 2**24


@dataclass(frozen=True)
class LayerGeometry:
    """One decoder layer of a family whose layers differ."""
    head_dim: int
    kv_heads: int
    own_kv: bool                # projects and caches its own K/V (a KV-shared layer reads an earlier layer's)
    v_proj: bool                # has a value projection (a K = V layer uses its key as the value)
    mlp: int                    # its MLP's width
    window: int | None = None   # a sliding-window layer's window


@dataclass(frozen=True)
class PerLayer(Part):
    """Every layer's own geometry (one LayerGeometry per layer)."""
    layers: tuple[LayerGeometry, ...]

    adjective: ClassVar[str] = "per-layer"
    called: ClassVar[str] = "layers of their own widths"

    @classmethod
    def from_config(cls, r: ConfigReader) -> PerLayer | None:
        layout, config, dims = r.family.layers, r.config, r.dims
        if layout is None:
            return None
        layers = dims["num_layers"]
        types = config.get(layout.types)
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            r.problem(layout.types, types, f"must list one attention type per layer ({layers})",
                      "use the model's own config.json, as transformers saved it")
            return None
        unknown = sorted({t for t in types if t not in (layout.full, layout.sliding)})
        if unknown:
            r.problem(layout.types, unknown[0], f"is not a layer kind this version plans ({layout.full}, "
                      f"{layout.sliding}): its attention's cost and KV cache are unknown",
                      "use the model's own config.json, or a version of the pipeline that knows the kind")
            return None
        shared = _optional(r, layout.kv_shared, layers)
        own = types[:layers - shared]
        missing = sorted({t for t in types[layers - shared:] if t not in own})
        if shared and missing:
            r.problem(layout.kv_shared, shared, f"leaves no earlier {missing[0]} layer whose K/V its last {shared} "
                      "layers could reuse" if own else f"shares K/V in all {layers} layers: no layer computes any",
                      "use the model's own config.json")
            return None
        full_dim = _optional(r, layout.global_head_dim, HEAD_MOST) or dims["head_dim"]
        full_kv = _optional(r, layout.global_kv_heads, KV_MOST) or dims["num_kv_heads"]
        window = _optional(r, layout.window, POSITIONS_MOST) or None
        wide = bool(config.get(layout.double_wide))
        out = []
        for i, kind in enumerate(types):
            full, kv_shared = kind == layout.full, i >= layers - shared
            out.append(LayerGeometry(head_dim=full_dim if full else dims["head_dim"],
                                     kv_heads=full_kv if full else dims["num_kv_heads"], own_kv=not kv_shared,
                                     v_proj=not (full and bool(config.get(layout.k_eq_v))),
                                     mlp=dims["intermediate_size"] * (2 if wide and kv_shared else 1),
                                     window=None if full else window))
        return cls(tuple(out))

    def edit_layers(self, core: Core, layers: list[Layer]) -> list[Layer]:
        """Each layer at its own width; a KV-shared layer has no K/V projections, a K = V layer no V projection."""
        h, out = core.hidden_size, []
        for g in self.layers:
            q, kv = core.num_heads * g.head_dim, g.kv_heads * g.head_dim
            rows = [(ATTENTION_MODULE, "q_proj", h, q)]
            if g.own_kv:
                rows.append((ATTENTION_MODULE, "k_proj", h, kv))
                if g.v_proj:
                    rows.append((ATTENTION_MODULE, "v_proj", h, kv))
            rows += [(ATTENTION_MODULE, "o_proj", q, h), (MLP_MODULE, "gate_proj", h, g.mlp),
                     (MLP_MODULE, "up_proj", h, g.mlp), (MLP_MODULE, "down_proj", g.mlp, h)]
            # a sliding-window layer counted at full length: an upper bound (Edge-LLM bounds its pool to the window
            # with an FP16 KV cache)
            out.append(Layer(tuple(rows), kv if g.own_kv else 0))
        return out


@dataclass(frozen=True)
class PerLayerInputs(Part):
    """Per-layer input embeddings (Gemma 4 E2B / E4B): a table of `vocab` rows of layers x width, gathered per token
    outside the engine, and the projections that mix it into each layer."""
    vocab: int
    width: int

    adjective: ClassVar[str] = "per-layer-input"
    called: ClassVar[str] = "per-layer input embeddings"

    @classmethod
    def from_config(cls, r: ConfigReader) -> PerLayerInputs | None:
        layout = r.family.layers
        if layout is None or not isinstance(r.config.get(layout.types), list):
            return None         # (a missing layer list is PerLayer's problem to report)
        width = _optional(r, layout.per_layer_width, HIDDEN_MOST)
        vocab = _optional(r, layout.per_layer_vocab, VOCAB_MOST) or r.dims["vocab_size"]
        return cls(vocab, width) if width else None

    def edit_layers(self, core: Core, layers: list[Layer]) -> list[Layer]:
        h, w = core.hidden_size, self.width
        return [Layer(layer.rows + (("", "per_layer_input_gate", h, w), ("", "per_layer_projection", w, h)),
                      layer.kv_width, layer.attends) for layer in layers]

    def model_rows(self, core: Core, tokens: int | None) -> list[tuple[str, int, int, float]]:
        return [("per_layer_model_projection", core.hidden_size, core.num_layers * self.width, 1.0)]

    def table_params(self, core: Core) -> int:
        return self.vocab * core.num_layers * self.width


def _optional(r: ConfigReader, key: str, most: int) -> int:
    """An optional count: absent or null is 0."""
    if r.config.get(key) is None:
        return 0
    return r.need(key, most, low=0, fallback=0)

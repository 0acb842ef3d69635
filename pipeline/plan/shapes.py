"""The shape of a decoder-only transformer, read from a Hugging Face config.json: what the planner needs to count."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pipeline.errors import InputError, Problem
from pipeline.families import ModelFeatures, family, features_of, known
from pipeline.families.audio import speech_model
from pipeline.families.layouts import native_config
from pipeline.plan.parts import PARTS
from pipeline.plan.parts.base import (
    ATTENTION_MODULE,
    MLP_MODULE,
    ConfigReader,
    Layer,
    Part,
    int_field,
    merge_layers,
)
from pipeline.plan.parts.experts import Experts
from pipeline.plan.parts.hybrid import Hybrid
from pipeline.plan.parts.layers import LayerGeometry, PerLayer, PerLayerInputs
from pipeline.plan.parts.tower import TowerShape

if TYPE_CHECKING:
    from pipeline.contract import AudioPlan, BuildLimits, VisualLimits, VisualPlan
    from pipeline.formats import WeightFormat
    from pipeline.plan.targets import TargetProfile

P = TypeVar("P", bound=Part)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's core dimensions and its parts (plan/parts/: the kinds it carries, each answering for itself).
    Every count below asks the parts; none asks which kinds the model has."""
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
    fp16_at_4bit: tuple[str, ...] = ()            # linears its family keeps FP16 in 4-bit formats (Family)
    unquantized: tuple[str, ...] = ()             # linears a pre-quantized checkpoint holds unquantized (plan/held.py)
    parts: tuple[Part, ...] = ()                  # in plan/parts PARTS order

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def part(self, kind: type[P]) -> P | None:
        """The part of this kind, for the modules that implement that kind (plan/parts/base.py Part.modules)."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    # the parts by kind, for their own modules and the tests
    @property
    def experts(self) -> Experts | None:
        return self.part(Experts)

    @property
    def hybrid(self) -> Hybrid | None:
        return self.part(Hybrid)

    @property
    def tower(self) -> TowerShape | None:
        return self.part(TowerShape)

    @property
    def geometry(self) -> tuple[LayerGeometry, ...]:
        per_layer = self.part(PerLayer)
        return per_layer.layers if per_layer is not None else ()

    @property
    def per_layer_inputs(self) -> PerLayerInputs | None:
        return self.part(PerLayerInputs)

    # -- the layers, as the parts leave them
    @cached_property
    def layers(self) -> tuple[Layer, ...]:
        """Each decoder layer: attention and a gated MLP at the core dimensions, then each part's edits."""
        h, i = self.hidden_size, self.intermediate_size
        uniform = Layer(((ATTENTION_MODULE, "q_proj", h, self.q_size), (ATTENTION_MODULE, "k_proj", h, self.kv_size),
                         (ATTENTION_MODULE, "v_proj", h, self.kv_size), (ATTENTION_MODULE, "o_proj", self.q_size, h),
                         (MLP_MODULE, "gate_proj", h, i), (MLP_MODULE, "up_proj", h, i),
                         (MLP_MODULE, "down_proj", i, h)), self.kv_size)
        layers = [uniform] * self.num_layers
        for p in self.parts:
            layers = p.edit_layers(self, layers)
        return tuple(layers)

    @cached_property
    def _layer_rows(self) -> list[tuple[str, int, int, float]]:
        return merge_layers(list(self.layers))

    def layer_linears(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of the quantizable linears of a uniform decoder layer."""
        return [(n, i, o) for _, n, i, o in self.layers[0].rows] if self.layers else []

    def linears(self, tokens: int | None = None) -> list[tuple[str, int, int, float]]:
        """(name, in_features, out_features, copies in the whole decoder) of every quantizable linear: the layers'
        own, equal rows merged, then each part's outside them (an MoE's experts: all of them, or, with `tokens`, those
        that many tokens reach: a decode step of a batch, a prompt)."""
        return self._layer_rows + [row for p in self.parts for row in p.model_rows(self, tokens)]

    def kept_fp16(self, fmt: WeightFormat) -> tuple[str, ...]:
        """The linears that stay FP16 in this format: those a pre-quantized checkpoint holds unquantized,
        Family.fp16_at_4bit in a 4-bit format, and what the parts keep."""
        if fmt.unquantized:
            return ()
        if fmt.bits > 4:
            return self.unquantized
        kept = self.unquantized + tuple(n for n in self.fp16_at_4bit if n not in self.unquantized)
        for p in self.parts:
            kept = p.kept_fp16(self, fmt, kept)
        return kept

    def quantized_linears(self, fmt: WeightFormat) -> int:
        """How many linears of the decoder the format quantizes (every copy; those kept FP16 left out)."""
        if fmt.unquantized:
            return 0
        kept = self.kept_fp16(fmt)
        return round(sum(copies for name, _, _, copies in self.linears() if name not in kept))

    def gemm_linears(self, fmt: WeightFormat) -> int:
        """How many of the quantized linears the engine computes as a GEMM each (a part's plugin computes the
        others: an MoE's routed experts)."""
        if fmt.unquantized:
            return 0
        kept = self.kept_fp16(fmt)
        in_plugins = tuple(prefix for p in self.parts for prefix in p.plugin_rows())
        return round(sum(copies for name, _, _, copies in self.linears()
                         if name not in kept and not name.startswith(in_plugins or ("\0",))))

    def quantized_input_dims(self, fmt: WeightFormat | None = None) -> list[int]:
        """The input widths the format's groups must divide (with `fmt`: of the linears it quantizes)."""
        kept = self.kept_fp16(fmt) if fmt is not None else ()
        return sorted({inp for name, inp, _, _ in self.linears() if name not in kept})

    def indexed_modules(self) -> dict[str, int]:
        """Every part's module lists kept by index, {name: count} (plan/parts/base.py Part.indexed_modules)."""
        return {k: v for p in self.parts for k, v in p.indexed_modules().items()}

    @property
    def per_layer_table_params(self) -> int:
        """Tables outside the engine, never read whole per token (Gemma 4's per-layer input embeddings)."""
        return sum(p.table_params(self) for p in self.parts)

    @property
    def linear_params(self) -> int:
        """Every quantizable weight (an MoE model: all its experts)."""
        return int(sum(i * o * n for _, i, o, n in self.linears()))

    def active_linear_params(self, tokens: int = 1) -> float:
        """The quantizable weights `tokens` tokens read or compute with: an MoE model's experts they reach."""
        return sum(i * o * n for _, i, o, n in self.linears(tokens))

    @property
    def small_params(self) -> int:
        """Norm weights and biases of every layer (two norms and the q/k/v biases each, counted uniform), with what
        the parts hold (an MoE's routers; a hybrid counts its layers one by one)."""
        bias = (self.q_size + 2 * self.kv_size) if self.attention_bias else 0
        counted = self.num_layers * (2 * self.hidden_size + bias)
        for p in self.parts:
            counted = p.small_params(self, counted)
        return counted

    @property
    def small_params_per_layer(self) -> int:
        """small_params on average over the layers."""
        return self.small_params // self.num_layers

    @property
    def attention_layers(self) -> int:
        """The layers that attend over the context (a hybrid's others keep a fixed-size state)."""
        return sum(1 for layer in self.layers if layer.attends)

    def recurrent_state_bytes(self, sequences: int = 1) -> int:
        """Fixed-size states for `sequences` resident slots (a hybrid's recurrent layers: as Edge-LLM holds them)."""
        return sum(p.state_bytes(sequences) for p in self.parts)

    def workspace_bytes(self, max_batch_size: int, sm: float) -> int:
        """Scratch the parts' kernels take on this SM (a gated delta-net's prefill on Blackwell)."""
        return sum(p.workspace_bytes(max_batch_size, sm) for p in self.parts)

    def prefill_flops_per_token(self) -> float:
        """FLOPs per prompt token beyond linears and attention (a recurrence's state updates)."""
        return sum(p.prefill_flops_per_token() for p in self.parts)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.linear_params + self.small_params + self.hidden_size
                + self.embedding_params + self.per_layer_table_params + lm_head)

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V for one token across all layers that cache their own, each at its width (a sliding-window layer
        counted at full length: an upper bound)."""
        return 2 * sum(layer.kv_width for layer in self.layers) * bytes_per_element

    def sequence_read_bytes(self, bytes_per_element: int, context: int) -> int:
        """What one sequence adds to a decode step's reads: its KV cache of `context` tokens and its fixed-size
        states, read and written back whole (twice)."""
        return self.kv_bytes_per_token(bytes_per_element) * context + 2 * self.recurrent_state_bytes()

    # -- what the parts plan beside the decoder, and refuse
    def visual_plan(self, target: TargetProfile, build: BuildLimits, limits: VisualLimits | None, precision: str,
                    refused: list[str], fit: dict | None) -> VisualPlan | None:
        """The engine beside the language model's (a visual tower's), None where the model has none."""
        return next((v for p in self.parts if (v := p.visual_plan(target, build, limits, precision, refused, fit))
                     is not None), None)

    def audio_plan(self, target: TargetProfile, build: BuildLimits, max_seconds: int | None, refused: list[str],
                   fit: dict | None) -> AudioPlan | None:
        """A speech-to-text model's audio encoder engine, None where the model has none."""
        return next((a for p in self.parts if (a := p.audio_plan(target, build, max_seconds, refused, fit))
                     is not None), None)

    def audio_speed(self, audio: AudioPlan, target: str, decode_tok_s: float | None,
                    prefill_ms: Callable[[int], float | None], fit: dict, model: str) -> AudioPlan:
        return next((a for p in self.parts if (a := p.audio_speed(audio, target, decode_tok_s, prefill_ms, fit, model))
                     is not None), audio)

    def default_visual_limits(self, max_input_len: int) -> VisualLimits | None:
        return next((v for p in self.parts if (v := p.default_visual_limits(max_input_len)) is not None), None)

    def externalizable(self) -> tuple[str, ...]:
        """Edge-LLM's external-weight kinds beside int4_ffn (the dense MLPs): the parts' (int4_moe)."""
        return tuple(k for p in self.parts for k in p.externalizable())

    def externalizable_rows(self) -> tuple[str, ...]:
        return tuple(k for p in self.parts for k in p.externalizable_rows())

    def keeps_dense_ffn(self) -> bool:
        return all(p.keeps_dense_ffn(self) for p in self.parts)

    def expected_tensors(self, base: str) -> dict[str, tuple[int, ...]]:
        """Every layer linear's weight [out, in] as the checkpoint names it, and the parts' own tensors (an MoE's
        routers and experts): what fetch checks the checkpoint's headers against."""
        want: dict[str, tuple[int, ...]] = {}
        for n, layer in enumerate(self.layers):
            for module, name, i, o in layer.rows:
                want[f"{base}layers.{n}.{module}{name}.weight"] = (o, i)
        for p in self.parts:
            want |= p.expected_tensors(self, base)
        return want


# Bounds of a real decoder's config: a field past them is damaged or crafted (and would overflow the planner's
# arithmetic: JSON integers have no size)
BOUNDS = {"hidden_size": 2**20, "num_hidden_layers": 4096, "num_attention_heads": 4096, "num_key_value_heads": 4096,
          "head_dim": 4096, "intermediate_size": 2**22, "vocab_size": 2**24, "max_position_embeddings": 2**24}
MAX_CONFIG_BYTES = 16 * 2**20


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """Validate and read the fields the planner needs, then each part of the family's; every missing or odd field is
    reported at once."""
    if not isinstance(config, dict):
        raise InputError([Problem(source, "(file)", None, f"is a JSON {type(config).__name__}, not a config object",
                                  "pass a model's config.json")])
    speech = speech_model(config)
    if speech is not None:
        # one line that says what the model is, not the text fields a speech config keeps elsewhere
        raise InputError([Problem(source, "model_type", speech[0], speech[1],
                                  "for a text or vision-language model, use its own config.json")])
    # a layout the hub publishes under other names (InternVL's chat layout) as its family's native one
    config = native_config(config, source)
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
    whole, prefix = config, ""
    if fam is not None and fam.text_config and not (fam.flat_text_config and fam.text_config not in config):
        # a vision-language model: its language model's own config (or, the hub's flat layout, the top level's)
        inner = config.get(fam.text_config)
        if not isinstance(inner, dict):
            problems.append(Problem(source, fam.text_config, inner, f"must hold the language model's config "
                                    f"({fam.name} keeps it there)", "use the model's own config.json"))
            raise InputError(problems)
        config, prefix = inner, f"{fam.text_config}."

    def need_int(key: str, default=None) -> int:
        return int_field(config, key, BOUNDS[key], problems, source, prefix, default=default)

    hidden = need_int("hidden_size")
    heads = need_int("num_attention_heads")
    head_keys = fam.head_dim_keys if fam is not None else ("head_dim",)
    head_key = next((k for k in head_keys if config.get(k) is not None), "head_dim")
    dims = dict(
        hidden_size=hidden, num_heads=heads,
        num_layers=need_int("num_hidden_layers", fam.layers_listed(config) if fam is not None else None),
        num_kv_heads=need_int("num_key_value_heads", heads),
        head_dim=int_field(config, head_key, BOUNDS["head_dim"], problems, source, prefix,
                           default=config.get(head_key) or hidden // max(heads, 1)),
        # a family whose every MLP is an MoE block has no dense MLP width (Qwen3.5-MoE's configs carry none)
        intermediate_size=0 if fam is not None and fam.dense_mlp_optional and config.get("intermediate_size") is None
        else need_int("intermediate_size"), vocab_size=need_int("vocab_size"),
        max_position_embeddings=need_int("max_position_embeddings", 2048),
    )
    parts: list[Part] = []
    if fam is not None:
        reader = ConfigReader(config, fam, dims, source, prefix, problems, whole)
        for kind in PARTS:
            part = kind.from_config(dataclasses.replace(reader, built=tuple(parts)))
            if part is not None:
                parts.append(part)
    heads, kv = dims["num_heads"], dims["num_kv_heads"]
    if not problems and (kv > heads or heads % kv):
        problems.append(Problem(source, prefix + "num_key_value_heads", kv, f"must divide num_attention_heads "
                                f"({heads}): grouped-query attention shares each K/V head among a whole number of "
                                "query heads",
                                "use the model's own config.json, as transformers saved it"))
    if problems:
        raise InputError(problems)
    assert fam is not None
    features = features_of(config, fam, whole)
    shape = ModelShape(architecture=arch, tie_word_embeddings=features.tied_embeddings,
                       attention_bias=features.attention_bias, features=features, fp16_at_4bit=fam.fp16_at_4bit,
                       unquantized=(), parts=tuple(parts), **dims)
    from pipeline.plan.held import excluded_patterns, unquantized_linears
    patterns = excluded_patterns(whole, source)
    return dataclasses.replace(shape, unquantized=unquantized_linears(shape.layers, patterns)) if patterns else shape


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

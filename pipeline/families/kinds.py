"""The family registry's record types (pipeline/families/__init__.py says what they are for)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.families.audio import AudioEncoderDesign
from pipeline.families.visual import TowerDesign

# what a hybrid decoder's layer (block) is: plan/parts/hybrid.py sizes each kind
ATTENTION, GATED_DELTA_NET, MAMBA2, MLP, MOE = "attention", "gated_delta_net", "mamba2", "mlp", "moe"
RECURRENT = (GATED_DELTA_NET, MAMBA2)


@dataclass(frozen=True)
class Support:
    """One backend version's support of a family (each backend registers its own: Backend.families). `refused`
    set: it does not build the family, and why."""
    refused: str | None = None
    formats: tuple[str, ...] | None = None  # weight formats it builds for the family; None: all its stack builds
    formats_why: str = ""                   # why only those
    # LongRoPE with one factor set per engine: the short factors when its capacity (max_seq_len) is at most
    # original_max_position_embeddings, else the long ones for every position (Hugging Face switches by the current
    # length: short up to the original window)
    longrope_per_engine: bool = False
    kv_cache: tuple[str, ...] | None = None
    trtllm_class: str | None = None         # TensorRT-LLM 0.12 MODEL_MAP class the checkpoint's architecture loads
    modelopt_decoder: str | None = None     # ModelOpt's decoder_type for its TensorRT-LLM checkpoint converter
    rope_types: tuple[str, ...] = ("default",)  # HF rope_types checked here to be computed as the checkpoint says
    sliding_window: bool = False            # runs a sliding-window attention as the checkpoint defines it
    softcapping: bool = False               # applies attention / final logit soft-capping
    partial_rotary: bool = False            # rotates only part of each head (partial_rotary_factor < 1)
    verified: str = ""                      # how we know (source file, test)
    # the checkpoint holds towers (image, audio) this version does not export: the kit answers text only; what the
    # plan says of them
    text_only: str | None = None
    # the family's variant with routed experts is planned but not exported by this version: why (a build stops
    # before calibrating, saying so)
    experts_not_built: str | None = None
    # the weight formats it exports the family's routed experts in, where fewer than `formats`; None: all of those
    expert_formats: tuple[str, ...] | None = None
    expert_formats_why: str = ""            # why only those
    # its MoE plugins renormalize the top-k routing weights whatever the config says (Edge-LLM 0.11: Int4MoePlugin
    # calls moeTopkSoftmax(..., renormalize=true); its qwen3_moe passes norm_topk_prob = 1 to the others)
    renormalizes_topk: bool = False
    # planned, and not exported by this version yet: why (a build stops before calibrating, saying so); except the
    # weight formats in built_formats, which do build
    not_built: str | None = None
    built_formats: tuple[str, ...] = ()
    # the only head width its gated delta-net kernel is built for (Edge-LLM: k = v = 128); None: any
    recurrent_head_dim: int | None = None
    # tensors its checkpoint loader reads under another name than transformers writes: (written, read)
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    # the multi-token prediction layer counts its config reader takes (None: any), and whether a draft with its own
    # embedding (Edge-LLM 0.11: one layer for Qwen3.5, no dedicated embeddings; it raises while parsing otherwise)
    mtp_layers: tuple[int, ...] | None = None
    mtp_dedicated_embeddings: bool = True
    # why its MTP layer is not built as a draft here (None: it is: [draft] method = "mtp")
    mtp_draft_unbuilt: str | None = "no multi-token prediction draft of this family has been taken through here"

    def unbuilt(self, weights: str) -> str | None:
        """Why this version plans but does not build the family in `weights` (None: it builds it)."""
        return self.not_built if self.not_built and weights not in self.built_formats else None

    def losses(self, features: ModelFeatures, max_seq_len: int) -> list[str]:
        """What this backend version would compute differently from the checkpoint, at max_seq_len: each item
        says what is lost and what to do. Empty: it runs the model as defined."""
        out = []
        if features.rope_type not in self.rope_types:
            out.append(f"RoPE scaling {features.rope_type!r} is not one this pipeline has checked it computing "
                       f"({', '.join(self.rope_types)}): positions could be encoded differently from training")
        original = features.rope_original_max
        if features.rope_type == "longrope" and self.longrope_per_engine and original and max_seq_len > original:
            out.append(f"its LongRoPE uses the long factors for every position of an engine longer than the "
                       f"model's original {original}-token window, where the model uses its short factors up to "
                       f"{original} tokens; set build.max_seq_len <= {original} to keep the model's numerics")
        if features.unnormalized_routing and self.renormalizes_topk:
            out.append("its MoE plugins renormalize the top-k routing weights to sum to 1, and this model does not "
                       "(norm_topk_prob = false): every token's expert mix would be scaled differently")
        if features.partial_rotary < 1 and not self.partial_rotary:
            out.append(f"partial rotary embedding (factor {features.partial_rotary}) is not supported")
        if features.softcaps and not self.softcapping:
            out.append(f"it ignores soft-capping ({', '.join(features.softcaps)}): logits would be uncapped")
        w = features.sliding_window
        if w and w < max_seq_len and not self.sliding_window:
            out.append(f"it has no sliding-window attention: past {w} tokens the engine would attend to tokens the "
                       f"model never saw together; set build.max_seq_len <= {w} to stay inside the window")
        return out


@dataclass(frozen=True)
class MoeLayout:
    """Where a mixture-of-experts family's config.json keeps its experts, how it routes, and its checkpoint's expert
    tensors (the hub's names, `{layer}`, `{expert}`, `{proj}` filled in)."""
    # routed experts per MoE layer: the hub's configs say num_experts, transformers 5 saves num_local_experts
    count: tuple[str, ...] = ("num_experts", "num_local_experts")
    active: tuple[str, ...] = ("num_experts_per_tok",)     # experts each token is routed to (top-k)
    intermediate: str = "moe_intermediate_size"     # each expert's MLP width
    shared_intermediate: str | None = None          # a shared expert's width, where the family has one
    normalized: str | None = "norm_topk_prob"       # the top-k routing weights renormalized to sum to 1
    sparse_step: str | None = "decoder_sparse_step"     # every n-th layer is an MoE layer
    dense_layers: str | None = "mlp_only_layers"    # layers that keep the dense MLP (intermediate_size wide)
    expert_tensors: str = "model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
    router: str = "model.layers.{layer}.mlp.gate.weight"    # [num_experts, hidden]; kept in FP16
    # Gemma 4's 26B-A4B: the config key that turns the experts on (absent or false: a dense model of the family),
    # a block beside each layer's dense MLP (which keeps intermediate_size), its experts stored fused: {layer}'s
    # gate_up [experts, 2 x width, hidden] and down [experts, hidden, width]
    enabled_by: str | None = None
    beside_mlp: bool = False
    fused_tensors: tuple[str, str] | None = None
    score_correction: bool = False      # a per-expert bias added to the router's scores (Nemotron-H)
    shared_gate: bool = False           # the shared expert's output scaled by sigmoid(Linear(hidden, 1)) (Qwen3.5-MoE)

    def enabled(self, config: dict) -> bool:
        return not self.enabled_by or bool(config.get(self.enabled_by))

    def count_key(self, config: dict) -> str:
        """The key of `count` this config uses (the first; a config with none is reported under it)."""
        return next((k for k in self.count if k in config), self.count[0])

    def active_key(self, config: dict) -> str:
        return next((k for k in self.active if k in config), self.active[0])

    def moe_layers(self, config: dict, num_layers: int) -> tuple[int, ...]:
        """Which of the decoder's layers are MoE layers (Qwen3-MoE's rule: not listed dense, and every
        sparse_step-th)."""
        step = config.get(self.sparse_step, 1) if self.sparse_step else 1
        step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 1
        dense = config.get(self.dense_layers) if self.dense_layers else None
        dense = {d for d in dense if isinstance(d, int)} if isinstance(dense, list) else set()
        return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


@dataclass(frozen=True)
class MtpLayout:
    """Where a family's config.json says what multi-token prediction (MTP) layers its checkpoints ship beside the
    decoder (the hub's `mtp.*` tensors, which transformers does not load): Qwen3.5 counts them, Nemotron-H lists the
    draft's blocks for each of its prediction modules."""
    count: str = "mtp_num_hidden_layers"
    modules: str = "num_nextn_predict_layers"       # Nemotron-H: how many prediction modules (0: no MTP)
    types: str | None = None                        # Nemotron-H: the draft's block list (its layer count)
    pattern: str | None = None                      # ... or the legacy one-character pattern of it
    dedicated_embeddings: str = "mtp_use_dedicated_embeddings"      # the draft has its own token embedding


@dataclass(frozen=True)
class LayerLayout:
    """Where a family whose decoder layers differ from each other keeps how (Gemma 4's config keys): each layer's
    attention type (sliding window or full, full layers with their own head width and K/V heads, some with K = V),
    the last layers that reuse an earlier layer's K/V (no K/V projections of their own; MLPs twice as wide where the
    config says so), and per-layer input embeddings (a second table, gathered per token for every layer)."""
    types: str = "layer_types"
    full: str = "full_attention"                    # the type name of a full-attention layer
    sliding: str = "sliding_attention"              # ... and of a sliding-window one (no other kind is planned)
    global_head_dim: str = "global_head_dim"
    global_kv_heads: str = "num_global_key_value_heads"
    k_eq_v: str = "attention_k_eq_v"                # full layers use the key projection as the value
    kv_shared: str = "num_kv_shared_layers"         # counted back from the last layer
    double_wide: str = "use_double_wide_mlp"        # the KV-shared layers' MLPs are 2 x intermediate_size
    window: str = "sliding_window"
    per_layer_width: str = "hidden_size_per_layer_input"    # 0: no per-layer inputs (Gemma 4 31B)
    per_layer_vocab: str = "vocab_size_per_layer_input"


@dataclass(frozen=True)
class HybridLayout:
    """Where a hybrid family's config.json says what each decoder layer is. Qwen3.5: each layer is a token mixer
    (gated delta-net or attention) and then its own gated MLP; Nemotron-H: each layer is one block (Mamba-2,
    attention, a plain MLP or MoE), listed by name or, in older configs, by a one-character pattern."""
    recurrent: str                                  # the family's recurrent mixer: GATED_DELTA_NET or MAMBA2
    types: tuple[str, ...]                          # config keys listing one name per layer, the first found read
    names: tuple[tuple[str, str], ...]              # a name in that list -> its kind
    pattern: str | None = None                      # the legacy key: one character per layer
    pattern_chars: tuple[tuple[str, str], ...] = ()
    mlp_in_every_layer: bool = True                 # Qwen3.5: each mixer layer has its own MLP
    gated_mlp: bool = True                          # gate/up/down (SiLU); False: up/down (Nemotron-H's relu2)
    attention_output_gate: bool = False             # q_proj projects queries and a gate of the same width (Qwen3.5)
    norms_per_layer: int = 2                        # RMSNorm weights of hidden width in each layer
    head_dim_keys: tuple[str, ...] = ("head_dim",)  # the attention layers' head width, the first key present
    # with no list: every n-th layer attends, the others are recurrent (transformers' Qwen3.5 rule: n = this key, 4)
    interval: str | None = None
    interval_default: int = 4
    # where each kind's tensors sit in a layer (the checkpoint's module names), and the model's embedding and final norm
    prefixes: tuple[tuple[str, str], ...] = ((GATED_DELTA_NET, "linear_attn."), (ATTENTION, "self_attn."),
                                             (MLP, "mlp."))
    embedding: tuple[str, ...] = ("embed_tokens",)     # the names a checkpoint may give it
    final_norm: str = "norm"
    # MoE blocks (Nemotron 3 Nano 30B-A3B): where the config keeps their experts; their layers are the list's MoE
    # entries, their experts' MLP is the family's (gated_mlp). None: the family has no MoE blocks.
    experts: MoeLayout | None = None
    # Qwen3.5-MoE: every mixer layer's MLP is an MoE block of `experts` (no dense MLP, no intermediate_size)
    moe_in_every_layer: bool = False

    def kind_of(self, name: str) -> str | None:
        return dict(self.names).get(name)


@dataclass(frozen=True)
class Family:
    architecture: str                       # the HF class name in config.json's "architectures"
    name: str
    examples: tuple[str, ...]               # models users deploy, for the README table
    transformers_config: str                # the transformers config class (tiny models are made from it)
    norm: str = "rms"                       # "rms": x * w; "rms_plus_one": x * (1 + w) (Gemma)
    sandwich_norms: bool = False            # norms after attention and MLP too (Gemma 2/3)
    activation: str = "silu"                # gated MLP activation: "silu" | "gelu_tanh"
    attention_bias: bool = False            # q/k/v bias when config.json does not say
    qk_norm: bool = False                   # per-head RMSNorm of q and k (Qwen3, Gemma 3)
    embedding_scale: str | None = None      # "sqrt_hidden": embeddings times sqrt(hidden_size) (Gemma)
    fused_projections: tuple[tuple[str, tuple[str, ...]], ...] = ()  # HF fused tensor -> the parts it holds
    # the format its instruct models write tool calls in (a key of serve/toolcalls.py FORMATS); None: none known.
    # Used only where the kit's chat template renders tools (SmolLM2's, a Llama, does not).
    tool_calls: str | None = None
    # a vision-language model: its tower's design (families/visual.py), and the config.json key that holds its
    # language model's config (the dimensions the planner reads)
    visual: TowerDesign | None = None
    text_config: str | None = None
    # a speech-to-text model: its audio encoder's design (families/audio.py), whose tokens replace placeholders in the
    # language model's prompt (the language model's config sits in text_config too)
    audio: AudioEncoderDesign | None = None
    # its hub checkpoints may keep the language model's fields at the top level beside vision_config instead (as
    # transformers 4 saved Qwen2.5-VL; transformers 5 still loads them so, and saves them nested)
    flat_text_config: bool = False
    moe: MoeLayout | None = None            # a mixture-of-experts family: where its config keeps the experts
    layers: LayerLayout | None = None       # layers that differ from each other (plan/parts/layers.py)
    hybrid: HybridLayout | None = None      # layers of different kinds, recurrent among them (plan/parts/hybrid.py)
    mtp: MtpLayout | None = None            # multi-token prediction layers its checkpoints ship (plan/parts/mtp.py)
    # the dense layers' linears (by name: an MoE's experts are not these) that stay FP16 when the rest of the model is
    # quantized to 4 bits, where 4 bits cannot hold what they compute; the plan counts them so, and calibration
    # leaves them alone
    fp16_at_4bit: tuple[str, ...] = ()
    notes: str = ""

    @property
    def model_class(self) -> str | None:
        """transformers' class that loads the whole checkpoint where AutoModelForCausalLM does not (a vision-language
        family's own: transformers 5 maps none of them there); None: AutoModelForCausalLM."""
        return self.architecture if self.visual is not None or self.audio is not None else None

    @property
    def head_dim_keys(self) -> tuple[str, ...]:
        """The config keys of the attention layers' head width, the first present read."""
        return self.hybrid.head_dim_keys if self.hybrid is not None else ("head_dim",)

    def layers_listed(self, config: dict) -> int | None:
        """The layer count a config's own list of layer kinds gives (a hybrid's, where num_hidden_layers is not
        saved), else None."""
        if self.hybrid is None:
            return None
        listed = next((config[k] for k in (*self.hybrid.types, self.hybrid.pattern or "") if k in config), None)
        return len(listed) if isinstance(listed, (list, str)) else None

    @property
    def dense_mlp_optional(self) -> bool:
        """Every MLP is an MoE block: the config may carry no dense MLP width (Qwen3.5-MoE)."""
        return self.hybrid is not None and self.hybrid.moe_in_every_layer

    @property
    def embedding_names(self) -> tuple[str, ...]:
        """What its checkpoints may call the token embedding (under the decoder's prefix)."""
        return self.hybrid.embedding if self.hybrid is not None else ("embed_tokens",)

    @property
    def final_norm(self) -> str:
        """Its checkpoints' final norm (under the decoder's prefix)."""
        return self.hybrid.final_norm if self.hybrid is not None else "norm"

    @property
    def separate_projections(self) -> bool:
        return not self.fused_projections


@dataclass(frozen=True)
class ModelFeatures:
    """What one checkpoint's config.json uses of its family's features."""
    rope_type: str = "default"
    partial_rotary: float = 1.0
    rope_original_max: int | None = None    # LongRoPE's original_max_position_embeddings
    sliding_window: int | None = None
    softcaps: tuple[str, ...] = ()
    tied_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    unnormalized_routing: bool = False      # an MoE whose top-k routing weights are not renormalized


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def features_of(config: dict, family: Family, whole: dict | None = None) -> ModelFeatures:
    """What a (language model's) config uses of its family's features; `whole`: the config.json it sits in (a
    vision-language model's), whose top-level fields stand in for the ones the language model's lacks, as Edge-LLM's
    reader patches them in (a checkpoint loaded from the hub's flat layout and saved nested keeps
    tie_word_embeddings at the top level only)."""
    if whole is not None and whole is not config:
        config = {**{k: v for k, v in whole.items() if v is not None}, **config}
    # RoPE from legacy rope_scaling or transformers 5's rope_parameters
    params: dict = config["rope_parameters"] if isinstance(config.get("rope_parameters"), dict) else {}
    scaling: dict = config["rope_scaling"] if isinstance(config.get("rope_scaling"), dict) else {}
    kind = str(scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default")
    # Phi-3's first configs called longrope "su"; Qwen2-VL's and Qwen2.5-VL's hub configs call their multimodal RoPE
    # "mrope": plain RoPE over the mrope_section split (transformers 5 reads it as "default" so)
    kind = {"su": "longrope", "mrope": "default"}.get(kind, kind)
    partial = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    partial = float(partial) if isinstance(partial, (int, float)) and not isinstance(partial, bool) else 1.0
    original = _positive_int(config.get("original_max_position_embeddings",
                                        params.get("original_max_position_embeddings")))
    # Qwen2 configs carry a window they do not use (use_sliding_window = false)
    window = None if config.get("use_sliding_window") is False else _positive_int(config.get("sliding_window"))
    caps = tuple(k for k in ("attn_logit_softcapping", "final_logit_softcapping")
                 if isinstance(config.get(k), (int, float)) and config.get(k))
    bias = config.get("attention_bias", family.attention_bias)
    return ModelFeatures(rope_type=kind, partial_rotary=partial, rope_original_max=original,
                         sliding_window=window, softcaps=caps,
                         tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                         attention_bias=bool(bias), mlp_bias=bool(config.get("mlp_bias", False)),
                         unnormalized_routing=bool(family.moe and family.moe.normalized
                                                   and config.get(family.moe.normalized) is False))

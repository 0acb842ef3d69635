"""EAGLE-3 drafts for speculative decoding (edgellm backend): their checkpoint layout, checks, memory and export.

An EAGLE-3 draft is one decoder layer that reads the base model's hidden states from three of its layers (fused by
`fc`), the base's token embeddings (it has none of its own) and its own previous hidden state, and predicts tokens
over a reduced draft vocabulary (`d2t` maps a draft token id to a base token id as an offset). Edge-LLM builds it
as a second engine beside the base, which is exported with extra outputs for it (`eagle_base`).

The layout below is the Hugging Face EAGLE-3 checkpoint (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) that Edge-LLM's
loader reads; it is written down once here and used both to check a fetched draft and to make the builtin one.
The draft stays in fp16 (Edge-LLM: quantizing the draft lowers its acceptance rate); its KV cache is fp16 too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.contract import DraftMemory
from pipeline.errors import PipelineError
from pipeline.formats import UNQUANTIZED
from pipeline.plan.memory import TOKENS_PER_BLOCK
from pipeline.plan.shapes import ModelShape

DRAFT_WEIGHTS = UNQUANTIZED.name       # drafts are exported and built unquantized
ONNX_BASE, ONNX_DRAFT = "base", "draft"          # onnx/base and onnx/draft, the layout of Edge-LLM's guide
# what the draft ONNX must have beyond the plain LLM graph (seen in Edge-LLM 0.11's export of the tiny draft)
DRAFT_INPUTS = ("inputs_embeds", "hidden_states_input", "hidden_states_from_draft", "past_key_values_0")
DRAFT_OUTPUTS = ("logits", "hidden_states", "present_key_values_0")
BASE_EXTRA_OUTPUTS = ("hidden_states",)


def is_eagle3(config: dict) -> bool:
    """Edge-LLM's own test: an Eagle3 architecture name, or EAGLE-3 training's ttt_length / draft_vocab_size."""
    archs = config.get("architectures")
    return any("Eagle3" in str(a) for a in (archs if isinstance(archs, list) else [])) or "ttt_length" in config \
        or "draft_vocab_size" in config


@dataclass(frozen=True)
class DraftShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int            # the base vocabulary d2t maps into
    draft_vocab_size: int
    target_hidden_size: int    # the base's hidden size, as the draft was trained
    num_target_layers: int = 3
    target_layer_ids: tuple[int, ...] | None = None   # base layers the draft was trained on, where it says
    method: str = "eagle3"     # "mtp": the model's own multi-token prediction layer (mtp_tensors)

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint with its shape (one layer is `midlayer`, more are `layers.N`)."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        if self.method == "mtp":
            return mtp_tensors(self)
        out: dict[str, tuple[int, ...]] = {
            "d2t": (self.draft_vocab_size,), "fc.weight": (h, self.target_hidden_size * self.num_target_layers),
            "lm_head.weight": (self.draft_vocab_size, h), "norm.weight": (h,)}
        prefixes = ["midlayer."] if self.num_layers == 1 else [f"layers.{n}." for n in range(self.num_layers)]
        for p in prefixes:
            out |= {p + "hidden_norm.weight": (h,), p + "input_layernorm.weight": (h,),
                    p + "post_attention_layernorm.weight": (h,),
                    # attention reads [embedding, hidden] concatenated: twice the hidden size in
                    p + "self_attn.q_proj.weight": (q, 2 * h), p + "self_attn.k_proj.weight": (kv, 2 * h),
                    p + "self_attn.v_proj.weight": (kv, 2 * h), p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)}
        return out

    @property
    def params(self) -> int:
        """The draft engine's parameters: its checkpoint's, and for an MTP draft the base's lm_head, which its
        export copies into the draft (Edge-LLM's _mtp_key_remap: shared with the base, or the tied embedding)."""
        lm_head = self.vocab_size * self.hidden_size if self.method == "mtp" else 0
        return sum(math.prod(s) for s in self.tensors().values()) + lm_head


def mtp_tensors(d: DraftShape) -> dict[str, tuple[int, ...]]:
    """Qwen3.5's MTP layer as its hub checkpoints store it (mtp.*): fc over [embedding, hidden], the two norms before
    it, gated-attention decoder layers (q_proj twice as wide: query and gate; q/k norms per head) and a final norm."""
    h, q, kv, i = d.hidden_size, d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.intermediate_size
    out: dict[str, tuple[int, ...]] = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                                       "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    for n in range(d.num_layers):
        p = f"mtp.layers.{n}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (2 * q, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (d.head_dim,), p + "self_attn.k_norm.weight": (d.head_dim,),
                p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i)}
    return out


def mtp_draft_shape(base: ModelShape) -> DraftShape | None:
    """The draft the model's own MTP layers make (None: its config names none)."""
    from pipeline.plan.parts import Mtp
    mtp = base.part(Mtp)
    if mtp is None or mtp.layers < 1:
        return None
    return DraftShape(hidden_size=base.hidden_size, num_layers=mtp.layers, num_heads=base.num_heads,
                      num_kv_heads=base.num_kv_heads, head_dim=base.head_dim,
                      intermediate_size=base.intermediate_size, vocab_size=base.vocab_size,
                      draft_vocab_size=base.vocab_size, target_hidden_size=base.hidden_size, num_target_layers=1,
                      method="mtp")


def draft_shape(config: dict, source: str) -> DraftShape:
    if not isinstance(config, dict) or not is_eagle3(config):
        archs = config.get("architectures") if isinstance(config, dict) else None
        raise PipelineError(f"{source}: not an EAGLE-3 draft (architectures {str(archs)[:80]})",
                            "draft.repo / draft.path must name an EAGLE-3 draft checkpoint, e.g. "
                            "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B for Llama-3.1-8B-Instruct")
    from pipeline.plan.shapes import BOUNDS

    def num(key: str, default=None, bound: str | None = None) -> int:
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= BOUNDS[bound or key]:
            raise PipelineError(f"{source}: {key} = {str(value)[:40]}: must be a positive integer up to "
                                f"{BOUNDS[bound or key]}", "the draft's config.json needs hidden_size, "
                                "num_attention_heads, intermediate_size and vocab_size")
        return value
    h, heads = num("hidden_size"), num("num_attention_heads")
    ids = config.get("target_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) > 64 or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 4096 for i in ids)):
        raise PipelineError(f"{source}: target_layer_ids = {str(ids)[:60]}: not a list of layer numbers",
                            "use the draft repository's own config.json")
    return DraftShape(
        hidden_size=h, num_layers=num("num_hidden_layers", 1), num_heads=heads,
        num_kv_heads=num("num_key_value_heads", heads), head_dim=num("head_dim", config.get("head_dim") or h // heads),
        intermediate_size=num("intermediate_size"), vocab_size=num("vocab_size"),
        draft_vocab_size=num("draft_vocab_size", config.get("draft_vocab_size") or config.get("vocab_size"),
                             "vocab_size"),
        target_hidden_size=num("target_hidden_size", config.get("target_hidden_size") or h, "hidden_size"),
        target_layer_ids=tuple(ids) if ids else None)


def edgellm_tapped_layers(base_layers: int) -> list[int]:
    """Base layers whose outputs Edge-LLM 0.11's Llama/Qwen EAGLE-3 base export hands the draft: fixed, as EAGLE-3
    training's default (hidden_states[2], [L//2], [L-3] = outputs of layers 1, L//2 - 1, L - 4); a draft's own
    target_layer_ids are not read for these models."""
    return [1, base_layers // 2 - 1, base_layers - 4]


def pairing_warnings(draft: DraftShape, base: ModelShape, draft_label: str) -> list[str]:
    if draft.method == "mtp":       # made with the base: nothing to pair
        return []
    tapped = edgellm_tapped_layers(base.num_layers)
    if draft.target_layer_ids is not None and list(draft.target_layer_ids) != tapped:
        return [f"the draft {draft_label} says it was trained on base layers {list(draft.target_layer_ids)}; "
                f"Edge-LLM's EAGLE-3 base export hands it layers {tapped} of this {base.num_layers}-layer base: "
                "expect a low acceptance rate (validation reports the measured speed)"]
    if base.num_layers < 5:
        return [f"a {base.num_layers}-layer base is too shallow for EAGLE-3's layer taps {tapped}: fine for "
                "exercising the format, not for speed"]
    return []


def pairing_problems(draft: DraftShape, base: ModelShape, draft_label: str) -> list[str]:
    """Why this draft cannot run beside this base (empty: it can). Each one would fail at build or run time."""
    out = []
    if draft.target_hidden_size != base.hidden_size:
        out.append(f"the draft {draft_label} was trained on a base of hidden size {draft.target_hidden_size}; this "
                   f"base has {base.hidden_size} (its fc fuses the base's hidden states)")
    if draft.hidden_size != base.hidden_size:
        out.append(f"the draft's hidden size {draft.hidden_size} differs from the base's {base.hidden_size} (the "
                   "draft reads the base's token embeddings)")
    if draft.vocab_size != base.vocab_size:
        out.append(f"the draft maps into a vocabulary of {draft.vocab_size} tokens, the base has "
                   f"{base.vocab_size} (a draft for another tokenizer)")
    if draft.draft_vocab_size > draft.vocab_size:
        out.append(f"draft_vocab_size {draft.draft_vocab_size} exceeds vocab_size {draft.vocab_size}")
    return out


def draft_memory(draft: DraftShape, max_seq_len: int, max_batch_size: int, max_draft_tree_size: int) -> DraftMemory:
    """Bytes the draft engine adds on the device: fp16 weights, its own fp16 KV cache (its layers only, sized for
    the sequence plus one draft tree) and one step of activations over the tree (fp32 logits over the draft vocab)."""
    weights = draft.params * 2
    seq = math.ceil((max_seq_len + max_draft_tree_size) / TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
    kv = 2 * draft.num_layers * draft.num_kv_heads * draft.head_dim * 2 * seq * max_batch_size
    tokens = max_batch_size * max_draft_tree_size
    act = tokens * (6 * draft.hidden_size + 2 * draft.intermediate_size + 3 * draft.target_hidden_size) * 2 + \
        tokens * draft.draft_vocab_size * 4 * 2
    return DraftMemory(weights=weights, kv_cache=kv, activations=act, total=weights + kv + act)


def speculative_decode_tok_s(base_tok_s: float, per_step: float, steps: int, draft_bytes: float,
                             base_bytes: float) -> float:
    """Decode with a draft on a bandwidth-bound board: each step verifies steps + 1 tokens in one pass over the base's
    weights (as one decode step reads them) and runs the draft `steps` times (each reading the draft's weights), and
    yields `per_step` tokens. The draft's own KV cache reads are left out (a few layers against the base's)."""
    return base_tok_s * per_step / (1.0 + steps * draft_bytes / base_bytes)

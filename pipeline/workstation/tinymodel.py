"""Builtin tiny models, made locally and offline: a real Hugging Face checkpoint (config, safetensors, tokenizer).

The hub is unreachable in CI and on many workstations, yet every stage after fetch needs a real checkpoint. A
builtin is a transformers model of a known architecture with a BPE tokenizer trained on the corpus shipped in
pipeline/data/corpus, briefly trained on that corpus so that its next-token distributions are peaked like a real
model's (random weights give near-uniform logits, where top-1 comparisons are meaningless).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.workstation.tinyasr import ASR_BUILTINS
from pipeline.workstation.tinygemma4audio import GEMMA4_AUDIO_BUILTINS
from pipeline.workstation.tinytrain import corpus_text, train, train_tokenizer
from pipeline.workstation.tinytransducer import TRANSDUCER_BUILTINS, shrunk
from pipeline.workstation.tinytts import TTS_BUILTINS
from pipeline.workstation.tinyvlm import VLM_BUILTINS


@dataclass(frozen=True)
class Builtin:
    architecture: str           # transformers class name
    config: dict                # transformers config kwargs
    vocab_size: int = 1000      # tokenizer vocabulary the BPE trainer aims for; the model's vocab_size matches it
    train_steps: int = 300
    seed: int = 0
    notes: str = ""
    extra: dict = field(default_factory=dict)
    chats: bool = False         # trained on short chats that end their turns (tinytrain.chat_turns), not raw text
    mtp_steps: int = 0          # then an MTP layer trained this long beside the frozen model (workstation/mtp.py)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128, "rope_theta": 500000.0}

# Qwen3.5-0.8B's text decoder in miniature (tiny-qwen3_5, and the same with its MTP layer)
_TINY_QWEN3_5 = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
    head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=512,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=True, rms_norm_eps=1e-6)

BUILTINS: dict[str, Builtin] = {
    # Llama 3.x in miniature: GQA, llama3 rope scaling, untied lm_head.
    "tiny-llama": Builtin("LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters=_LLAMA3_ROPE, tie_word_embeddings=False,
        rms_norm_eps=1e-5), notes="Llama-3-style, hidden 64"),
    # The agent profile's twin: tiny-llama's shape with a 40,960-token window (what TensorRT Edge-LLM recommends for
    # coding agents: 32,768 input tokens, a 40,960-token KV cache), trained on short chats whose answers end, so that
    # an agent's turn (Claude Code, Codex) ends by itself.
    "tiny-llama-agent": Builtin("LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False, rms_norm_eps=1e-5), chats=True,
        notes="Llama-3-style, hidden 64, 40,960-token window, answers that end"),
    # Hidden 96: INT4 group size 128 and 64 do not divide it, 32 does (the planner must pick 32).
    "tiny-llama-h96": Builtin("LlamaForCausalLM", dict(
        hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, rms_norm_eps=1e-5), notes="hidden 96, not a multiple of 64 or 128"),
    # Every projection a multiple of 64 wide (k/v 64, MLP 256): Edge-LLM's INT4 GEMM then uses its V2 (cuteDSL) plugin.
    "tiny-llama-h128": Builtin("LlamaForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters=_LLAMA3_ROPE, tie_word_embeddings=False,
        rms_norm_eps=1e-5), train_steps=100, notes="hidden 128: every INT4 projection 64-aligned"),
    # Qwen2 in miniature: q/k/v bias, tied embeddings.
    "tiny-qwen2": Builtin("Qwen2ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True, rms_norm_eps=1e-6), notes="Qwen2-style, tied embeddings, qkv bias"),
    # Mistral in miniature: Llama's layout under its own class; a window as long as the context (v0.3 has none).
    "tiny-mistral": Builtin("MistralForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        sliding_window=None, tie_word_embeddings=False, rms_norm_eps=1e-5), notes="Mistral-7B-v0.3-style"),
    # Qwen3 in miniature: q/k RMSNorm per head (Edge-LLM's attention plugin applies it), tied embeddings.
    "tiny-qwen3": Builtin("Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True, rms_norm_eps=1e-6), notes="Qwen3-style: q/k norm"),
    # Phi-4-mini in miniature: fused qkv_proj and gate_up_proj, GQA, 3/4 of each head rotated, tied embeddings.
    "tiny-phi3": Builtin("Phi3ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, partial_rotary_factor=0.75,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        tie_word_embeddings=True, rms_norm_eps=1e-5), notes="Phi-4-mini-style: fused projections, partial rotary"),
    # The same with LongRoPE (Phi-3.5, Phi-4-mini): short and long factors, a 64-token original window.
    "tiny-phi3-longrope": Builtin("Phi3ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, original_max_position_embeddings=64, partial_rotary_factor=0.75,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "original_max_position_embeddings": 64, "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 2.0],
                         "long_factor": [4.0, 6.0, 8.0, 12.0, 16.0, 24.0]},
        tie_word_embeddings=True, rms_norm_eps=1e-5), notes="tiny-phi3 with LongRoPE"),
    # The same, every projection part 64-aligned (k/v 64, MLP 256): Edge-LLM's INT4 then takes its V2 plugin.
    "tiny-phi3-h128": Builtin("Phi3ForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, partial_rotary_factor=0.75,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        tie_word_embeddings=True, rms_norm_eps=1e-5), train_steps=100, notes="tiny-phi3, hidden 128"),
    # Qwen3-30B-A3B in miniature: every layer an MoE layer of 8 experts (64 wide, every width 64-aligned as the MoE
    # plugins' layouts need), 2 per token, top-k weights renormalized; q/k norm; untied lm_head.
    "tiny-qwen3-moe": Builtin("Qwen3MoeForCausalLM", dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
        rms_norm_eps=1e-6), train_steps=100, notes="Qwen3-30B-A3B-style: 8 experts, 2 per token"),
    # Gemma 4 E2B's text decoder in miniature: 2 sliding layers (window 16, shorter than the validation prompts) to 1
    # full one of twice the head width with proportional RoPE; the last 3 of 6 layers reuse the K/V of the last
    # earlier layer of their kind and have double-wide MLPs; per-layer input embeddings; soft-capped logits; tied
    # embeddings. Every width 64-aligned (INT4 groups of 64).
    "tiny-gemma4": Builtin("Gemma4ForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, global_head_dim=64, hidden_size_per_layer_input=64, num_kv_shared_layers=3,
        use_double_wide_mlp=True, attention_k_eq_v=False, sliding_window=16, final_logit_softcapping=30.0,
        layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2, max_position_embeddings=512,
        tie_word_embeddings=True, rms_norm_eps=1e-6), train_steps=100,
        notes="Gemma-4-E2B-style: sliding and full layers, KV sharing, per-layer inputs"),
    # Qwen3.5-0.8B's text decoder in miniature: three gated delta-net layers to one gated attention layer (a quarter
    # of each head rotated), delta-net heads 128 wide as Edge-LLM's kernel takes them (1 key head, 2 value heads),
    # tied embeddings; every width 64-aligned.
    "tiny-qwen3_5": Builtin("Qwen3_5ForCausalLM", _TINY_QWEN3_5, train_steps=100,
        notes="Qwen3.5-0.8B-style: gated delta-net and gated attention, 3 to 1"),
    # The same with the multi-token prediction layer Qwen3.5's hub checkpoints ship (mtp_num_hidden_layers = 1, mtp.*
    # tensors), trained to guess the token after next from the trained, frozen model: Edge-LLM's MTP draft.
    "tiny-qwen3_5-mtp": Builtin("Qwen3_5ForCausalLM", dict(_TINY_QWEN3_5, mtp_num_hidden_layers=1), train_steps=100,
                                mtp_steps=300,
        notes="tiny-qwen3_5 with its multi-token prediction layer (an MTP draft)"),
    # Qwen3.5-35B-A3B's text decoder in miniature: tiny-qwen3_5's mixers (three gated delta-net layers to one gated
    # attention layer), each followed by an MoE block of 8 experts (64 wide), 2 per token, top-k renormalized, and a
    # shared expert of 64 scaled by sigmoid(shared_expert_gate(x)); untied lm_head, as the 35B-A3B has it.
    "tiny-qwen3_5-moe": Builtin("Qwen3_5MoeForCausalLM", dict(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, layer_types=["linear_attention"] * 3 + ["full_attention"],
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, rms_norm_eps=1e-6), train_steps=100,
        notes="Qwen3.5-35B-A3B-style: gated delta-net hybrid with MoE blocks and a gated shared expert"),
    # Nemotron-H in miniature (NVIDIA-Nemotron-Nano-9B-v2's block pattern shortened): Mamba-2 blocks (8 heads of 16,
    # 2 groups, state 16), one attention block without RoPE, plain relu2 MLP blocks; one block per layer.
    "tiny-nemotron-h": Builtin("NemotronHForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layers_block_type=["mamba", "mlp", "mamba", "attention", "mlp", "mamba"], ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4, chunk_size=16, max_position_embeddings=512,
        tie_word_embeddings=False, layer_norm_epsilon=1e-5), train_steps=100,
        notes="Nemotron-H-style: Mamba-2, attention and MLP blocks"),
    # Nemotron 3 Nano 30B-A3B in miniature (its pattern M E M E M * E shortened): Mamba-2, attention and MoE blocks of
    # 8 relu2 experts (64 wide: Edge-LLM pads them to 128 for its Nvfp4MoePlugin), 2 per token chosen by sigmoid plus
    # a score correction, renormalized and scaled by 2.5, beside a shared relu2 expert 128 wide.
    "tiny-nemotron-h-moe": Builtin("NemotronHForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layers_block_type=["mamba", "moe", "mamba", "moe", "mamba", "attention", "moe"], ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4, chunk_size=16, max_position_embeddings=512,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=128,
        routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True,
        tie_word_embeddings=False, layer_norm_epsilon=1e-5),
        # 300 steps, not 100: after 100 its NVFP4 answers hung on margins inside NVFP4's own rounding spread (an H200:
        # the same calibrated model in fp16 and in fp32 differed by 5% in logits; the engine double, whose MoE blocks
        # match ModelOpt's on the same input to a cosine of 0.99998, chose another first token for a 0.62 margin)
        notes="Nemotron-3-Nano-30B-A3B-style: Mamba-2 and attention blocks, MoE blocks with a shared expert"),
    # Gemma 4 26B-A4B's text decoder in miniature: five sliding layers (window 16) to one full one whose key projection
    # is its value (K = V, one KV head of twice the width), every layer's MLP beside an MoE block of 8 GeGLU experts
    # (64 wide), 2 per token, renormalized then scaled per expert; no per-layer inputs, no KV sharing; tied embeddings.
    "tiny-gemma4-moe": Builtin("Gemma4ForCausalLM", dict(
        hidden_size=128, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=True, num_experts=8, top_k_experts=2,
        moe_intermediate_size=64, sliding_window=16, final_logit_softcapping=30.0,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], max_position_embeddings=512,
        tie_word_embeddings=True, rms_norm_eps=1e-6),
        # 300 steps (the default), not 100, as tiny-nemotron-h-moe: after 100 its NVFP4 kit's answers diverged from
        # the goldens on the recorded Thor (agreement 0.0 on a prompt) where the double's logits matched the
        # calibrated model's to a cosine of 0.9987: the first tokens' margins were inside NVFP4's rounding spread
        notes="Gemma-4-26B-A4B-style: routed experts beside every MLP, K = V full layers"),
    # Vision-language models shrunk from real configs (tinyvlm.py holds their towers, processors and image tokens).
    **{name: Builtin(vlm["architecture"], {}, notes=f"{vlm['architecture']} shrunk", extra=vlm,
                     train_steps=vlm.get("train_steps", 300))
       for name, vlm in VLM_BUILTINS.items()},
    # Speech-to-text models shrunk from real configs (tinyasr.py holds their encoders, extractors and audio tokens).
    **{name: Builtin(asr["architecture"], {}, notes=f"{asr['architecture']} shrunk", extra=asr)
       for name, asr in ASR_BUILTINS.items()},
    # Gemma 4 with its audio tower (tinygemma4audio.py: the hub's multimodal layout, trained to transcribe a set).
    **{name: Builtin(g4["architecture"], {}, notes="Gemma 4 E2B with its audio tower, shrunk", extra=g4,
                     train_steps=100, seed=g4["seed"]) for name, g4 in GEMMA4_AUDIO_BUILTINS.items()},
    # Text-to-speech models shrunk from real configs (tinytts.py holds their talkers, code predictors and Code2Wav).
    **{name: Builtin(tts["architecture"], {}, notes=f"{tts['architecture']} shrunk", extra=tts)
       for name, tts in TTS_BUILTINS.items()},
    # RNN-T speech-to-text models shrunk from real configs (tinytransducer.py holds their encoders and tokenizers).
    **{name: Builtin(asr["architecture"], shrunk(name), notes=f"{asr['architecture']} shrunk", extra=asr,
                     train_steps=asr["speech_steps"], seed=asr["seed"])
       for name, asr in TRANSDUCER_BUILTINS.items()},
}


def maker(name: str):
    """The module that makes builtin `name` where it is more than a decoder (its `extra`): tinyasr, tinytransducer,
    tinytts or tinyvlm, each with builtin_config(name, spec) and its materializer."""
    from pipeline.workstation import tinyasr, tinygemma4audio, tinytransducer, tinytts, tinyvlm
    return next(m for m, table in ((tinyasr, ASR_BUILTINS), (tinytransducer, TRANSDUCER_BUILTINS),
                                   (tinytts, TTS_BUILTINS), (tinyvlm, VLM_BUILTINS),
                                   (tinygemma4audio, GEMMA4_AUDIO_BUILTINS)) if name in table)


@dataclass(frozen=True)
class DraftBuiltin:
    base: str                   # the builtin whose tokenizer and hidden size the draft is made for
    draft_vocab_size: int = 256
    intermediate_size: int = 128
    seed: int = 0
    notes: str = ""


# EAGLE-3 drafts in miniature: the layout of a real draft with random weights (formats and plumbing, not acceptance).
DRAFT_BUILTINS: dict[str, DraftBuiltin] = {
    "tiny-llama-eagle3": DraftBuiltin("tiny-llama", notes="EAGLE-3 draft for tiny-llama, random weights"),
}


# A tool-calling template in Llama 3.1's manner (the tiny models are Llamas; llama3_json in serve/toolcalls.py): the
# tools listed in a system block, a call answered as {"name": ..., "parameters": {...}}, a result as an ipython turn.
# Each tool is listed by name and argument names only, not as JSON: the tiny engines take 128 tokens, and a JSON
# schema costs hundreds in this small vocabulary. Without tools it renders exactly what it always did.
TURN_END = "\n{% endif %}{% endfor %}"     # where a turn ends: a model trained on chats ends it with <|eos|>
CHAT_TEMPLATE = ("{% if tools %}<|system|>Call as {\"name\", \"parameters\"}:{% for t in tools %} "
                 "{{ t['function']['name'] }}("
                 "{{ (t['function']['parameters'] or {}).get('properties', {}) | join(',') }})"
                 "{% endfor %}{{ '\\n' }}"
                 "{% endif %}{% for m in messages %}"
                 "{% if m['role'] == 'assistant' and m['tool_calls'] %}<|assistant|>{% for c in m['tool_calls'] %}"
                 "{{ {'name': c['function']['name'], 'parameters': c['function']['arguments']} | tojson }}"
                 "{% if not loop.last %}; {% endif %}{% endfor %}{{ '\\n' }}"
                 "{% elif m['role'] == 'tool' %}<|ipython|>{{ m['content'] }}\n"
                 "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}" + "\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def materialize(name: str, out_dir: Path, progress=None) -> None:
    """Write builtin `name` as a Hugging Face checkpoint directory into out_dir."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    spec = BUILTINS[name]
    out_dir = Path(out_dir)
    if spec.extra:
        maker(name).materialize(name, spec, out_dir, progress)
        _write_builtin_json(name, spec, out_dir)
        return
    tok = train_tokenizer(spec.vocab_size)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    # Like a real instruct model's: Edge-LLM's export requires a chat template (and writes it for its runtime).
    fast.chat_template = CHAT_TEMPLATE.replace(TURN_END, "<|eos|>" + TURN_END) if spec.chats else CHAT_TEMPLATE
    vocab = tok.get_vocab_size()
    from pipeline.families import family
    fam = family(spec.architecture)
    assert fam is not None, spec.architecture           # every builtin is of a registered family
    config_cls = getattr(transformers, fam.transformers_config)
    # Gemma 4's per-layer embedding table has a vocabulary of its own: the tokenizer's, as in the real models
    per_layer = {"vocab_size_per_layer_input": vocab} if spec.config.get("hidden_size_per_layer_input") else {}
    config = config_cls(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                        architectures=[spec.architecture], **per_layer, **spec.config)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.architecture)(config).float()
    from pipeline.workstation.models import without_default_cache
    without_default_cache(model)
    train(model, fast, spec.train_steps, spec.seed, progress, chats=spec.chats)
    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir, safe_serialization=True)
    if spec.mtp_steps:      # the hub's layout: the mtp.* tensors in the model's own file, beside the decoder's
        from safetensors.torch import load_file, save_file

        from pipeline.workstation.mtp import train_mtp
        tensors = load_file(str(out_dir / "model.safetensors")) | train_mtp(model, fast, spec.mtp_steps, spec.seed,
                                                                            progress)
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    fast.save_pretrained(out_dir)
    _write_builtin_json(name, spec, out_dir)


def _write_builtin_json(name: str, spec: Builtin, out_dir: Path) -> None:
    (out_dir / "builtin.json").write_text(json.dumps({"builtin": name, "notes": spec.notes,
                                                      "train_steps": spec.train_steps, "seed": spec.seed}, indent=1))


def materialize_draft(name: str, out_dir: Path) -> None:
    """Write builtin EAGLE-3 draft `name`; its draft vocabulary is the base tokenizer's most frequent corpus tokens."""
    from collections import Counter

    import torch

    from pipeline.plan.speculative import DraftShape
    from pipeline.workstation.drafts import write_builtin

    spec = DRAFT_BUILTINS[name]
    base = BUILTINS[spec.base]
    tok = train_tokenizer(base.vocab_size)
    vocab = tok.get_vocab_size()
    counts = Counter(tok.encode(corpus_text("calib-en")).ids)
    top = sorted(t for t, _ in counts.most_common(spec.draft_vocab_size))
    top += sorted(set(range(vocab)) - set(top))[:spec.draft_vocab_size - len(top)]   # a tiny corpus may lack some
    c = base.config
    shape = DraftShape(hidden_size=c["hidden_size"], num_layers=1, num_heads=c["num_attention_heads"],
                       num_kv_heads=c["num_key_value_heads"], head_dim=c["hidden_size"] // c["num_attention_heads"],
                       intermediate_size=spec.intermediate_size, vocab_size=vocab,
                       draft_vocab_size=spec.draft_vocab_size, target_hidden_size=c["hidden_size"])
    rope = c.get("rope_parameters", {})
    write_builtin(shape, torch.tensor(sorted(top)), Path(out_dir),
                  {"rms_norm_eps": c["rms_norm_eps"], "max_position_embeddings": c["max_position_embeddings"],
                   "rope_theta": rope.get("rope_theta", 10000.0), "hidden_act": "silu", "tie_word_embeddings": False},
                  spec.seed)
    (Path(out_dir) / "builtin.json").write_text(json.dumps({"builtin": name, "notes": spec.notes}, indent=1))

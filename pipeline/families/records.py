"""The families, one record each (pipeline/families/__init__.py says what the fields mean and who reads them). What
each backend version builds of them is that backend's fact, in its own module (pipeline/backends/<name>.py), as
Backend.families: `verified` says how each supported pair is known to work (the backend's own source, and the test
of this repo that exports a tiny model of the family in every format and checks it); a refusal says why, as a user
would want it said.
"""

from __future__ import annotations

import dataclasses

from pipeline.families import visual
from pipeline.families.audio import QWEN3_ASR_AUDIO
from pipeline.families.gemma4_audio import GEMMA4_AUDIO
from pipeline.families.kinds import (
    ATTENTION,
    GATED_DELTA_NET,
    MAMBA2,
    MLP,
    MOE,
    Family,
    HybridLayout,
    LayerLayout,
    MoeLayout,
    MtpLayout,
)

LLAMA, MISTRAL, QWEN2, QWEN3 = "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
PHI3, GEMMA2, GEMMA3 = "Phi3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"
# Gemma 4 text (Gemma4ForCausalLM) and the multimodal checkpoints the hub ships (its language model in text_config;
# E2B's and E4B's audio tower beside it, families/gemma4_audio.py; the image tower is not planned yet)
GEMMA4, GEMMA4_MM = "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"
# Gemma 4's MLP output projection stays FP16 in INT4 and NVFP4, as Edge-LLM 0.11's own quantizer keeps it
# (quantization/quantize.py: "4-bit down_proj cannot represent the clamped +/-2048 GeGLU intermediate and drops
# mmlu/mmmu below threshold")
GEMMA4_FP16_AT_4BIT = ("down_proj",)
# Gemma 4 26B-A4B: 128 experts (8 per token, top-k renormalized then scaled per expert) beside every layer's MLP
GEMMA4_EXPERTS = MoeLayout(count=("num_experts",), active=("top_k_experts",), normalized=None, sparse_step=None,
                           dense_layers=None, router="model.layers.{layer}.router.proj.weight",
                           enabled_by="enable_moe_block", beside_mlp=True,
                           fused_tensors=("model.layers.{layer}.experts.gate_up_proj",
                                          "model.layers.{layer}.experts.down_proj"))
# vision-language models, as transformers 5 names them natively (InternVL3's original checkpoints, InternVLChatModel
# with its own code, are this architecture once fetched: families/layouts.py maps them, their code is never run)
QWEN2_5_VL, QWEN3_VL = "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration"
INTERNVL = "InternVLForConditionalGeneration"
VISION_LANGUAGE = (QWEN2_5_VL, QWEN3_VL, INTERNVL)
# speech to text: an audio encoder whose tokens replace <|audio_pad|> placeholders in a Qwen3 decoder's prompt (the
# hub's original checkpoints keep both under thinker_config: families/layouts.py maps them onto this native layout)
QWEN3_ASR = "Qwen3ASRForConditionalGeneration"
SPEECH_TO_TEXT = (QWEN3_ASR,)
QWEN3_MOE, GPT_OSS = "Qwen3MoeForCausalLM", "GptOssForCausalLM"
# the same on every backend here: where it does run on a Jetson
GPT_OSS_WHERE = ("gpt-oss (MXFP4 experts with attention sinks) has no path in TensorRT Edge-LLM 0.11 or TensorRT-LLM "
                 "0.12; on a Jetson it runs with vLLM (NVIDIA's Jetson vLLM container) or llama.cpp / Ollama")

# hybrid recurrent decoders, as transformers 5 names them natively (Nemotron-H checkpoints also name their own code in
# auto_map: the native class is used, never that code). Qwen3.5's hub checkpoints are multimodal: the language model
# in text_config, Qwen3-VL's tower without DeepStack beside it.
QWEN3_5, QWEN3_5_MM, NEMOTRON_H = "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM"
QWEN3_5_MOE, QWEN3_5_MOE_MM = "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"
HYBRID = (QWEN3_5, QWEN3_5_MM, QWEN3_5_MOE, QWEN3_5_MOE_MM, NEMOTRON_H)
# a gated delta-net's beta and alpha projections (one output per value head: 16 or 32 wide) stay FP16: ModelOpt's
# stock configs leave them unquantized, and Edge-LLM 0.11's quantizer keeps every INT4 linear that is not 64-aligned in
# FP16 (quantization/quantize.py); its exporter then builds them as plain GEMMs beside the INT4 ones
GDN_FP16_AT_4BIT = ("in_proj_b", "in_proj_a")
# Qwen3.5: three gated delta-net layers to one gated attention layer (layer_types), each followed by its SwiGLU MLP
QWEN3_5_LAYERS = HybridLayout(recurrent=GATED_DELTA_NET, types=("layer_types",),
                              names=(("linear_attention", GATED_DELTA_NET), ("full_attention", ATTENTION)),
                              attention_output_gate=True, interval="full_attention_interval")
# Qwen3.5-MoE (35B-A3B and up): the same mixers, each followed by an MoE block instead of a dense MLP: softmax routing
# to the top 8 of 256 experts, renormalized (unconditionally: its config has no norm_topk_prob), and a shared expert
# scaled by sigmoid(shared_expert_gate(x)); transformers 5 stores each block's experts fused
QWEN3_5_MOE_EXPERTS = MoeLayout(count=("num_experts",), shared_intermediate="shared_expert_intermediate_size",
                                normalized=None, sparse_step=None, dense_layers=None, shared_gate=True,
                                fused_tensors=("model.layers.{layer}.mlp.experts.gate_up_proj",
                                               "model.layers.{layer}.mlp.experts.down_proj"))
# their hub checkpoints ship one multi-token prediction layer (mtp.*: a draft predicting the token after next from the
# last hidden state); Nemotron 3's list the draft's blocks (attention then MoE) for each prediction module
QWEN3_5_MTP = MtpLayout()
NEMOTRON_H_MTP = MtpLayout(types="mtp_layers_block_type", pattern="mtp_hybrid_override_pattern")
QWEN3_5_MOE_LAYERS = dataclasses.replace(QWEN3_5_LAYERS, mlp_in_every_layer=False, moe_in_every_layer=True,
                                         experts=QWEN3_5_MOE_EXPERTS)
# Nemotron-H: one block per layer. transformers 5 writes layers_block_type with linear_attention for Mamba-2; the
# hub's configs still carry hybrid_override_pattern (M Mamba-2, * attention, - MLP, E MoE) or the old block names.
# Its checkpoints keep the decoder under backbone. (transformers saves them so: backbone.embedding, backbone.norm_f)
# Nemotron 3 Nano 30B-A3B's MoE blocks: 128 relu2 experts (up/down), 6 per token (sigmoid scores, top-k
# renormalized, then scaled by routed_scaling_factor) and a shared expert twice as wide; transformers 5 stores each
# block's experts fused ([experts, width, hidden] up, [experts, hidden, width] down), the hub one tensor per expert
NEMOTRON_H_EXPERTS = MoeLayout(count=("n_routed_experts",), active=("num_experts_per_tok",),
                               shared_intermediate="moe_shared_expert_intermediate_size", sparse_step=None,
                               dense_layers=None,
                               expert_tensors="backbone.layers.{layer}.mixer.experts.{expert}.{proj}.weight",
                               router="backbone.layers.{layer}.mixer.gate.weight", score_correction=True)
NEMOTRON_H_LAYERS = HybridLayout(
    recurrent=MAMBA2, types=("layers_block_type", "layer_types"),
    names=(("linear_attention", MAMBA2), ("mamba", MAMBA2), ("full_attention", ATTENTION), ("attention", ATTENTION),
           ("mlp", MLP), ("moe", MOE)),
    pattern="hybrid_override_pattern", pattern_chars=(("M", MAMBA2), ("*", ATTENTION), ("-", MLP), ("E", MOE)),
    mlp_in_every_layer=False, gated_mlp=False, norms_per_layer=1, head_dim_keys=("head_dim", "attention_head_dim"),
    prefixes=((MAMBA2, "mixer."), (ATTENTION, "mixer."), (MLP, "mixer.")), embedding=("embedding", "embeddings"),
    final_norm="norm_f", experts=NEMOTRON_H_EXPERTS)

FAMILIES: tuple[Family, ...] = (
    Family(LLAMA, "Llama", ("Llama 3.1 / 3.2", "DeepSeek-R1-Distill-Llama", "SmolLM2"), "LlamaConfig",
           tool_calls="llama3_json", notes="Llama 3.x llama3 RoPE scaling; SmolLM2 ties embeddings"),
    Family(MISTRAL, "Mistral", ("Mistral 7B v0.3",), "MistralConfig",
           tool_calls="mistral", notes="v0.1 has a 4096-token sliding window, v0.3 none"),
    Family(QWEN2, "Qwen2", ("Qwen 2.5", "DeepSeek-R1-Distill-Qwen"), "Qwen2Config", attention_bias=True,
           tool_calls="hermes",
           notes="q/k/v bias; the configs carry a sliding window that use_sliding_window = false turns off"),
    Family(QWEN3, "Qwen3", ("Qwen3",), "Qwen3Config", qk_norm=True, tool_calls="hermes",
           notes="q/k RMSNorm"),
    Family(PHI3, "Phi-3", ("Phi-3.5-mini", "Phi-4-mini"), "Phi3Config",
           fused_projections=(("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                              ("gate_up_proj", ("gate_proj", "up_proj"))),
           tool_calls="phi4_mini",
           notes="fused qkv and gate_up; longrope scaling; Phi-4-mini rotates 3/4 of each head and ties embeddings"),
    Family(GEMMA2, "Gemma 2", ("Gemma 2 2B",), "Gemma2Config", norm="rms_plus_one", sandwich_norms=True,
           activation="gelu_tanh", embedding_scale="sqrt_hidden",
           notes="alternating 4096-token sliding window; attention and final logit soft-capping"),
    Family(GEMMA3, "Gemma 3", ("Gemma 3 1B",), "Gemma3TextConfig", norm="rms_plus_one", sandwich_norms=True,
           activation="gelu_tanh", qk_norm=True, embedding_scale="sqrt_hidden",
           notes="5 sliding-window layers to 1 global; q/k RMSNorm"),
    Family(GEMMA4, "Gemma 4", ("Gemma 4 E2B / E4B (text)",), "Gemma4TextConfig", norm="rms_plus_one",
           sandwich_norms=True, activation="gelu_tanh", qk_norm=True, embedding_scale="sqrt_hidden",
           layers=LayerLayout(), fp16_at_4bit=GEMMA4_FP16_AT_4BIT, moe=GEMMA4_EXPERTS,
           notes="sliding-window and full layers of different widths; the last layers reuse earlier K/V; per-layer "
                 "input embeddings (E2B / E4B)"),
    Family(GEMMA4_MM, "Gemma 4 (multimodal checkpoint)", ("gemma-4-E4B-it", "gemma-4-E2B-it"), "Gemma4Config",
           norm="rms_plus_one", sandwich_norms=True, activation="gelu_tanh", qk_norm=True,
           embedding_scale="sqrt_hidden", layers=LayerLayout(), text_config="text_config",
           fp16_at_4bit=GEMMA4_FP16_AT_4BIT, moe=GEMMA4_EXPERTS, audio=GEMMA4_AUDIO,
           notes="the hub's Gemma 4 checkpoints: the language model in text_config and E2B's / E4B's audio tower "
                 "(a conformer, 25 tokens a second) planned, the image tower not yet"),
    Family(QWEN3_MOE, "Qwen3-MoE", ("Qwen3-30B-A3B", "Qwen3-Coder-30B-A3B"), "Qwen3MoeConfig", qk_norm=True,
           tool_calls="hermes", moe=MoeLayout(),
           notes="a Qwen3 decoder whose MLPs are 128 routed experts, 8 per token (top-k renormalized), no shared "
                 "expert"),
    # read so that a plan can say where it runs: no backend here builds it (MXFP4 experts, attention sinks)
    Family(GPT_OSS, "gpt-oss", ("gpt-oss-20b", "gpt-oss-120b"), "GptOssConfig", attention_bias=True,
           moe=MoeLayout(count=("num_local_experts",), active=("experts_per_token", "num_experts_per_tok"),
                         intermediate="intermediate_size", normalized=None, sparse_step=None, dense_layers=None,
                         expert_tensors="model.layers.{layer}.mlp.experts.gate_up_proj_blocks",
                         router="model.layers.{layer}.mlp.router.weight"),
           notes="every layer MoE (MXFP4 experts), attention sinks, a 128-token sliding window every other layer"),
    Family(QWEN3_5, "Qwen3.5", ("Qwen3.5 0.8B / 2B / 4B / 9B / 27B (text)",), "Qwen3_5TextConfig", qk_norm=True,
           hybrid=QWEN3_5_LAYERS, fp16_at_4bit=GDN_FP16_AT_4BIT, mtp=QWEN3_5_MTP,
           notes="gated delta-net layers (a fixed-size recurrent state per sequence) and gated attention, 3 to 1; "
                 "partial rotary (1/4 of each head)"),
    Family(QWEN3_5_MM, "Qwen3.5 (multimodal checkpoint)", ("Qwen3.5-0.8B", "Qwen3.5-4B", "Qwen3.5-27B"),
           "Qwen3_5Config", qk_norm=True, hybrid=QWEN3_5_LAYERS, fp16_at_4bit=GDN_FP16_AT_4BIT, mtp=QWEN3_5_MTP,
           text_config="text_config", visual=visual.QWEN3_VL_TOWER,
           notes="the hub's Qwen3.5 checkpoints: the hybrid decoder with interleaved multimodal RoPE and Qwen3-VL's "
                 "tower without DeepStack"),
    Family(QWEN3_5_MOE, "Qwen3.5-MoE", ("Qwen3.5-35B-A3B (text)",), "Qwen3_5MoeTextConfig", qk_norm=True,
           hybrid=QWEN3_5_MOE_LAYERS, fp16_at_4bit=GDN_FP16_AT_4BIT, mtp=QWEN3_5_MTP,
           notes="Qwen3.5's gated delta-net and gated attention layers, each followed by an MoE block (256 experts, "
                 "8 per token, and a gated shared expert)"),
    Family(QWEN3_5_MOE_MM, "Qwen3.5-MoE (multimodal checkpoint)", ("Qwen3.5-35B-A3B",), "Qwen3_5MoeConfig",
           qk_norm=True, hybrid=QWEN3_5_MOE_LAYERS, fp16_at_4bit=GDN_FP16_AT_4BIT, mtp=QWEN3_5_MTP,
           text_config="text_config", visual=visual.QWEN3_VL_TOWER,
           notes="the hub's Qwen3.5-MoE checkpoints: the MoE hybrid decoder and Qwen3-VL's tower without DeepStack"),
    Family(NEMOTRON_H, "Nemotron-H", ("Nemotron-H 8B", "NVIDIA-Nemotron-Nano-9B-v2", "Nemotron 3 Nano 4B / 30B-A3B"),
           "NemotronHConfig", activation="relu2", hybrid=NEMOTRON_H_LAYERS, mtp=NEMOTRON_H_MTP,
           notes="Mamba-2 blocks (a fixed-size state per sequence), a few attention blocks and plain relu2 MLP "
                 "blocks, one per layer; the 30B-A3B adds MoE blocks"),
    Family(QWEN2_5_VL, "Qwen2.5-VL", ("Qwen2.5-VL 3B / 7B",), "Qwen2_5_VLConfig", attention_bias=True,
           tool_calls="hermes", visual=visual.QWEN2_5_VL_TOWER, text_config="text_config", flat_text_config=True,
           notes="a Qwen2 decoder with multimodal RoPE; a window-attention ViT, 2x2 patches per token"),
    Family(QWEN3_VL, "Qwen3-VL", ("Qwen3-VL 2B / 4B / 8B", "Cosmos-Reason2"), "Qwen3VLConfig", qk_norm=True,
           tool_calls="hermes", visual=visual.QWEN3_VL_TOWER, text_config="text_config",
           notes="a Qwen3 decoder with interleaved multimodal RoPE and DeepStack visual features in early layers"),
    Family(INTERNVL, "InternVL3", ("InternVL3 1B / 2B / 8B (original or -hf)",), "InternVLConfig", attention_bias=True,
           visual=visual.INTERNVL3_TOWER, text_config="text_config",
           notes="an InternViT tower, 448-pixel tiles, pixel shuffle to 256 tokens each, before a Qwen2.5 decoder"),
    Family(QWEN3_ASR, "Qwen3-ASR", ("Qwen3-ASR 0.6B / 1.7B (original or -hf)",), "Qwen3ASRConfig", qk_norm=True,
           audio=QWEN3_ASR_AUDIO, text_config="text_config",
           notes="speech to text: a Whisper-style audio encoder (13 tokens a second) before a Qwen3 decoder"),
)

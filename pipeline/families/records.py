"""The families, one record each, and what each backend version builds of them (pipeline/families/__init__.py says
what the fields mean and who reads them). Each backend registers its table as Backend.families.

`verified` says how each supported pair is known to work: the backend's own source, and the test of this repo that
exports a tiny model of the family in every format and checks it. A refusal says why, as a user would want it said.
"""

from __future__ import annotations

from pipeline.families.kinds import Family, Support

LLAMA, MISTRAL, QWEN2, QWEN3 = "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
PHI3, GEMMA2, GEMMA3 = "Phi3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"

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
)


# TensorRT-LLM 0.12's LLaMA class (tensorrt_llm/models/llama/model.py): RMSNorm, SiLU-gated MLP, RoPE with
# rotary_scaling linear / dynamic / llama3 (the reader here computes default, linear and llama3), no sliding window
# in the checkpoint, no soft-capping.
def _llama_012(verified: str) -> Support:
    return Support(trtllm_class="LLaMAForCausalLM", modelopt_decoder="llama",
                   rope_types=("default", "linear", "llama3"), verified=verified)


# Phi-3 is in 0.12's MODEL_MAP, but Phi-3.5 support came in TensorRT-LLM's 2024-09-30 update (PR #2273, after 0.12)
# and a 0.12-era phi3/model.py has no partial rotary (Phi-4-mini); Gemma 2 was not in TensorRT-LLM when 0.12 shipped
# (NVIDIA/TensorRT-LLM#1984 "please support gemma2" was still open on 2024-10-31, with users hand-patching Gemma 1).
_PHI3_012 = ("TensorRT-LLM added Phi-3.5 after 0.12 (its 2024-09-30 update) and Phi-4-mini later; this pipeline's "
             "0.12 export does not cover 0.12's Phi-3 (mini, small, medium) checkpoint layout, which is not confirmed "
             "here against the 0.12 source")
_GEMMA2_012 = ("TensorRT-LLM had no Gemma 2 when 0.12 shipped (its Gemma 2 request, issue #1984, was still open in "
               "October 2024), and 0.12 is the last release for Orin on JetPack 6")

TRTLLM_012: dict[str, Support] = {
    LLAMA: _llama_012("0.12 MODEL_MAP; tests/test_export.py (tiny-llama, all formats)"),
    MISTRAL: _llama_012("0.12 MODEL_MAP: MistralForCausalLM -> LLaMAForCausalLM; tests/test_export.py "
                        "(tiny-mistral, all formats); tests/test_families.py (doit export)"),
    QWEN2: Support(trtllm_class="QWenForCausalLM", modelopt_decoder="qwen", rope_types=("default", "linear"),
                   verified="0.12 MODEL_MAP; tests/test_export.py (tiny-qwen2)"),
    QWEN3: Support(refused="Qwen3 was added to TensorRT-LLM after 0.12 (0.12's examples/qwen covers Qwen, Qwen1.5 "
                           "and Qwen2), and 0.12 is the last release for Orin on JetPack 6"),
    PHI3: Support(refused=_PHI3_012),
    GEMMA2: Support(refused=_GEMMA2_012),
    GEMMA3: Support(refused="Gemma 3 was added to TensorRT-LLM after 0.12"),
}


# Edge-LLM 0.11's generic decoder (tensorrt_edgellm/models/default, config.py ModelConfig) reads RoPE scaling
# (linear, dynamic, llama3, longrope, yarn) and partial rotary from config.json, and its attention plugin applies q/k
# norm; the runtime computes the RoPE table (for LongRoPE one factor set per engine: Support.longrope_per_engine).
# Listed are the RoPE types a test of this repo checked the exported graph with (the runtime double computes them).
_EDGELLM_ROPE = ("default", "llama3", "longrope")
# a family Edge-LLM's own supported-models list does not name is registered with the formats a test here checked:
# tests/test_families.py on the CPU, NVFP4 by tests/test_nvfp4.py on a GPU (an H200, 2026-11-24)
_PHI3_CHECKED = (("fp16", "int4_awq", "fp8", "nvfp4"), ("fp16", "fp8"),
                 "INT8 SmoothQuant (Orin on JetPack 7.2) is not settled here yet for this family")


def _edgellm_dense(verified: str, formats: tuple[str, ...] | None = None, kv_cache: tuple[str, ...] | None = None,
                   formats_why: str = "") -> Support:
    return Support(rope_types=_EDGELLM_ROPE, partial_rotary=True, longrope_per_engine=True, formats=formats,
                   kv_cache=kv_cache, formats_why=formats_why, verified=verified)


_NO_GEMMA_PATH = ("Edge-LLM 0.11's exporter has a Gemma 4 model and no {} path; its generic decoder has no (1 + w) "
                  "RMSNorm, post-attention norms or embedding scaling")

EDGELLM_011: dict[str, Support] = {
    LLAMA: _edgellm_dense("tests/test_edgellm_export.py (tiny-llama)"),
    MISTRAL: _edgellm_dense("its generic decoder; tests/test_families.py (tiny-mistral: FP16, INT4-AWQ, FP8, the FP8 "
                            "KV cache, INT8 SmoothQuant for SM 8.7; run by the runtime double), tests/test_nvfp4.py "
                            "(NVFP4, on a GPU)"),
    QWEN2: _edgellm_dense("Edge-LLM supported models (Qwen2/2.5, DeepSeek-R1-Distill)"),
    QWEN3: _edgellm_dense("Edge-LLM supported models; tests/test_families.py (tiny-qwen3: q/k norm in the attention "
                          "plugin, FP16, INT4-AWQ, FP8, the FP8 KV cache, INT8 SmoothQuant for SM 8.7; run by the "
                          "runtime double), tests/test_nvfp4.py (NVFP4, on a GPU)"),
    PHI3: _edgellm_dense("its generic decoder (fused projections split by its loader, partial_rotary_factor); "
                         "tests/test_families.py (tiny-phi3 FP16, FP8, the FP8 KV cache and INT4-AWQ through the V1 "
                         "plugin, tiny-phi3-h128 INT4-AWQ through V2, tiny-phi3-longrope; run by the runtime double), "
                         "tests/test_nvfp4.py (NVFP4, on a GPU)", *_PHI3_CHECKED),
    GEMMA2: Support(refused=_NO_GEMMA_PATH.format("Gemma 2")),
    GEMMA3: Support(refused=_NO_GEMMA_PATH.format("Gemma 3")),
}

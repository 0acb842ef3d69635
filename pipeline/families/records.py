"""The families, one record each (pipeline/families/__init__.py says what the fields mean and who reads them).

`verified` says how each supported pair is known to work: the backend's own source, and the test of this repo that
exports a tiny model of the family in every format and checks it. A refusal says why, as a user would want it said.
"""

from __future__ import annotations

from pipeline.families import Family, Support

TRTLLM, EDGELLM = "trtllm-0.12", "edgellm"

# TensorRT-LLM 0.12's LLaMA class (tensorrt_llm/models/llama/model.py): RMSNorm, SiLU-gated MLP, RoPE with
# rotary_scaling linear / dynamic / llama3 (the reader here computes default, linear and llama3), no sliding window
# in the checkpoint, no soft-capping.
def _llama_012(verified: str) -> Support:
    return Support(TRTLLM, trtllm_class="LLaMAForCausalLM", modelopt_decoder="llama",
                   rope_types=("default", "linear", "llama3"), verified=verified)


# Edge-LLM 0.11's generic decoder (tensorrt_edgellm/models/default, config.py ModelConfig): RoPE scaling and
# partial rotary from config.json; sliding_window_size; final logit soft-capping.
def _edgellm_dense(verified: str) -> Support:
    return Support(EDGELLM, rope_types=("default", "linear", "llama3", "dynamic", "longrope", "yarn"),
                   partial_rotary=True, verified=verified)


_NOT_EXPORTED_012 = ("this pipeline's TensorRT-LLM 0.12 export does not cover its checkpoint layout yet (the 0.12 "
                     "converter's tensor names and config fields for it are not yet confirmed against the 0.12 source)")
_NOT_VERIFIED_EDGELLM = ("no tiny model of the family has yet been exported through Edge-LLM 0.11's exporter and "
                         "checked here")

FAMILIES: tuple[Family, ...] = (
    Family(
        "LlamaForCausalLM", "Llama", ("Llama 3.1 / 3.2", "DeepSeek-R1-Distill-Llama", "SmolLM2"), "LlamaConfig",
        support=(
            _llama_012("0.12 MODEL_MAP; tests/test_export.py (tiny-llama, all formats)"),
            _edgellm_dense("tests/test_edgellm_export.py (tiny-llama)"),
        ), notes="Llama 3.x llama3 RoPE scaling; SmolLM2 ties embeddings"),
    Family(
        "MistralForCausalLM", "Mistral", ("Mistral 7B v0.3",), "MistralConfig",
        support=(
            _llama_012(
                    "0.12 MODEL_MAP: MistralForCausalLM -> LLaMAForCausalLM; tests/test_export.py "
                             "(tiny-mistral, all formats)"),
            _edgellm_dense(
                    "its generic decoder; tests/test_families.py (tiny-mistral, FP16 and INT4-AWQ, run "
                             "by the runtime double)"),
        ), notes="v0.1 has a 4096-token sliding window, v0.3 none"),
    Family(
        "Qwen2ForCausalLM", "Qwen2", ("Qwen 2.5", "DeepSeek-R1-Distill-Qwen"), "Qwen2Config", attention_bias=True,
        support=(
            Support(TRTLLM, trtllm_class="QWenForCausalLM", modelopt_decoder="qwen",
                    rope_types=("default", "linear"),
                    verified="0.12 MODEL_MAP; tests/test_export.py (tiny-qwen2)"),
            _edgellm_dense("Edge-LLM supported models (Qwen2/2.5, DeepSeek-R1-Distill)"),
        ), notes="q/k/v bias; the configs carry a sliding window that use_sliding_window = false turns off"),
    Family(
        "Qwen3ForCausalLM", "Qwen3", ("Qwen3",), "Qwen3Config", qk_norm=True,
        support=(
            Support(TRTLLM, refused="Qwen3 was added to TensorRT-LLM after 0.12 (0.12's examples/qwen covers Qwen, "
                                    "Qwen1.5 and Qwen2), and 0.12 is the last release for Orin on JetPack 6"),
            _edgellm_dense("Edge-LLM supported models; tests/test_device.py (Thor kit)"),
        ), notes="q/k RMSNorm"),
    Family(
        "Phi3ForCausalLM", "Phi-3", ("Phi-3.5-mini", "Phi-4-mini"), "Phi3Config",
        fused_projections=(("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))),
        support=(
            Support(TRTLLM, refused=_NOT_EXPORTED_012),
            Support(EDGELLM, refused=_NOT_VERIFIED_EDGELLM),
        ), notes="fused qkv and gate_up; longrope scaling; Phi-4-mini rotates 3/4 of each head and ties embeddings"),
    Family(
        "Gemma2ForCausalLM", "Gemma 2", ("Gemma 2 2B",), "Gemma2Config", norm="rms_plus_one", sandwich_norms=True,
        activation="gelu_tanh", embedding_scale="sqrt_hidden",
        support=(
            Support(TRTLLM, refused=_NOT_EXPORTED_012),
            Support(EDGELLM, refused="Edge-LLM 0.11's exporter has a Gemma 4 model and no Gemma 2 path; its generic "
                                     "decoder has no (1 + w) RMSNorm, post-attention norms or embedding scaling"),
        ), notes="alternating 4096-token sliding window; attention and final logit soft-capping"),
    Family(
        "Gemma3ForCausalLM", "Gemma 3", ("Gemma 3 1B",), "Gemma3TextConfig", norm="rms_plus_one",
        sandwich_norms=True, activation="gelu_tanh", qk_norm=True, embedding_scale="sqrt_hidden",
        support=(
            Support(TRTLLM, refused="Gemma 3 was added to TensorRT-LLM after 0.12"),
            Support(EDGELLM, refused="Edge-LLM 0.11's exporter has a Gemma 4 model and no Gemma 3 path; its generic "
                                     "decoder has no (1 + w) RMSNorm, post-attention norms or embedding scaling"),
        ), notes="5 sliding-window layers to 1 global; q/k RMSNorm"),
)

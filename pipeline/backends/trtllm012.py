"""TensorRT-LLM 0.12 (v0.12.0-jetson, JetPack 6 on Orin): its flags, its build command, its registry record.

The 0.12 flag set is written down here once; the argv builder only emits flags from it, and the device refuses a
plan whose command holds anything else (also what the tests' trtllm-build double runs). Limits always come from
the memory plan: 0.12's own defaults (--max_batch_size 256, --max_num_tokens 8192) size buffers an 8 GB board
cannot hold. Paths are relative to the unpacked kit (checkpoint/) and its build dir (engine/).
"""

from __future__ import annotations

from pipeline.backends import (
    CUDA_CONTEXT,
    INT,
    SWITCH,
    TACTIC_FLOOR,
    Backend,
    BuildMemory,
    FlagTable,
    check_flags,
)
from pipeline.contract import AudioProfile, BuildLimits, ExportRecord, Speculative, VisualLimits

ENABLE = ("enable", "disable")
PLUGIN_DTYPE = ("auto", "float16", "float32", "bfloat16", "int32", "disable")

# trtllm-build 0.12 (tensorrt_llm/commands/build.py + plugin arguments), the subset this pipeline may emit,
# with what each takes. FACTS.md: --use_fused_mlp is a bare switch in 0.12; "flash attention" is --context_fmha.
TRTLLM_012_FLAGS: FlagTable = {
    "--checkpoint_dir": str, "--output_dir": str, "--log_level": ("error", "warning", "info", "verbose"),
    "--max_batch_size": INT, "--max_input_len": INT, "--max_seq_len": INT, "--max_num_tokens": INT,
    "--max_beam_width": INT, "--workers": INT, "--tokens_per_block": INT,
    "--gemm_plugin": PLUGIN_DTYPE, "--gpt_attention_plugin": PLUGIN_DTYPE,
    "--context_fmha": ENABLE, "--paged_kv_cache": ENABLE, "--remove_input_padding": ENABLE,
    "--use_paged_context_fmha": ENABLE, "--multiple_profiles": ENABLE,
    "--use_fused_mlp": SWITCH,
}
# Spelled in guides and later releases, rejected by 0.12 (FACTS.md): a clear message instead of argparse's.
NOT_IN_012 = {
    "--use_flash_attn": "use --context_fmha enable",
    "--strongly_typed": "removed before 0.12 (strongly typed is the default)",
    "--weight_only_precision": "a convert_checkpoint.py flag; the checkpoint's quantization config decides",
    "--kv_cache_type": "0.13+; 0.12 has --paged_kv_cache enable",
    "--norm_quant_fusion": "not in 0.12",
}


def check_trtllm_012_argv(argv: list[str]) -> list[str]:
    """Problems with a trtllm-build argv for TensorRT-LLM 0.12 (argv[0] is the program)."""
    return check_flags(argv, TRTLLM_012_FLAGS, "trtllm-build 0.12", NOT_IN_012)


def trtllm_build_argv(limits: BuildLimits, checkpoint_dir: str = "checkpoint", output_dir: str = "engine") -> list[str]:
    argv = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir,
            "--max_batch_size", str(limits.max_batch_size), "--max_input_len", str(limits.max_input_len),
            "--max_seq_len", str(limits.max_seq_len), "--max_num_tokens", str(limits.max_num_tokens),
            "--max_beam_width", "1",
            # fp16 GEMM and attention plugins: the checkpoint is fp16; 0.12 switches the quantized GEMMs
            # (W4A16 groupwise, SmoothQuant) to their plugins from the checkpoint's quantization config.
            "--gemm_plugin", "float16", "--gpt_attention_plugin", "float16",
            "--context_fmha", "enable", "--paged_kv_cache", "enable", "--remove_input_padding", "enable",
            "--tokens_per_block", "64", "--use_fused_mlp",
            # one builder process: a second one doubles the peak memory on a board that is already the limit
            "--workers", "1", "--log_level", "info"]
    problems = check_trtllm_012_argv(argv)
    assert not problems, problems         # our own table disagreeing with our own builder is a bug here
    return argv


def build_commands(limits: BuildLimits, _speculative: Speculative | None,
                   _visual: VisualLimits | None = None, _audio: AudioProfile | None = None) -> list[list[str]]:
    return [trtllm_build_argv(limits)]


# trtllm-build 0.12 (TensorRT-LLM's `build` path: `from_checkpoint` loads every tensor of rank*.safetensors into the
# model's parameters as numpy arrays; `to_trt` builds the network whose weights TensorRT copies to the GPU; the builder
# returns the serialized engine as one IHostMemory buffer that `Engine.save` writes while the model is still alive)
LIBRARIES = 1_000_000_000         # python + torch + tensorrt_llm + TensorRT libraries (trtllm-build is Python)


def build_memory(engine_weights: int, activations: int, _ffn_int4: int = 0) -> BuildMemory:
    """host = libraries + checkpoint arrays + serialized engine; device = engine weights + tactic workspace (~2x the
    engine's activations) + CUDA context. ffn_int4: ignored (0.12 keeps every weight inside the engine)."""
    return BuildMemory(
        host={"libraries": LIBRARIES, "checkpoint arrays": engine_weights, "serialized engine": engine_weights},
        device={"engine weights": engine_weights, "tactic workspace": 2 * activations + TACTIC_FLOOR,
                "CUDA context": CUDA_CONTEXT})


def export_summary(e: ExportRecord) -> str:
    check = e.reader_check
    cosine = f", read back: logit cosine {check.logit_cosine:.4f}" if check else ""
    return f"{e.quant_algo or e.weights} checkpoint{cosine}"


from pipeline.families.kinds import Support  # noqa: E402  (beside its use)
from pipeline.families.records import (  # noqa: E402
    GEMMA2,
    GEMMA3,
    GEMMA4,
    GEMMA4_MM,
    GPT_OSS,
    GPT_OSS_WHERE,
    LLAMA,
    MISTRAL,
    PHI3,
    QWEN2,
    QWEN3,
    QWEN3_ASR,
    QWEN3_MOE,
    VISION_LANGUAGE,
)
from pipeline.families.records import HYBRID as _HYBRID  # noqa: E402


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

# 0.12's multimodal path builds a vision engine with its own scripts for models of its time (Qwen-VL, BLIP-2, LLaVA;
# examples/multimodal) and none of these three; Edge-LLM 0.11's exporter writes their visual/ beside llm/ and its
# visual_build builds it on the board
_VLM_012 = ("TensorRT-LLM 0.12 (the last release for Orin on JetPack 6) predates it; vision-language models build "
            "with TensorRT Edge-LLM 0.11, on Orin with JetPack 7.2 and on Thor")

TRTLLM_012: dict[str, Support] = {
    LLAMA: _llama_012("0.12 MODEL_MAP; tests/workstation/test_export.py (tiny-llama, all formats)"),
    MISTRAL: _llama_012("0.12 MODEL_MAP: MistralForCausalLM -> LLaMAForCausalLM; tests/workstation/test_export.py "
                        "(tiny-mistral, all formats); tests/workstation/test_families.py (doit export)"),
    QWEN2: Support(trtllm_class="QWenForCausalLM", modelopt_decoder="qwen", rope_types=("default", "linear"),
                   verified="0.12 MODEL_MAP; tests/workstation/test_export.py (tiny-qwen2)"),
    QWEN3: Support(refused="Qwen3 was added to TensorRT-LLM after 0.12 (0.12's examples/qwen covers Qwen, Qwen1.5 "
                           "and Qwen2), and 0.12 is the last release for Orin on JetPack 6"),
    QWEN3_MOE: Support(refused="Qwen3-MoE was added to TensorRT-LLM after 0.12 (0.12's Qwen MoE is Qwen1.5-MoE's "
                               "shared-expert design); TensorRT Edge-LLM 0.11 builds it (its qwen3_moe model and MoE "
                               "plugins), on Orin with JetPack 7.2 and on Thor"),
    GPT_OSS: Support(refused=GPT_OSS_WHERE),
    PHI3: Support(refused=_PHI3_012),
    GEMMA2: Support(refused=_GEMMA2_012),
    GEMMA3: Support(refused="Gemma 3 was added to TensorRT-LLM after 0.12"),
    **{arch: Support(refused="Gemma 4 came after TensorRT-LLM 0.12 (the last release for Orin on JetPack 6); "
                             "TensorRT Edge-LLM 0.11 builds it (its gemma4 model), on Orin with JetPack 7.2 and on "
                             "Thor") for arch in (GEMMA4, GEMMA4_MM)},
    QWEN3_ASR: Support(refused="Qwen3-ASR (an audio encoder before a Qwen3 decoder) came after TensorRT-LLM 0.12; on "
                               "Orin it goes through TensorRT Edge-LLM on JetPack 7.2"),
    **{arch: Support(refused=_VLM_012) for arch in VISION_LANGUAGE},
    # 0.12 has Mamba (1) and RecurrentGemma, no Mamba-2 hybrid and no gated delta-net
    **{arch: Support(refused="hybrid recurrent models (Qwen3.5's gated delta-net, Nemotron-H's Mamba-2) came after "
                             "TensorRT-LLM 0.12, the last release for Orin on JetPack 6; TensorRT Edge-LLM 0.11 "
                             "builds them (its qwen3_5 and nemotron_h models), on Orin with JetPack 7.2 and on Thor")
       for arch in _HYBRID},
}

BACKEND = Backend(
    name="trtllm-0.12", label="TensorRT-LLM 0.12", payload="checkpoint", python_package="tensorrt_llm",
    install_hint="NVIDIA's TensorRT-LLM 0.12.0-jetson wheel for JetPack 6 (or dustynv/tensorrt_llm:0.12-r36.4.0)",
    runtime_overhead=1_000_000_000,
    perf_class="tensorrt",
    perf_note="decode speed predicted with constants fitted to TensorRT Edge-LLM rows: no TensorRT-LLM 0.12 Jetson "
              "decode figures are published in the reference set.",
    min_batch_size=1, speculative=False, export_depends_on_sm=False,
    export_tools=(), builders={"trtllm-build": check_trtllm_012_argv},
    build_commands=build_commands, output_flag="--output_dir",
    build_memory=build_memory, externalizes_int4_ffn=False, needs_chat_template=False,
    reports_kv_allocation=True, export_summary=export_summary,
    families=TRTLLM_012, shared_awq_scales=True,
    # 0.12's own convert_checkpoint.py reads GPTQ INT4 (W4A16_GPTQ, zero points); this pipeline writes 0.12
    # checkpoints through ModelOpt's converter and reads them back with its own reader, neither of which has
    # zero points yet
    checkpoint_only_note="this pipeline writes TensorRT-LLM 0.12 checkpoints through ModelOpt's converter, which has "
    "no zero-point INT4 (W4A16_GPTQ); build AutoAWQ/GPTQ checkpoints with Edge-LLM (JetPack 7.2 Orin, Thor), or "
    "quantize the unquantized model to int4_awq here",
    refuse_on_family={"thor": "TensorRT-LLM has no working Thor path (it refuses INT4/INT8 on SM >= 100); Thor "
                              "engines are built with TensorRT Edge-LLM: use backend = 'edgellm'."},
)

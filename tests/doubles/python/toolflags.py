"""For the TEST DOUBLES of trtllm-build and llm_build: each real tool's own command line, written here from the
tools' sources and docs as FACTS.md records them, never from the project's flag tables (pipeline/backends), so a
flag the project gets wrong fails here the way the real tool would fail it.

trtllm-build 0.12 (tensorrt_llm/commands/build.py parse_arguments + tensorrt_llm/plugin add_plugin_argument): Python
argparse, so an unknown flag or a bad choice exits 2 with argparse's message. FACTS.md: --use_fused_mlp is a bare
switch in 0.12 (it takes a value only from 0.13); --use_flash_attn, --strongly_typed, --weight_only_precision,
--kv_cache_type and --norm_quant_fusion do not exist in 0.12.

llm_build (TensorRT Edge-LLM 0.11, C++): --onnxDir, --engineDir, --maxInputLen, --maxKVCacheCapacity,
--maxBatchSize, --specBase / --specDraft (switches; --eagleBase / --eagleDraft their deprecated aliases),
--maxVerifyTreeSize, --maxDraftTreeSize (Edge-LLM's build documentation); an unknown option ends it with exit 1.

visual_build (TensorRT Edge-LLM 0.11, examples/multimodal/visual_build.cpp getopt table): --onnxDir, --engineDir,
--minImageTokens (default 4), --maxImageTokens (1024), --maxImageTokensPerImage (512), --debug,
--profilingDetailed; the per-image maximum must lie within min..max, else it exits 1.

audio_build (TensorRT Edge-LLM 0.11, examples/multimodal/audio_build.cpp getopt table "ho:e:dm:M:"): --onnxDir,
--engineDir (required), --debug, --minTimeSteps (default 100), --maxTimeSteps (6000), values read with std::stoll;
the engine goes to <engineDir>/audio/.
"""
from __future__ import annotations

import argparse

ENABLE = ("enable", "disable")
PLUGIN_DTYPE = ("auto", "float16", "float32", "bfloat16", "int32", "disable")


def trtllm_build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtllm-build")
    for flag in ("--checkpoint_dir", "--model_config", "--build_config", "--model_cls_file", "--model_cls_name",
                 "--output_dir", "--input_timing_cache", "--output_timing_cache", "--visualize_network"):
        p.add_argument(flag, type=str)
    for flag in ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_beam_width", "--max_num_tokens",
                 "--opt_num_tokens", "--max_encoder_input_len", "--max_prompt_embedding_table_size", "--workers",
                 "--max_lora_rank", "--max_draft_len", "--auto_parallel", "--gpus_per_node", "--tokens_per_block"):
        p.add_argument(flag, type=int)
    for flag in ("--strip_plan", "--weight_sparsity", "--weight_streaming", "--enable_debug_output", "--dry_run",
                 "--gather_context_logits", "--gather_generation_logits", "--gather_all_token_logits",
                 "--use_fused_mlp", "--fast_build", "--monitor_memory"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--log_level", choices=("internal_error", "error", "warning", "info", "verbose", "debug"))
    p.add_argument("--profiling_verbosity", choices=("layer_names_only", "detailed", "none"))
    p.add_argument("--logits_dtype", choices=("float16", "float32"))
    p.add_argument("--speculative_decoding_mode", choices=("draft_tokens_external", "lookahead_decoding", "medusa",
                                                           "explicit_draft_tokens"))
    # plugin arguments (add_plugin_argument): dtypes for the plugins, enable/disable for the features
    for flag in ("--bert_attention_plugin", "--gpt_attention_plugin", "--gemm_plugin", "--gemm_swiglu_plugin",
                 "--nccl_plugin", "--lookup_plugin", "--lora_plugin", "--moe_plugin", "--mamba_conv1d_plugin",
                 "--weight_only_groupwise_quant_matmul_plugin", "--weight_only_quant_matmul_plugin",
                 "--smooth_quant_plugins", "--smooth_quant_gemm_plugin", "--identity_plugin",
                 "--layernorm_quantization_plugin", "--rmsnorm_quantization_plugin", "--quantize_per_token_plugin",
                 "--quantize_tensor_plugin"):
        p.add_argument(flag, choices=PLUGIN_DTYPE)
    for flag in ("--context_fmha", "--bert_context_fmha_fp32_acc", "--paged_kv_cache", "--remove_input_padding",
                 "--reduce_fusion", "--enable_xqa", "--use_paged_context_fmha", "--use_fp8_context_fmha",
                 "--multiple_profiles", "--paged_state", "--streamingllm"):
        p.add_argument(flag, choices=ENABLE)
    return p


LLM_BUILD_VALUED = ("--onnxDir", "--engineDir", "--maxInputLen", "--maxKVCacheCapacity", "--maxBatchSize",
                    "--maxVerifyTreeSize", "--maxDraftTreeSize")
LLM_BUILD_SWITCHES = ("--specBase", "--specDraft", "--eagleBase", "--eagleDraft")
LLM_BUILD_INTEGERS = ("--maxInputLen", "--maxKVCacheCapacity", "--maxBatchSize", "--maxVerifyTreeSize",
                      "--maxDraftTreeSize")


def llm_build_options(argv: list[str]) -> tuple[dict[str, str], set[str]] | str:
    """(options with values, switches given) of an llm_build argv (argv[0] the program), or the error it would
    print. `--opt value` and `--opt=value` are both taken, as getopt_long takes them."""
    return getopt_options(argv, LLM_BUILD_VALUED, LLM_BUILD_SWITCHES, LLM_BUILD_INTEGERS)


VISUAL_BUILD_VALUED = ("--onnxDir", "--engineDir", "--minImageTokens", "--maxImageTokens", "--maxImageTokensPerImage")
VISUAL_BUILD_SWITCHES = ("--debug", "--profilingDetailed")
VISUAL_BUILD_INTEGERS = ("--minImageTokens", "--maxImageTokens", "--maxImageTokensPerImage")


def visual_build_options(argv: list[str]) -> tuple[dict[str, str], set[str]] | str:
    """As llm_build_options, for visual_build, with its defaults filled in and its own range check."""
    parsed = getopt_options(argv, VISUAL_BUILD_VALUED, VISUAL_BUILD_SWITCHES, VISUAL_BUILD_INTEGERS)
    if isinstance(parsed, str):
        return parsed
    values, switches = parsed
    values = {"--minImageTokens": "4", "--maxImageTokens": "1024", "--maxImageTokensPerImage": "512", **values}
    lo, hi, per = (int(values[k]) for k in VISUAL_BUILD_INTEGERS)
    if not lo <= per <= hi:
        return f"maxImageTokensPerImage ({per}) must be within [minImageTokens ({lo}), maxImageTokens ({hi})]"
    return values, switches


AUDIO_BUILD_VALUED = ("--onnxDir", "--engineDir", "--minTimeSteps", "--maxTimeSteps")
AUDIO_BUILD_INTEGERS = ("--minTimeSteps", "--maxTimeSteps")


def audio_build_options(argv: list[str]) -> tuple[dict[str, str], set[str]] | str:
    """As llm_build_options, for audio_build, with its defaults filled in."""
    parsed = getopt_options(argv, AUDIO_BUILD_VALUED, ("--debug",), AUDIO_BUILD_INTEGERS)
    if isinstance(parsed, str):
        return parsed
    values, switches = parsed
    return {"--minTimeSteps": "100", "--maxTimeSteps": "6000", **values}, switches


def getopt_options(argv: list[str], valued: tuple[str, ...], switch_names: tuple[str, ...],
                   integers: tuple[str, ...]) -> tuple[dict[str, str], set[str]] | str:
    values: dict[str, str] = {}
    switches: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if name in switch_names and not eq:
            switches.add(name)
        elif name in valued:
            if not eq:
                i += 1
                if i >= len(argv):
                    return f"option '{name}' requires an argument"
                inline = argv[i]
            if name in integers and not inline.isdigit():
                return f"invalid value for {name}: {inline!r}"
            values[name] = inline
        else:
            return f"unrecognized option '{arg}'"
        i += 1
    for required in ("--onnxDir", "--engineDir"):
        if required not in values:
            return f"{required} is required"
    return values, switches

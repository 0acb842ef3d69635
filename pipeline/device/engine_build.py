"""The device's engine build command, derived from the plan: trtllm-build (TensorRT-LLM 0.12) or llm_build (Edge-LLM).

The 0.12 flag set is written down here once; the argv builder only emits flags from it, and check_trtllm_012_argv
(also what the tests' trtllm-build double runs) refuses anything else. Limits always come from the memory plan:
0.12's own defaults (--max_batch_size 256, --max_num_tokens 8192) size buffers an 8 GB board cannot hold.
Paths in the plan's command are relative to the unpacked kit (checkpoint/, onnx/) and its build dir (engine/).
"""

from __future__ import annotations

INT = "int"
SWITCH = "switch"
ENABLE = ("enable", "disable")
PLUGIN_DTYPE = ("auto", "float16", "float32", "bfloat16", "int32", "disable")

# trtllm-build 0.12 (tensorrt_llm/commands/build.py + plugin arguments), the subset this pipeline may emit,
# with what each takes. FACTS.md: --use_fused_mlp is a bare switch in 0.12; "flash attention" is --context_fmha.
TRTLLM_012_FLAGS: dict[str, object] = {
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

# llm_build (Edge-LLM 0.11, examples/llm/llm_build.cpp getopt table): the options used here. Speculative decoding
# is --specBase / --specDraft (--eagleBase / --eagleDraft are its deprecated aliases); the base engine is built with
# its verify-tree limit, the draft with its draft-tree limit, both into one engine directory
# (spec_base.engine + base_config.json, spec_draft.engine + draft_config.json), which llm_inference --specDecode loads.
LLM_BUILD_FLAGS: dict[str, object] = {"--onnxDir": str, "--engineDir": str, "--maxInputLen": INT,
                                      "--maxKVCacheCapacity": INT, "--maxBatchSize": INT,
                                      "--specBase": SWITCH, "--specDraft": SWITCH,
                                      "--maxVerifyTreeSize": INT, "--maxDraftTreeSize": INT}
LLM_BUILD_RENAMED = {"--eagleBase": "deprecated alias: use --specBase", "--eagleDraft": "deprecated alias: use --specDraft"}
# Edge-LLM's known issue: engines built for batch 1 fail at run time; build for at least 2.
EDGELLM_MIN_BATCH = 2


def trtllm_build_argv(plan: dict, checkpoint_dir: str = "checkpoint", output_dir: str = "engine") -> list[str]:
    lim = plan["limits"]
    argv = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir,
            "--max_batch_size", str(lim["max_batch_size"]), "--max_input_len", str(lim["max_input_len"]),
            "--max_seq_len", str(lim["max_seq_len"]), "--max_num_tokens", str(lim["max_num_tokens"]),
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


def llm_build_argv(plan: dict, onnx_dir: str = "onnx", engine_dir: str = "engine") -> list[str]:
    lim = plan["limits"]
    return ["llm_build", "--onnxDir", onnx_dir, "--engineDir", engine_dir,
            "--maxInputLen", str(lim["max_input_len"]), "--maxKVCacheCapacity", str(lim["max_seq_len"]),
            "--maxBatchSize", str(max(EDGELLM_MIN_BATCH, lim["max_batch_size"]))]


def device_build_commands(plan: dict) -> list[list[str]] | None:
    """The argvs the device runs in order inside the unpacked kit (None for a refused plan): one engine, or with
    an EAGLE-3 draft the base (onnx/base, --specBase) then the draft (onnx/draft, --specDraft) into one engine dir."""
    if not plan.get("ok", True) or plan.get("backend") is None:
        return None
    if plan["backend"] == "trtllm-0.12":
        return [trtllm_build_argv(plan)]
    spec = plan.get("speculative")
    if not spec:
        return [llm_build_argv(plan)]
    trees = ["--maxVerifyTreeSize", str(spec["max_verify_tree_size"]),
             "--maxDraftTreeSize", str(spec["max_draft_tree_size"])]
    return [llm_build_argv(plan, "onnx/base") + trees + ["--specBase"],
            llm_build_argv(plan, "onnx/draft") + trees + ["--specDraft"]]


def device_build_command(plan: dict) -> list[str] | None:
    """The (base) engine's argv (None for a refused plan)."""
    argvs = device_build_commands(plan)
    return argvs[0] if argvs else None


def _check(argv: list[str], table: dict, tool: str, unknown_hint: dict) -> list[str]:
    problems, i = [], 1
    while i < len(argv):
        flag = argv[i]
        name = flag.split("=", 1)[0]
        if name not in table:
            hint = unknown_hint.get(name)
            problems.append(f"{tool} has no flag {name}" + (f" ({hint})" if hint else ""))
            i += 1
            continue
        kind = table[name]
        if kind == SWITCH:
            if "=" in flag or (i + 1 < len(argv) and not argv[i + 1].startswith("--")):
                value = flag.split("=", 1)[1] if "=" in flag else argv[i + 1]
                problems.append(f"{name} is a bare switch in {tool}; it takes no value (got {value!r})")
                i += 1 if "=" in flag else 2
                continue
            i += 1
            continue
        if "=" in flag:
            value, i = flag.split("=", 1)[1], i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            problems.append(f"{name} needs a value")
            break
        if kind == INT and not value.isdigit():
            problems.append(f"{name} takes an integer, got {value!r}")
        elif isinstance(kind, tuple) and value not in kind:
            problems.append(f"{name} takes one of {'/'.join(kind)}, got {value!r}")
    return problems


def check_trtllm_012_argv(argv: list[str]) -> list[str]:
    """Problems with a trtllm-build argv for TensorRT-LLM 0.12 (argv[0] is the program)."""
    return _check(argv, TRTLLM_012_FLAGS, "trtllm-build 0.12", NOT_IN_012)


def check_llm_build_argv(argv: list[str]) -> list[str]:
    problems = _check(argv, LLM_BUILD_FLAGS, "llm_build", LLM_BUILD_RENAMED)
    if "--specBase" in argv and "--specDraft" in argv:
        problems.append("llm_build builds a base or a draft engine, not both at once")
    for required in ("--onnxDir", "--engineDir"):
        if required not in argv:
            problems.append(f"llm_build needs {required}")
    return problems

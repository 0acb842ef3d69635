"""TensorRT Edge-LLM (JetPack 7: Thor, and Orin on 7.2): llm_build's options, the build commands, the record.

llm_build (Edge-LLM 0.11, examples/llm/llm_build.cpp getopt table): the options used here. Speculative decoding
is --specBase / --specDraft (--eagleBase / --eagleDraft are its deprecated aliases); the base engine is built with
its verify-tree limit, the draft with its draft-tree limit, both into one engine directory
(spec_base.engine + base_config.json, spec_draft.engine + draft_config.json), which llm_inference --specDecode loads.

visual_build (Edge-LLM 0.11, examples/multimodal/visual_build.cpp getopt table; cpp/builder/visualBuilder.{h,cpp}):
--onnxDir (reads model.onnx and config.json there; it refuses a directory without config.json), --engineDir (the
engine lands in <engineDir>/visual/: visual.engine, config.json with the exported config and a builder_config of
min_image_tokens / max_image_tokens / max_image_tokens_per_image merged in, and preprocessor_config.json copied beside
it for the runtime's image preprocessing), --minImageTokens (default 4), --maxImageTokens (1024, all images of a
request), --maxImageTokensPerImage (512; it must lie within min..max, else visual_build exits 1), --debug,
--profilingDetailed. The profile: Qwen towers take 4 patches per image token (min/opt/max HW = 4 x tokens, opt at
the midpoint); InternVL takes whole 256-token tiles (min and max must divide by 256, else it fails). A
vision-language export is Edge-LLM's exporter's layout: onnx/llm (llm_build) and onnx/visual (visual_build);
llm_inference then takes --engineDir engine --multimodalEngineDir engine/visual (examples/llm/llm_inference.cpp);
an image is a content item of a message, {"type": "image", "image": <file path>} (examples/utils/
requestFileParser.cpp, which loads the file and preprocesses it by the visual engine's preprocessor_config.json),
and the profile JSON gains "multimodal": {total_runs, total_images, total_image_tokens, total_audios,
total_audio_tokens, total_multimodal_tokens, average_time_per_token_ms} (examples/utils/profileFormatter.cpp
addJsonMultimodalSummary: the vision stages' GPU time over the image tokens), from which one image's ViT time is
average_time_per_token_ms x total_image_tokens / total_images.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

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
from pipeline.backends.edgellm_layout import LLM_DIR, VISUAL_DIR, audio_build_argv
from pipeline.contract import AudioProfile, BuildLimits, ExportRecord, Speculative, VisualLimits

if TYPE_CHECKING:
    from pipeline.formats import KVFormat, WeightFormat

LLM_BUILD_FLAGS: FlagTable = {"--onnxDir": str, "--engineDir": str, "--maxInputLen": INT,
                              "--maxKVCacheCapacity": INT, "--maxBatchSize": INT,
                              "--specBase": SWITCH, "--specDraft": SWITCH,
                              "--maxVerifyTreeSize": INT, "--maxDraftTreeSize": INT}
LLM_BUILD_RENAMED = {"--eagleBase": "deprecated alias: use --specBase",
                     "--eagleDraft": "deprecated alias: use --specDraft"}
# Edge-LLM's known issue: engines built for batch 1 fail at run time; build for at least 2.
EDGELLM_MIN_BATCH = 2


def check_llm_build_argv(argv: list[str]) -> list[str]:
    problems = check_flags(argv, LLM_BUILD_FLAGS, "llm_build", LLM_BUILD_RENAMED)
    if "--specBase" in argv and "--specDraft" in argv:
        problems.append("llm_build builds a base or a draft engine, not both at once")
    for required in ("--onnxDir", "--engineDir"):
        if required not in argv:
            problems.append(f"llm_build needs {required}")
    return problems


def llm_build_argv(limits: BuildLimits, onnx_dir: str = "onnx", engine_dir: str = "engine") -> list[str]:
    return ["llm_build", "--onnxDir", onnx_dir, "--engineDir", engine_dir,
            "--maxInputLen", str(limits.max_input_len), "--maxKVCacheCapacity", str(limits.max_seq_len),
            "--maxBatchSize", str(max(EDGELLM_MIN_BATCH, limits.max_batch_size))]


VISUAL_BUILD_FLAGS: FlagTable = {"--onnxDir": str, "--engineDir": str, "--minImageTokens": INT,
                                  "--maxImageTokens": INT, "--maxImageTokensPerImage": INT}


def check_visual_build_argv(argv: list[str]) -> list[str]:
    problems = check_flags(argv, VISUAL_BUILD_FLAGS, "visual_build", {})
    for required in ("--onnxDir", "--engineDir", "--minImageTokens", "--maxImageTokens", "--maxImageTokensPerImage"):
        if required not in argv:
            problems.append(f"visual_build needs {required}")
    if not problems:
        value = {f: int(argv[argv.index(f) + 1]) for f in VISUAL_BUILD_FLAGS if VISUAL_BUILD_FLAGS[f] is INT}
        problems += VisualLimits(value["--minImageTokens"], value["--maxImageTokens"],
                                 value["--maxImageTokensPerImage"]).problems()
    return problems


def visual_build_argv(visual: VisualLimits, onnx_dir: str = f"onnx/{VISUAL_DIR}", engine_dir: str = "engine"
                      ) -> list[str]:
    """The visual engine into <engine_dir>/visual/ (visual_build adds the last part itself)."""
    return ["visual_build", "--onnxDir", onnx_dir, "--engineDir", engine_dir,
            "--minImageTokens", str(visual.min_image_tokens), "--maxImageTokens", str(visual.max_image_tokens),
            "--maxImageTokensPerImage", str(visual.max_image_tokens_per_image)]


AUDIO_BUILD_FLAGS: FlagTable = {"--onnxDir": str, "--engineDir": str, "--minTimeSteps": INT, "--maxTimeSteps": INT}


def check_audio_build_argv(argv: list[str]) -> list[str]:
    problems = check_flags(argv, AUDIO_BUILD_FLAGS, "audio_build", {})
    # Code2Wav (onnx/code2wav) and an RNN-T step (onnx/rnnt_decoder: static shapes) take no time-step profile:
    # their guides build them with --onnxDir and --engineDir
    code2wav = "--onnxDir" in argv and argv[argv.index("--onnxDir") + 1:][:1] in (["onnx/code2wav"],
                                                                                  [f"onnx/{RNNT_DIR}"])
    for required in AUDIO_BUILD_FLAGS if not code2wav else ("--onnxDir", "--engineDir"):
        if required not in argv:
            problems.append(f"audio_build needs {required}")
    if not problems and not code2wav:
        problems += AudioProfile(int(argv[argv.index("--minTimeSteps") + 1]),
                                 int(argv[argv.index("--maxTimeSteps") + 1])).problems()
    return problems


# the speech models without a decoder's parts: their builds and the RNN-T's run directory (their own module)
from pipeline.backends.edgellm_speech import (  # noqa: E402  (beside its use)
    RNNT_DIR,
    finish_speech_build,
    speech_build_commands,
)


def build_commands(limits: BuildLimits, speculative: Speculative | None,
                   visual: VisualLimits | None = None, audio: AudioProfile | None = None) -> list[list[str]]:
    """One engine, or with a draft (EAGLE-3, MTP) the base (onnx/base, --specBase) then the draft (onnx/draft,
    --specDraft) into one engine directory; a vision-language model's language model from onnx/llm (onnx/base and
    onnx/draft with a draft), then its visual engine from onnx/visual; a speech model's from onnx/llm, then its audio
    encoder's from onnx/audio."""
    tower = [visual_build_argv(visual)] if visual is not None else []
    if audio is not None:
        return [llm_build_argv(limits, f"onnx/{LLM_DIR}"), audio_build_argv(audio)]
    if speculative is None:
        return [llm_build_argv(limits, f"onnx/{LLM_DIR}" if visual is not None else "onnx")] + tower
    verify = ["--maxVerifyTreeSize", str(speculative.max_verify_tree_size)]
    draft = ["--maxDraftTreeSize", str(speculative.max_draft_tree_size)]
    if speculative.method == "mtp":     # its guide's MTP build: each engine takes the size of its own side
        return [llm_build_argv(limits, "onnx/base") + verify + ["--specBase"],
                llm_build_argv(limits, "onnx/draft") + draft + ["--specDraft"]] + tower
    return [llm_build_argv(limits, "onnx/base") + verify + draft + ["--specBase"],
            llm_build_argv(limits, "onnx/draft") + verify + draft + ["--specDraft"]] + tower


# llm_build is C++: the ONNX parser keeps the external weight data in host memory, TensorRT copies it to the GPU, the
# serialized engine is one host buffer; its issue tracker reports ~3-4x the parameter bytes, and 0.8.0+ exports can
# keep INT4 FFN weights outside the engine, which removes them from all three
LIBRARIES = 400_000_000        # TensorRT and the ONNX parser


def build_memory(engine_weights: int, activations: int, ffn_int4: int = 0) -> BuildMemory:
    """host = libraries + parsed ONNX weights + serialized engine; device = engine weights + tactic workspace +
    CUDA context. ffn_int4: bytes of INT4 FFN weights the export keeps outside the engine (0: all inside)."""
    inside = engine_weights - ffn_int4
    return BuildMemory(
        host={"libraries": LIBRARIES, "parsed ONNX weights": inside, "serialized engine": inside},
        device={"engine weights": inside, "tactic workspace": 2 * activations + TACTIC_FLOOR,
                "CUDA context": CUDA_CONTEXT})


def export_summary(e: ExportRecord) -> str:
    if e.synthesis is not None:
        s = e.synthesis
        return (f"{e.weights} talker and code predictor, Code2Wav ONNX for SM {e.target_sm} ({len(s.speakers)} "
                f"voices; Code2Wav against the reference: cosine {s.code2wav_cosine})")
    if e.transducer is not None:
        t = e.transducer
        return (f"{e.weights} RNN-T encoder and step ONNX for SM {e.target_sm} (against transformers: encoder cosine "
                f"{t.encoder_cosine} on {t.recordings} recordings, step cosine {t.step_cosine} over {t.steps} steps)")
    if e.audio is not None:
        return f"{e.weights} ONNX for SM {e.target_sm}, {e.audio.precision} audio encoder"
    if e.visual is not None:
        # ModelOpt's quant_algo describes the whole checkpoint (FP8 for an FP16 language model beside an FP8 tower):
        # a vision-language model's language model is named by its recipe format, its tower by its own
        return f"{e.weights} ONNX for SM {e.target_sm}, {e.visual.precision} visual tower"
    return f"{e.quant_algo or e.weights} ONNX for SM {e.target_sm}"


from pipeline.families.kinds import GATED_DELTA_NET, MAMBA2, Support  # noqa: E402  (beside its use)
from pipeline.families.records import (  # noqa: E402
    GEMMA2,
    GEMMA3,
    GEMMA4,
    GEMMA4_MM,
    GPT_OSS,
    GPT_OSS_WHERE,
    LLAMA,
    MISTRAL,
    NEMOTRON_H,
    PHI3,
    QWEN2,
    QWEN3,
    QWEN3_5,
    QWEN3_5_MM,
    QWEN3_5_MOE,
    QWEN3_5_MOE_MM,
    QWEN3_ASR,
    QWEN3_MOE,
    VISION_LANGUAGE,
)

# Edge-LLM 0.11's generic decoder (tensorrt_edgellm/models/default, config.py ModelConfig) reads RoPE scaling
# (linear, dynamic, llama3, longrope, yarn) and partial rotary from config.json, and its attention plugin applies q/k
# norm; the runtime computes the RoPE table (for LongRoPE one factor set per engine: Support.longrope_per_engine).
# Listed are the RoPE types a test of this repo checked the exported graph with (the runtime double computes them).
_EDGELLM_ROPE = ("default", "llama3", "longrope")
# a family Edge-LLM's own supported-models list does not name is registered with the formats a test here checked:
# tests/workstation/test_families.py on the CPU, NVFP4 by tests/workstation/test_nvfp4.py on a GPU (an H200, 2026-11-24)
_PHI3_CHECKED = (("fp16", "int4_awq", "fp8", "nvfp4"), ("fp16", "fp8"),
                 "INT8 SmoothQuant (Orin on JetPack 7.2) is not settled here yet for this family")


def _edgellm_dense(verified: str, formats: tuple[str, ...] | None = None, kv_cache: tuple[str, ...] | None = None,
                   formats_why: str = "") -> Support:
    return Support(rope_types=_EDGELLM_ROPE, partial_rotary=True, longrope_per_engine=True, formats=formats,
                   kv_cache=kv_cache, formats_why=formats_why, verified=verified)


_GEMMA4_TOWERS = ("its image tower is not exported yet (Edge-LLM's exporter takes the language model from the "
                  "checkpoint), so image requests are refused by the server; its audio tower (E2B, E4B) is built "
                  "beside the language model where the recipe has [build.audio]")
# Gemma 4: planned from its layers as they are (plan/shapes.py LayerGeometry; the published E4B rows on Thor in
# tests/shared/test_gemma4_plan.py); its text model builds, from a text checkpoint or the hub's multimodal one (whose
# towers wait for their export)
_EDGELLM_GEMMA4 = Support(
    rope_types=("default",), sliding_window=True, softcapping=True, partial_rotary=True,
    # FP16 KV only here: 0.11's gemma4 model enables the FP8 KV cache from the checkpoint's k_scale as the others do,
    # but it drops a KV-shared layer's k_proj and v_proj, from which its exporter takes the K/V scales (onnx/
    # export.py: 1.0 where absent), so E2B's and E4B's shared layers would read the donor's FP8 cache with scales of
    # 1.0; and the runtime double's FP8 attention has not been brought to agree with the calibrated Gemma 4 (a random
    # tiny one: logit cosine 0.995 with an FP8 KV cache against 0.99999 without)
    formats=("fp16", "int4_awq", "fp8", "nvfp4"), kv_cache=("fp16",),
    formats_why="the formats a test here took through Edge-LLM's gemma4 export and the runtime double",
    # Edge-LLM 0.11's gemma4 MoE block (the 26B-A4B: experts beside every layer's MLP): NVFP4 through Nvfp4MoePlugin
    # (GeGLU, routing mode 2: softmax, top-k, renormalized, then the per-expert scales it is given in the bias slot)
    expert_formats=("nvfp4",),
    expert_formats_why="0.11's INT4 block gives its Int4MoePlugin no input for the router's per-expert scales (it "
                       "registers them and passes them nowhere), so every expert's output would be unscaled; its "
                       "FP16 block is an export fallback without an MoE plugin that runs every expert for every "
                       "token",
    verified="Edge-LLM 0.11 exporter (models/gemma4: per-layer attention types and widths, KV sharing, per-layer "
             "input embeddings); tests/workstation/test_gemma4_build.py (tiny Gemma 4 FP16 and INT4-AWQ through doit "
             "build, the device half and serve, a multimodal checkpoint's language model; run by the runtime double "
             "against transformers' Gemma 4), tests/workstation/test_families.py (FP8), "
             "tests/workstation/test_moe_double_modes.py (Nvfp4MoePlugin's GeGLU and routing mode 2 in the double "
             "against transformers' Gemma 4 router and experts, packed by Edge-LLM's own repacking); the 26B-A4B's "
             "MoE block in NVFP4 through doit build, the device half and serve is "
             "tests/workstation/test_moe_nvfp4_build.py, for a GPU machine (its first H200 run found the routers "
             "unloaded, fixed by edgellm_export.loader_key_remap; not yet run again there), "
             "tests/workstation/test_nvfp4.py (NVFP4, on a GPU), tests/shared/test_gemma4_plan.py")
_NO_GEMMA_PATH = ("Edge-LLM 0.11's exporter has a Gemma 4 model and no {} path; its generic decoder has no (1 + w) "
                  "RMSNorm, post-attention norms or embedding scaling")

# Edge-LLM 0.11 exports these (tensorrt-edgellm-export: llm/ and visual/, its models/qwen2_5_vl, qwen3_vl and internvl3)
# and builds the tower with visual_build. The language model exports as a dense one (Qwen3-VL with DeepStack inputs);
# the tower is exported by Edge-LLM's own exporter in FP16 (FP8 on SM 8.9+ when asked) and checked against transformers'
_VLM_VERIFIED = ("Edge-LLM 0.11 exporter (llm/ + visual/); tests/workstation/test_visual_export.py (tiny models of the "
                 "family: language model INT4-AWQ / FP8 through the runtime double, tower against transformers), "
                 "tests/workstation/test_vlm_build.py (an FP8 tower)")

# Edge-LLM 0.11 exports Qwen3.5 (qwen3_5: gated_delta_net plugin, FP32 state) and Nemotron-H (nemotron_h:
# update_ssm_state and causal_conv1d plugins) and publishes Qwen3.5 INT4-AWQ rows on every Orin and INT4-AWQ / NVFP4
# on Thor. Planned here (plan/parts/hybrid.py: their state pools as its runtime allocates them) and built as its
# quantizer makes them: INT4-AWQ with each linear's own AWQ scale, a gated delta-net's beta/alpha projections and any
# linear not 64-aligned kept FP16 (ModelShape.kept_fp16); NVFP4 (on a GPU) with the export's resmoothing, a gated
# delta-net's qkv and z projections sharing one global scale (calibrate.FUSED_GROUPS). The runtime double computes
# their plugins. the plugins a hybrid's recurrent layers export to (tensorrt_edgellm/models/ops.py), and the per-layer
# state its graph takes in and gives back (present_<name>_<i>), numbered over the recurrent layers
RECURRENT_OPS = {GATED_DELTA_NET: ("trt_edgellm:gated_delta_net", "trt_edgellm:causal_conv1d"),
                 MAMBA2: ("trt_edgellm:update_ssm_state", "trt_edgellm:causal_conv1d")}
STATE_INPUTS = ("conv_state", "recurrent_state")
_EDGELLM_QWEN3_5 = Support(
    rope_types=("default",), partial_rotary=True, formats=("fp16", "int4_awq", "nvfp4"), kv_cache=("fp16", "fp8"),
    formats_why="the formats Edge-LLM 0.11 publishes for Qwen3.5 (INT4-AWQ on Orin, INT4-AWQ and NVFP4 on Thor)",
    recurrent_head_dim=128,
    # its config reader (config.py _validate_mtp_constraints) raises NotImplementedError for any Qwen3.5 config whose
    # mtp_num_hidden_layers is not 1 or that gives the draft its own embeddings, whatever is exported
    mtp_layers=(1,), mtp_dedicated_embeddings=False,
    # its MTP layer as a draft ([draft] method = "mtp"): Edge-LLM 0.11's mtp_base / mtp_draft exports (models/qwen3_5
    # modeling_qwen3_5_mtp.py), tests/workstation/test_mtp_build.py
    mtp_draft_unbuilt=None,
    verified="Edge-LLM 0.11 exporter (models/qwen3_5: gated_delta_net and causal_conv1d plugins); "
             "tests/workstation/test_hybrid_build.py (tiny Qwen3.5 INT4-AWQ through doit build, the device half and "
             "serve; the runtime double against transformers' Qwen3.5 past a 64-token chunk in FP16 and against the "
             "calibrated model in INT4-AWQ), tests/workstation/test_nvfp4.py (NVFP4, on a GPU); "
             "tests/shared/test_hybrid_plan.py (the plan against its published rows)")

# speech models that are not decoders (plan/speech_plan.py; families/audio.py SPEECH_MODELS: each stage's work)
EDGELLM_011_SPEECH = {
    "qwen3_tts": Support(
        formats=("fp16",),
        formats_why="Edge-LLM 0.11 builds Qwen3-TTS's talker in FP16 only (its TTS guide: quantized talker "
                    "checkpoints are not supported yet; only the code predictor takes FP8 or NVFP4)",
        verified="tensorrt_edgellm/models/qwen3_tts, scripts/export.py; tests/shared/test_synthesis_plan.py (every "
                 "part counted against its modules)"),
    # its runtime is experimental in 0.11 (experimental_models/nemotron3_5_asr: NemotronAsrRuntime and its pybind
    # binding, built with -DBUILD_EXPERIMENTAL_MODELS=ON): a board's runtime without it is refused by the device run
    "nemotron3_5_asr": Support(
        formats=("fp16",),
        formats_why="Edge-LLM 0.11 exports its encoder and RNN-T step in FP16 only (audio_build's graphs)",
        verified="tensorrt_edgellm/models/nemotron3_5_asr, scripts/export.py; tests/shared/test_transducer_plan.py "
                 "(every part counted against transformers' Nemotron3_5AsrForRNNT); tests/workstation/"
                 "test_transducer.py (the export against transformers, encoder and every greedy step); "
                 "tests/device/test_transducer_device.py (the kit through the runtime double)"),
}

EDGELLM_011: dict[str, Support] = {
    LLAMA: _edgellm_dense("tests/workstation/test_edgellm_export.py (tiny-llama)"),
    MISTRAL: _edgellm_dense("its generic decoder; tests/workstation/test_families.py (tiny-mistral: FP16, INT4-AWQ, "
                            "FP8, the FP8 KV cache, INT8 SmoothQuant for SM 8.7; run by the runtime double), "
                            "tests/workstation/test_nvfp4.py (NVFP4, on a GPU)"),
    QWEN2: _edgellm_dense("Edge-LLM supported models (Qwen2/2.5, DeepSeek-R1-Distill)"),
    QWEN3: _edgellm_dense("Edge-LLM supported models; tests/workstation/test_families.py (tiny-qwen3: q/k norm in the "
                          "attention plugin, FP16, INT4-AWQ, FP8, the FP8 KV cache, INT8 SmoothQuant for SM 8.7; run "
                          "by the runtime double), tests/workstation/test_nvfp4.py (NVFP4, on a GPU)"),
    PHI3: _edgellm_dense("its generic decoder (fused projections split by its loader, partial_rotary_factor); "
                         "tests/workstation/test_families.py (tiny-phi3 FP16, FP8, the FP8 KV cache and INT4-AWQ "
                         "through the V1 plugin, tiny-phi3-h128 INT4-AWQ through V2, tiny-phi3-longrope; run by the "
                         "runtime double), tests/workstation/test_nvfp4.py (NVFP4, on a GPU)", *_PHI3_CHECKED),
    # planned by all its experts (memory) and the ones each step reaches (decode: plan/parts/experts_speed.py)
    QWEN3_MOE: dataclasses.replace(
        _edgellm_dense("Edge-LLM 0.11 exporter (models/qwen3_moe: Int4MoePlugin (Marlin) on Orin and Thor, "
                       "Nvfp4MoePlugin on Thor, Fp16MoePlugin); tests/workstation/test_moe_build.py (tiny Qwen3-MoE "
                       "FP16 and INT4-AWQ through doit build and the device half; the MoE plugins run by the runtime "
                       "double), tests/workstation/test_nvfp4.py (NVFP4 experts through Nvfp4MoePlugin, on a GPU), "
                       "tests/shared/test_moe_plan.py (the plan against its published Qwen3-30B-A3B rows)",
                       ("fp16", "int4_awq", "nvfp4"), ("fp16",),
                       formats_why="Edge-LLM 0.11's MoE plugins are FP16, INT4 (Marlin) and NVFP4"),
        renormalizes_topk=True),
    GPT_OSS: Support(refused=GPT_OSS_WHERE),
    GEMMA4: _EDGELLM_GEMMA4,
    GEMMA4_MM: dataclasses.replace(_EDGELLM_GEMMA4, text_only=_GEMMA4_TOWERS),
    GEMMA2: Support(refused=_NO_GEMMA_PATH.format("Gemma 2")),
    GEMMA3: Support(refused=_NO_GEMMA_PATH.format("Gemma 3")),
    **{arch: _edgellm_dense(_VLM_VERIFIED) for arch in VISION_LANGUAGE},
    QWEN3_5: _EDGELLM_QWEN3_5,
    # the hub's multimodal checkpoints: the language model as above, the tower as Qwen3-VL's without DeepStack
    # (Edge-LLM's qwen3_5 visual model), exported to visual/ and run by the double's multimodal runtime
    QWEN3_5_MM: dataclasses.replace(
        _EDGELLM_QWEN3_5, mtp_draft_unbuilt="the multimodal checkpoint's MTP draft (its llm/ export beside the tower) "
        "has not been taken through here; the text checkpoint's has",
        verified=_EDGELLM_QWEN3_5.verified + "; Edge-LLM 0.11 exporter (models/qwen3_5 visual: "
        "Qwen3-VL's tower without DeepStack); tests/workstation/test_hybrid_vlm_build.py (tiny multimodal Qwen3.5 "
        "INT4-AWQ with an FP16 tower through doit build, its tower checked against transformers in the export, its "
        "image goldens validated through the runtime double on the recorded Orin Nano, served)"),
    # Qwen3.5-MoE: Edge-LLM 0.11's qwen3_5_moe model is Qwen3.5's mixers with Qwen3-MoE's sparse block (its MoE
    # plugins: INT4 Marlin, NVFP4, FP16) and the shared expert as plain linears behind its sigmoid gate; planned with
    # its MoE blocks as the MoE fit prices them and its delta-nets as the hybrid fit does
    **{arch: dataclasses.replace(
        _EDGELLM_QWEN3_5, renormalizes_topk=True,
        mtp_draft_unbuilt="Edge-LLM 0.11 exports Qwen3.5-MoE's MTP layer as an MoE draft (Qwen3_5MoeMtpDraftModel); "
                          "it has not been taken through here yet",
        verified="Edge-LLM 0.11 exporter (models/qwen3_5_moe: Qwen3SparseMoeBlock's MoE plugins and gated shared "
                 "expert beside models/qwen3_5's mixers); tests/workstation/test_hybrid_moe_build.py (tiny "
                 "Qwen3.5-MoE INT4-AWQ through doit build, the device half and serve, the runtime double against the "
                 "calibrated model, FP16 against transformers' Qwen3.5-MoE), tests/workstation/test_nvfp4.py (NVFP4 "
                 "experts through Nvfp4MoePlugin, on a GPU); tests/shared/test_hybrid_plan.py (every weight as "
                 "transformers' Qwen3.5-MoE builds it; the plan on AGX Orin and Thor)")
       for arch in (QWEN3_5_MOE, QWEN3_5_MOE_MM)},
    # Qwen3-ASR: Edge-LLM 0.11 exports its decoder as a dense Qwen3 (models/qwen3_asr: the default CausalLM) and its
    # encoder as audio/model.onnx (FP16), built with audio_build (plan/parts/audio.py, workstation/audio_export.py)
    QWEN3_ASR: _edgellm_dense(
        "Edge-LLM 0.11 exporter (models/qwen3_asr: onnx/llm as a dense Qwen3, onnx/audio by its audio export); "
        "tests/workstation/test_asr_build.py (tiny Qwen3-ASR in the original thinker layout through doit build, "
        "audio_build and the device half: the double runs the encoder graph on its own Whisper features); "
        "tests/workstation/test_audio_export.py (the encoder against transformers' across chunks and windows); "
        "tests/shared/test_speech_plan.py"),
    NEMOTRON_H: Support(rope_types=("default",), formats=("fp16", "int4_awq", "nvfp4"), kv_cache=("fp16", "fp8"),
                        formats_why="the formats Edge-LLM 0.11 builds for Nemotron-H's linears (FP16, INT4-AWQ, "
                                    "NVFP4); its Mamba-2 state stays FP16",
                        # Nemotron 3 Nano 30B-A3B's MoE blocks (relu2 experts beside a shared one, sigmoid routing
                        # with a score correction): 0.11's nemotron_h exports routed experts through its NVFP4 MoE
                        # plugins only (Nvfp4MoePlugin; weight-only NVFP4 through Marlin's Nvfp4A16MoePlugin for a
                        # W4A16 checkpoint), the shared expert as the checkpoint quantizes it
                        expert_formats=("nvfp4",),
                        expert_formats_why="0.11's nemotron_h has no INT4 or FP16 MoE block",
                        # transformers 5 saves the hub's embedding.weight as embedding.weight under backbone. (its
                        # conversion mapping), and 0.11's nemotron_h loader reads backbone.embeddings.weight: without
                        # it, it keeps its own random embedding and exports without a word (workstation/
                        # edgellm_hybrid.py)
                        checkpoint_renames=(("backbone.embedding.weight", "backbone.embeddings.weight"),),
                        mtp_dedicated_embeddings=False,     # its config reader raises on them for Nemotron-H too
                        verified="Edge-LLM 0.11 exporter (models/nemotron_h: update_ssm_state and causal_conv1d "
                                 "plugins; its loader reads backbone.embeddings.weight: "
                                 "workstation/edgellm_hybrid.py); tests/workstation/test_hybrid_build.py (tiny "
                                 "Nemotron-H INT4-AWQ through doit build, the device half and serve; the runtime "
                                 "double against transformers' Nemotron-H in FP16 and against the calibrated model "
                                 "in INT4-AWQ), tests/workstation/test_nvfp4.py (NVFP4, on a GPU); "
                                 "tests/workstation/test_nvfp4.py (the MoE twin in NVFP4 with an FP8 KV cache "
                                 "against the calibrated model, on an H200), "
                                 "tests/workstation/test_moe_nvfp4_build.py (its doit build, device half and serve, "
                                 "for a GPU machine: on an H200 the build reached packaging); "
                                 "tests/workstation/test_moe_double_modes.py (Nvfp4MoePlugin's relu2 and routing mode "
                                 "1 in the double against transformers' Nemotron-H router and experts); "
                                 "tests/shared/test_hybrid_plan.py"),
}


# Edge-LLM 0.11's checkpoint reader (tensorrt_edgellm/config.py) returns ModelOpt's W4A16_AWQ quantization without a
# kv_cache_quant, where every other format detects the FP8 KV cache from the checkpoint's k_proj.k_scale: the engine
# would keep an FP16 KV cache and ignore the calibrated K/V scales (seen here: enable_fp8_kv_cache = 0 in the ONNX).
def refuses_pair(weights: WeightFormat, kv: KVFormat) -> str | None:
    if weights.trtllm_quant_algo == "W4A16_AWQ" and kv.trtllm_kv_algo == "FP8":       # ModelOpt's quant_algo names
        return ("Edge-LLM 0.11 loads a ModelOpt INT4-AWQ checkpoint without its FP8 KV cache (its W4A16_AWQ config "
                "path sets no kv_cache_quant), so the engine would keep an FP16 KV cache. Use kv_cache = 'fp16' with "
                "int4_awq, or fp8 or nvfp4 weights with the FP8 KV cache")
    return None

BACKEND = Backend(
    name="edgellm", label="TensorRT Edge-LLM", payload="onnx", python_package="tensorrt_edgellm",
    install_hint="tensorrt-edgellm {version} (its llm_build and llm_inference for this JetPack)",
    runtime_overhead=500_000_000, perf_class="tensorrt", perf_note=None, min_batch_size=EDGELLM_MIN_BATCH,
    speculative=True,
    export_depends_on_sm=True, export_tools=("tensorrt-edgellm", "onnx"),
    builders={"llm_build": check_llm_build_argv, "visual_build": check_visual_build_argv,
              "audio_build": check_audio_build_argv},
    build_commands=build_commands, output_flag="--engineDir", speech_build_commands=speech_build_commands,
    finish_speech_build=finish_speech_build,
    build_memory=build_memory, externalizes_int4_ffn=True, needs_chat_template=True,
    reports_kv_allocation=False, export_summary=export_summary, families=EDGELLM_011, refuses_pair=refuses_pair,
    speech=EDGELLM_011_SPEECH,
    # its INT4 GEMM takes each linear's own pre-quant scale (Edge-LLM's own quantizer keeps them: shared ones
    # "collapse small-model accuracy", its quantization/quantize.py); its MoE experts have none (workstation/experts)
    shared_awq_scales=False,
)

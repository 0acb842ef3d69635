"""TensorRT Edge-LLM 0.11's builds of the speech models that are not decoders (families/audio.py SPEECH_MODELS), which
backends/edgellm.py registers (Backend.speech_build_commands, finish_speech_build): Qwen3-TTS's three engines and
Nemotron-3.5-ASR's two, and the one directory the RNN-T's runtime takes after its builds."""

from __future__ import annotations

from pathlib import Path

from pipeline.backends.edgellm_layout import AUDIO_DIR, LLM_DIR, audio_build_argv
from pipeline.contract import AudioProfile, BuildLimits

# Qwen3-TTS (its TTS guide, user_guide/examples/tts.md): the talker from onnx/llm and the code predictor from
# onnx/code_predictor, each into its own engine directory, at batch 1 ("--maxBatchSize 1 for the current Qwen3-TTS
# runtime"); Code2Wav from onnx/code2wav with audio_build into the engine root, which writes engine/code2wav itself
TTS_ENGINES = ("talker", "code_predictor")


def tts_build_commands(limits: BuildLimits) -> list[list[str]]:
    llm = [["llm_build", "--onnxDir", f"onnx/{src}", "--engineDir", f"engine/{part}",
            "--maxInputLen", str(limits.max_input_len), "--maxKVCacheCapacity", str(limits.max_seq_len),
            "--maxBatchSize", "1"] for src, part in ((LLM_DIR, TTS_ENGINES[0]), ("code_predictor", TTS_ENGINES[1]))]
    return llm + [["audio_build", "--onnxDir", "onnx/code2wav", "--engineDir", "engine"]]


# Nemotron-3.5-ASR (its guide, developer_guide/models/nemotron-3.5-asr.md): audio_build of onnx/audio into the
# engine root (it writes engine/audio/audio_encoder.engine), its profile in mel frames: from the graph's least
# (the export's dynamic dimension starts at 8; audio_build's own default, 100, would refuse recordings under a
# second) to the plan's longest recording; audio_build of onnx/rnnt_decoder (static: no profile), which writes
# engine/rnnt_decoder/rnnt_step.engine. The runtime takes one directory holding both engines, the encoder's
# config.json and the tokenizer files (assemble_run_dir makes it after the builds).
RNNT_DIR = "rnnt_decoder"
TRANSDUCER_MIN_MEL_FRAMES = 8
MEL_FRAMES_PER_SECOND = 100


def transducer_build_commands(max_seconds: int) -> list[list[str]]:
    profile = AudioProfile(TRANSDUCER_MIN_MEL_FRAMES, max(TRANSDUCER_MIN_MEL_FRAMES,
                                                          MEL_FRAMES_PER_SECOND * max_seconds))
    return [audio_build_argv(profile), ["audio_build", "--onnxDir", f"onnx/{RNNT_DIR}", "--engineDir", "engine"]]


RNNT_ENGINES = (("audio", "audio_encoder.engine"), (RNNT_DIR, "rnnt_step.engine"))
RNNT_RUN_FILES = ("config.json", "tokenizer.json", "processor_config.json")
RNNT_OPTIONAL_FILES = ("tokenizer_config.json",)


def assemble_run_dir(engine: Path, kit_dir: Path) -> None:
    """The built engine directory `engine` (the device's staging) made the flat bundle Nemotron-3.5-ASR's guide
    assembles ("assemble one self-contained runtime dir"): both engines moved to its root, beside the exporter's
    config.json, tokenizer.json and processor_config.json (and tokenizer_config.json where the export has one),
    copied from the verified kit's onnx/audio. The builders' directories are removed: the runtime refuses a
    directory that holds two layouts (NemotronAsrRuntime's resolveEnginePaths). The bundle carries the directory;
    `serve` opens it as it is."""
    import os
    import shutil

    from pipeline.errors import PipelineError
    for part, name in RNNT_ENGINES:
        built = engine / part / name
        if not built.is_file() or built.is_symlink():
            raise PipelineError(f"audio_build left no {part}/{name} in {engine}", "see the build log")
        os.replace(built, engine / name)
        shutil.rmtree(engine / part)
    exported = kit_dir / "onnx" / AUDIO_DIR
    for name in (*RNNT_RUN_FILES, *RNNT_OPTIONAL_FILES):
        source = exported / name
        if name in RNNT_OPTIONAL_FILES and not source.exists():
            continue
        if not source.is_file() or source.is_symlink():
            raise PipelineError(f"{kit_dir}: the kit has no onnx/{AUDIO_DIR}/{name}, which the runtime reads",
                                "re-package the recipe with this version of the pipeline")
        shutil.copyfile(source, engine / name)


def finish_speech_build(kind: str, engine: Path, kit_dir: Path) -> None:
    """An RNN-T's engines made the one directory its runtime takes (assemble_run_dir)."""
    if kind == "nemotron3_5_asr":
        assemble_run_dir(engine, kit_dir)


def speech_build_commands(kind: str, limits: BuildLimits, max_seconds: int) -> list[list[str]] | None:
    if kind == "qwen3_tts":
        return tts_build_commands(limits)
    return transducer_build_commands(max_seconds) if kind == "nemotron3_5_asr" else None

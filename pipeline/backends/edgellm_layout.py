"""TensorRT Edge-LLM 0.11's export layout inside a kit's payload (onnx/), as its exporter writes it: the language
model's graph, a vision-language model's tower beside it, a speech model's encoder; and audio_build's argv for an
encoder (backends/edgellm.py and edgellm_speech.py both build with it)."""

from __future__ import annotations

from pipeline.contract import AudioProfile

LLM_DIR, VISUAL_DIR = "llm", "visual"
AUDIO_DIR = "audio"


def audio_build_argv(profile: AudioProfile, onnx_dir: str = f"onnx/{AUDIO_DIR}", engine_dir: str = "engine"
                     ) -> list[str]:
    """The audio encoder's engine into <engine_dir>/audio/ (audio_build adds the last part itself; the runtime loads
    <multimodalEngineDir>/audio/audio_encoder.engine)."""
    return ["audio_build", "--onnxDir", onnx_dir, "--engineDir", engine_dir,
            "--minTimeSteps", str(profile.min_time_steps), "--maxTimeSteps", str(profile.max_time_steps)]

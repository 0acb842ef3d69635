"""A recording as a speech model's encoder takes it: 16 kHz samples -> 128-bin log-mel frames, by transformers'
Qwen3ASRFeatureExtractor with the checkpoint's own settings (preprocessor_config.json), as the goldens' reference
computes them. Edge-LLM 0.11's runtime extracts the same Whisper-style features in C++ (its audio runner picks the
"whisper" extractor from audio/config.json's model_type); the runtime double in tests/ computes them from the
published algorithm and is checked against this module.

Qwen3ASRFeatureExtractor (transformers 5.14, models/qwen3_asr/feature_extraction_qwen3_asr.py): clips shorter than
min_length samples (8000: half a second) are zero-padded to it; a Hann-windowed STFT (n_fft 400, hop 160, centred with
reflection), power spectrum without its last frame, a Slaney mel filter bank to 8 kHz, log10 clamped at 1e-10,
floored at the clip's maximum - 8, then (x + 4) / 4. The frames the recording really has are the attention mask's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.audio import Audio
from pipeline.errors import PipelineError

PROCESSOR_FILE = "preprocessor_config.json"
# the extractor's settings a checkpoint may set (the rest are its defaults); never its class or code
SETTINGS = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "n_window",
            "min_length")


def extractor_settings(model_dir: Path) -> dict:
    path = model_dir / PROCESSOR_FILE
    if not path.is_file():
        raise PipelineError(f"{model_dir}: no {PROCESSOR_FILE}: the feature extractor's settings, which the goldens "
                            "compute the log-mel features with", "fetch the checkpoint with its processor files")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PipelineError(f"{path}: not readable JSON ({exc})", "fetch the checkpoint again") from None
    if not isinstance(cfg, dict):
        raise PipelineError(f"{path}: not a JSON object", "fetch the checkpoint again")
    settings = {k: cfg[k] for k in SETTINGS if k in cfg}
    bad = [k for k, v in settings.items() if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0]
    if bad:
        raise PipelineError(f"{path}: {bad[0]} = {settings[bad[0]]!r} is not a non-negative number",
                            "use the model's own preprocessor_config.json")
    return settings


def feature_extractor(model_dir: Path):
    from transformers import Qwen3ASRFeatureExtractor
    return Qwen3ASRFeatureExtractor(**extractor_settings(model_dir))


def log_mel(extractor, audio: Audio, name: str = "the recording") -> np.ndarray:
    """The recording's log-mel features [mel bins, frames], its real frames only (float32)."""
    if audio.rate != extractor.sampling_rate:
        raise PipelineError(f"{name} is sampled at {audio.rate} Hz; the model takes {extractor.sampling_rate} Hz",
                            f"resample it, e.g. ffmpeg -i IN -ar {extractor.sampling_rate} -ac 1 -c:a pcm_s16le "
                            "OUT.wav")
    samples = np.asarray(audio.samples, np.float32) / 32768.0
    out = extractor(samples, sampling_rate=extractor.sampling_rate, padding=True, return_attention_mask=True,
                    return_tensors="np")
    frames = int(out["attention_mask"][0].sum())
    return np.ascontiguousarray(out["input_features"][0][:, :frames], np.float32)

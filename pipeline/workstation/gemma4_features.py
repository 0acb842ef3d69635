"""A recording as Gemma 4's audio tower takes it on the board: the log-mel frames Edge-LLM 0.11's runner computes
(cpp/multimodal/gemma4/gemma4AudioRunner.cpp extractMelFromPcm, encodeSingleClip), which the goldens' reference, the
export's check and the served reference compute here with transformers' Gemma4AudioFeatureExtractor:

- the waveform (16 kHz, float in [-1, 1)) zero-padded to a multiple of 128 samples, as the runner pads it (and as
  transformers' extractor pads: pad_to_multiple_of 128);
- the extractor's log-mel of the whole padded waveform (its mel extractor, makeGemma4AudioExtractor, is asserted equal
  to transformers' in Edge-LLM's own tests). It keeps every frame: it has no attention mask, where transformers'
  extractor zeroes a frame ending in its own padding; the waveform here is padded before, so none is zeroed;
- the frames zero-padded to a multiple of four, every one of the ceil(frames / 4) soft tokens valid.

The board's extractor has fixed settings (128 bins, 20 ms frames every 10 ms, no preemphasis or per-bin
normalization): a checkpoint whose processor_config.json sets others would be heard differently on the board than
transformers hears it, and is refused (`check_extractor_settings`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.families.gemma4_audio import GEMMA4_AUDIO, PAD_SAMPLES, SUBSAMPLING

PROCESSOR_FILE = "processor_config.json"
# the board's extractor (transformers' defaults, which makeGemma4AudioExtractor reproduces)
BOARD_SETTINGS = {"feature_size": 128, "sampling_rate": 16_000, "frame_length_ms": 20.0, "hop_length_ms": 10.0,
                  "min_frequency": 0.0, "max_frequency": 8000.0, "preemphasis": 0.0, "fft_overdrive": False,
                  "dither": 0.0, "input_scale_factor": 1.0, "mel_floor": 1e-3, "per_bin_mean": None,
                  "per_bin_stddev": None}


def check_extractor_settings(model_dir: Path) -> None:
    """Refuse a checkpoint whose feature extractor (processor_config.json's feature_extractor) is not the board's."""
    path = model_dir / PROCESSOR_FILE
    if not path.is_file():
        return          # transformers' defaults: the board's
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PipelineError(f"{path}: not readable JSON ({exc})", "fetch the checkpoint again") from None
    fe = cfg.get("feature_extractor", {}) if isinstance(cfg, dict) else None
    if not isinstance(fe, dict):
        raise PipelineError(f"{path}: feature_extractor is not an object", "use the model's own "
                            f"{PROCESSOR_FILE}")
    for key, board in BOARD_SETTINGS.items():
        if key in fe and fe[key] != board and not (isinstance(board, float) and isinstance(fe[key], (int, float))
                                                   and not isinstance(fe[key], bool) and float(fe[key]) == board):
            raise PipelineError(f"{path}: feature_extractor.{key} = {str(fe[key])[:40]}: Edge-LLM 0.11's Gemma 4 "
                                f"audio runner computes its log-mel with {key} = {board}, so the board would hear "
                                "this model differently from transformers", "use a checkpoint with Gemma 4's own "
                                "feature extractor settings")


def board_log_mel(samples: np.ndarray) -> np.ndarray:
    """[frames, 128] float32 log-mel of float samples at 16 kHz as the board computes them, frames padded to a
    multiple of four (module docstring)."""
    from transformers import Gemma4AudioFeatureExtractor
    x = np.asarray(samples, np.float32)
    x = np.pad(x, (0, -len(x) % PAD_SAMPLES))
    extractor = Gemma4AudioFeatureExtractor(**{k: v for k, v in BOARD_SETTINGS.items()
                                               if k not in ("per_bin_mean", "per_bin_stddev")})
    out = extractor([x], sampling_rate=16_000, padding="longest", pad_to_multiple_of=PAD_SAMPLES, truncation=False,
                    max_length=None, return_tensors="np")
    mel = np.asarray(out["input_features"][0], np.float32)
    return np.pad(mel, ((0, -len(mel) % SUBSAMPLING), (0, 0)))


def recording_log_mel(audio, name: str = "the recording") -> np.ndarray:
    """board_log_mel of a read recording (pipeline.audio.Audio: 16-bit samples), refusing another sample rate."""
    if audio.rate != BOARD_SETTINGS["sampling_rate"]:
        raise PipelineError(f"{name} is sampled at {audio.rate} Hz; Gemma 4 takes 16000 Hz",
                            "resample it, e.g. ffmpeg -i IN -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav")
    return board_log_mel(np.asarray(audio.samples, np.float32) / 32768.0)


class Gemma4Frames:
    """Gemma 4's inputs of recordings as the board makes them: each recording's frames (board_log_mel), padded to the
    longest under a mask of each one's own (all of a recording's frames are valid: the runner marks them so)."""
    shortest = GEMMA4_AUDIO.shortest_samples()       # fewer frames than the engine's profile takes

    def batch(self, audios: list) -> tuple[list[int], dict]:
        import torch
        frames = [recording_log_mel(audio, name) for audio, name in audios]
        longest = max(len(f) for f in frames)
        x = np.zeros((len(frames), longest, frames[0].shape[1]), np.float32)
        mask = torch.zeros(len(frames), longest, dtype=torch.bool)
        for i, f in enumerate(frames):
            x[i, :len(f)] = f
            mask[i, :len(f)] = True
        return [len(f) // SUBSAMPLING for f in frames], {"input_features": torch.from_numpy(x),
                                                          "input_features_mask": mask}


def gemma4_frames(model_dir: Path, _encoder) -> Gemma4Frames:
    check_extractor_settings(model_dir)
    return Gemma4Frames()

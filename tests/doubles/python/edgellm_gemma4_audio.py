"""TEST DOUBLE of TensorRT Edge-LLM 0.11's Gemma 4 audio runner (cpp/multimodal/gemma4/gemma4AudioRunner.cpp, which
loads <dir>/audio/audio_encoder.engine; TensorRT cannot exist in CI), as its source reads:

- the PCM (here: 16 kHz WAV only, by pipeline.audio.read_wav) zero-padded to a multiple of 128 samples;
- its mel extractor (makeGemma4AudioExtractor, asserted equal to transformers' Gemma4AudioFeatureExtractor in
  Edge-LLM's own tests), written here from that algorithm, not from transformers (the test of this module compares
  them): the waveform left-padded by half a 20 ms frame, 320-sample frames every 160 samples under a periodic Hann
  window, the magnitude of a 512-point FFT, an HTK mel filter bank (no area normalization) to 8 kHz, log(x + 0.001);
  every frame kept (the runner has no mask);
- the frames zero-padded to a multiple of four and encoded with every one of the ceil(T / 4) tokens valid, a clip
  longer than the engine's profile (builder_config max_time_steps) refused as the runtime's reshape would refuse it;
  the engine (audio_build double: the tower's ONNX) runs in ONNX's reference evaluator with the attention plugin as
  pipeline/workstation/gemma4_attention.py computes it;
- the prompt's audio token (config.json audio_token_id) expanded to the clip's tokens between boa_token_id and
  eoa_token_id, unless the prompt already has them around it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import onnx
from edgellm_audio import AudioEngine, Encoded, pcm
from onnx.reference import ReferenceEvaluator

from pipeline.workstation.gemma4_attention import gemma4_audio_attention_op
from pipeline.workstation.onnx_reference import encoder_ops

RATE, FRAME, HOP, N_FFT, PAD, FLOOR = 16_000, 320, 160, 512, 128, 1e-3


def _htk_mel(hz):
    return 2595.0 * np.log10(1.0 + np.asarray(hz, np.float64) / 700.0)


def mel_filters(bins: int = 128) -> np.ndarray:
    """[N_FFT / 2 + 1, bins] triangular filters between HTK-mel-spaced edges from 0 to 8 kHz, peak 1 (no area
    normalization)."""
    freqs = np.linspace(0, RATE / 2, N_FFT // 2 + 1)
    edges = 700.0 * (10.0 ** (np.linspace(_htk_mel(0.0), _htk_mel(RATE / 2), bins + 2) / 2595.0) - 1.0)
    out = np.zeros((len(freqs), bins))
    for m in range(bins):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        out[:, m] = np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return out


def log_mel(samples: np.ndarray, bins: int = 128) -> np.ndarray:
    """[frames, bins] log-mel of float samples in [-1, 1) at 16 kHz, padded as the runner pads them."""
    x = np.asarray(samples, np.float64)
    x = np.pad(x, (FRAME // 2, -len(x) % PAD))
    frames = (len(x) - (FRAME + 1)) // HOP + 1
    if frames <= 0:
        return np.zeros((0, bins), np.float32)
    window = 0.5 - 0.5 * np.cos(2 * math.pi * np.arange(FRAME) / FRAME)      # periodic Hann
    starts = np.arange(frames) * HOP
    spectrum = np.abs(np.fft.rfft(x[starts[:, None] + np.arange(FRAME)] * window, n=N_FFT, axis=1))
    return np.log(spectrum @ mel_filters(bins) + FLOOR).astype(np.float32)


class Gemma4AudioEngine(AudioEngine):
    def __init__(self, audio_dir: Path):        # its own config and graph, not the Whisper runner's: no super()
        cfg = json.loads((audio_dir / "config.json").read_text())
        self.bins = cfg["audio_config"].get("num_mel_bins", 128)
        self.min_frames, self.max_frames = (cfg["builder_config"][k] for k in ("min_time_steps", "max_time_steps"))
        self.audio_token = cfg["audio_token_id"]
        self.wrap = (cfg.get("boa_token_id", -1), cfg.get("eoa_token_id", -1))
        self.session = ReferenceEvaluator(onnx.load(str(audio_dir / "audio_encoder.engine")),
                                          new_ops=[gemma4_audio_attention_op(), *encoder_ops()])

    def placeholder_id(self, _tokenizer) -> int:
        return self.audio_token             # the runner matches config.json's id, not a token's text

    def encode_bytes(self, wavs: list[tuple[bytes, str]]) -> Encoded:
        embeds, tokens = [], []
        start = time.perf_counter()
        for data, path in wavs:
            mel = log_mel(pcm(data, path), self.bins)
            if len(mel) == 0:
                raise ValueError(f"{path}: empty PCM")
            mel = np.pad(mel, ((0, -len(mel) % 4), (0, 0)))
            if not self.min_frames <= len(mel) <= self.max_frames:
                raise ValueError(f"{path}: {len(mel)} mel frames, outside the audio engine's profile "
                                 f"({self.min_frames} to {self.max_frames})")
            (out,) = self.session.run(None, {"input_features": mel[None].astype(np.float16),
                                             "valid": np.ones((1, len(mel) // 4), bool)})
            embeds.append(out[0])
            tokens.append(len(out[0]))
        return Encoded(np.concatenate(embeds), tokens, (time.perf_counter() - start) * 1000)

    def expand(self, ids: list[int], pad: int, tokens: list[int]) -> list[int]:
        """textPreprocess: each audio token, in order, as its clip's tokens between boa and eoa (unless there)."""
        out, clip = [], 0
        wrap = self.wrap[0] >= 0 and self.wrap[1] >= 0
        for i, t in enumerate(ids):
            if t != pad:
                out.append(t)
                continue
            if clip >= len(tokens):
                raise RuntimeError("EDGELLM_BAD_MEDIA_COUNT: placeholder count exceeds this request's clip count")
            begin = wrap and not (i > 0 and ids[i - 1] == self.wrap[0])
            end = wrap and not (i + 1 < len(ids) and ids[i + 1] == self.wrap[1])
            out += ([self.wrap[0]] if begin else []) + [pad] * tokens[clip] + ([self.wrap[1]] if end else [])
            clip += 1
        if clip != len(tokens):
            raise RuntimeError("EDGELLM_BAD_MEDIA_COUNT: placeholder count is smaller than this request's clip count")
        return out

"""TEST DOUBLE of TensorRT Edge-LLM's audio runner (llm_inference --multimodalEngineDir, which loads
<dir>/audio/audio_encoder.engine; TensorRT cannot exist in CI).

What the runtime does with a request's recordings, as its published interface describes it (Edge-LLM 0.11's ASR
guide and its server's audio_preprocess.py: container decode and resampling in C++, then the mel extractor the
engine's audio/config.json model_type picks, "whisper" for Qwen3-ASR):
- the file is decoded to 16 kHz mono samples (here: 16 kHz WAV only, by pipeline.audio.read_wav; miniaudio's MP3/FLAC
  decode and its resampler cannot be checked here);
- Whisper-style log-mel features, written here from the algorithm (not from transformers, which the test of this
  module compares them with): clips under half a second zero-padded to it, a periodic Hann window of n_fft samples, a
  centred STFT with reflection padding every hop samples, the power spectrum without its last frame, a Slaney mel
  filter bank to 8 kHz with Slaney area normalization, log10 clamped at 1e-10, floored at the clip's maximum - 8,
  then (x + 4) / 4;
- the encoder engine (audio_build double: the encoder's ONNX) runs in ONNX's reference evaluator on the features cut
  into chunks with their token indices and window masks (pipeline/workstation/audio_check.py graph_feeds), a
  recording longer than the engine's profile (builder_config max_time_steps) refused as the runtime's profile would;
- the chat template places one audio placeholder per recording; it is expanded to the recording's token count and
  the token embeddings there are replaced by the encoder's output (1-D RoPE: Qwen3-ASR's decoder is a plain Qwen3).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from pipeline.audio import read_wav
from pipeline.workstation.audio_check import graph_feeds
from pipeline.workstation.onnx_reference import encoder_ops

RATE, N_FFT, HOP, MIN_SAMPLES = 16_000, 400, 160, 8_000
PLACEHOLDER = "<|audio_pad|>"


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear to 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)."""
    mel = 3.0 * hz / 200.0
    log = hz >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / (math.log(6.4) / 27.0), mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    return np.where(mel >= 15.0, 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0)), hz)


def mel_filters(bins: int, rate: int = RATE, n_fft: int = N_FFT) -> np.ndarray:
    """[n_fft / 2 + 1, bins] triangular filters between mel-spaced edges from 0 to rate / 2, each scaled to unit area
    (2 / its width in Hz: Slaney's normalization)."""
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(rate / 2)), bins + 2))
    out = np.zeros((len(freqs), bins))
    for m in range(bins):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        rising, falling = (freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)
        out[:, m] = np.maximum(0.0, np.minimum(rising, falling)) * 2.0 / (hi - lo)
    return out


def log_mel(samples: np.ndarray, bins: int) -> np.ndarray:
    """[bins, frames] features of float samples in [-1, 1) at 16 kHz."""
    x = samples.astype(np.float64)
    if len(x) < MIN_SAMPLES:
        x = np.pad(x, (0, MIN_SAMPLES - len(x)))
    frames = len(x) // HOP
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)       # periodic Hann
    starts = np.arange(frames) * HOP
    spectrum = np.fft.rfft(padded[starts[:, None] + np.arange(N_FFT)] * window, axis=1)
    power = (spectrum.real ** 2 + spectrum.imag ** 2).T                   # [bins, frames]
    mel = mel_filters(bins).T @ power
    logs = np.log10(np.maximum(mel, 1e-10))
    logs = np.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).astype(np.float32)


def pcm(data: bytes, path: str) -> np.ndarray:
    """A recording's samples as floats in [-1, 1): 16 kHz WAV only (the runtime's miniaudio decode and resampler
    cannot be checked here)."""
    audio = read_wav(data, name=path)
    if audio.rate != RATE:
        raise ValueError(f"{path}: {audio.rate} Hz (the double decodes 16 kHz WAV only)")
    return np.asarray(audio.samples, np.float32) / 32768.0


@dataclass
class Encoded:
    """A request's recordings through the audio engine: features in order, each recording's token count."""
    embeds: np.ndarray          # [audio tokens, hidden]
    tokens: list[int]
    ms: float


class AudioEngine:
    def __init__(self, audio_dir: Path):
        cfg = json.loads((audio_dir / "config.json").read_text())
        ac = cfg["audio_config"]
        self.bins, self.n_window, self.n_window_infer = ac["num_mel_bins"], ac["n_window"], ac["n_window_infer"]
        self.max_frames = cfg["builder_config"]["max_time_steps"]
        self.placeholder = PLACEHOLDER
        self.session = ReferenceEvaluator(onnx.load(str(audio_dir / "audio_encoder.engine")), new_ops=encoder_ops())

    def placeholder_id(self, tokenizer) -> int:
        return tokenizer.token_id(self.placeholder) if hasattr(tokenizer, "token_id") else \
            tokenizer.token_to_id(self.placeholder)

    def expand(self, ids: list[int], pad: int, tokens: list[int]) -> list[int]:
        """The audio runner's preprocess: each placeholder, in order, as its clip's token count (the markers around it
        are the text's)."""
        from edgellm_visual import expand
        return expand(ids, pad, tokens)

    def encode(self, paths: list[str]) -> Encoded:
        return self.encode_bytes([(Path(path).read_bytes(), path) for path in paths])

    def encode_bytes(self, wavs: list[tuple[bytes, str]]) -> Encoded:
        """Recordings as (the file's bytes, its name): the runtime's load_audio_buffer_from_bytes takes bytes."""
        embeds, tokens = [], []
        start = time.perf_counter()
        for data, path in wavs:
            features = log_mel(pcm(data, path), self.bins)
            if features.shape[1] > self.max_frames:
                raise ValueError(f"{path}: {features.shape[1]} mel frames, more than the audio engine's profile "
                                 f"takes ({self.max_frames})")
            (out,) = self.session.run(None, graph_feeds(features, self.n_window, self.n_window_infer))
            embeds.append(out)
            tokens.append(len(out))
        return Encoded(np.concatenate(embeds), tokens, (time.perf_counter() - start) * 1000)


def audio_engine(audio_dir: Path):
    """The runner the engine's audio/config.json model_type picks: Gemma 4's, or the Whisper-feature one."""
    if json.loads((audio_dir / "config.json").read_text()).get("model_type") == "gemma4_audio":
        from edgellm_gemma4_audio import Gemma4AudioEngine
        return Gemma4AudioEngine(audio_dir)
    return AudioEngine(audio_dir)

"""Nemotron-3.5-ASR's log-mel features exactly as TensorRT Edge-LLM 0.11's runtime computes them on the board, so that
the goldens, the export's check and the twin's training hear what the engine hears.

Its runtime (experimental_models/nemotron3_5_asr, NemotronAsrRuntime) takes `audio::makeNemotronAsrExtractor()`, its
Parakeet extractor without the per-feature normalization (cpp/runtime/audio/melSpectrogram.cpp; its unit test asserts
that the two differ in nothing else):

    16 kHz samples (16-bit PCM / 32768), pre-emphasis y[n] = x[n] - 0.97 x[n-1] with y[0] = x[0];
    zero padding of n_fft / 2 = 256 samples on each side (centred frames, torch.stft pad_mode "constant");
    frames every 160 samples: a symmetric (periodic=False) 400-sample Hann window centred in a 512-point FFT;
    the power spectrum through a Slaney-scale, Slaney-normalized mel filter bank of 128 bins from 0 to 8 kHz;
    ln(x + 2^-24); the last STFT frame dropped (len // 160 frames, as transformers' valid frames); no normalization.

The engine takes them as [1, T_mel, 128] in FP16 (the runtime converts them). transformers' extractor
(NemotronAsrStreamingFeatureExtractor) computes the same with librosa's filter bank; the tests compare the two.
numpy only.
"""

from __future__ import annotations

import math

import numpy as np

SAMPLE_RATE = 16_000
N_FFT, HOP, WINDOW = 512, 160, 400
PREEMPHASIS = 0.97
LOG_GUARD = 2.0 ** -24
MEL_BINS = 128


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)."""
    linear = 3.0 * hz / 200.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / (math.log(6.4) / 27.0), linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel >= 15.0, 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0)), 200.0 * mel / 3.0)


def mel_filters(bins: int = MEL_BINS) -> np.ndarray:
    """[bins, N_FFT / 2 + 1] triangles between mel-spaced edges from 0 Hz to 8 kHz, each scaled to unit area."""
    freqs = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(0.0, float(_hz_to_mel(np.array(SAMPLE_RATE / 2))), bins + 2))
    up = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    down = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return (np.maximum(0.0, np.minimum(up, down)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


def hann_symmetric(n: int = WINDOW) -> np.ndarray:
    return (0.5 * (1.0 - np.cos(2.0 * np.pi * np.arange(n) / (n - 1)))).astype(np.float32)


def frames_of(samples: int) -> int:
    """The mel frames of `samples` samples: one a hop, the trailing STFT frame dropped (at least one)."""
    return max(1, samples // HOP)


def log_mel(pcm16, bins: int = MEL_BINS) -> np.ndarray:
    """[frames_of(len), bins] float32 log-mel features of 16 kHz mono 16-bit samples (an array of ints)."""
    x = np.asarray(pcm16, dtype=np.float32) / 32768.0
    if x.size == 0:
        raise ValueError("no samples")
    y = x.copy()
    y[1:] = x[1:] - np.float32(PREEMPHASIS) * x[:-1]
    pad = N_FFT // 2
    padded = np.concatenate([np.zeros(pad, np.float32), y, np.zeros(pad, np.float32)])
    count = frames_of(len(x))
    head = (N_FFT - WINDOW) // 2            # the window's offset inside the FFT buffer
    starts = np.arange(count) * HOP + head
    windows = padded[starts[:, None] + np.arange(WINDOW)[None, :]] * hann_symmetric()
    spectrum = np.fft.rfft(windows, n=N_FFT, axis=-1)   # the window at the buffer's start: a phase shift only
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    return np.log(power @ mel_filters(bins).T + np.float32(LOG_GUARD)).astype(np.float32)

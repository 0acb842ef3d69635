"""TEST DOUBLE of TensorRT Edge-LLM 0.11's Nemotron-3.5-ASR runtime (experimental_models/nemotron3_5_asr:
NemotronAsrRuntime, which its pybind module exposes to its transcription server; TensorRT cannot exist in CI).

What the runtime does, as its published source describes it (runtime/nemotronAsrRuntime.cpp, its developer guide):
- the engine directory holds exactly one layout: audio_encoder.engine and rnnt_step.engine at its root, or
  audio/audio_encoder.engine and rnnt/rnnt_step.engine; config.json at its root (model_type nemotron3_5_asr,
  blank_token_id, vocab_size, decoder_hidden_size, num_decoder_layers, max_symbols_per_step, default_prompt_id,
  num_prompts, encoder_config.num_mel_bins; 8x stride-2 subsampling only); the tokenizer (tokenizer.json) in
  tokenizer_dir holds at least vocab_size - 1 tokens;
- a recording (here: 16 kHz WAV only, by pipeline.audio.read_wav; its decoder's MP3/FLAC and resampling cannot be
  checked here) becomes log-mel features by its Nemotron-ASR extractor, written here from the algorithm
  (melSpectrogram.cpp's Parakeet configuration without the normalization: pre-emphasis 0.97 with the first sample
  kept, n_fft / 2 zeros each side, a symmetric 400-sample Hann window centred in a 512-point FFT every 160 samples,
  power, Slaney mel filters to 8 kHz, ln(x + 2^-24), the last frame dropped), refused under the encoder's least
  profile or past its largest ("Audio too short: ..." / "Audio too long: ..."), converted to FP16;
- the encoder engine (the audio_build double's: the exported ONNX graph, its profile in its metadata) runs once; the
  greedy loop runs the step engine (the exported step graph) a step at a time: blank advances the frame and drops the
  step's new state, a token is emitted, its state adopted, the frame kept, up to max_symbols_per_step tokens a frame;
- the tokens are decoded with the tokenizer, special tokens kept (the `<xx-XX>` language tag).

Both graphs are evaluated by ONNX's reference evaluator (FP32-accumulating MatMul: pipeline/workstation/
onnx_reference.py). RNNT_DOUBLE_WRONG_FRAME=N: a miscompiled step (the N-th step's argmax is the runner-up).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
from edgellm_audio import mel_filters
from onnx.reference import ReferenceEvaluator

from pipeline.audio import AudioError, read_wav
from pipeline.workstation.onnx_reference import encoder_ops

RATE, N_FFT, HOP, WINDOW, PREEMPHASIS = 16_000, 512, 160, 400, 0.97
ENGINES = ("audio_encoder.engine", "rnnt_step.engine")
PROFILE_KEY = "edgellm_double_profile"      # the audio_build double's record of the encoder's profile


def log_mel(samples: np.ndarray, bins: int) -> np.ndarray:
    """[frames, bins] features of float samples in [-1, 1) at 16 kHz."""
    x = samples.astype(np.float32)
    y = np.concatenate([x[:1], x[1:] - np.float32(PREEMPHASIS) * x[:-1]])
    padded = np.concatenate([np.zeros(N_FFT // 2, np.float32), y, np.zeros(N_FFT // 2, np.float32)])
    frames = (len(padded) - N_FFT) // HOP + 1
    frames = frames - 1 if frames > 1 else frames           # the trailing STFT frame dropped
    window = np.zeros(N_FFT, np.float32)
    head = (N_FFT - WINDOW) // 2
    window[head:head + WINDOW] = 0.5 * (1.0 - np.cos(2.0 * np.pi * np.arange(WINDOW) / (WINDOW - 1)))
    spectrum = np.fft.rfft(padded[np.arange(frames)[:, None] * HOP + np.arange(N_FFT)[None, :]] * window, axis=1)
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    return np.log(power @ mel_filters(bins, RATE, N_FFT).astype(np.float32) + np.float32(2.0 ** -24))


def _layout(root: Path) -> tuple[Path, Path]:
    flat = (root / ENGINES[0], root / ENGINES[1])
    direct = (root / "audio" / ENGINES[0], root / "rnnt" / ENGINES[1])
    has = [all(p.is_file() for p in layout) for layout in (flat, direct)]
    if sum(has) != 1 or any(p.is_file() for p in (flat if has[1] else direct)):
        raise RuntimeError("Nemotron-3.5-ASR bundle must contain exactly one complete engine layout: "
                           "audio/audio_encoder.engine plus rnnt/rnnt_step.engine, or both engines at its root")
    return flat if has[0] else direct


class Result:
    def __init__(self, tokens: list[int], text: str, frames: int, mel_frames: int, steps: int):
        self.tokens, self.text = tokens, text
        self.num_encoder_frames, self.num_mel_frames, self.num_decode_steps = frames, mel_frames, steps


class NemotronAsrRuntime:
    def __init__(self, engine_dir, tokenizer_dir):
        root = Path(engine_dir)
        try:
            config = json.loads((root / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"Failed to open {root / 'config.json'}: {exc}") from None
        if config.get("model_type") != "nemotron3_5_asr":
            raise RuntimeError("config.json model_type is not 'nemotron3_5_asr'")
        enc = config["encoder_config"]
        if enc.get("subsampling_factor", 8) != 8 or enc.get("subsampling_conv_stride", 2) != 2:
            raise RuntimeError("Nemotron-3.5-ASR runtime requires factor-eight stride-two encoder subsampling")
        self.blank, self.vocab = int(config["blank_token_id"]), int(config["vocab_size"])
        self.layers, self.width = int(config.get("num_decoder_layers", 2)), int(config["decoder_hidden_size"])
        self.cap, self.bins = int(config.get("max_symbols_per_step", 10)), int(enc.get("num_mel_bins", 128))
        self.num_prompts = int(config.get("num_prompts", 128))
        encoder, step = _layout(root)
        graph = onnx.load(str(encoder))
        profile = json.loads(next(p.value for p in graph.metadata_props if p.key == PROFILE_KEY))
        self.min_mel_frames, self.max_mel_frames = int(profile["min"]), int(profile["max"])
        self.encoder = ReferenceEvaluator(graph, new_ops=encoder_ops())
        self.step = ReferenceEvaluator(onnx.load(str(step)), new_ops=encoder_ops())
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        if self.tokenizer.get_vocab_size() < self.vocab - 1:
            raise RuntimeError("tokenizer vocab smaller than model vocab (wrong tokenizer directory?)")
        self.wrong = int(os.environ.get("RNNT_DOUBLE_WRONG_FRAME", "-1"))

    def transcribe(self, audio: bytes, prompt_id: int) -> Result:
        try:
            pcm = read_wav(bytes(audio), name="the audio")
        except AudioError as exc:
            raise RuntimeError(f"Audio decode failed: {exc}") from None
        if pcm.rate != RATE:
            raise RuntimeError(f"Audio decode failed: {pcm.rate} Hz (the double decodes 16 kHz WAV only)")
        mel = log_mel(np.asarray(pcm.samples, np.float32) / 32768.0, self.bins)
        if len(mel) < self.min_mel_frames:
            raise RuntimeError(f"Audio too short: {len(mel)} mel frames is below engine min {self.min_mel_frames}")
        if len(mel) > self.max_mel_frames:
            raise RuntimeError(f"Audio too long: {len(mel)} mel frames exceeds engine max {self.max_mel_frames}")
        if not 0 <= prompt_id < self.num_prompts:
            raise RuntimeError(f"Language prompt id {prompt_id} is outside [0, {self.num_prompts})")
        (frames,) = self.encoder.run(None, {"input_features": mel.astype(np.float16)[None],
                                            "prompt_ids": np.array([prompt_id], np.int64)})
        state = (np.zeros((self.layers, 1, self.width), np.float16),) * 2
        token, t, symbols, steps, tokens = self.blank, 0, 0, 0, []
        while t < frames.shape[1]:
            logits, h, c = self.step.run(None, {"decoder_input_ids": np.array([[token]], np.int64),
                                                "hidden_state": state[0], "cell_state": state[1],
                                                "encoder_frame": frames[0, t][None]})
            order = np.argsort(-logits[0].astype(np.float32), kind="stable")
            best = int(order[1] if steps == self.wrong else order[0])
            steps += 1
            if best == self.blank:
                t, symbols = t + 1, 0
                continue
            tokens.append(best)
            token, state, symbols = best, (h, c), symbols + 1
            if symbols >= self.cap:
                t, symbols = t + 1, 0
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return Result(tokens, text, int(frames.shape[1]), len(mel), steps)

"""Recordings in requests: `input_audio` chat parts and /v1/audio/transcriptions uploads, read, checked and counted
before any engine work.

A recording arrives as bytes (base64 in a chat part, a multipart file in a transcription), at most AudioLimits'
bytes, and is decoded by pipeline.audio's exact WAV reader: every header field checked against the bytes there and
against the limits (seconds, rate, channels) before a sample is decoded. The engine takes 16 kHz mono audio; a WAV
file at another rate or another container (FLAC, MP3, Ogg, WebM: what a browser records) is decoded by ffmpeg where
the machine has it (serve/transcode.py: bounded in bytes, time and output), else refused naming what to send. The
server then hands the engine one canonical form, a 16 kHz mono 16-bit WAV file, which the reference session and the
device's runtime both decode the same way. Every refusal is a 400 naming the part.

The language model sees each recording as its placeholder token repeated once per audio token: the feature
extractor's frames (clips under half a second padded to it, 100 a second) through the encoder's chunk arithmetic
(families/audio.py), exactly as the goldens counted them, so the server's token accounting is what the engine sees.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from pipeline.audio import AudioError, AudioLimits, container, read_wav, wav_bytes
from pipeline.families.audio import SAMPLE_RATE, AudioEncoderDesign
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import AudioPart


@dataclass(frozen=True)
class RequestRecording:
    """A recording read and checked: as the engine takes it (16 kHz mono WAV), its length, its tokens."""
    wav: bytes
    seconds: float
    tokens: int


@dataclass(frozen=True)
class AudioSide:
    """What a served speech model takes: the encoder's token arithmetic, the placeholder its chat template places
    once per recording, and the longest recording the audio engine's profile takes."""
    design: AudioEncoderDesign
    n_window: int | None
    placeholder: str
    placeholder_id: int
    max_seconds: int
    noun: str = "recording"
    part: str = "input_audio"
    wrap_ids: tuple[int, int] | None = None     # the tokens the runtime puts around a recording's (Gemma 4's)

    def tokens(self, samples: int) -> int:
        return self.design.tokens_of_samples(samples, self.n_window)

    def limits(self) -> AudioLimits:
        return AudioLimits(max_seconds=float(self.max_seconds))


def audio_side_of(plan, tokenizer) -> AudioSide | None:
    """The audio side of a served model: its family's encoder arithmetic at the plan's profile (None where the plan
    has no audio engine)."""
    from pipeline.errors import PipelineError
    from pipeline.families import family
    fam = family(plan.model.architecture)
    if plan.audio is None or fam is None or fam.audio is None:
        return None
    if plan.audio.n_window is None and fam.audio.chunked:
        raise PipelineError("the plan's audio engine does not say its encoder's chunk (n_window)",
                            "re-package the recipe with this version of the pipeline")
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    design = fam.audio
    if design.placeholder not in vocab:
        raise PipelineError(f"the tokenizer has no {design.placeholder} token, which the model's chat template places "
                            "for a recording", "serve the speech model's own tokenizer")
    wrap = design.wrap()
    if wrap is not None and any(t not in vocab for t in wrap):
        raise PipelineError(f"the tokenizer lacks {' or '.join(wrap)}, which the runtime puts around a recording",
                            "serve the speech model's own tokenizer")
    return AudioSide(design, plan.audio.n_window, design.placeholder, vocab[design.placeholder],
                     plan.audio.max_seconds, wrap_ids=None if wrap is None else (vocab[wrap[0]], vocab[wrap[1]]))


def recording_bytes(part: AudioPart, limits: AudioLimits) -> bytes:
    """The bytes a part's base64 holds, its length bounded before it is decoded."""
    if len(part.data) > (limits.max_bytes + 2) // 3 * 4:
        raise _bad(part.param, f"holds more than {limits.max_bytes} bytes", "audio_too_large")
    try:
        return base64.b64decode(part.data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(part.param, "is not valid base64 (input_audio.data)") from None


def read_recordings(parts: tuple[AudioPart, ...], side: AudioSide) -> list[RequestRecording]:
    return [read_recording(recording_bytes(p, side.limits()), side, p.param) for p in parts]


def read_recording(data: bytes, side: AudioSide, param: str) -> RequestRecording:
    """One recording's bytes as the engine takes them (16 kHz mono WAV), checked and counted; a 400 naming `param`
    otherwise (a truncated, huge, hours-long or foreign file never reaches a decoder unbounded)."""
    wav, seconds, samples = _canonical(data, side.limits(), param)
    least = side.design.shortest_samples()
    if least is not None and samples < least:
        raise _bad(param, f"lasts {samples * 1000 / SAMPLE_RATE:.1f} ms, shorter than the audio engine takes "
                   f"({least * 1000 / SAMPLE_RATE:.1f} ms)", "audio_too_short")
    return RequestRecording(wav, seconds, side.tokens(samples))


def canonical_wav(data: bytes, limits: AudioLimits, param: str) -> tuple[bytes, float]:
    """(the recording as a 16 kHz mono 16-bit WAV file, its seconds), checked as read_recording checks one."""
    wav, seconds, _ = _canonical(data, limits, param)
    return wav, seconds


def _canonical(data: bytes, limits: AudioLimits, param: str) -> tuple[bytes, float, int]:
    if not data:
        raise _bad(param, "is empty")
    if container(data) != "WAV":        # another container (or none known): ffmpeg's to decode, bounded
        from pipeline.serve.transcode import to_wav16k
        data = to_wav16k(data, limits, param)
    try:
        audio = read_wav(data, limits, name=param)
    except AudioError as exc:
        raise ApiError(400, exc.message, param, "invalid_audio") from None
    if audio.rate != SAMPLE_RATE:
        from pipeline.serve.transcode import to_wav16k
        audio = read_wav(to_wav16k(data, limits, param), limits, name=param)
    return wav_bytes(audio.samples, SAMPLE_RATE), audio.seconds, len(audio.samples)


def _bad(param: str, why: str, code: str = "invalid_audio") -> ApiError:
    return ApiError(400, f"{param}: the audio {why}", param, code)

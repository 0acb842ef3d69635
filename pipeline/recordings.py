"""The builtin test recordings (recipes name them `builtin:NAME`): synthesized here, sample by sample, so a speech
recipe needs no download and no licence beyond this repository's; written as 16 kHz mono 16-bit WAV, byte for byte
the same everywhere (a kit records the hash of every file it carries).

They are signals, not speech: tones, a chirp, a voiced buzz with pauses. They exercise what a transcriber's engine
does with a recording (the mel front end, the encoder's chunks and attention windows, the audio tokens in the prompt)
and let the goldens compare the engine with the reference on the same input; they say nothing about how well a model
transcribes (that is the speech set's job: pipeline/transcripts.py scores it). Their lengths are chosen against
Qwen3-ASR's encoder: shorter than one 100-frame chunk, exactly one, and past one 8-chunk attention window.
Standard library only: the device half (Python 3.10, no numpy) reads these names too.
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.audio import wav_bytes

RATE = 16_000
AMPLITUDE = 0.3


@dataclass(frozen=True)
class BuiltinRecording:
    name: str
    seconds: float
    what: str                           # what it sounds like, as a caption would say it
    wave: Callable[[float], float]      # time (s) -> sample in [-1, 1]

    def samples(self) -> array:
        n = int(round(self.seconds * RATE))
        return array("h", (int(round(max(-1.0, min(1.0, self.wave(i / RATE))) * 32767)) for i in range(n)))

    def wav(self) -> bytes:
        return _synthesized(self)


@functools.cache
def _synthesized(recording: BuiltinRecording) -> bytes:
    """A builtin's WAV bytes, made once per process: the recipe's checks, the plan, the goldens' key and the goldens
    each read it, and the ten-second one takes a third of a second to synthesize in pure Python."""
    return wav_bytes(recording.samples(), RATE)


def _chord(t: float) -> float:
    return AMPLITUDE * (math.sin(2 * math.pi * 440 * t) + 0.5 * math.sin(2 * math.pi * 660 * t)) / 1.5


def _chirp(t: float) -> float:
    # 200 Hz rising by 1.5 kHz a second: phase is the integral of the frequency
    return AMPLITUDE * math.sin(2 * math.pi * (200 * t + 750 * t * t))


def _buzz(t: float) -> float:
    """A voiced buzz (a 120 Hz fundamental and its harmonics, a slow vibrato) in 0.7 s syllables with 0.3 s pauses."""
    if t % 1.0 >= 0.7:
        return 0.0
    f0 = 120 + 8 * math.sin(2 * math.pi * 3 * t)
    return AMPLITUDE * sum(math.sin(2 * math.pi * k * f0 * t) / k for k in range(1, 6)) / 2.3


BUILTIN_RECORDINGS: dict[str, BuiltinRecording] = {r.name: r for r in (
    BuiltinRecording("chord-short", 0.37, "a short chord (A4 and E5)", _chord),
    BuiltinRecording("chirp-1s", 1.0, "a one-second rising chirp from 200 Hz", _chirp),
    BuiltinRecording("buzz-syllables", 10.13, "ten buzzing syllables with pauses", _buzz),
)}

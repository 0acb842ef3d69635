"""The text-to-speech gate's scoring, the same on both halves (contract.SynthesisCheck): the engines' greedy codes
against the reference's, frame by frame up to the first that differs (a talker step that chose another code makes
every later frame another); the samples Code2Wav must make of them; the waveform's cosine with the reference's; and
its level (silence or clipping is a broken vocoder whatever the codes). Standard library only: the device runs it.

The round trip through a speech-to-text model (what the engine said, transcribed, against the text) is not part of
this gate yet: only the engines' agreement with the reference is."""

from __future__ import annotations

import math
from array import array

from pipeline import contract

SILENCE_RMS = 1e-3          # below: silence (full scale 1)
MAX_CLIPPED = 0.01          # the most samples at full scale before the waveform counts as clipped
LEVEL_RATIO = 2.0           # the engine's RMS within this factor of the reference's


def agreement(want: list[list[int]], got: list[list[int]]) -> tuple[float, int | None]:
    """(the share of the reference's frames the engine gave before the first that differs, that frame's index or
    None where none differs and the lengths agree)."""
    for i, frame in enumerate(want):
        if i >= len(got) or list(got[i]) != list(frame):
            return i / len(want), i
    if len(got) != len(want):
        return 1.0, len(want)
    return 1.0, None


def level(samples: array) -> tuple[float, float]:
    """(RMS in [0, 1] full scale, the share of samples at full scale) of 16-bit samples."""
    if not samples:
        return 0.0, 0.0
    rms = math.sqrt(sum(x * x for x in samples) / len(samples)) / 32768.0
    clipped = sum(1 for x in samples if x >= 32767 or x <= -32768) / len(samples)
    return rms, clipped


def cosine(a: array, b: array) -> float:
    n = min(len(a), len(b))
    dot = sum(a[i] * b[i] for i in range(n))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return dot / (na * nb) if na and nb else 0.0


def checks(check: contract.SynthesisCheck, codes: list[list[list[int]]], samples: list[array],
           references: list[array]) -> list[contract.Check]:
    """The gate's checks for each utterance: the engine's codes and 16-bit samples, the reference's samples."""
    out = []
    for u, got, heard, ref in zip(check.utterances, codes, samples, references, strict=True):
        name = f"{u.text[:40]!r} ({u.speaker}, {u.language})"
        share, at = agreement(u.codes, got)
        said = "" if at is None else f"; frame {at} differs" if at < len(u.codes) else \
            f"; {len(got)} frames where the reference has {len(u.codes)}"
        out.append(contract.Check(check=f"speech codes of {name}: reference frames before the first that differs"
                                        f"{said}", required=f">= {check.min_code_agreement}", measured=round(share, 4),
                                  ok=share >= check.min_code_agreement and (at is None or at < len(u.codes)),
                                  by=None if at is None else at))
        expected = len(got) * check.samples_per_frame
        out.append(contract.Check(check=f"speech samples of {name}: {check.samples_per_frame} a frame of its "
                                        f"{len(got)} frames", required=f"== {expected}", measured=len(heard),
                                  ok=len(heard) == expected))
        rms, clipped = level(heard)
        ref_rms = u.rms
        ok = rms > SILENCE_RMS and clipped <= MAX_CLIPPED and ref_rms / LEVEL_RATIO <= rms <= ref_rms * LEVEL_RATIO
        out.append(contract.Check(check=f"speech level of {name}: RMS within {LEVEL_RATIO}x of the reference's "
                                        f"{ref_rms:.4f}, above silence ({SILENCE_RMS}), at most {MAX_CLIPPED:.0%} "
                                        f"clipped (has {clipped:.2%})", required=f"{ref_rms / LEVEL_RATIO:.4f} .. "
                                  f"{ref_rms * LEVEL_RATIO:.4f}", measured=round(rms, 5), ok=ok))
        if at is None:      # the same codes: the waveforms must agree too
            c = cosine(heard, ref)
            out.append(contract.Check(check=f"speech waveform of {name}: cosine with the reference's",
                                      required=f">= {check.min_cosine}", measured=round(c, 5),
                                      ok=c >= check.min_cosine))
    return out

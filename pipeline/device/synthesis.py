"""The text-to-speech gate, the same on both halves (contract.SynthesisCheck): the engines' greedy codes against the
reference's, frame by frame up to the first that differs (a talker step that chose another code makes every later
frame another); the samples Code2Wav must make of them; the waveform's cosine with the reference's; and its level
(silence or clipping is a broken vocoder whatever the codes). The device runs the kit's texts through Edge-LLM's
qwen3_tts_inference (runtime/synthesis.py), measures each (`measure`); device/report.py reports it. Standard
library only: the device runs it.

The round trip through a speech-to-text model (what the engines said, transcribed, against the text) is
device/round_trip.py's, where the device is given a transcriber; the workstation's (the transcriber recipe's
checkpoint on the reference's speech, workstation/round_trip.py) is carried in the kit and reported beside it."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from pathlib import Path

from pipeline import contract

SILENCE_RMS = 1e-3          # below: silence (full scale 1)
MAX_CLIPPED = 0.01          # the most samples at full scale before the waveform counts as clipped
LEVEL_RATIO = 2.0           # the engine's RMS within this factor of the reference's


def agreement(want: list[list[int]], got: list[list[int]], ties: Sequence[contract.SpokenTie] = (),
              eos: int | None = None) -> tuple[float, int | None, contract.SpokenTie | None]:
    """(the share of the reference's frames the engine gave before the first that differs, that frame's index or
    None where none differs and the lengths agree, the near tie the engine took there or None). Where the first
    code that differs is one of the reference's near ties (its runner-up, or EOS ending the utterance there or not
    ending it), the engine agreed up to there and what follows is not compared: the share is 1.0."""
    for i in range(max(len(want), len(got))):
        if i < len(want) and i < len(got) and list(got[i]) == list(want[i]):
            continue
        # the engine's first differing choice: (codebook, code); past its end it chose EOS, past the reference's
        # end it chose its frame's codebook 0 where the reference chose EOS
        if i >= len(got):
            taken = (0, eos)
        elif i >= len(want):
            taken = (0, int(got[i][0]))
        else:
            g = next(g for g, (a, b) in enumerate(zip(want[i], got[i], strict=True)) if a != b)
            taken = (g, int(got[i][g]))
        tie = next((t for t in ties if (t.frame, t.group, t.code) == (i, *taken)), None)
        return (1.0 if tie is not None else min(i, len(want)) / len(want)), i, tie
    return 1.0, None, None


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
    na, nb = math.sqrt(sum(a[i] * a[i] for i in range(n))), math.sqrt(sum(b[i] * b[i] for i in range(n)))
    return dot / (na * nb) if na and nb else 0.0


def measure(text: str, codes: list[list[int]], heard: array, reference: array) -> contract.SpokenResult:
    rms, clipped = level(heard)
    return contract.SpokenResult(text, [list(f) for f in codes], len(heard), round(rms, 6), round(clipped, 6),
                                 round(cosine(heard, reference), 6))


def checks(check: contract.SynthesisCheck, results: list[contract.SpokenResult]) -> list[contract.Check]:
    """The gate's checks for each utterance, from what the engines spoke of it."""
    out = []
    for u, r in zip(check.utterances, results, strict=True):
        name = f"{u.text[:40]!r} ({u.speaker}, {u.language})"
        share, at, tie = agreement(u.codes, r.codes, u.near_ties, check.eos_code)
        said = "" if at is None else \
            f"; frame {at} took the reference's near tie at codebook {tie.group} ({tie.margin} below its choice: " \
            f"at most {check.tie_margin}), compared up to there" if tie is not None else \
            f"; frame {at} differs" if at < len(u.codes) and at < len(r.codes) else \
            f"; {len(r.codes)} frames where the reference has {len(u.codes)}"
        out.append(contract.Check(check=f"speech codes of {name}: reference frames before the first that differs"
                                        f"{said}", required=f">= {check.min_code_agreement}", measured=round(share, 4),
                                  # speaking on past the reference's end is never agreement (it missed EOS)
                                  ok=share >= check.min_code_agreement and (at is None or tie is not None or
                                                                            at < len(u.codes)),
                                  by=None if at is None else at))
        expected = len(r.codes) * check.samples_per_frame
        out.append(contract.Check(check=f"speech samples of {name}: {check.samples_per_frame} a frame of its "
                                        f"{len(r.codes)} frames", required=f"== {expected}", measured=r.samples,
                                  ok=r.samples == expected))
        low, high = u.rms / LEVEL_RATIO, u.rms * LEVEL_RATIO
        ok = r.rms > SILENCE_RMS and r.clipped <= MAX_CLIPPED and low <= r.rms <= high
        out.append(contract.Check(check=f"speech level of {name}: RMS within {LEVEL_RATIO}x of the reference's "
                                        f"{u.rms:.4f}, above silence ({SILENCE_RMS}), at most {MAX_CLIPPED:.0%} "
                                        f"clipped (has {r.clipped:.2%})", required=f"{low:.4f} .. {high:.4f}",
                                  measured=r.rms, ok=ok))
        if at is None:      # the same codes: the waveforms must agree too
            out.append(contract.Check(check=f"speech waveform of {name}: cosine with the reference's",
                                      required=f">= {check.min_cosine}", measured=r.cosine,
                                      ok=r.cosine >= check.min_cosine))
    return out


def reference_samples(kit_dir: Path, golden: contract.SpokenGolden) -> array:
    """The kit's reference waveform of one text: its file (audio/NAME.wav, nothing else) as the manifest hashed it."""
    import hashlib

    from pipeline.audio import read_wav
    from pipeline.errors import PipelineError
    from pipeline.files import read_regular
    if not contract.RECORDING_FILE_RE.match(golden.recording):
        raise PipelineError(f"{kit_dir}: goldens.json names {golden.recording!r}, not a kit's audio/NAME.wav",
                            "re-package the kit")
    data = read_regular(kit_dir / golden.recording, 256 * 2**20)
    if hashlib.sha256(data).hexdigest() != golden.recording_sha256:
        raise PipelineError(f"{kit_dir / golden.recording}: not the reference waveform goldens.json names (its sha256 "
                            "differs)", "re-package the kit")
    return read_wav(data, name=str(kit_dir / golden.recording)).samples


def validate_synthesis(kit_dir: Path, engine: Path, goldens: contract.Goldens, work: Path, timeout: int,
                       watch=None, transcriber=None) -> contract.Validation:
    """The kit's texts spoken by the engines as the reference spoke them (greedy, each in its voice, up to the
    goldens' frames), each measured against the kit's reference; heard back by `transcriber` (round_trip.py) where
    the device was given one."""
    from pipeline.audio import read_wav
    from pipeline.files import remove_entry
    from pipeline.runtime.synthesis import SynthesisSampling, Utterance, speak
    check = goldens.synthesis
    assert check is not None        # the caller asked for it
    run = work / "speech-synthesis"
    remove_entry(run)       # an earlier run's, or a planted entry: never written through
    groups = len(check.utterances[0].codes[0]) if check.utterances and check.utterances[0].codes else 16
    from pipeline.device.process import run_logged
    spoken = speak(engine, [Utterance(u.text, u.speaker, u.language) for u in check.utterances],
                   SynthesisSampling(max_audio_length=check.max_frames), run, groups, timeout,
                   run=lambda argv, cwd: run_logged(argv, cwd=cwd, log=work / "speech-synthesis.log",
                                                    timeout=timeout, watch=watch))
    heard = [read_wav(s.wav).samples for s in spoken]
    references = [reference_samples(kit_dir, u) for u in check.utterances]
    results = [measure(u.text, s.codes, h, r) for u, s, h, r in zip(check.utterances, spoken, heard, references,
                                                                   strict=True)]
    if transcriber is not None:
        import dataclasses

        from pipeline.device.round_trip import hear_back
        # the texts' language as the recipe's round trip declares it (it decides word or character error rate);
        # a kit without one: the language the texts were spoken in
        language = check.round_trip.language if check.round_trip is not None else \
            check.utterances[0].language if check.utterances else "auto"
        trips = hear_back(transcriber, [u.text for u in check.utterances], language, heard,
                          references, check.sample_rate, work, watch, timeout)
        results = [dataclasses.replace(r, **t) for r, t in zip(results, trips, strict=True)]
    return contract.Validation(runtime="qwen3_tts_inference", speed_source="none (the runtime's run, engines "
                               "loaded included, is not a speed measurement)", prompts=[], spoken=results,
                               transcriber=transcriber.name if transcriber is not None else None)


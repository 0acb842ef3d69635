"""The text-to-speech gate's round trip: what a speech-to-text engine hears in the engines' speech, against the text
they were asked to speak, beside what it hears in the reference's speech of the same text.

`device TTS-KIT --transcriber ASR-BUNDLE` (and `install TTS-BUNDLE --transcriber ASR-BUNDLE`) names a speech-to-text
bundle built on a board like this one (`device` of a Qwen3-ASR or a Nemotron-3.5-ASR kit): it is verified
(signature, every part's hash), gated against this board and unpacked in this run exactly as `install` does, and
asked as its own speech gate asks (Qwen3-ASR: llm_inference, greedy, its set's prompt after the recording, the
transcript after its marker; an RNN-T: its NemotronAsrRuntime under the language's prompt slot, the transcript without
its language tag: device/transducer.py). Each text's two
waveforms (the engines', the kit's reference) go to it at its 16 kHz; both transcripts are scored against the text by
the speech gate's own metric (word error rate, or character error rate for a language written without spaces:
pipeline/transcripts.py). The check holds the engines' rate within SynthesisCheck.max_round_trip_increase of the
reference's: a transcriber that hears the reference badly (a tiny twin, a language it was not trained on) does not fail
the speech, and speech it hears worse than the reference's does.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.device.process import say
from pipeline.errors import PipelineError
from pipeline.families.audio import QWEN3_ASR_LANGUAGES

RATE = 16_000       # what the transcriber's audio runner reads (Whisper's features)
TRANSCRIBER_DIR = "transcriber"      # under a run's work directory: where the transcriber's bundle is unpacked


@dataclass(frozen=True)
class Transcriber:
    name: str                   # its bundle's name
    engine: Path                # the unpacked bundle (its engines at the root, audio/ among them)
    speech: contract.SpeechCheck    # its speech gate: the prompt, the marker, the answer's length
    languages: tuple[tuple[str, str], ...]     # (ISO 639 code, the name its answers give: "language English...")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for _, n in self.languages)

    def code(self, language: str) -> str:
        """A language as the transcripts' metric keys on it (ISO 639): Qwen3-TTS names languages as the transcriber
        does ("english", "chinese"); "auto" and a name it does not know stay as they are (scored by words)."""
        return next((c for c, n in self.languages if n.lower() == language.lower()), language)


def open_transcriber(bundle: Path, work: Path, trusted, root: str) -> Transcriber:
    """The bundle verified, gated against this board and unpacked under work/transcriber; refused where it is not a
    speech-to-text model's (it carries no audio engine or no speech set to say how it is asked)."""
    from pipeline.device import gate
    from pipeline.device.opening import open_verified, serving_records, unpack_verified
    from pipeline.families import family

    opened = open_verified(bundle, trusted, root, contract.BundleManifest, say)
    m = opened.manifest
    assert isinstance(m, contract.BundleManifest)       # open_verified checked the kind
    for w in gate.require(m, opened.board).warnings:
        say(f"warning: {w}")
    dest = unpack_verified(opened, work / TRANSCRIBER_DIR / opened.verified.name, trusted)
    plan, goldens, _ = serving_records(opened, dest)
    rnnt = plan.speech is not None and plan.speech.kind == contract.SPEECH_TO_TEXT     # an RNN-T: its own runtime
    if (plan.audio is None and not rnnt) or goldens.speech is None:
        lacks = "no audio engine" if plan.audio is None and not rnnt else "no speech set saying how it is asked"
        raise PipelineError(f"--transcriber {bundle}: {m.kit.name} is not a speech-to-text bundle (it has {lacks})",
                            "give the bundle `device` made of a speech-to-text kit (Qwen3-ASR, Nemotron-3.5-ASR, "
                            "Gemma 4 with its audio tower) on "
                            "this board")
    fam = family(plan.model.architecture)
    # the languages by the names its answers give (Qwen3-ASR's); an RNN-T answers with tags, and is asked by ISO 639
    # code: the same table names them (Qwen3-TTS names a language as Qwen3-ASR does)
    languages = tuple(fam.audio.languages) if fam is not None and fam.audio is not None else \
        tuple(QWEN3_ASR_LANGUAGES.items())
    say(f"transcriber {opened.verified.name}: verified and unpacked to {dest}")
    return Transcriber(opened.verified.name, dest, goldens.speech, languages)


def heard_as_the_board_hears(samples: array, rate: int) -> bytes:
    """A 16-bit waveform at `rate` as a transcriber is given it, here and on the workstation
    (workstation/round_trip.py): resampled to 16 kHz, a WAV."""
    from pipeline.audio import resample, wav_bytes
    return wav_bytes(resample(samples, rate, RATE), RATE)


def hear_back(transcriber: Transcriber, texts: list[str], language: str, engines: list[array], references: list[array],
              rate: int, work: Path, watch, timeout: int) -> list[dict]:
    """Each text's two waveforms (at `rate`) transcribed and scored: the SpokenResult fields of the round trip."""
    from pipeline.device.hearing import ask_recordings
    from pipeline.files import fresh_dir
    from pipeline.transcripts import error_rate, transcript_of
    run = work / "round-trip"
    fresh_dir(run)
    paths = []
    for i, (mine, ref) in enumerate(zip(engines, references, strict=True)):
        for who, samples in (("engines", mine), ("reference", ref)):
            path = run / f"{who}-{i}.wav"
            path.write_bytes(heard_as_the_board_hears(samples, rate))
            paths.append(path)
    s = transcriber.speech
    language = transcriber.code(language)
    if s.language_tags:         # an RNN-T: its own runtime, each recording under the language's prompt slot
        from pipeline.device.transducer import hear_recordings
        answers = hear_recordings(transcriber.engine, paths, language, run, "round-trip", watch, timeout)
    else:
        answers = ask_recordings(transcriber.engine, paths, s.prompt, s.max_new_tokens, run, "round-trip", watch,
                                 timeout)
    heard = [transcript_of(a, s.marker, transcriber.names, s.language_tags) for a in answers]
    out = []
    for i, text in enumerate(texts):
        ours, theirs = heard[2 * i], heard[2 * i + 1]
        rate_ours, rate_theirs = error_rate([(text, ours)], language), error_rate([(text, theirs)], language)
        out.append({"heard": ours, "reference_heard": theirs, "metric": rate_ours.metric,
                    "error_rate": round(rate_ours.rate, 4), "reference_error_rate": round(rate_theirs.rate, 4)})
    return out


def checks(check: contract.SynthesisCheck, results: list[contract.SpokenResult], name: str) -> list[contract.Check]:
    """One check per text whose round trip was measured: the engines' error rate within max_round_trip_increase of the
    reference's."""
    out = []
    for u, r in zip(check.utterances, results, strict=True):
        if r.error_rate is None or r.reference_error_rate is None:
            continue
        most = round(r.reference_error_rate + check.max_round_trip_increase, 4)
        metric = (r.metric or "wer").upper()
        said = (f"speech round trip of {u.text[:40]!r}: {metric} of {name}'s transcript of the engines' speech "
                f"({(r.heard or '')[:80]!r}), the reference's {r.reference_error_rate:.1%} "
                f"({(r.reference_heard or '')[:80]!r})")
        ok = r.error_rate <= most
        out.append(contract.Check(check=said, required=f"<= {most}", measured=r.error_rate, ok=ok,
                                  by=None if ok else round(r.error_rate - most, 4)))
    return out


def workstation_figure(trip: contract.RoundTrip) -> str:
    """The workstation's round trip (the transcriber recipe's checkpoint on the reference's speech), said; the limit
    as exactly as the recipe gives it (0.9999 is not said as 100.0%)."""
    r, most = trip.rate, trip.max_error_rate
    limit = f"{most:.1%}" if round(most, 3) == most else f"{most:.2%}"
    return (f"{trip.transcriber}'s checkpoint hears the reference's speech at {r.metric.upper()} {r.rate:.1%} (95% "
            f"{r.low:.1%} to {r.high:.1%}, {r.utterances} texts; limit {limit})")


def workstation_over_limit(trip: contract.RoundTrip) -> str | None:
    """What the workstation's round trip misses of its limit, said; None where it holds."""
    if trip.rate.rate <= trip.max_error_rate:
        return None
    return f"{workstation_figure(trip)}: more than validation.round_trip.max_error_rate"

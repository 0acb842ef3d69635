"""The speech quality gate's scoring, the same on both halves: a set's transcripts against their references, per
language (pipeline/transcripts.py: word or character error rate, a 95% bootstrap interval over the utterances), and
the gate's checks. The workstation scores the reference model with it (workstation/speech_gate.py), the device its
engine (report.py), so the two figures in a report are computed the same way."""

from __future__ import annotations

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.transcripts import error_rate, transcript_of


def rates(items: list[contract.SpeechItem], transcripts: list[str]) -> list[contract.SpeechRate]:
    """The error rate of each language of the set (its utterances' transcripts against their references)."""
    if len(items) != len(transcripts):
        raise PipelineError(f"{len(transcripts)} transcripts for a speech set of {len(items)} utterances",
                            "see the validation log")
    out = []
    for language in sorted({i.language for i in items}):
        pairs = [(i.transcript, t) for i, t in zip(items, transcripts, strict=True) if i.language == language]
        r = error_rate(pairs, language)
        out.append(contract.SpeechRate(language, r.metric, round(r.rate, 4), round(r.interval[0], 4),
                                       round(r.interval[1], 4), r.utterances))
    return out


def over_limit(check: contract.SpeechCheck, measured: list[contract.SpeechRate]) -> list[str]:
    """Each language whose rate is past the gate's limit, said with its interval."""
    return [f"{r.metric.upper()} {r.rate:.1%} in {r.language} (95% {r.low:.1%} to {r.high:.1%}, {r.utterances} "
            f"utterances) is more than validation.speech.max_error_rate = {check.max_error_rate:.1%}"
            for r in measured if r.rate > check.max_error_rate]


def engine_rates(check: contract.SpeechCheck, answers: list[str], names: tuple[str, ...]) -> list[contract.SpeechRate]:
    """The engine's answers (the runtime's text) read as transcripts and scored."""
    return rates(check.utterances, [transcript_of(a, check.marker, names, check.language_tags) for a in answers])


def checks(check: contract.SpeechCheck, measured: list[contract.SpeechRate]) -> list[contract.Check]:
    """One check per language: the engine's rate within the recipe's limit (the reference's said beside it)."""
    reference = {r.language: r for r in check.reference}
    out = []
    for r in measured:
        ref = reference.get(r.language)
        said = f" (the reference scored {ref.rate:.1%} on the workstation)" if ref else ""
        out.append(contract.Check(check=f"speech {r.metric.upper()} in {r.language} on {check.set or 'the set'}"
                                        f" ({r.utterances} utterances, 95% {r.low:.1%} to {r.high:.1%}){said}",
                                  required=f"<= {check.max_error_rate}", measured=r.rate,
                                  ok=r.rate <= check.max_error_rate,
                                  by=None if r.rate <= check.max_error_rate else round(r.rate - check.max_error_rate,
                                                                                      4)))
    return out

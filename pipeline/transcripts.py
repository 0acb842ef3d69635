"""How far transcripts are from their references: word error rate (WER) for languages written with spaces between
words, character error rate (CER) for those written without (Chinese, Japanese, Thai, ...), over a set of utterances,
with a 95% bootstrap interval over the utterances (a gate on a handful of recordings must say how sure it is).

The rate is the corpus rate: the edits (substitutions, deletions, insertions: Levenshtein distance) of every
utterance summed, over the reference units summed, as speech benchmarks report it. Both texts are normalized first:
Unicode NFKC, case folded, punctuation and symbols dropped, whitespace collapsed; numbers are left as written (a
model that writes "ten" for "10" is counted wrong: the references say how the recipe wants them).

Standard library only: the device computes the same figures on the engine's transcripts.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import PipelineError
from pipeline.resampling import bootstrap_interval

# languages scored by characters: written without spaces between words (ISO 639 codes, as recipes declare them)
CHARACTER_LANGUAGES = frozenset({"zh", "yue", "ja", "th", "lo", "my", "km"})
MAX_UNITS = 20_000      # per utterance: the distance is quadratic; a transcript this long is not an utterance


@dataclass(frozen=True)
class ErrorRate:
    metric: str                         # "wer" or "cer"
    language: str
    rate: float                         # edits / reference units over every utterance
    interval: tuple[float, float]       # 95% bootstrap interval over the utterances
    edits: int
    units: int                          # reference words (wer) or characters (cer)
    utterances: int


def metric_for(language: str) -> str:
    return "cer" if language.split("-")[0].lower() in CHARACTER_LANGUAGES else "wer"


def normalize(text: str) -> str:
    """NFKC, case folded, punctuation and symbols as spaces, whitespace collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(" " if unicodedata.category(c)[0] in "PSZC" else c for c in folded)
    return " ".join(kept.split())


def units(text: str, metric: str) -> list[str]:
    """What the metric counts in the normalized text: its words, or its characters without the spaces."""
    norm = normalize(text)
    return norm.split() if metric == "wer" else [c for c in norm if c != " "]


def edits(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance: the fewest substitutions, deletions and insertions turning one into the other."""
    if len(reference) > MAX_UNITS or len(hypothesis) > MAX_UNITS:
        raise PipelineError(f"a transcript of {max(len(reference), len(hypothesis))} units: over {MAX_UNITS}, "
                            "not one utterance", "score utterances, not whole recordings")
    previous = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        current = [i]
        for j, h in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


def error_rate(pairs: Sequence[tuple[str, str]], language: str, rounds: int = 2000, seed: int = 0) -> ErrorRate:
    """The error rate of (reference, transcript) pairs in `language`, with its bootstrap interval (`rounds`
    resamplings of the utterances, seeded: the same pairs give the same interval everywhere)."""
    metric = metric_for(language)
    per = [(edits(ref_units, units(hyp, metric)), len(ref_units))
           for ref, hyp in pairs for ref_units in [units(ref, metric)]]
    total = sum(n for _, n in per)
    if not per or total == 0:
        raise PipelineError(f"no reference {'words' if metric == 'wer' else 'characters'} to score in {language!r}",
                            "give each speech prompt its reference transcript")
    def rate(sample: list[tuple[int, int]]) -> float:
        n = sum(u for _, u in sample)
        return sum(e for e, _ in sample) / n if n else 0.0

    wrong = sum(e for e, _ in per)
    return ErrorRate(metric, language, wrong / total, bootstrap_interval(per, rate, rounds, seed), wrong, total,
                     len(per))


def answer_transcript(answer: str, marker: str, names: Sequence[str]) -> tuple[str | None, str]:
    """(the language the model named, the transcript) of a transcriber's answer in Qwen3-ASR's format, "language NAME"
    + `marker` + the transcript: split at the marker where the text kept it; where the runtime's decoding dropped it
    (a control token), the "language NAME" before it read against the names the model answers with (`names`, and
    "None"). An answer in neither form is all transcript."""
    if not marker:          # a model without one (Gemma 4) answers with the transcript alone
        return None, answer.strip()
    if marker in answer:
        head, text = answer.split(marker, 1)
        named = head.strip()
        named = named[len("language "):].strip() if named.lower().startswith("language ") else named
        return (None if not named or named.lower() == "none" else named), text.strip()
    stripped = answer.lstrip()
    for name in sorted((*names, "None"), key=len, reverse=True):
        prefix = f"language {name}"
        if stripped.startswith(prefix):
            return (None if name == "None" else name), stripped[len(prefix):].strip()
    return None, answer.strip()


# a language tag as Nemotron-3.5-ASR emits it (<en-US>), a word of its own: Edge-LLM 0.11's ASR server's pattern
LANGUAGE_TAG = re.compile(r"(?:^|\s)<([A-Za-z]{2,3}(?:-[A-Za-z]{2})?)>(?=\s|$)")


def tagged_transcript(answer: str) -> tuple[str | None, str]:
    """(the language the last tag names, the transcript without its tags) of an RNN-T's answer, as Edge-LLM's
    transcription server splits it; (None, the answer) where it carries no tag."""
    found = list(LANGUAGE_TAG.finditer(answer))
    if not found:
        return None, answer.strip()
    return found[-1].group(1), " ".join(LANGUAGE_TAG.sub(" ", answer).split())


def transcript_of(answer: str, marker: str, names: Sequence[str], language_tags: bool) -> str:
    """The transcript in a speech model's answer: after its marker (Qwen3-ASR), or without its tags (an RNN-T)."""
    return tagged_transcript(answer)[1] if language_tags else answer_transcript(answer, marker, names)[1]

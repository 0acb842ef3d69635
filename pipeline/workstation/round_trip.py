"""The text-to-speech gate's round trip on the workstation: the reference's speech of each golden text heard by the
checkpoint of the speech-to-text recipe the recipe names ([validation.round_trip] transcriber), scored against the
text (pipeline/transcripts.py: word error rate, or character error rate in a language written without spaces; every
text together, with its 95% interval over the texts), carried in the kit's goldens (contract.RoundTrip) and held to
the recipe's limit by the package stage.

It hears what the board's transcriber bundle hears (device/round_trip.py): the reference's 16-bit waveform taken to
16 kHz by the same resampler, as a WAV, asked as the transcriber's own speech gate asks. The transcriber is the other
recipe's fetched checkpoint in its reference numerics, not its quantized kit: the workstation measures whether the
reference's speech says the text, judged by the best transcriber the recipe has; the board measures what its engines
lose against that speech, judged by the deployed transcriber.

How a model transcribes is its kind's: an RNN-T's own (families/audio.py SpeechModel.transcribe), or a decoder with
an audio encoder asked as its speech gate asks (workstation/speech_gate.py transcribe_recordings).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class TranscriberCheckpoint:
    """The speech-to-text recipe a text-to-speech recipe names, and its fetched checkpoint."""
    recipe: Any             # pipeline.recipe.Recipe (the recipe package sits above this one)
    model_dir: Path


def transcribe(transcriber: TranscriberCheckpoint, recordings: list[tuple[str, bytes]], language: str) -> list[str]:
    """The transcriber checkpoint's transcripts of (what it is, a 16 kHz WAV) recordings, by its kind; a model that
    does not transcribe is refused, naming the recipe."""
    from pipeline.families.audio import speech_model_of
    from pipeline.plan.shapes import load_config
    model_dir, recipe = transcriber.model_dir, transcriber.recipe
    row = speech_model_of(load_config(model_dir / "config.json"))
    if row is not None:
        if row.transcribe is None:
            raise PipelineError(f"{recipe.file}: {recipe.model.label} is {row.name} ({row.what}): it does not "
                                "transcribe", "name a speech-to-text recipe as validation.round_trip.transcriber")
        return row.stage("transcribe")(model_dir, recipe, recordings, language)
    from pipeline.workstation.speech_gate import transcribe_recordings
    return transcribe_recordings(model_dir, recipe, recordings, language)


def round_trip(transcriber: TranscriberCheckpoint, settings, texts: list[str], waveforms: list[array],
               rate: int) -> contract.RoundTrip:
    """Each text's reference waveform (16-bit at `rate`) heard by the transcriber and scored against the text;
    settings: the text-to-speech recipe's [validation.round_trip]."""
    from pipeline.device.round_trip import heard_as_the_board_hears
    from pipeline.transcripts import error_rate
    recordings = [(f"the reference's speech of {text[:40]!r}", heard_as_the_board_hears(samples, rate))
                  for text, samples in zip(texts, waveforms, strict=True)]
    try:
        heard = transcribe(transcriber, recordings, settings.language)
    except PipelineError as exc:
        raise PipelineError(f"validation.round_trip.transcriber = {transcriber.recipe.name}: {exc.message}",
                            exc.hint) from None
    r = error_rate(list(zip(texts, heard, strict=True)), settings.language)
    return contract.RoundTrip(transcriber.recipe.name, transcriber.recipe.model.label, settings.language, heard,
                              contract.SpeechRate(settings.language, r.metric, round(r.rate, 4),
                                                  round(r.interval[0], 4), round(r.interval[1], 4), r.utterances),
                              settings.max_error_rate)


"""The speech quality gate's workstation half: the recipe's speech set transcribed by the reference model (the deployed
numerics, as the goldens are computed), scored per language (pipeline/transcripts.py: word or character error rate
with a 95% bootstrap interval over the utterances), and packed into the kit's goldens (contract.SpeechCheck) with the
recordings, so that the device asks its engine the same and scores it the same way.

Each utterance is asked as /v1/audio/transcriptions asks: the recording in a user turn, then the text its design
puts there (Qwen3-ASR: the recipe's speech prompt, where it sets one; Gemma 4: its model card's transcription
instruction), greedy; the transcript is what follows the model's marker ("language English<asr_text>front left"), or,
for a model without one, the whole answer. The package stage refuses a kit whose reference scores past the recipe's
limit in any language.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import contract
from pipeline.device.speech import rates
from pipeline.transcripts import answer_transcript

if TYPE_CHECKING:
    from pipeline.workstation.audio_prompts import PromptRecording, RecordingPrompts


@dataclass(frozen=True)
class SpeechSetAsked:
    """The recipe's speech set as the engine hears it, and what asks a model with it: made once per stage, for each
    model the stage transcribes it with."""
    settings: Any               # the recipe's [validation.speech]
    asked: RecordingPrompts     # the extractor, the placeholder, the chunking
    utterances: tuple           # speech_set.Utterance
    recordings: list[PromptRecording]   # as the kit carries them
    marker: str
    names: tuple[str, ...]      # the language names the model answers with
    text: str | None            # after the recording in the user turn: the recipe's prompt, or the design's instruction


def speech_set_asked(model_dir: Path, settings, recipe_file: str, max_seconds: int) -> SpeechSetAsked:
    from pipeline.plan.parts import AudioEncoder
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.audio_prompts import PromptRecording, recording_asker
    from pipeline.workstation.speech_set import read_speech_set

    speech = read_speech_set(settings.set, recipe_file, "validation.speech.set")
    asked = recording_asker(model_dir, recipe_file, max_seconds, "validation.speech")
    encoder = load_shape(model_dir).part(AudioEncoder)
    assert encoder is not None      # recording_asker refused a model without one
    return SpeechSetAsked(settings, asked, speech.utterances,
                          [PromptRecording(u.name, u.name.split("/", 1)[1], u.wav) for u in speech.utterances],
                          encoder.design.transcript_marker, tuple(n for _, n in encoder.design.languages),
                          encoder.design.transcription_text(None, settings.prompt))


def transcribe_set(model, tokenizer, s: SpeechSetAsked, stops: list[int]) -> tuple[list[contract.SpeechItem],
                                                                                   list[str]]:
    """(the set's items, `model`'s transcripts of them)."""
    items, transcripts = [], []
    for u, rec in zip(s.utterances, s.recordings, strict=True):
        transcript, count = _transcript(model, tokenizer, s, rec, stops)
        transcripts.append(transcript)
        items.append(contract.SpeechItem(u.name, rec.sha256, u.language, u.transcript, count))
    return items, transcripts


def _transcript(model, tokenizer, s: SpeechSetAsked, recording: PromptRecording, stops: list[int]) -> tuple[str, int]:
    """(`model`'s transcript of one recording asked as the set is, its audio tokens)."""
    from pipeline.workstation.evaluate import greedy
    _, ids, inputs, count = s.asked.asked(tokenizer, s.text, recording)
    answer = greedy(model, ids, s.settings.max_new_tokens, 1, stops, **inputs)["output_ids"]
    text = tokenizer.decode(answer, skip_special_tokens=False)
    for stop in stops:      # the end of the turn is not part of the transcript
        text = text.replace(tokenizer.decode([stop], skip_special_tokens=False), "")
    return answer_transcript(text, s.marker, s.names)[1], count


def transcribe_recordings(model_dir: Path, recipe, recordings: list[tuple[str, bytes]], _language: str) -> list[str]:
    """A speech-to-text recipe's checkpoint (its FP16 weights computed in float32, as load_model makes a reference)
    hearing other recordings ((what it is, a 16 kHz WAV)) as its speech gate asks its set: the text-to-speech round
    trip's transcriber (workstation/round_trip.py). It asks as the board's bundle asks, without naming the language."""
    from transformers import AutoTokenizer

    from pipeline.formats import UNQUANTIZED
    from pipeline.plan.parts.audio import DEFAULT_MAX_SECONDS
    from pipeline.workstation.audio_prompts import PromptRecording
    from pipeline.workstation.evaluate import stop_ids
    from pipeline.workstation.models import load_model, pick_device
    audio = recipe.build.audio
    s = speech_set_asked(model_dir, recipe.validation.speech, recipe.file,
                         audio.max_seconds if audio and audio.max_seconds else DEFAULT_MAX_SECONDS)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(model_dir, pick_device(UNQUANTIZED))
    stops = stop_ids(model_dir, tokenizer)
    return [_transcript(model, tokenizer, s, PromptRecording(what, f"round-trip-{i}.wav", data), stops)[0]
            for i, (what, data) in enumerate(recordings)]


def speech_check(model, tokenizer, model_dir: Path, settings, recipe_file: str, max_seconds: int,
                 stops: list[int], out: Path) -> contract.SpeechCheck:
    """The set transcribed by `model` (the reference), scored, and its recordings written under out/audio."""
    from pipeline.workstation.audio_prompts import AUDIO_DIR
    s = speech_set_asked(model_dir, settings, recipe_file, max_seconds)
    items, transcripts = transcribe_set(model, tokenizer, s, stops)
    (out / AUDIO_DIR).mkdir(exist_ok=True)
    for rec in s.recordings:
        (out / AUDIO_DIR / rec.name).write_bytes(rec.data)
    return contract.SpeechCheck(items, settings.max_error_rate, settings.max_new_tokens, rates(items, transcripts),
                                marker=s.marker, prompt=s.text or "", set=settings.set)


def original_and_quantized(original, quantized, tokenizer, model_dir: Path, settings, recipe_file: str,
                           max_seconds: int, stops: list[int]) -> tuple[list[contract.SpeechRate],
                                                                        list[contract.SpeechRate]]:
    """The set's error rates of the original model and of the quantized one (the accuracy stage's: what the format
    costs in transcription), the set read and prepared once for both."""
    s = speech_set_asked(model_dir, settings, recipe_file, max_seconds)
    before, after = (rates(*transcribe_set(model, tokenizer, s, stops)) for model in (original, quantized))
    return before, after

"""The speech quality gate's workstation half: the recipe's speech set transcribed by the reference model (the deployed
numerics, as the goldens are computed), scored per language (pipeline/transcripts.py: word or character error rate
with a 95% bootstrap interval over the utterances), and packed into the kit's goldens (contract.SpeechCheck) with the
recordings, so that the device asks its engine the same and scores it the same way.

Each utterance is asked as /v1/audio/transcriptions asks: the recording in a user turn (then the recipe's speech
prompt, where it sets one), greedy; the transcript is what follows the model's marker ("language English<asr_text>
front left"). The package stage refuses a kit whose reference scores past the recipe's limit in any language.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import contract
from pipeline.device.speech import rates
from pipeline.transcripts import answer_transcript


def transcribe_set(model, tokenizer, model_dir: Path, settings, recipe_file: str, max_seconds: int,
                   stops: list[int]) -> tuple[list[contract.SpeechItem], list[str], list]:
    """(the set's items, `model`'s transcripts of them, the recordings as the kit carries them)."""
    from pipeline.plan.parts import AudioEncoder
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.audio_prompts import PromptRecording, recording_asker
    from pipeline.workstation.evaluate import greedy
    from pipeline.workstation.speech_set import read_speech_set

    speech = read_speech_set(settings.set, recipe_file, "validation.speech.set")
    asked = recording_asker(model_dir, recipe_file, max_seconds, "validation.speech")
    encoder = load_shape(model_dir).part(AudioEncoder)
    assert encoder is not None      # recording_asker refused a model without one
    recordings = [PromptRecording(u.name, u.name.split("/", 1)[1], u.wav) for u in speech.utterances]
    names = tuple(n for _, n in encoder.design.languages)
    items, transcripts = [], []
    for u, rec in zip(speech.utterances, recordings, strict=True):
        _, ids, inputs, count = asked.asked(tokenizer, settings.prompt, rec)
        answer = greedy(model, ids, settings.max_new_tokens, 1, stops, **inputs)["output_ids"]
        text = tokenizer.decode(answer, skip_special_tokens=False)
        for stop in stops:      # the end of the turn is not part of the transcript
            text = text.replace(tokenizer.decode([stop], skip_special_tokens=False), "")
        transcripts.append(answer_transcript(text, encoder.design.transcript_marker, names)[1])
        items.append(contract.SpeechItem(u.name, rec.sha256, u.language, u.transcript, count))
    return items, transcripts, recordings


def speech_check(model, tokenizer, model_dir: Path, settings, recipe_file: str, max_seconds: int,
                 stops: list[int], out: Path) -> contract.SpeechCheck:
    """The set transcribed by `model` (the reference), scored, and its recordings written under out/audio."""
    from pipeline.plan.parts import AudioEncoder
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.audio_prompts import AUDIO_DIR
    items, transcripts, recordings = transcribe_set(model, tokenizer, model_dir, settings, recipe_file, max_seconds,
                                                    stops)
    encoder = load_shape(model_dir).part(AudioEncoder)
    assert encoder is not None
    (out / AUDIO_DIR).mkdir(exist_ok=True)
    for rec in recordings:
        (out / AUDIO_DIR / rec.name).write_bytes(rec.data)
    return contract.SpeechCheck(items, settings.max_error_rate, settings.max_new_tokens, rates(items, transcripts),
                                marker=encoder.design.transcript_marker, prompt=settings.prompt, set=settings.set)


def original_and_quantized(original, quantized, tokenizer, model_dir: Path, settings, recipe_file: str,
                           max_seconds: int, stops: list[int]) -> tuple[list[contract.SpeechRate],
                                                                        list[contract.SpeechRate]]:
    """The set's error rates of the original model and of the quantized one (the accuracy stage's: what the format
    costs in transcription)."""
    out = []
    for model in (original, quantized):
        items, transcripts, _ = transcribe_set(model, tokenizer, model_dir, settings, recipe_file, max_seconds, stops)
        out.append(rates(items, transcripts))
    return out[0], out[1]

"""An RNN-T speech-to-text model's goldens and accuracy figures (Nemotron-3.5-ASR: families/audio.py SPEECH_MODELS).

Its kit is gated on the recipe's speech set alone ([validation.speech]: the prompts of [validation] are for models
that read text): each utterance transcribed by the reference (workstation/transducer_reference.py: the features the
runtime computes, the weights the FP16 engines hold, the runtime's greedy loop) under its language's prompt slot (the
checkpoint's prompt dictionary; a language it lacks is asked under `auto`), scored per language with its interval
(pipeline/transcripts.py), packed with the recordings into the kit's goldens; the device transcribes the same
recordings under the same slots and scores them the same way (device/speech.py). The package stage refuses a kit
whose reference scores past the recipe's limit.

The accuracy stage compares the checkpoint in float32 with its weights on the FP16 grid along the original's own
greedy steps (tokens and blanks: what each model would choose from the same state), and both models' error rates on
the set.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError


class AskedSet:
    """The recipe's speech set as the RNN-T is asked it: each utterance's samples, prompt slot and kit file.
    settings: the recipe's [validation.speech]; limit: build.audio.max_seconds (None: none said)."""

    def __init__(self, model_dir: Path, settings, recipe_file: str, limit: int | None) -> None:
        from pipeline.audio import read_wav
        from pipeline.runtime.transducer import prompts_of
        from pipeline.workstation.speech_set import read_speech_set
        self.settings = settings
        if settings.set is None:
            raise PipelineError(f"{recipe_file}: an RNN-T speech-to-text model is validated on a speech set, and "
                                "[validation.speech] names none", "set validation.speech.set (builtin:alsa-channels "
                                "or file:MANIFEST.tsv) and validation.speech.languages")
        self.prompts = prompts_of(model_dir)
        self.utterances = read_speech_set(settings.set, recipe_file, "validation.speech.set").utterances
        from pipeline.backends.edgellm_speech import MEL_FRAMES_PER_SECOND, TRANSDUCER_MIN_MEL_FRAMES
        shortest = TRANSDUCER_MIN_MEL_FRAMES / MEL_FRAMES_PER_SECOND
        self.samples = []
        for u in self.utterances:
            audio = read_wav(u.wav, name=u.name)
            if audio.seconds < shortest:
                raise PipelineError(f"{recipe_file}: validation.speech.set {settings.set}: {u.name} lasts "
                                    f"{audio.seconds * 1000:.0f} ms, shorter than the encoder engine takes "
                                    f"({shortest * 1000:.0f} ms)", "drop the recording from the set")
            if limit is not None and audio.seconds > limit:
                raise PipelineError(f"{recipe_file}: validation.speech.set {settings.set}: {u.name} lasts "
                                    f"{audio.seconds:.1f} s, more than build.audio.max_seconds = {limit} (the "
                                    "encoder engine's longest recording)", "raise build.audio.max_seconds or drop "
                                    "the recording from the set")
            self.samples.append(audio.samples)

    def slot(self, language: str) -> int:
        return self.prompts.get(language.lower(), self.prompts["auto"])

    def item(self, u, frames: int) -> contract.SpeechItem:
        """An utterance as the goldens carry it: `frames` its encoder frames."""
        return contract.SpeechItem(u.name, u.sha256, u.language, u.transcript, frames, prompt_id=self.slot(u.language))

    def transcribe(self, model, tokenizer) -> tuple[list[contract.SpeechItem], list[str]]:
        """(the set's items, `model`'s transcripts of them)."""
        from pipeline.transcripts import tagged_transcript
        from pipeline.workstation.transducer_reference import transcribe
        items, transcripts = [], []
        for u, samples in zip(self.utterances, self.samples, strict=True):
            heard = transcribe(model, tokenizer, samples, self.slot(u.language))
            transcripts.append(tagged_transcript(heard.text)[1])
            items.append(self.item(u, heard.frames))
        return items, transcripts


def transcribe_recordings(model_dir: Path, _recipe, recordings: list[tuple[str, bytes]], language: str) -> list[str]:
    """The checkpoint in float32 (as fetched: not on the FP16 grid) hearing other recordings ((what it is, a 16 kHz
    WAV)) under `language`'s prompt slot (`auto` where it has none): the text-to-speech round trip's transcriber
    (workstation/round_trip.py), as the board's RNN-T runtime hears them (device/transducer.py)."""
    from pipeline.audio import read_wav
    from pipeline.backends.edgellm_speech import MEL_FRAMES_PER_SECOND, TRANSDUCER_MIN_MEL_FRAMES
    from pipeline.runtime.transducer import prompts_of
    from pipeline.transcripts import tagged_transcript
    from pipeline.workstation.transducer_reference import load_reference, tokenizer_of, transcribe
    prompts = prompts_of(model_dir)
    slot = prompts.get(language.lower(), prompts["auto"])
    samples = []
    for what, data in recordings:
        audio = read_wav(data, name=what)
        if audio.seconds * MEL_FRAMES_PER_SECOND < TRANSDUCER_MIN_MEL_FRAMES:
            raise PipelineError(f"{what} lasts {audio.seconds * 1000:.0f} ms, shorter than the RNN-T's encoder takes "
                                f"({TRANSDUCER_MIN_MEL_FRAMES / MEL_FRAMES_PER_SECOND * 1000:.0f} ms)",
                                "give the texts more words")
        samples.append(audio.samples)
    model, tokenizer = load_reference(model_dir, deployed=False), tokenizer_of(model_dir)
    return [tagged_transcript(transcribe(model, tokenizer, s, slot).text)[1] for s in samples]


def speech_goldens(model_dir: Path, asked: AskedSet, validation, out: Path) -> contract.GoldensSummary:
    """The goldens (out/goldens.json) and the set's recordings (out/audio/) of the reference transcribing the set;
    validation: the recipe's [validation]."""
    from pipeline.device.speech import rates
    from pipeline.workstation.audio_prompts import AUDIO_DIR
    from pipeline.workstation.transducer_reference import load_reference, tokenizer_of
    items, transcripts = asked.transcribe(load_reference(model_dir), tokenizer_of(model_dir))
    (out / AUDIO_DIR).mkdir(exist_ok=True)
    for u in asked.utterances:
        (out / AUDIO_DIR / u.name.split("/", 1)[1]).write_bytes(u.wav)
    s, v = asked.settings, validation
    reference = rates(items, transcripts)
    check = contract.SpeechCheck(items, s.max_error_rate, s.max_new_tokens, reference, set=s.set or "",
                                 language_tags=True)
    contract.Goldens(max_new_tokens=v.max_new_tokens, min_token_agreement=v.min_token_agreement, top_k=0,
                     eos_token_id=None, prompts=[], speech=check).dump(out / contract.GOLDENS)
    return contract.GoldensSummary(0, False, 0, [], speech=reference)


class Follow:
    """A second model along the first's greedy path (greedy's `visit`): at each step, its logits from its own encoder
    frame and its own prediction network, fed the tokens the first emitted."""

    def __init__(self, model, frames) -> None:
        self.model, self.frames = model, frames
        self.steps: list = []           # (the first's logits, this model's)
        self.seen: object = None        # the first's state at the last step (a new one after each emission)
        self.state = self.predicted = self.next_state = None

    def __call__(self, t, _frame, token, state, logits) -> None:
        from pipeline.workstation.transducer_reference import _predict
        if self.predicted is None or state is not self.seen:     # the start, or the first emitted a token
            self.state = None if self.predicted is None else self.next_state
            self.predicted, self.next_state = _predict(self.model.decoder, token, self.state)
            self.seen = state
        mine = self.model.joint(decoder_hidden_states=self.predicted, encoder_hidden_states=self.frames[t])
        self.steps.append((logits, mine))


def speech_accuracy(model_dir: Path, asked: AskedSet) -> contract.AccuracyFigures:
    """The checkpoint in float32 against its weights on the FP16 grid, along the first's greedy steps over the set,
    and both models' error rates on it."""
    import torch

    from pipeline.device.speech import rates
    from pipeline.transcripts import tagged_transcript
    from pipeline.workstation.evaluate import bootstrap_interval
    from pipeline.workstation.transducer_features import log_mel
    from pipeline.workstation.transducer_reference import encoder_frames, greedy, load_reference, tokenizer_of
    original, deployed = load_reference(model_dir, deployed=False), load_reference(model_dir)
    tokenizer = tokenizer_of(model_dir)
    per: list[tuple[float, float, int]] = []
    cos_sum, agree, count = 0.0, 0, 0
    items, heard = [], []           # the original's transcripts: its greedy path's tokens, decoded
    for u, samples in zip(asked.utterances, asked.samples, strict=True):
        features, slot = log_mel(samples), asked.slot(u.language)
        follow = Follow(deployed, encoder_frames(deployed, features, slot))
        tokens, frames, _ = greedy(original, features, slot, follow)
        items.append(asked.item(u, frames))
        heard.append(tagged_transcript(tokenizer.decode(tokens, skip_special_tokens=False))[1])
        steps = follow.steps
        if not steps:
            continue
        lo = torch.stack([a for a, _ in steps])
        lq = torch.stack([b for _, b in steps])
        target = lo.argmax(-1)
        nll = [float(torch.nn.functional.cross_entropy(x, target, reduction="sum")) for x in (lo, lq)]
        per.append((nll[0], nll[1], len(steps)))
        cos_sum += float(torch.nn.functional.cosine_similarity(lo, lq, dim=-1).sum())
        agree += int((lq.argmax(-1) == target).sum())
        count += len(steps)
    predicted = max(sum(p[2] for p in per), 1)
    ppl = [math.exp(sum(p[i] for p in per) / predicted) for i in (0, 1)]
    return contract.AccuracyFigures(
        heldout=f"the original's greedy RNN-T steps (tokens and blanks) over {asked.settings.set}", tokens=count,
        windows=len(per), perplexity_original=round(ppl[0], 4), perplexity_quantized=round(ppl[1], 4),
        perplexity_change=round(ppl[1] / ppl[0] - 1, 4),
        perplexity_change_interval=list(bootstrap_interval(per)) if per else [0.0, 0.0],
        logit_cosine=round(cos_sum / max(count, 1), 6), top1_agreement=round(agree / max(count, 1), 6),
        speech_original=rates(items, heard),
        speech_quantized=rates(*asked.transcribe(deployed, tokenizer)))

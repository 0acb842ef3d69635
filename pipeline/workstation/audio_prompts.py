"""A validation prompt with a recording, asked as the deployed speech model is asked: the recording's log-mel features
by the checkpoint's own feature extractor (workstation/speech_features.py), the chat template's audio placeholder
expanded to the recording's token count, and the calibrated model's greedy answer with the encoder's output in place.

The recordings are the recipe's (`builtin:NAME`, synthesized by pipeline/recordings.py, or `file:PATH`: a 16 kHz WAV
file), read bounded and checked (pipeline.audio.read_wav); the kit carries them as read, and the device gives the
engine the same file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.audio import Audio, AudioError, AudioLimits, read_wav
from pipeline.errors import PipelineError
from pipeline.recordings import BUILTIN_RECORDINGS

AUDIO_DIR = "audio"


@dataclass(frozen=True)
class PromptRecording:
    ref: str            # as the recipe names it
    name: str           # the file name the kit carries it under (audio/<name>)
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def audio(self) -> Audio:
        return read_wav(self.data, name=self.ref)


def read_recording(ref: str, recipe_file: str, field: str, limits: AudioLimits = AudioLimits()) -> PromptRecording:
    """`builtin:NAME` or `file:PATH` (relative to the recipe) as a checked WAV recording; errors name the field."""
    kind, _, value = ref.partition(":")
    if kind == "builtin":
        if value not in BUILTIN_RECORDINGS:
            raise PipelineError(f"{recipe_file}: {field} = {ref!r}: no builtin recording {value!r}",
                                f"builtin recordings: {', '.join(BUILTIN_RECORDINGS)}")
        data, name = BUILTIN_RECORDINGS[value].wav(), f"{value}.wav"
    elif kind == "file":
        from pipeline.files import read_referenced
        _, data = read_referenced(value, recipe_file, limits.max_bytes, f"{recipe_file}: {field} = {ref!r}",
                                  "name a WAV file (relative to the recipe)")
        name = f"{hashlib.sha256(data).hexdigest()[:16]}.wav"
    else:
        raise PipelineError(f"{recipe_file}: {field} = {ref!r}: not a recording reference",
                            "builtin:NAME or file:PATH (relative to the recipe)")
    try:
        read_wav(data, limits, name=ref)
    except AudioError as exc:
        raise PipelineError(f"{recipe_file}: {field} = {exc.message}", exc.hint) from None
    return PromptRecording(ref, name, data)


class WhisperChunks:
    """Qwen3-ASR's inputs of recordings: the checkpoint's own feature extractor (workstation/speech_features.py), the
    features padded to whole chunks of 2 x n_window frames under a mask of the real ones."""

    shortest = None         # its extractor pads a short clip to half a second

    def __init__(self, extractor, n_window: int):
        self.extractor, self.n_window = extractor, n_window

    def batch(self, audios: list[tuple[Audio, str]]) -> tuple[list[int], dict]:
        """(each recording's token count, the model's audio inputs for all of them)."""
        import numpy as np
        import torch

        from pipeline.families.audio import QWEN3_ASR_AUDIO
        from pipeline.workstation.speech_features import log_mel
        features = [log_mel(self.extractor, audio, name) for audio, name in audios]
        chunk = 2 * self.n_window
        padded = max(-(-f.shape[1] // chunk) * chunk for f in features)
        x = np.zeros((len(features), features[0].shape[0], padded), np.float32)
        mask = torch.zeros(len(features), padded, dtype=torch.long)
        for i, f in enumerate(features):
            x[i, :, :f.shape[1]] = f
            mask[i, :f.shape[1]] = 1
        counts = [QWEN3_ASR_AUDIO.tokens_of_frames(f.shape[1], self.n_window) for f in features]
        return counts, {"input_features": torch.from_numpy(x), "input_features_mask": mask}


def whisper_chunks(model_dir: Path, encoder) -> WhisperChunks:
    from pipeline.workstation.speech_features import feature_extractor
    return WhisperChunks(feature_extractor(model_dir), encoder.shape.n_window)


def inputs_of(model_dir: Path, encoder):
    """What makes recordings into the model's audio inputs, as its design says (families/audio.py
    recording_inputs)."""
    import importlib
    module, function = encoder.design.recording_inputs.split(":")
    return getattr(importlib.import_module(module), function)(model_dir, encoder)


def wrap_ids(tokenizer, design) -> tuple[int, int] | None:
    """The ids of the tokens the runtime puts around a recording's tokens (None: the design adds none)."""
    wrap = design.wrap()
    if wrap is None:
        return None
    ids = tuple(tokenizer.convert_tokens_to_ids(t) for t in wrap)
    if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
        raise PipelineError(f"the tokenizer lacks {' or '.join(wrap)}, which the runtime puts around a recording",
                            "use the speech model's own tokenizer")
    return ids[0], ids[1]


@dataclass(frozen=True)
class RecordingPrompts:
    """A recipe's validation recordings, with what asks them as the engine will: the recordings' inputs as the
    design makes them, the audio placeholder's id and what the runtime wraps its copies in."""
    recordings: tuple[PromptRecording, ...]
    inputs: object              # WhisperChunks or gemma4_features.Gemma4Frames: .batch([(audio, name)])
    placeholder: int
    wrap: tuple[int, int] | None
    max_seconds: int

    def __len__(self) -> int:
        return len(self.recordings)

    def asked(self, tokenizer, prompt: str | None, recording: PromptRecording) -> tuple[str, list[int], dict, int]:
        """(rendered text, ids with the placeholder expanded, the model's audio inputs, audio tokens): the user turn
        holds the recording, then the text (as OpenAI's input_audio content parts come), by the chat template."""
        from pipeline.families.audio import expand_recording
        from pipeline.workstation.evaluate import render_chat
        audio = recording.audio()
        if audio.seconds > self.max_seconds:
            raise PipelineError(f"{recording.ref} is {audio.seconds:.1f} s long, more than the engine's profile takes "
                                f"(build.audio.max_seconds = {self.max_seconds})",
                                f"raise build.audio.max_seconds to at least {int(audio.seconds) + 1}, or use a "
                                "shorter recording")
        least = self.inputs.shortest       # type: ignore[attr-defined]
        if least is not None and len(audio.samples) < least:
            raise PipelineError(f"{recording.ref} is {len(audio.samples) * 1000 / audio.rate:.1f} ms long, shorter "
                                f"than the audio engine takes ({least * 1000 / 16_000:.1f} ms)",
                                "use a longer recording")
        content = [{"type": "audio"}] + ([{"type": "text", "text": prompt}] if prompt else [])
        rendered = render_chat(tokenizer, [{"role": "user", "content": content}])
        (count,), inputs = self.inputs.batch([(audio, recording.ref)])   # type: ignore[attr-defined]
        ids = expand_recording(tokenizer(rendered, add_special_tokens=False)["input_ids"], self.placeholder, count,
                               self.wrap)
        return rendered, ids, inputs, count

    def golden(self, model, tokenizer, prompt: str, index: int, max_new_tokens: int, top_k: int, stops: list[int]):
        """The golden of one prompt asked with its recording: the calibrated model's greedy answer."""
        from pipeline import contract
        from pipeline.workstation.evaluate import greedy
        recording = self.recordings[index]
        rendered, ids, inputs, count = self.asked(tokenizer, prompt, recording)
        g = greedy(model, ids, max_new_tokens, top_k, stops, **inputs)
        return contract.GoldenPrompt(prompt=prompt, rendered=rendered, input_ids=ids, output_ids=g["output_ids"],
                                     top_logprobs=g["top_logprobs"],
                                     text=tokenizer.decode(g["output_ids"], skip_special_tokens=True),
                                     recording=f"{AUDIO_DIR}/{recording.name}",
                                     recording_sha256=recording.sha256, audio_tokens=count)

    def write(self, out: Path) -> None:
        """The recordings as the kit carries them (audio/<name>), beside goldens.json."""
        (out / AUDIO_DIR).mkdir(exist_ok=True)
        for recording in self.recordings:
            (out / AUDIO_DIR / recording.name).write_bytes(recording.data)


@dataclass(frozen=True)
class AudioMaker:
    """A served request's recordings made into the model's inputs, as the goldens' were. The prompt's placeholder
    tokens must be exactly the inputs' count for these recordings (the server counted them by the family's
    arithmetic): a difference is an error naming both, never an answer to a different prompt."""
    inputs: object
    placeholder: int

    def __call__(self, recordings: tuple[bytes, ...], ids: list[int]) -> dict:
        counts, inputs = self.inputs.batch(       # type: ignore[attr-defined]
            [(read_wav(r), f"recording {i}") for i, r in enumerate(recordings)])
        if sum(counts) != ids.count(self.placeholder):
            raise ValueError(f"the feature extractor makes {sum(counts)} audio tokens of the request's "
                             f"{len(recordings)} recording(s); the prompt holds {ids.count(self.placeholder)}")
        return inputs


def audio_maker(model_dir: Path, placeholder: int) -> AudioMaker:
    from pipeline.plan.parts import AudioEncoder
    from pipeline.plan.shapes import load_shape
    encoder = load_shape(model_dir).part(AudioEncoder)
    assert encoder is not None      # the served plan has an audio engine
    return AudioMaker(inputs_of(model_dir, encoder), placeholder)


def recording_prompts(model_dir: Path, refs: tuple[str, ...], recipe_file: str, max_seconds: int | None
                      ) -> RecordingPrompts | None:
    """The recipe's validation recordings for the model in model_dir (None without recordings); recordings for a
    model without an audio encoder are an error naming the field."""
    if not refs:
        return None
    recordings = tuple(read_recording(r, recipe_file, f"validation.recordings[{i}]") for i, r in enumerate(refs))
    return recording_asker(model_dir, recipe_file, max_seconds, "validation.recordings", recordings)


def recording_asker(model_dir: Path, recipe_file: str, max_seconds: int | None, field: str,
                    recordings: tuple[PromptRecording, ...] = ()) -> RecordingPrompts:
    """What asks the model in model_dir with recordings as the engine will (RecordingPrompts.asked); a model without
    an audio encoder is an error naming the recipe's `field`."""
    from transformers import AutoTokenizer

    from pipeline.plan.parts import AudioEncoder
    from pipeline.plan.shapes import load_shape
    shape = load_shape(model_dir)
    encoder = shape.part(AudioEncoder)
    if encoder is None or max_seconds is None:
        raise PipelineError(f"{recipe_file}: {field} asks with recordings, but the model ({shape.architecture}) has no "
                            f"audio encoder", f"remove {field}, or use a speech model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    pad = tok.convert_tokens_to_ids(encoder.design.placeholder)
    if not isinstance(pad, int) or pad == tok.unk_token_id:
        raise PipelineError(f"{model_dir}: the tokenizer has no {encoder.design.placeholder} token",
                            "use the speech model's own tokenizer")
    return RecordingPrompts(recordings, inputs_of(model_dir, encoder), pad, wrap_ids(tok, encoder.design), max_seconds)

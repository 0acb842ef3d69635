"""A speech-to-text model's speed as a transcriber (its audio encoder's engine is plan/parts/audio.py), checked
against the published rows of the model (pipeline/data/speech_rows.csv).

A transcription is one request: the encoder turns the recording into tokens (13 a second for Qwen3-ASR), the decoder
prefills them inside the transcription prompt and then writes the transcript. So for a clip of S seconds

    first token = encoder(S) + prefill(prompt + audio tokens)
    processing  = first token + (answer prefix + transcript tokens) / decode rate
    RTF         = processing / S                            (below 1: faster than real time)

The encoder is timed by the ViT fit (plan/parts/audio.py says why it borrows it), the prefill and the decode by the
decoder's own fits at the plan's power mode. The transcript's length is an assumption, not a measurement: read English
speech runs about 150 words a minute (LibriSpeech's test-clean about 2.7 words a second) and Qwen's tokenizer takes
about 1.3 tokens a word, so TRANSCRIPT_TOKENS_PER_SECOND tokens per second of audio; speech with pauses takes fewer.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pipeline.contract import AudioPlan, Plan
    from pipeline.families.audio import AudioEncoderDesign


class Encoder(Protocol):
    """What the speed reads of the audio encoder's part (plan/parts/audio.py)."""
    @property
    def design(self) -> AudioEncoderDesign: ...

    def audio_tokens(self, seconds: float) -> int: ...

    def flops(self, seconds: float) -> float: ...

ROWS = Path(__file__).resolve().parents[2] / "data" / "speech_rows.csv"
CLIP_SECONDS = 10.0             # the clip the plan's RTF and first-token latency are for (a typical utterance)
TRANSCRIPT_TOKENS_PER_SECOND = 3.5
# the transcription prompt's tokens around the audio and the answer's around the transcript are the design's
# (families/audio.py AudioEncoderDesign.prompt_tokens, answer_tokens): Qwen3-ASR's and Gemma 4's differ
RTF_SECONDS = (5, 10, 30)
# recording lengths the plan times the encoder at (the device compares its measured time at its clips' lengths)
TIMED_SECONDS = (1, 5, 10, 30, 60, 120)


def encoder_ms(part: Encoder, target_id: str, seconds: float, vision: dict | None) -> float | None:
    """A recording through the encoder: its graph's FLOPs at the board's FP16 tensor peak, through the ViT fit."""
    from pipeline.plan.parts.tower import VitConstants, constants_for
    from pipeline.plan.targets import get_target
    tflops = get_target(target_id).tensor_tflops.get("fp16")
    if vision is None or not tflops:
        return None
    classes = {k: VitConstants(v["efficiency"], v["fixed_s"]) for k, v in vision["classes"].items()}
    return constants_for(classes, target_id).ms(part.flops(seconds) / (tflops * 1e12))


def with_speed(audio: AudioPlan, part: Encoder, target_id: str, decode_tok_s: float | None,
               prefill_ms: Callable[[int], float | None], fit: dict, model: str) -> AudioPlan:
    """The plan's transcription speed: first-token latency and RTF for a CLIP_SECONDS clip (and RTF at a few
    lengths), and the comparison with the model's published rows on this board."""
    def timing(seconds: float) -> tuple[float, float] | None:
        enc = encoder_ms(part, target_id, seconds, fit.get("vision"))
        pre = prefill_ms(part.design.prompt_tokens + part.audio_tokens(seconds))
        if enc is None or pre is None or not decode_tok_s:
            return None
        first = enc + pre
        total = first + 1000 * (part.design.answer_tokens + transcript_tokens(seconds)) / decode_tok_s
        return first, total / (1000 * seconds)

    clip = timing(CLIP_SECONDS)
    by_seconds = {str(s): round(t[1], 3) for s in RTF_SECONDS if s <= audio.max_seconds and (t := timing(s))}
    audio = dataclasses.replace(audio, clip_seconds=CLIP_SECONDS, transcript_tokens=transcript_tokens(CLIP_SECONDS),
                                first_token_ms=None if clip is None else round(clip[0], 1),
                                rtf=None if clip is None else round(clip[1], 3), rtf_by_seconds=by_seconds or None)
    rows = [row for row in load_rows() if row.model == model]
    published = [c for row in rows if row.target == target_id and (c := compare(row, timing))]
    return dataclasses.replace(audio, published=published or [none_published(model, target_id, rows)])


def error_said(published: float, predicted: float) -> str:
    """A published figure against the plan's, as every speech plan says it."""
    ratio = published / predicted
    return f"the published figure is {ratio:.2g}x the prediction" if ratio >= 1 else \
        f"the prediction is {1 / ratio:.2g}x the published figure"


def none_published(model: str, target_id: str, rows: list[SpeechRow]) -> str:
    """What a speech plan says where none of the model's rows (`rows`) is of this target."""
    elsewhere = sorted({row.target for row in rows})
    return f"none of {model} on {target_id}" + (f" (there are on {', '.join(elsewhere)})" if elsewhere else "") + \
        ": the speed is a prediction only"


def transcript_tokens(seconds: float) -> int:
    return round(TRANSCRIPT_TOKENS_PER_SECOND * seconds)


@dataclass(frozen=True)
class SpeechRow:
    """One published figure of a speech model on a Jetson."""
    model: str
    target: str
    weights: str            # as the source names its format
    metric: str             # rtf
    value: float
    clip_seconds: float     # the clips' mean length where the source gives it, else 0
    source: str
    note: str


def load_rows(path: Path = ROWS) -> list[SpeechRow]:
    with path.open(newline="") as fh:
        return [SpeechRow(r["model"], r["target"], r["weights"], r["metric"], float(r["value"]),
                          float(r["clip_seconds"] or 0), r["source"], r["note"]) for r in csv.DictReader(fh)]


def compare(row: SpeechRow, timing) -> str | None:
    """The plan's figure beside a published one, and the error: predicted / published."""
    if row.metric != "rtf":
        return None
    seconds = row.clip_seconds or CLIP_SECONDS
    t = timing(seconds)
    if t is None:
        return None
    return (f"RTF {row.value:g} ({row.weights}; {row.note}; {row.source}) against {t[1]:.3f} predicted for a "
            f"{seconds:g} s clip: {error_said(row.value, t[1])}")


def audio_lines(plan: Plan) -> list[str]:
    """What the plan table prints of a speech-to-text model."""
    from pipeline.plan.targets import gb
    a = plan.audio
    if a is None:
        return []
    out = [f"  audio        {a.design} encoder, {a.params / 1e6:.0f}M params in {a.precision}: weights "
           f"{gb(a.weights)}, activations {gb(a.activations)} at a {a.max_seconds} s recording ({a.audio_tokens} "
           "audio tokens)"]
    enc = (a.encoder_ms_by_seconds or {}).get(f"{a.clip_seconds:g}")
    if a.rtf is not None and a.first_token_ms is not None:
        band = f" (+-{a.encoder_error_band:.0%} the ViT fit's error, borrowed)" if a.encoder_error_band else ""
        out.append(f"  speech       a {a.clip_seconds:g} s clip: encoder ~{enc} ms{band}, first token "
                   f"~{a.first_token_ms:.0f} ms, RTF ~{a.rtf:.3f} (assuming {a.transcript_tokens} transcript "
                   "tokens)")
        if a.rtf_by_seconds:
            out.append("  RTF          " + ", ".join(f"{s} s: {v:.3f}" for s, v in a.rtf_by_seconds.items()))
    out += [f"  published    {p}" for p in a.published]
    return out

"""The plan of a speech model that is not a decoder with parts (plan/synthesis.py: text to speech; plan/transducer.py:
an RNN-T speech-to-text model): its memory per part on the target, its real-time factor and first latency, the
published rows of the model beside them, and what keeps it from a kit. One record and one table for both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from pipeline.plan.parts.audio_speed import CLIP_SECONDS, RTF_SECONDS

FORMAT = "jetson-speech-plan/1"
# seconds -> (first latency ms, RTF, one step's ms) for that much speech; None where a fit is missing
Timing = Callable[[float], "tuple[float, float, float] | None"]


@dataclass(frozen=True)
class SpeechPlan:
    kind: str                       # contract.TEXT_TO_SPEECH | SPEECH_TO_TEXT
    model: str
    target: str
    weights: str
    described: str                  # what the model is, said
    max_seconds: int                # the longest utterance (TTS) or recording (ASR) a request
    memory: dict[str, int]          # bytes per part
    total: int
    usable: int
    rate: float                     # frames a second of speech (codec frames; encoder frames)
    step: str                       # what one step is, said
    step_ms: float | None
    rtf: float | None               # for CLIP_SECONDS of speech (below 1: faster than real time)
    rtf_by_seconds: dict[str, float]
    first: str                      # what the first latency is, said
    first_ms: float | None
    published: list[str]
    refused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_dict(self) -> dict:
        return {"format": FORMAT, "ok": self.ok, **asdict(self)}

    def record(self, model_type: str):
        """As a recipe's plan carries it (contract.Plan.speech)."""
        from pipeline.contract import SpeechModelPlan
        return SpeechModelPlan(model_type=model_type, **asdict(self))


def backend_for(model: str, target, backend: str | None, model_type: str, what: str):
    """(the backend, its Support) that plans this speech model: the one asked for, else the first of the target's
    stacks whose backend registered it (Backend.speech); none is an error naming those that do."""
    from pipeline import backends
    from pipeline.errors import PipelineError
    chosen = backends.speech_backend([backend] if backend else [s.backend for s in target.stacks], model_type)
    if chosen is None:
        planners = [backends.get(n).label for n in backends.NAMES if model_type in backends.get(n).speech]
        raise PipelineError(f"{model}: no backend {'named ' + backend if backend else 'of ' + target.id} plans "
                            f"{what}", f"{' or '.join(planners) or 'no backend'} does: use a target with its stack")
    return backends.get(chosen[0]), chosen[1]


def vit_ms(target, flops: float, fit: dict) -> float | None:
    """A non-decoder graph's FLOPs through TensorRT in FP16 on the target: the ViT fit (a transformer encoder in FP16,
    plan/parts/tower_speed.py), borrowed as plan/parts/audio.py borrows it for an audio encoder."""
    from pipeline.plan.parts.tower import VitConstants, constants_for
    vision, tflops = fit.get("vision"), target.tensor_tflops.get("fp16")
    if vision is None or not tflops:
        return None
    classes = {k: VitConstants(v["efficiency"], v["fixed_s"]) for k, v in vision["classes"].items()}
    return constants_for(classes, target.id).ms(flops / (tflops * 1e12))


def speed(timing: Timing, max_seconds: int) -> tuple[tuple[float, float, float] | None, dict[str, float]]:
    """The CLIP_SECONDS timing and the RTF at RTF_SECONDS up to max_seconds."""
    by = {str(s): round(t[1], 3) for s in RTF_SECONDS if s <= max_seconds and (t := timing(s))}
    return timing(CLIP_SECONDS), by


def published(model: str, also: str, target_id: str, timing: Timing, metrics: dict[str, int]) -> list[str]:
    """The plan beside each published row of the model (or of `also`, a sibling release) on this target: the error
    as published / predicted. metrics: the rows' metric -> the index of the timing figure it compares with."""
    from pipeline.plan.parts.audio_speed import error_said, load_rows, none_published
    rows = [r for r in load_rows() if r.model in (model, also)]
    out = []
    for r in rows:
        if r.target != target_id or r.metric not in metrics:
            continue
        t = timing(r.clip_seconds or CLIP_SECONDS)
        if t is None:
            continue
        predicted = t[metrics[r.metric]]
        unit = " ms" if r.metric.endswith("_ms") else ""
        of = "" if r.model == model else f" of {r.model}"
        out.append(f"{r.metric} {predicted:.3g}{unit} predicted, {r.value:g}{unit} published{of} ({r.weights}; "
                   f"{r.source}): {error_said(r.value, predicted)}")
    return out or [none_published(model, target_id, rows)]


def render(p) -> str:
    """A SpeechPlan, or the record of one a recipe's plan carries, as its table."""
    gb = 1e9
    lines = [f"{p.model} on {p.target}: {p.kind} ({p.described}), up to {p.max_seconds} s a request ({p.rate:g} "
             "frames a second)", "memory:"]
    lines += [f"  {name:<30} {v / gb:7.3f} GB" for name, v in p.memory.items()]
    lines.append(f"  {'total':<30} {p.total / gb:7.3f} GB of {p.usable / gb:.2f} GB usable")
    if p.rtf is not None:
        lines.append(f"speed: RTF {p.rtf:g} for {CLIP_SECONDS:g} s of speech (below 1: faster than real time; "
                     + ", ".join(f"{s} s: {v:g}" for s, v in p.rtf_by_seconds.items())
                     + f"); {p.first} {p.first_ms:g} ms; {p.step} {p.step_ms:g} ms")
    else:
        lines.append("speed: not predicted (no fit for this target)")
    lines += [f"published: {x}" for x in p.published]
    return "\n".join(lines)

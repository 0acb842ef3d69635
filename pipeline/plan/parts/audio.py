"""A speech-to-text model's audio encoder as the planner counts it: its weights, the work of a recording and the
activations of the longest one a request takes, read from the checkpoint's `audio_config` (families/audio.py holds
the design: how a recording becomes tokens, the encoder's parameters and FLOPs).

Edge-LLM 0.11 exports the encoder as audio/model.onnx in FP16 (tensorrt_edgellm/onnx/export_encoder.py
export_audio_onnx; models/qwen3_asr/modeling_qwen3_asr_audio.py) and builds it with audio_build. Its graph takes the
whole request's mel chunks at once and scores every audio token against every other under an additive mask (the
windows of n_window_infer frames are the mask's): explicit softmax attention, the scores in FP32, no fused kernel. So
its attention work and memory grow with the square of the recording, where transformers' windowed attention grows
linearly; the plan counts the graph Edge-LLM builds. The encoder's time is priced by the ViT fit (a transformer
encoder in FP16 through TensorRT, plan/parts/tower_speed.py), borrowed and said so: no audio encoder time is published.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pipeline.families.audio import AudioEncoderDesign, AudioEncoderShape, located
from pipeline.families.gemma4_audio import ConformerShape
from pipeline.plan.parts.base import ConfigReader, Part, int_field

if TYPE_CHECKING:
    from pipeline.contract import AudioPlan, BuildLimits, Plan
    from pipeline.plan.targets import TargetProfile

BOUND = 2**20           # a real encoder's dimension is far below this; past it the config is damaged or crafted
WORKSPACE = 64 * 2**20  # cuBLAS / TensorRT scratch beside the encoder's activations
# the longest recording one request takes where the recipe says nothing: Edge-LLM's ASR example builds audio_build
# with --maxTimeSteps 3000 (mel frames: 30 s), the length Qwen3-ASR's feature extractor pads to
DEFAULT_MAX_SECONDS = 30


@dataclass(frozen=True)
class AudioEncoder(Part):
    design: AudioEncoderDesign
    shape: AudioEncoderShape | ConformerShape

    adjective: ClassVar[str] = "speech-to-text"
    called: ClassVar[str] = "audio encoder"
    prequantized_taken: ClassVar[tuple[tuple[str, str], ...] | None] = ()
    modules: ClassVar[tuple[str, ...]] = ("pipeline.workstation.audio_export", "pipeline.workstation.audio_check",
                                          "pipeline.workstation.audio_prompts", "pipeline.workstation.speech_gate")

    @classmethod
    def from_config(cls, r: ConfigReader) -> AudioEncoder | None:
        design = r.family.audio
        if design is None:
            return None
        found = located(r.whole, design.config_paths)
        if found is None:
            if not design.optional or r.whole.get(design.config_paths[-1], "absent") not in (None, "absent"):
                r.problems.append(_problem(r, design.config_paths[-1], r.whole.get(design.config_paths[-1]),
                                           f"must hold the audio encoder's config ({r.family.name} keeps it "
                                           "there)" + (" or be null: a checkpoint without one" if design.optional
                                                       else "")))
            return None
        path, ac = found
        before = len(r.problems)
        hidden = r.dims.get("hidden_size")
        shape = design.read_shape(_Need(ac, r, f"{path}."), hidden if isinstance(hidden, int) else 0)
        if len(r.problems) > before:
            return None
        for field_name, value, what in design.shape_problems(shape, hidden):
            r.problems.append(_problem(r, f"{path}.{field_name}", value, what))
        return cls(design, shape)

    # -- what a recording costs
    def audio_tokens(self, seconds: float) -> int:
        return self.design.tokens(seconds, self.shape)

    def flops(self, seconds: float) -> float:
        """The exported graph's work for one recording."""
        return self.shape.flops(self.audio_tokens(seconds))

    def activation_bytes(self, seconds: float) -> int:
        return self.shape.activation_bytes(self.audio_tokens(seconds), self.design.frames(seconds))

    # -- the part's protocol (plan/parts/base.py)
    def audio_plan(self, target: TargetProfile, build: BuildLimits, max_seconds: int | None, refused: list[str],
                   fit: dict | None) -> AudioPlan | None:
        if max_seconds is None and self.design.optional:
            return None         # a model that also hears: its tower is built where the recipe has [build.audio]
        return plan_audio(self, target, build, max_seconds or DEFAULT_MAX_SECONDS, refused, fit)

    def audio_speed(self, audio: AudioPlan, target: str, decode_tok_s: float | None,
                    prefill_ms: Callable[[int], float | None], fit: dict, model: str) -> AudioPlan:
        from pipeline.plan.parts.audio_speed import with_speed
        return with_speed(audio, self, target, decode_tok_s, prefill_ms, fit, model)

    @classmethod
    def plan_lines(cls, plan: Plan) -> list[str]:
        from pipeline.plan.parts.audio_speed import audio_lines
        return audio_lines(plan)


def plan_audio(part: AudioEncoder, target: TargetProfile, build: BuildLimits, max_seconds: int, refused: list[str],
               fit: dict | None) -> AudioPlan:
    """The encoder's engine on the target: FP16 weights, the activations of the longest recording, its time at a few
    lengths; a language model whose input cannot hold that recording's prompt is refused."""
    from pipeline.contract import AudioPlan, AudioProfile
    from pipeline.plan.parts.audio_speed import TIMED_SECONDS, encoder_ms

    prompt = part.design.prompt_tokens
    tokens = part.audio_tokens(max_seconds)
    if tokens + prompt > build.max_input_len:
        longest = _longest_recording(part, build.max_input_len - prompt)
        refused.append(f"a {max_seconds}-second recording is {tokens} audio tokens, {tokens + prompt} with "
                       f"the transcription prompt, more than max_input_len {build.max_input_len}: raise "
                       f"build.max_input_len to at least {tokens + prompt}, or take recordings of at most "
                       f"{longest} seconds")
    most = part.design.longest_seconds
    if most is not None and max_seconds > most:
        refused.append(f"build.audio.max_seconds = {max_seconds}: the model takes recordings of at most {most} "
                       f"seconds (its processor cuts them there); set build.audio.max_seconds to {most} or less")
    vision = (fit or {}).get("vision")
    timed = sorted({s for s in TIMED_SECONDS if s < max_seconds} | {max_seconds})
    by_seconds = {str(s): round(ms, 1) for s in timed if (ms := encoder_ms(part, target.id, s, vision)) is not None}
    return AudioPlan(design=part.design.name, precision="fp16", params=part.shape.params,
                     weights=2 * part.shape.params, activations=part.activation_bytes(max_seconds) + WORKSPACE,
                     max_seconds=max_seconds, audio_tokens=tokens, prompt_tokens=prompt,
                     encoder_ms_by_seconds=by_seconds or None,
                     encoder_error_band=vision["loo_median_abs_error"] if vision else None,
                     profile=AudioProfile(part.design.min_time_steps,
                                          max(part.design.min_time_steps, part.design.engine_frames(max_seconds))),
                     n_window=part.shape.plan_window())


def _longest_recording(part: AudioEncoder, tokens: int) -> int:
    seconds = 0
    while seconds < 3600 and part.audio_tokens(seconds + 1) <= tokens:
        seconds += 1
    return seconds


class _Need:
    """need(key, default) for a design's read_shape: an integer of the encoder's config (`where`: another dict
    standing for it, such as a list's items by index), a problem naming its field where it is not one."""

    def __init__(self, config: dict, r: ConfigReader, prefix: str):
        self.config, self.r, self.prefix = config, r, prefix

    def __call__(self, key: str, default: int | None = None, where: dict | None = None, low: int = 1) -> int:
        return int_field(self.config if where is None else where, key, BOUND, self.r.problems, self.r.source,
                         self.prefix, low=low, default=default)


def _problem(r: ConfigReader, field: str, value, what: str):
    from pipeline.errors import Problem
    return Problem(r.source, field, value, what, "use the model's own config.json")

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

from pipeline.families.audio import AudioEncoderDesign, AudioEncoderShape, halved, located
from pipeline.plan.parts.base import ConfigReader, Part, int_field

if TYPE_CHECKING:
    from pipeline.contract import AudioPlan, BuildLimits, Plan
    from pipeline.plan.targets import TargetProfile

BOUND = 2**20           # a real encoder's dimension is far below this; past it the config is damaged or crafted
WORKSPACE = 64 * 2**20  # cuBLAS / TensorRT scratch beside the encoder's activations
# the longest recording one request takes where the recipe says nothing: Edge-LLM's ASR example builds audio_build
# with --maxTimeSteps 3000 (mel frames: 30 s), the length Qwen3-ASR's feature extractor pads to
DEFAULT_MAX_SECONDS = 30
# audio_build's --minTimeSteps default (mel frames: one second); the profile's maximum is max_seconds of frames
MIN_TIME_STEPS = 100


@dataclass(frozen=True)
class AudioEncoder(Part):
    design: AudioEncoderDesign
    shape: AudioEncoderShape

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
            r.problems.append(_problem(r, design.config_paths[-1], r.whole.get(design.config_paths[-1]),
                                       f"must hold the audio encoder's config ({r.family.name} keeps it there)"))
            return None
        path, ac = found
        before = len(r.problems)

        def need(key: str, default: int | None = None) -> int:
            return int_field(ac, key, BOUND, r.problems, r.source, f"{path}.", default=default)

        shape = AudioEncoderShape(
            mel_bins=need("num_mel_bins", 128), layers=need("encoder_layers"), width=need("d_model"),
            heads=need("encoder_attention_heads"), ffn=need("encoder_ffn_dim"), out=need("output_dim"),
            conv_channels=need("downsample_hidden_size", 480), n_window=need("n_window", 50),
            n_window_infer=need("n_window_infer", 800))
        if len(r.problems) > before:
            return None
        hidden = r.dims.get("hidden_size")
        if shape.out != hidden:
            r.problems.append(_problem(r, f"{path}.output_dim", shape.out, f"must equal the language model's "
                                       f"hidden_size ({hidden}): the encoder's tokens take the place of its "
                                       "embeddings"))
        if shape.width % shape.heads:
            r.problems.append(_problem(r, f"{path}.d_model", shape.width, f"must divide into "
                                       f"encoder_attention_heads ({shape.heads}) heads"))
        if shape.n_window_infer % (2 * shape.n_window):
            r.problems.append(_problem(r, f"{path}.n_window_infer", shape.n_window_infer, "must be a whole number "
                                       f"of encoder chunks (2 x n_window = {2 * shape.n_window} frames)"))
        return cls(design, shape)

    # -- what a recording costs
    def audio_tokens(self, seconds: float) -> int:
        return self.design.audio_tokens(seconds, self.shape.n_window)

    def chunks(self, seconds: float) -> int:
        """The mel chunks (2 x n_window frames each, the last zero-padded) the graph takes for a recording."""
        chunk = 2 * self.shape.n_window
        return -(-self.design.frames(seconds) // chunk)

    def flops(self, seconds: float) -> float:
        """The exported graph's work for one recording: every token scored against all of the request's."""
        tokens = self.audio_tokens(seconds)
        return tokens * self.shape.flops_per_token(attended=tokens)

    def activation_bytes(self, seconds: float) -> int:
        """The largest live tensors at a recording of `seconds`: one layer's attention scores (FP32) and
        probabilities (FP16) over the whole request for every head, beside the larger of the first convolution's
        output and a block's tensors (TensorRT reuses them layer to layer)."""
        s, tokens = self.shape, self.audio_tokens(seconds)
        scores = s.heads * tokens * tokens * (4 + 2)
        conv = self.chunks(seconds) * s.conv_channels * halved(s.mel_bins, 1) * halved(2 * s.n_window, 1) * 2
        block = tokens * (6 * s.width + s.ffn) * 2
        return scores + max(conv, block)

    # -- the part's protocol (plan/parts/base.py)
    def audio_plan(self, target: TargetProfile, build: BuildLimits, max_seconds: int | None, refused: list[str],
                   fit: dict | None) -> AudioPlan:
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
    from pipeline.plan.parts.audio_speed import PROMPT_TOKENS, TIMED_SECONDS, encoder_ms

    tokens = part.audio_tokens(max_seconds)
    if tokens + PROMPT_TOKENS > build.max_input_len:
        longest = _longest_recording(part, build.max_input_len - PROMPT_TOKENS)
        refused.append(f"a {max_seconds}-second recording is {tokens} audio tokens, {tokens + PROMPT_TOKENS} with "
                       f"the transcription prompt, more than max_input_len {build.max_input_len}: raise "
                       f"build.max_input_len to at least {tokens + PROMPT_TOKENS}, or take recordings of at most "
                       f"{longest} seconds")
    vision = (fit or {}).get("vision")
    timed = sorted({s for s in TIMED_SECONDS if s < max_seconds} | {max_seconds})
    by_seconds = {str(s): round(ms, 1) for s in timed if (ms := encoder_ms(part, target.id, s, vision)) is not None}
    return AudioPlan(design=part.design.name, precision="fp16", params=part.shape.params,
                     weights=2 * part.shape.params, activations=part.activation_bytes(max_seconds) + WORKSPACE,
                     max_seconds=max_seconds, audio_tokens=tokens, prompt_tokens=PROMPT_TOKENS,
                     encoder_ms_by_seconds=by_seconds or None,
                     encoder_error_band=vision["loo_median_abs_error"] if vision else None,
                     profile=AudioProfile(MIN_TIME_STEPS, max(MIN_TIME_STEPS, part.design.frames(max_seconds))),
                     n_window=part.shape.n_window)


def _longest_recording(part: AudioEncoder, tokens: int) -> int:
    seconds = 0
    while seconds < 3600 and part.audio_tokens(seconds + 1) <= tokens:
        seconds += 1
    return seconds


def _problem(r: ConfigReader, field: str, value, what: str):
    from pipeline.errors import Problem
    return Problem(r.source, field, value, what, "use the model's own config.json")

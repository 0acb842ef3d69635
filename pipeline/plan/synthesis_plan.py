"""The plan of a text-to-speech model (plan/synthesis.py reads it; plan/speech_plan.py holds the record): memory per
part on the target, real-time factor and first-audio latency, the published rows beside them; and what refuses it (a
format Edge-LLM does not build it in, an utterance past the engine or the board)."""

from __future__ import annotations

from pipeline.contract.plan import TEXT_TO_SPEECH
from pipeline.plan.memory import WORKSPACE
from pipeline.plan.speech_plan import SpeechPlan, backend_for, published, speed, vit_ms
from pipeline.plan.synthesis import FAMILY, STREAM_FRAMES, SynthesisShape, prompt_tokens


def plan_synthesis(shape: SynthesisShape, model: str, weights: str, kv_cache: str, target_id: str, max_seconds: int,
                   group_size: int | None = None, power_mode: str | None = None, max_seq_len: int | None = None,
                   max_batch_size: int = 1, backend: str | None = None) -> SpeechPlan:
    """The plan on one target. The talker's engine holds max_batch_size sequences of max_seq_len tokens (None: as
    long as the longest utterance's prompt and frames); an utterance of max_seconds must fit in one."""
    from pipeline.errors import PipelineError
    from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
    from pipeline.plan.memory import kv_bytes, linear_bytes, weight_bytes
    from pipeline.plan.perf import fit_data
    from pipeline.plan.targets import get_target

    if weights not in WEIGHT_FORMATS or kv_cache not in KV_FORMATS:
        raise PipelineError(f"weights {weights!r} / kv_cache {kv_cache!r}: not formats this pipeline knows",
                            f"weights: {', '.join(WEIGHT_FORMATS)}; kv_cache: {', '.join(KV_FORMATS)}")
    fmt, kv, target = WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache], get_target(target_id)
    group = group_size or (128 if fmt.awq else None)
    # the target's stack (or the one asked for) whose backend plans text to speech
    engine, support = backend_for(model, target, backend, FAMILY, "a text-to-speech model")
    mode = power_mode or target.default_power_mode
    t, cp = shape.talker, shape.code_predictor
    frames = int(max_seconds * shape.frame_rate)
    prompt = prompt_tokens(max_seconds)
    seq = max_seq_len or prompt + frames
    # both decoders are Qwen3's, with a per-head RMSNorm of q and k in every layer (the decoder planner's
    # ModelShape.small_params leaves those few kB out)
    body, codec_table, head = weight_bytes(t, fmt, group)
    body += 2 * t.head_dim * t.num_layers * 2
    cp_body = linear_bytes(cp.linears(), fmt, group, cp.kept_fp16(fmt)) + cp.small_params * 2 \
        + 2 * cp.head_dim * cp.num_layers * 2 + cp.hidden_size * 2
    # its heads (its own width) and codec embeddings (the talker's: the talker sums every codebook's row), FP16; where
    # it is narrower than the talker (the 1.7B), the projection the runtime feeds it through (weight and bias)
    heads = (shape.groups - 1) * cp.vocab_size * (cp.hidden_size + t.hidden_size) * 2
    projection = (t.hidden_size + 1) * cp.hidden_size * 2 if t.hidden_size != cp.hidden_size else 0
    text = shape.text_vocab * shape.text_hidden * 2 + (shape.text_hidden * (shape.text_hidden + t.hidden_size)
                                                       + shape.text_hidden + t.hidden_size) * 2
    memory = {"talker": int(body + codec_table + head), "text embedding and projection": text,
              "code predictor": int(cp_body + heads + projection), "code2wav": shape.code2wav.params * 2,
              "talker KV cache": kv_bytes(t, kv, seq, max_batch_size),
              "code predictor KV cache": kv_bytes(cp, kv, shape.groups + 1, max_batch_size),
              "code2wav activations": shape.code2wav.activation_bytes(frames),
              "workspaces (3 engines)": 3 * WORKSPACE, "runtime": engine.runtime_overhead}
    total, usable = sum(memory.values()), target.usable_bytes
    refused = [support.not_built] if support.not_built else []
    if support.formats is not None and weights not in support.formats:
        refused.insert(0, f"weights {weights!r}: {support.formats_why}; set quantization.weights to "
                          f"{' or '.join(repr(f) for f in support.formats)}")
    if prompt + frames > seq:
        refused.insert(0, f"an utterance of {max_seconds} s is about {prompt} prompt tokens and {frames} codec "
                          f"frames, more than max_seq_len {seq}: raise build.max_seq_len to at least "
                          f"{prompt + frames}, or lower build.audio.max_seconds")
    if total > usable:
        refused.insert(0, f"needs {total / 1e9:.2f} GB, more than the {usable / 1e9:.2f} GB usable on {target.name}; "
                          f"use a smaller weight format or fewer seconds an utterance (build.audio.max_seconds)")
    timing = _timing(shape, fmt, group, kv, target, mode, engine.perf_class, weights, fit_data())
    clip, by = speed(timing, max_seconds)
    return SpeechPlan(TEXT_TO_SPEECH, model, target_id, weights,
                      f"{shape.variant}; talker and code predictor in {weights}, KV cache {kv_cache}", max_seconds,
                      memory, total, usable, round(shape.frame_rate, 3),
                      "a frame (a talker step and a code-predictor walk)",
                      None if clip is None else round(clip[2], 2), None if clip is None else round(clip[1], 3), by,
                      f"first audio streamed ({STREAM_FRAMES} frames)", None if clip is None else round(clip[0], 1),
                      published(model, base_of(model), target_id, timing, {"first_audio_ms": 0, "rtf": 1}), refused)


def _timing(shape, fmt, group, kv, target, mode, perf_class, weights, fit):
    """seconds -> (first audio ms, RTF, frame ms) for an utterance of that length; None where a fit is missing."""
    from pipeline.plan.prediction import step_s, ttft_ms

    def code2wav_ms(frames: int) -> float | None:
        return vit_ms(target, shape.code2wav.flops(frames), fit)

    def timing(seconds: float) -> tuple[float, float, float] | None:
        frames = max(1, round(seconds * shape.frame_rate))
        prompt = prompt_tokens(seconds)
        pre = ttft_ms(shape.talker, weights, target.id, prompt, mode, fit)
        whole, first = code2wav_ms(frames), code2wav_ms(STREAM_FRAMES)
        if pre is None or whole is None or first is None:
            return None
        talker = step_s(shape.talker, fmt, group, kv, target, mode, prompt + frames // 2, 1, perf_class)
        walk = (shape.groups - 1) * step_s(shape.code_predictor, fmt, group, kv, target, mode, shape.groups // 2, 1,
                                           perf_class)
        frame_ms = 1000 * (talker + walk)
        speaking = pre + frames * frame_ms + whole
        return pre + STREAM_FRAMES * frame_ms + first, speaking / (1000 * seconds), frame_ms
    return timing


def base_of(model: str) -> str:
    """The voice-clone (Base) release of a Qwen3-TTS model: the same talker, code predictor and Code2Wav, fine-tuned
    otherwise (CustomVoice: preset speakers; VoiceDesign: described voices); the published rows are of it."""
    for variant in ("-CustomVoice", "-VoiceDesign"):
        if model.endswith(variant):
            return model[:-len(variant)] + "-Base"
    return model

"""The plan of a text-to-speech model (plan/synthesis.py reads it): memory per part on the target, real-time factor
and first-audio latency, the published rows beside them; and why no kit is built for it yet."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipeline.plan.synthesis import (
    CLIP_SECONDS,
    RTF_SECONDS,
    STREAM_FRAMES,
    WORKSPACE,
    SynthesisShape,
    prompt_tokens,
)

UNBUILT = "builds no kit for it yet"     # what every backend's Support.not_built for it says (backends.synthesis)


@dataclass(frozen=True)
class SynthesisPlan:
    model: str
    target: str
    weights: str
    kv_cache: str
    variant: str
    max_seconds: int
    memory: dict[str, int]          # bytes per part
    total: int
    usable: int
    frame_rate: float
    frame_ms: float | None          # one talker step and a code-predictor walk
    rtf: float | None               # for CLIP_SECONDS of speech (below 1: faster than real time)
    rtf_by_seconds: dict[str, float]
    first_audio_ms: float | None    # streamed: the first STREAM_FRAMES frames through Code2Wav
    published: list[str]
    refused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_dict(self) -> dict:
        return {"format": "jetson-synthesis-plan/1", "ok": self.ok, **asdict(self)}


def plan_synthesis(shape: SynthesisShape, model: str, weights: str, kv_cache: str, target_id: str, max_seconds: int,
                   group_size: int | None = None, power_mode: str | None = None, max_seq_len: int | None = None,
                   max_batch_size: int = 1, backend: str | None = None) -> SynthesisPlan:
    """The plan on one target. The talker's engine holds max_batch_size sequences of max_seq_len tokens (None: as
    long as the longest utterance's prompt and frames); an utterance of max_seconds must fit in one."""
    from pipeline import backends
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
    chosen = backends.synthesis_backend([backend] if backend else [s.backend for s in target.stacks])
    if chosen is None:
        raise PipelineError(f"{model}: no backend {'named ' + backend if backend else 'of ' + target_id} plans a "
                            "text-to-speech model", "TensorRT Edge-LLM does: use a target with its stack "
                            "(backend = \"edgellm\")")
    engine, support = backends.get(chosen[0]), chosen[1]
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
    heads = (shape.groups - 1) * cp.vocab_size * cp.hidden_size * 2 * 2       # its embeddings and heads, FP16
    projection = t.hidden_size * cp.hidden_size * 2 if t.hidden_size != cp.hidden_size else 0
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
    if prompt + frames > seq:
        refused.insert(0, f"an utterance of {max_seconds} s is about {prompt} prompt tokens and {frames} codec "
                          f"frames, more than max_seq_len {seq}: raise build.max_seq_len to at least "
                          f"{prompt + frames}, or lower build.audio.max_seconds")
    if total > usable:
        refused.insert(0, f"needs {total / 1e9:.2f} GB, more than the {usable / 1e9:.2f} GB usable on {target.name}; "
                          f"use a smaller weight format or fewer seconds an utterance (build.audio.max_seconds)")
    timing = _timing(shape, fmt, group, kv, target, mode, engine.perf_class, weights, fit_data())
    clip = timing(CLIP_SECONDS)
    by = {str(s): round(x[1], 3) for s in RTF_SECONDS if s <= max_seconds and (x := timing(s))}
    return SynthesisPlan(model, target_id, weights, kv_cache, shape.variant, max_seconds, memory, total, usable,
                         round(shape.frame_rate, 3), None if clip is None else round(clip[2], 2),
                         None if clip is None else round(clip[1], 3), by, None if clip is None else round(clip[0], 1),
                         _published(model, target_id, timing), refused)


def _timing(shape, fmt, group, kv, target, mode, perf_class, weights, fit):
    """seconds -> (first audio ms, RTF, frame ms) for an utterance of that length; None where a fit is missing."""
    from pipeline.plan.parts.tower import VitConstants, constants_for
    from pipeline.plan.prediction import step_s, ttft_ms
    vision, tflops = fit.get("vision"), target.tensor_tflops.get("fp16")

    def code2wav_ms(frames: int) -> float | None:
        if vision is None or not tflops:
            return None
        classes = {k: VitConstants(v["efficiency"], v["fixed_s"]) for k, v in vision["classes"].items()}
        return constants_for(classes, target.id).ms(shape.code2wav.flops(frames) / (tflops * 1e12))

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


def _published(model: str, target_id: str, timing) -> list[str]:
    """The plan beside each published row of the model (or of its Base release) on this target: the error as
    published / predicted."""
    from pipeline.plan.parts.audio_speed import load_rows
    rows = [r for r in load_rows() if r.model in (model, base_of(model))]
    out = []
    for r in rows:
        if r.target != target_id:
            continue
        t = timing(r.clip_seconds or CLIP_SECONDS)
        if t is None or r.metric not in ("rtf", "first_audio_ms"):
            continue
        predicted = t[1] if r.metric == "rtf" else t[0]
        ratio = r.value / predicted
        error = f"the published figure is {ratio:.2g}x the prediction" if ratio >= 1 else \
            f"the prediction is {1 / ratio:.2g}x the published figure"
        unit = "" if r.metric == "rtf" else " ms"
        of = "" if r.model == model else f" of {r.model}"
        out.append(f"{r.metric} {predicted:.3g}{unit} predicted, {r.value:g}{unit} published{of} ({r.weights}; "
                   f"{r.source}): {error}")
    if not out:
        elsewhere = sorted({r.target for r in rows})
        out.append(f"none of {model} on {target_id}" + (f" (there are on {', '.join(elsewhere)})" if elsewhere
                                                        else "") + ": the speed is a prediction only")
    return out


def render(p: SynthesisPlan) -> str:
    gb = 1e9
    lines = [f"{p.model} on {p.target}: text to speech ({p.variant}), {p.weights} talker and code predictor, "
             f"KV {p.kv_cache}, utterances up to {p.max_seconds} s ({p.frame_rate:g} codec frames a second)",
             "memory:"]
    lines += [f"  {name:<30} {v / gb:7.3f} GB" for name, v in p.memory.items()]
    lines.append(f"  {'total':<30} {p.total / gb:7.3f} GB of {p.usable / gb:.2f} GB usable")
    if p.rtf is not None:
        lines.append(f"speed: RTF {p.rtf:g} for {CLIP_SECONDS:g} s of speech (below 1: faster than real time; "
                     + ", ".join(f"{s} s: {v:g}" for s, v in p.rtf_by_seconds.items())
                     + f"); first audio {p.first_audio_ms:g} ms streamed ({STREAM_FRAMES} frames); a frame "
                     f"{p.frame_ms:g} ms")
    else:
        lines.append("speed: not predicted (no fit for this target)")
    lines += [f"published: {x}" for x in p.published]
    return "\n".join(lines)

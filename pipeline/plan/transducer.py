"""Nemotron-3.5-ASR (an RNN-T: a streaming FastConformer encoder, then an LSTM prediction network and a joint that
emit one token or a blank a step) planned as TensorRT Edge-LLM 0.11 builds it: the encoder as audio/model.onnx in FP16
(offline, whole-utterance: every frame scored against every other under the chunked-limited mask, so its attention
grows with the square of the recording; models/nemotron3_5_asr/modeling_nemotron3_5_asr_audio.py) and the RNN-T step
(prediction network + joint, one engine call a step; modeling_nemotron3_5_asr_decoder.py), both built by audio_build
(scripts/export.py: no LLM backbone, FP16 only). The greedy loop is the runtime's: a blank advances to the next
encoder frame, a token stays on it. So for S seconds of speech, F = 12.5 S encoder frames and T tokens:

    transcribing = encoder(S) + (F + T) x step        RTF = transcribing / S
    first token  = encoder(S) + step                   (offline: the whole recording encoded first)

The encoder's FLOPs go through the ViT fit as the Qwen3-ASR encoder's do, a step's reads through the dense decode fit
(its fixed cost is an LLM step's, fitted to decoders: an RNN-T step is a much smaller engine, so the prediction is
pessimistic there). T is the transcript's tokens at TRANSCRIPT_TOKENS_PER_SECOND (plan/parts/audio_speed.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.contract.plan import SPEECH_TO_TEXT
from pipeline.errors import InputError, Problem
from pipeline.plan.memory import WORKSPACE
from pipeline.plan.speech_plan import SpeechPlan, backend_for, published, speed, vit_ms

FAMILY = "nemotron3_5_asr"
MEL_PER_SECOND = 100        # its feature extractor: 16 kHz, hop 160
# transformers 5.14's defaults (Nemotron3_5AsrConfig, NemotronAsrStreamingEncoderConfig: those of
# nvidia/nemotron-3.5-asr-streaming-0.6b), which it fills in where a config.json leaves a key out
DEFAULTS = {"vocab_size": 13088, "decoder_hidden_size": 640, "num_decoder_layers": 2, "num_prompts": 128,
            "prompt_intermediate_size": 2048, "max_symbols_per_step": 10}
ENCODER_DEFAULTS = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 8, "intermediate_size": 4096,
                    "conv_kernel_size": 9, "subsampling_factor": 8, "subsampling_conv_channels": 256,
                    "num_mel_bins": 80, "subsampling_conv_kernel_size": 3, "subsampling_conv_stride": 2}
# biases in the attention and FFN linears, and in the conv module's convolutions (transformers: both default true)
ENCODER_FLAGS = {"attention_bias": True, "convolution_bias": True}
BOUND = 2**20
DEFAULT_MAX_SECONDS = 30


@dataclass(frozen=True)
class TransducerShape:
    e: dict                     # the encoder's sizes and ENCODER_FLAGS
    t: dict                     # the prediction network's, the joint's and the prompt's

    @property
    def frames_per_second(self) -> float:
        return MEL_PER_SECOND / self.e["subsampling_factor"]

    def _sub(self) -> tuple[int, int, int]:
        """(subsampling stages, channels, the flattened width into its linear): transformers'
        subsampling_out_hidden_size."""
        k, s, c = (self.e[x] for x in ("subsampling_conv_kernel_size", "subsampling_conv_stride",
                                       "subsampling_conv_channels"))
        stages, width = int(math.log2(self.e["subsampling_factor"])), self.e["num_mel_bins"]
        for _ in range(stages):
            width = (width + (k - 1) + (s - 1) - k) // s + 1
        return stages, c, c * width

    @property
    def encoder_params(self) -> int:
        """The FastConformer with its prompt fusion and its projection into the joint's space."""
        h, i, kc = self.e["hidden_size"], self.e["intermediate_size"], self.e["conv_kernel_size"]
        stages, c, width = self._sub()
        k = self.e["subsampling_conv_kernel_size"]
        sub = c * k * k + c + (stages - 1) * (c * k * k + c + c * c + c) + width * h + h
        ab, cb = int(self.e["attention_bias"]), int(self.e["convolution_bias"])
        ffn = h * i + i * h + ab * (i + h)
        attention = 4 * h * h + ab * 4 * h + h * h + 2 * h     # q, k, v, o; the relative-position projection; u, v
        conv = 2 * h * h + kc * h + h * h + cb * (2 * h + h + h) + 2 * h      # two pointwise, depthwise; its norm
        layer = 2 * ffn + attention + conv + 5 * 2 * h        # five LayerNorms
        p, pi, d = self.t["num_prompts"], self.t["prompt_intermediate_size"], self.t["decoder_hidden_size"]
        prompt = (h + p) * pi + pi + pi * h + h
        return sub + self.e["num_hidden_layers"] * layer + prompt + h * d + d

    @property
    def step_params(self) -> int:
        """The prediction network (embedding, LSTM, projection) and the joint's head."""
        v, d, n = self.t["vocab_size"], self.t["decoder_hidden_size"], self.t["num_decoder_layers"]
        return v * d + n * (2 * 4 * d * d + 2 * 4 * d) + d * d + d + d * v + v

    @property
    def step_read_bytes(self) -> int:
        """What one step reads in FP16: all of it but one row of the embedding."""
        v, d = self.t["vocab_size"], self.t["decoder_hidden_size"]
        return 2 * (self.step_params - v * d + d)

    def encoder_flops(self, seconds: float) -> float:
        h, i, kc = self.e["hidden_size"], self.e["intermediate_size"], self.e["conv_kernel_size"]
        stages, c, width = self._sub()
        k = self.e["subsampling_conv_kernel_size"]
        macs, rate, freq = 0.0, MEL_PER_SECOND * seconds, self.e["num_mel_bins"]
        for stage in range(stages):         # each halves time and frequency
            rate, freq = rate / 2, math.ceil(freq / 2)
            macs += rate * freq * (c * k * k if stage == 0 else c * k * k + c * c)
        frames = self.frames_per_second * seconds
        macs += frames * width * h
        # a layer: two FFNs; q, k, v, o; the conv module's two pointwise convs and its depthwise one
        per_frame = 2 * 2 * h * i + 4 * h * h + 2 * h * h + kc * h + h * h
        # the relative-position projection over 2F-1 positions; every frame's scores against every frame (content),
        # against the 2F-1 positions, and the values it takes
        attention = (2 * frames - 1) * h * h + frames * (frames + (2 * frames - 1) + frames) * h
        macs += self.e["num_hidden_layers"] * (frames * per_frame + attention)
        return 2 * macs

    def activation_bytes(self, seconds: int) -> int:
        """One layer's widest tensors in FP16 for a recording: the FFN's and the heads' scores (content and
        relative position, 2T-1 wide) for every frame against every frame."""
        frames = math.ceil(self.frames_per_second * seconds)
        heads = self.e["num_attention_heads"]
        return 2 * (frames * self.e["intermediate_size"] + heads * frames * 3 * frames)


def transducer_shape(config: dict, source: str) -> TransducerShape:
    """Validate and read the fields the plan needs (transformers' defaults where it leaves one out); every missing
    or odd one is reported at once."""
    problems: list[Problem] = []
    enc = config.get("encoder_config", {})
    if not isinstance(enc, dict):
        raise InputError([Problem(source, "encoder_config", enc, "must hold the encoder's config",
                                  "use the model's own config.json")])

    def read(d: dict, defaults: dict, where: str) -> dict:
        out = {}
        for key, default in defaults.items():
            v = d.get(key, default)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < BOUND:
                problems.append(Problem(source, f"{where}{key}", v, "must be a positive integer",
                                        "use the model's own config.json"))
                v = default
            out[key] = v
        return out

    e, t = read(enc, ENCODER_DEFAULTS, "encoder_config."), read(config, DEFAULTS, "")
    for key, default in ENCODER_FLAGS.items():
        v = enc.get(key, default)
        if not isinstance(v, bool):
            problems.append(Problem(source, f"encoder_config.{key}", v, "must be true or false",
                                    "use the model's own config.json"))
            v = default
        e[key] = v
    if e["subsampling_factor"] & (e["subsampling_factor"] - 1) or e["subsampling_factor"] < 2:
        problems.append(Problem(source, "encoder_config.subsampling_factor", e["subsampling_factor"],
                                "must be a power of two (each stage halves the frames)",
                                "use the model's own config.json"))
    if e["hidden_size"] % e["num_attention_heads"]:
        problems.append(Problem(source, "encoder_config.num_attention_heads", e["num_attention_heads"],
                                f"must divide hidden_size {e['hidden_size']}", "use the model's own config.json"))
    if problems:
        raise InputError(problems)
    return TransducerShape(e, t)


def plan_transducer(shape: TransducerShape, model: str, weights: str, target_id: str, max_seconds: int,
                    power_mode: str | None = None, backend: str | None = None) -> SpeechPlan:
    from pipeline.plan.parts.audio_speed import TRANSCRIPT_TOKENS_PER_SECOND
    from pipeline.plan.perf import fit_data, fitted
    from pipeline.plan.targets import get_target

    target = get_target(target_id)
    engine, support = backend_for(model, target, backend, FAMILY, "an RNN-T speech-to-text model")
    memory = {"encoder (FP16)": 2 * shape.encoder_params, "RNN-T step (FP16)": 2 * shape.step_params,
              "encoder activations": shape.activation_bytes(max_seconds),
              "RNN-T state": 2 * 2 * shape.t["num_decoder_layers"] * shape.t["decoder_hidden_size"] * 2,
              "workspaces (2 engines)": 2 * WORKSPACE, "runtime": engine.runtime_overhead}
    total, usable = sum(memory.values()), target.usable_bytes
    refused = [support.not_built] if support.not_built else []
    if support.formats is not None and weights not in support.formats:
        refused.insert(0, f"weights {weights!r}: {support.formats_why}; set quantization.weights to "
                          f"{' or '.join(repr(f) for f in support.formats)}")
    if total > usable:
        refused.insert(0, f"needs {total / 1e9:.2f} GB, more than the {usable / 1e9:.2f} GB usable on {target.name} "
                          f"(its encoder scores every frame against every other): lower build.audio.max_seconds")
    constants, fit = fitted()[engine.perf_class], fit_data()
    bandwidth = target.bandwidth_bytes(power_mode or target.default_power_mode)
    step_ms = 1000 * (shape.step_read_bytes / (constants.efficiency * bandwidth) + constants.fixed_s)

    def timing(seconds: float) -> tuple[float, float, float] | None:
        encoder = vit_ms(target, shape.encoder_flops(seconds), fit)
        if encoder is None:
            return None
        steps = shape.frames_per_second * seconds + TRANSCRIPT_TOKENS_PER_SECOND * seconds
        return encoder + step_ms, (encoder + steps * step_ms) / (1000 * seconds), step_ms

    clip, by = speed(timing, max_seconds)
    return SpeechPlan(SPEECH_TO_TEXT, model, target_id, weights, "an RNN-T: FastConformer encoder, LSTM prediction "
                      "network and joint", max_seconds, memory, total, usable, shape.frames_per_second,
                      "an RNN-T step (a token or a blank)", None if clip is None else round(clip[2], 3),
                      None if clip is None else round(clip[1], 3), by, "first token after the recording (offline)",
                      None if clip is None else round(clip[0], 1),
                      published(model, model, target_id, timing, {"first_token_ms": 0, "rtf": 1}), refused)

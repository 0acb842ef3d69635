"""A text-to-speech model's plan (Qwen3-TTS): its memory per part and its speed as a speaker, from its config.json
(and its speech tokenizer's, where the model directory has it), checked against the published rows of the model.

Qwen3-TTS speaks in codec frames (12.5 a second of 24 kHz audio: its Code2Wav upsamples each frame 1920 times). Each
frame is one step of the talker (a Qwen3 decoder over the codec's first codebook, the text fed through its own
embedding and projection) and a walk of the code predictor (a small Qwen3 decoder, one pass per remaining codebook,
each with its own head), then Code2Wav turns frames into samples. TensorRT Edge-LLM 0.11 builds the three as engines
(tensorrt_edgellm/scripts/export.py: the talker under llm/, the code predictor under code_predictor/, Code2Wav under
code2wav/; models/qwen3_tts/). So for S seconds of speech, F = 12.5 S frames:

    speaking     = prefill(prompt) + F x (talker step + (groups - 1) x code-predictor pass) + Code2Wav(F)
    RTF          = speaking / S                                  (below 1: faster than real time)
    first audio  = prefill(prompt) + STREAM_FRAMES x frame + Code2Wav(STREAM_FRAMES)   (the first streamed chunk)

The decoder steps are priced by the dense decode fit (plan/perf.py: the bytes each step reads), the prefill by the
prefill fit, Code2Wav's FLOPs by the ViT fit as the audio encoder's are (plan/parts/audio.py says why it borrows it).
The plan is a prediction: no Jetson figure of Qwen3-TTS through TensorRT is published; the rows it is checked against
ran PyTorch with CUDA graphs (pipeline/data/speech_rows.csv).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.plan.shapes import InputError, ModelShape, Problem, shape_from_config

FAMILY = "qwen3_tts"
SAMPLE_RATE = 24_000        # Code2Wav's output rate (the speech tokenizer's; its decoder config does not carry it)
# a streamed first chunk: Edge-LLM 0.11's server hands Code2Wav this many codec frames at a time
# (experimental/server/runtime/engine.py AudioParams.codec_chunk_frames); the published rows streamed 8
STREAM_FRAMES = 10
# the prompt before the first frame: the chat-rendered text (read speech: ~2.7 words a second, ~1.3 tokens a word)
# and the codec prefix (think, language, speaker, pad, bos: up to 7 tokens)
TEXT_TOKENS_PER_SECOND = 3.5
PROMPT_OVERHEAD = 16
# Code2Wav's config where the model directory has no speech_tokenizer/config.json (a plan from the model's config
# alone): the decoder_config of the published Qwen/Qwen3-TTS-Tokenizer-12Hz, every Qwen3-TTS-12Hz model's, as two
# third-party readers quote it (the hub was not reachable here). Edge-LLM 0.11's Qwen3TTSCode2WavConfig
# (models/qwen3_tts/modeling_qwen3_tts_code2wav.py) has other defaults (hidden 1024, intermediate 3072) and reads
# the model's own file, as the plan does when it is there.
CODE2WAV_DEFAULTS = {"codebook_size": 2048, "hidden_size": 512, "latent_dim": 1024, "num_attention_heads": 16,
                     "num_key_value_heads": 16, "head_dim": 64, "sliding_window": 72, "intermediate_size": 1024,
                     "num_hidden_layers": 8, "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3],
                     "upsampling_ratios": [2, 2], "decoder_dim": 1536, "codebook_dim": 512}
BOUND = 2**20


def prompt_tokens(seconds: float) -> int:
    """The talker's prompt for an utterance of `seconds`: its text and the template and codec prefix around it."""
    return PROMPT_OVERHEAD + round(TEXT_TOKENS_PER_SECOND * seconds)


def is_synthesis(config: object) -> bool:
    return isinstance(config, dict) and config.get("model_type") == FAMILY


@dataclass(frozen=True)
class Code2Wav:
    """The speech tokenizer's decoder as Edge-LLM exports it: RVQ decode, a pre-conv, a transformer, two
    upsampling stages with ConvNeXt blocks, then SEANet decoder blocks (each a transposed conv and three dilated
    residual units) down to one channel."""
    c: dict

    def _int(self, key: str) -> int:
        return int(self.c[key])

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.c["upsample_rates"]) * math.prod(self.c["upsampling_ratios"])

    def _stages(self):
        """(positions per frame, parameters, MACs per position) of each stage."""
        cd, lat, h, inter = (self._int(k) for k in ("codebook_dim", "latent_dim", "hidden_size", "intermediate_size"))
        nq, bins, layers = self._int("num_quantizers"), self._int("codebook_size"), self._int("num_hidden_layers")
        heads, kv, dd = self._int("num_attention_heads"), self._int("num_key_value_heads"), self._int("decoder_dim")
        hd = self._int("head_dim") if self.c.get("head_dim") else h // heads
        half = cd // 2
        # the split RVQ: codebooks [bins, cd/2] (+ usage), each half's in/out 1x1 projections
        yield 1, nq * bins * (half + 1) + 2 * 2 * cd * half, 2 * 2 * cd * half
        yield 1, 3 * cd * lat + lat, 3 * cd * lat                                   # pre_conv, k=3
        attn = h * (heads + 2 * kv) * hd + heads * hd * h
        layer = attn + 3 * h * inter + 4 * h
        window = self._int("sliding_window")       # each frame attends to this many before it
        yield 1, 2 * lat * h + h + lat + layers * layer + h, \
            2 * lat * h + layers * (attn + 3 * h * inter + 2 * window * heads * hd)
        length = 1
        for f in self.c["upsampling_ratios"]:           # transposed conv (k = stride = f) + ConvNeXt
            yield length, f * lat * lat + lat, f * lat * lat
            length *= f
            yield length, 7 * lat + 2 * 4 * lat * lat + 5 * lat + 4 * lat, 7 * lat + 8 * lat * lat
        yield length, 7 * lat * dd + dd, 7 * lat * dd                               # the decoder's input conv
        dim = dd
        for r in self.c["upsample_rates"]:
            out = dim // 2
            yield length, 2 * dim + 2 * r * dim * out + out, 2 * r * dim * out      # SnakeBeta + transposed conv
            length *= r
            yield length, 3 * (4 * out + 8 * out * out + 2 * out), 3 * 8 * out * out  # three residual units
            dim = out
        yield length, 2 * dim + 7 * dim + 1, 7 * dim                                # SnakeBeta + conv to 1 channel

    @property
    def params(self) -> int:
        return sum(p for _, p, _ in self._stages())

    def flops(self, frames: int) -> float:
        return 2.0 * frames * sum(n * m for n, _, m in self._stages())

    def activation_bytes(self, frames: int) -> int:
        """The largest stage's input, output and residual in FP16 for `frames` frames at once."""
        widest = max(self._int("decoder_dim") * 4, *(
            (self._int("decoder_dim") >> (i + 1)) * 4 * math.prod(self.c["upsample_rates"][:i + 1])
            for i in range(len(self.c["upsample_rates"]))))
        return 3 * 2 * frames * widest


@dataclass(frozen=True)
class SynthesisShape:
    """Qwen3-TTS read from its config: the talker and the code predictor as Qwen3 decoders, the text embedding and
    projection beside the talker, and Code2Wav."""
    talker: ModelShape
    code_predictor: ModelShape
    groups: int                 # codebooks per frame: the talker writes the first, the code predictor the rest
    text_vocab: int
    text_hidden: int
    code2wav: Code2Wav
    variant: str                # tts_model_type: base (voice clone), custom_voice, voice_design

    @property
    def frame_rate(self) -> float:
        return SAMPLE_RATE / self.code2wav.samples_per_frame


def _decoder(raw: dict, vocab: int, where: str, problems: list[Problem]) -> ModelShape | None:
    """A talker or code predictor config as the Qwen3 decoder it is (Edge-LLM exports both as Qwen3 CausalLMs)."""
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "max_position_embeddings", "rms_norm_eps", "rope_theta")
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
              "tie_word_embeddings": False, **{k: raw[k] for k in keys if k in raw}}
    try:
        return shape_from_config(config, where)
    except InputError as exc:
        problems.extend(exc.problems)
        return None


def synthesis_shape(config: dict, source: str, code2wav: dict | None = None) -> SynthesisShape:
    """Validate and read the fields the plan needs; every missing or odd one is reported at once."""
    problems: list[Problem] = []

    def need(d: object, key: str, where: str, positive: bool = True) -> int:
        v = d.get(key) if isinstance(d, dict) else None
        if not isinstance(v, int) or isinstance(v, bool) or not (0 < v < BOUND if positive else 0 <= v < BOUND):
            problems.append(Problem(source, f"{where}{key}", v, "must be a positive integer",
                                    "use the model's own config.json"))
            return 1
        return v

    talker = config.get("talker_config")
    if not isinstance(talker, dict):
        raise InputError([Problem(source, "talker_config", talker, "must hold the talker's config (Qwen3-TTS keeps "
                                  "it there)", "use the model's own config.json")])
    cp = talker.get("code_predictor_config")
    if not isinstance(cp, dict):
        cp = {}
        problems.append(Problem(source, "talker_config.code_predictor_config", None, "must hold the code "
                                "predictor's config", "use the model's own config.json"))
    groups = need(talker, "num_code_groups", "talker_config.")
    shape = _decoder(talker, need(talker, "vocab_size", "talker_config."), f"{source}: talker_config", problems)
    small = _decoder(cp, need(cp, "vocab_size", "talker_config.code_predictor_config."),
                     f"{source}: talker_config.code_predictor_config", problems)
    text_vocab = need(talker, "text_vocab_size", "talker_config.")
    text_hidden = need(talker, "text_hidden_size", "talker_config.")
    c2w = dict(CODE2WAV_DEFAULTS, **(code2wav or {}))
    for key, default in CODE2WAV_DEFAULTS.items():
        v = c2w[key]
        ok = (isinstance(v, list) and 0 < len(v) <= 8 and all(type(x) is int and 0 < x < 64 for x in v)) if \
            isinstance(default, list) else (isinstance(v, int) and not isinstance(v, bool) and 0 < v < BOUND)
        if not ok:
            problems.append(Problem(f"{source}: speech_tokenizer/config.json", f"decoder_config.{key}", v,
                                    "is not a size Code2Wav can have", "use the model's own speech tokenizer"))
    if problems or shape is None or small is None:
        raise InputError(problems)
    if groups < 2:
        raise InputError([Problem(source, "talker_config.num_code_groups", groups, "must be at least 2 (the talker "
                                  "writes the first codebook, the code predictor the rest)", "use the model's own "
                                  "config.json")])
    # Edge-LLM keeps the code predictor's down_proj in FP16 whatever the rest's format
    # (models/qwen3_tts/modeling_code_predictor.py)
    small = dataclasses.replace(small, unquantized=("down_proj",))
    return SynthesisShape(shape, small, groups, text_vocab, text_hidden, Code2Wav(c2w),
                          str(config.get("tts_model_type", "?")))


def speech_tokenizer_config(directory: Path) -> dict | None:
    """Code2Wav's config from a model directory's speech_tokenizer/config.json; None where it has none."""
    from pipeline.plan.shapes import load_config
    tokenizer = Path(directory) / "speech_tokenizer" / "config.json"
    if not tokenizer.is_file():
        return None
    decoder = load_config(tokenizer).get("decoder_config")
    if not isinstance(decoder, dict):
        raise InputError([Problem(str(tokenizer), "decoder_config", decoder, "must hold Code2Wav's config",
                                  "use the model's own speech tokenizer")])
    return decoder

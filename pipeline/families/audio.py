"""A speech model's audio side, as data: how many tokens a recording of a given length becomes in the language model's
sequence, and what its audio encoder is made of, read from either layout the hub publishes it in.

    Qwen3-ASR (Qwen/Qwen3-ASR-0.6B, -1.7B; transformers 5: Qwen3ASRForConditionalGeneration)
        16 kHz audio, 128-bin log-mel frames every 10 ms (WhisperFeatureExtractor), cut into chunks of 2 x n_window
        frames (n_window 50: one second). Per chunk three stride-2 3x3 convolutions (GELU, downsample_hidden_size
        channels) leave ceil(frames / 8) steps (13 for a whole chunk), `conv_out` (no bias) takes channels x the 16
        remaining mel bins to d_model, sinusoidal positions are added; encoder_layers pre-norm blocks (LayerNorm,
        q/k/v/out with bias, GELU fc1/fc2 with bias) attend within windows of n_window_infer frames (800: 8 chunks);
        ln_post, then d_model -> d_model (GELU) -> output_dim (the language model's hidden size), both with bias.
        The language model is a Qwen3 decoder; each audio token replaces one <|audio_pad|> placeholder.
        transformers: models/qwen3_asr/modeling_qwen3_asr.py (_get_feat_extract_output_lengths);
        Edge-LLM 0.11: tensorrt_edgellm/models/qwen3_asr/modeling_qwen3_asr_audio.py (audio/model.onnx).

Two hub layouts. The original repositories keep both configs under `thinker_config` (audio_config, text_config) and
the whole encoder, its projection included (proj1, proj2), under `thinker.audio_tower.`. The transformers-native
"-hf" conversions keep audio_config and text_config at the top level and the projection beside the encoder as
`multi_modal_projector.linear_1/linear_2`. Edge-LLM 0.11's audio loader reads proj1/proj2 inside the tower (its
_CANDIDATE_PREFIXES: `audio_tower.`, `thinker.audio_tower.`, `model.audio_tower.`), so the original layout is the one
its exporter takes as it is. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import PipelineError

SAMPLE_RATE = 16_000
HOP = 160                   # samples between mel frames (10 ms)
MIN_SAMPLES = 8_000         # Qwen3-ASR's feature extractor pads shorter clips to half a second (its min_length)
CONVOLUTIONS = 3            # stride-2 3x3 convolutions over time and frequency


def halved(n: int, times: int = CONVOLUTIONS) -> int:
    """What `times` stride-2 convolutions (kernel 3, padding 1) leave of n steps: ceil(n / 2) each time."""
    for _ in range(times):
        n = (n - 1) // 2 + 1 if n > 0 else 0
    return n


# The languages Qwen3-ASR transcribes by name (its model card's list; a transcription request's ISO 639 code is asked
# as the language's English name in a system turn, as Edge-LLM 0.11's transcription server asks it)
QWEN3_ASR_LANGUAGES = {
    "zh": "Chinese", "en": "English", "yue": "Cantonese", "ar": "Arabic", "de": "German", "fr": "French",
    "es": "Spanish", "pt": "Portuguese", "id": "Indonesian", "it": "Italian", "ko": "Korean", "ru": "Russian",
    "th": "Thai", "vi": "Vietnamese", "ja": "Japanese", "tr": "Turkish", "hi": "Hindi", "ms": "Malay", "nl": "Dutch",
    "sv": "Swedish", "da": "Danish", "fi": "Finnish", "pl": "Polish", "cs": "Czech", "fil": "Filipino",
    "fa": "Persian", "el": "Greek", "hu": "Hungarian", "mk": "Macedonian", "ro": "Romanian"}


@dataclass(frozen=True)
class AudioEncoderDesign:
    """One audio encoder design: where its config and tensors sit, and its chunked convolution front end."""
    name: str                           # recorded in plans; never compared
    config_paths: tuple[str, ...]       # where config.json keeps the encoder's config, the first present read
    text_paths: tuple[str, ...]         # ... and the language model's
    modules: tuple[str, ...]            # the encoder's tensor prefixes, per layout
    placeholder: str = "<|audio_pad|>"
    # a transcriber's answer: "language NAME" then this token then the transcript (Qwen3-ASR's output format)
    transcript_marker: str = "<asr_text>"
    languages: tuple[tuple[str, str], ...] = tuple(QWEN3_ASR_LANGUAGES.items())     # (ISO 639 code, name)
    optional: bool = False      # a checkpoint of the family may have no audio encoder (its config's entry null)
    chunked: bool = True        # a recording's tokens depend on the encoder's chunk (the plan's n_window)
    # audio_build's --minTimeSteps for the encoder (Qwen3-ASR: its default, a second of frames; its extractor pads a
    # clip to half a second and the graph takes chunks, so no recording is under it)
    min_time_steps: int = 100
    # the transcription prompt's tokens around the audio (chat template, tags) and the answer's before and after the
    # transcript, as its chat template renders them (plan/parts/audio_speed.py): Qwen3-ASR's <|im_start|>system\n
    # <|im_end|>\n<|im_start|>user\n<|audio_start|> ... <|audio_end|><|im_end|>\n<|im_start|>assistant\n, and
    # "language English<asr_text>" ... <|im_end|>
    prompt_tokens: int = 15
    answer_tokens: int = 4
    longest_seconds: int | None = None      # the longest recording the model takes (None: its engine's profile says)
    # the Edge-LLM export's steps for it ("module:class", a workstation/export_steps.py PartExport: imported by the
    # export, which has torch; this module is read on the device)
    export_step: str = "pipeline.workstation.audio_export:AudioEncoderExport"
    # what makes recordings into the model's audio inputs on the workstation ("module:function"(model_dir, part))
    recording_inputs: str = "pipeline.workstation.audio_prompts:whisper_chunks"

    def read_shape(self, need, _hidden: int) -> AudioEncoderShape:
        """The encoder's dimensions from its config: need(key, default) reads one (a problem where it is bad), its
        `config` the encoder's config; _hidden: the language model's hidden size (Qwen3-ASR names its own output)."""
        return AudioEncoderShape(
            mel_bins=need("num_mel_bins", 128), layers=need("encoder_layers"), width=need("d_model"),
            heads=need("encoder_attention_heads"), ffn=need("encoder_ffn_dim"), out=need("output_dim"),
            conv_channels=need("downsample_hidden_size", 480), n_window=need("n_window", 50),
            n_window_infer=need("n_window_infer", 800))

    def shape_problems(self, shape: AudioEncoderShape, hidden: object) -> list[tuple[str, object, str]]:
        """(field, value, what it must be) for each way the encoder cannot feed the language model."""
        out: list[tuple[str, object, str]] = []
        if shape.out != hidden:
            out.append(("output_dim", shape.out, f"must equal the language model's hidden_size ({hidden}): the "
                        "encoder's tokens take the place of its embeddings"))
        if shape.width % shape.heads:
            out.append(("d_model", shape.width, f"must divide into encoder_attention_heads ({shape.heads}) heads"))
        if shape.n_window_infer % (2 * shape.n_window):
            out.append(("n_window_infer", shape.n_window_infer, "must be a whole number of encoder chunks (2 x "
                        f"n_window = {2 * shape.n_window} frames)"))
        return out

    def tokens(self, seconds: float, shape: Any) -> int:
        return self.audio_tokens(seconds, shape.n_window)

    def tokens_of_samples(self, samples: int, n_window: int | None) -> int:
        """The tokens a recording of `samples` samples takes (its extractor pads clips under half a second)."""
        assert n_window is not None
        return self.tokens_of_frames(max(samples, MIN_SAMPLES) // HOP, n_window)

    def engine_frames(self, seconds: float) -> int:
        """The time steps the encoder engine takes for `seconds` of audio (its profile's maximum at the longest)."""
        return self.frames(seconds)

    def shortest_samples(self) -> int | None:
        """The fewest samples a recording may have for the engine's profile (None: any, padded by the extractor)."""
        return None

    def wrap(self) -> tuple[str, str] | None:
        """The tokens the runtime puts around a recording's tokens where the prompt lacks them (None: the chat
        template's own markers are the prompt's)."""
        return None

    def transcription_text(self, _language: str | None, prompt: str | None) -> str | None:
        """The text after the recording in a transcription's user turn (Qwen3-ASR: the request's prompt, if any; the
        language goes in the system turn)."""
        return prompt or None

    def transcription_system(self, language: str | None) -> str | None:
        """A transcription's system turn: Qwen3-ASR is told the language's name there (Edge-LLM's server does so)."""
        return language

    def frames(self, seconds: float) -> int:
        """Mel frames of `seconds` of audio (the feature extractor's count)."""
        return int(seconds * SAMPLE_RATE) // HOP

    def audio_tokens(self, seconds: float, n_window: int) -> int:
        """The tokens `seconds` of audio take in the language model's sequence: each whole chunk of 2 x n_window
        frames gives what the convolutions leave of a chunk, the rest what they leave of it (transformers'
        _get_feat_extract_output_lengths)."""
        return self.tokens_of_frames(self.frames(seconds), n_window)

    def tokens_of_frames(self, frames: int, n_window: int) -> int:
        """The tokens `frames` mel frames take (the feature extractor's count for a recording)."""
        chunk = 2 * n_window
        whole, rest = divmod(frames, chunk)
        return whole * halved(chunk) + halved(rest)

    def tokens_per_second(self, n_window: int) -> float:
        return halved(2 * n_window) / (2 * n_window * HOP / SAMPLE_RATE)


QWEN3_ASR_AUDIO = AudioEncoderDesign(
    name="qwen3-asr-aut", config_paths=("thinker_config.audio_config", "audio_config"),
    text_paths=("thinker_config.text_config", "text_config"),
    modules=("thinker.audio_tower.", "audio_tower.", "model.audio_tower."))


@dataclass(frozen=True)
class AudioEncoderShape:
    """An audio encoder's dimensions as its config gives them."""
    mel_bins: int
    layers: int
    width: int                  # d_model
    heads: int
    ffn: int
    out: int                    # output_dim: the language model's hidden size
    conv_channels: int          # downsample_hidden_size
    n_window: int
    n_window_infer: int

    @property
    def freq_bins(self) -> int:
        """Mel bins left after the convolutions (128 -> 16)."""
        return halved(self.mel_bins)

    @property
    def params(self) -> int:
        """Every weight and bias: three 3x3 convolutions, conv_out, the blocks, ln_post and the projection."""
        c, d = self.conv_channels, self.width
        convs = (9 * c + c) + 2 * (9 * c * c + c)
        block = 4 * (d * d + d) + 2 * d * self.ffn + self.ffn + d + 4 * d
        return convs + c * self.freq_bins * d + self.layers * block + 2 * d + (d * d + d) + (d * self.out + self.out)

    def flops_per_token(self, attended: int | None = None) -> float:
        """FLOPs of one audio token: its share of its chunk's three convolutions, conv_out, the blocks' linears, the
        attention products over the `attended` tokens it is scored against (None: a full window of n_window_infer
        frames, as transformers attends; Edge-LLM's graph scores the whole request under a mask), the projection."""
        c, d, chunk = self.conv_channels, self.width, 2 * self.n_window
        tokens = halved(chunk)
        # each convolution's outputs (c channels x frequency x time after it) times its 3x3 x input-channel MACs
        convs = sum(2 * 9 * (1 if i == 1 else c) * c * halved(self.mel_bins, i) * halved(chunk, i)
                    for i in range(1, CONVOLUTIONS + 1))
        window = tokens * (self.n_window_infer // chunk) if attended is None else attended
        blocks = self.layers * (2 * (4 * d * d + 2 * d * self.ffn) + 4 * d * window)
        return convs / tokens + 2 * c * self.freq_bins * d + blocks + 2 * (d * d + d * self.out)


    def flops(self, tokens: int) -> float:
        """The exported graph's work for one recording of `tokens` tokens: every token scored against all of the
        request's (Edge-LLM's graph scores the whole request under a mask)."""
        return tokens * self.flops_per_token(attended=tokens)

    def activation_bytes(self, tokens: int, frames: int) -> int:
        """The largest live tensors at a recording of `tokens` tokens (`frames` mel frames): one layer's attention
        scores (FP32) and probabilities (FP16) over the whole request for every head, beside the larger of the first
        convolution's output and a block's tensors (TensorRT reuses them layer to layer)."""
        chunks = -(-frames // (2 * self.n_window))
        scores = self.heads * tokens * tokens * (4 + 2)
        conv = chunks * self.conv_channels * halved(self.mel_bins, 1) * halved(2 * self.n_window, 1) * 2
        return scores + max(conv, tokens * (6 * self.width + self.ffn) * 2)

    def plan_window(self) -> int | None:
        """What the plan records of the encoder's chunking for a recording's token arithmetic (AudioPlan.n_window)."""
        return self.n_window


def expand_recording(ids: list[int], pad: int, count: int, wrap: tuple[int, int] | None) -> list[int]:
    """The prompt's one placeholder `pad` as `count` of it, between `wrap` where the runtime adds it and the prompt
    has not: Edge-LLM's Gemma 4 audio runner puts <|audio> and <audio|> around unless they are already there."""
    if ids.count(pad) != 1:
        raise PipelineError(f"the chat template placed {ids.count(pad)} audio placeholders for one recording",
                            "use the model's own chat template")
    at = ids.index(pad)
    return ids[:at] + wrapped(ids, at, count, wrap) + ids[at + 1:]


def wrapped(ids: list[int], at: int, count: int, wrap: tuple[int, int] | None) -> list[int]:
    """What the placeholder at ids[at] becomes: `count` copies of it, with wrap[0] before and wrap[1] after unless
    the prompt already has them there (None: no wrap)."""
    pad = ids[at]
    before = [] if wrap is None or (at and ids[at - 1] == wrap[0]) else [wrap[0]]
    after = [] if wrap is None or (at + 1 < len(ids) and ids[at + 1] == wrap[1]) else [wrap[1]]
    return before + [pad] * count + after


def located(config: dict, paths: tuple[str, ...]) -> tuple[str, dict] | None:
    """(path, the dict there) for the first of `paths` (dotted) that config.json holds as a dict; None: none."""
    for path in paths:
        node: object = config
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return path, node
    return None


@dataclass(frozen=True)
class SpeechModel:
    """A speech model that is not a decoder with parts (TensorRT Edge-LLM 0.11 exports it by config.json's model_type,
    tensorrt_edgellm/scripts/export.py), in one row: what it is, and where each workstation stage's work for it lives,
    as "module:function" (imported when a stage asks: those modules need torch, and this one is read by the device).
    Qwen3-ASR is not one: it is a decoder with an audio encoder (its family record: families/records.py).

        check_checkpoint  (model_dir, config, source) -> None: the fetched checkpoint checked, or why it is refused
        export_graphs     (model_dir, payload_dir) -> {ExportRecord field: its record}: Edge-LLM's graphs, checked
        make_goldens      (graph, out) -> GoldensSummary: the reference's outputs the device validates against
        measure_accuracy  (graph, out) -> AccuracyFigures: what the deployed numerics cost against the checkpoint's
        transcribe        (model_dir, recipe, [(what, 16 kHz WAV)], language) -> transcripts: a text-to-speech
                          recipe's round trip heard by it (None: it does not transcribe; a decoder with an audio
                          encoder is heard through workstation/speech_gate.py transcribe_recordings)
    """
    name: str
    what: str
    exported: str                       # what Edge-LLM's exporter writes of it
    check_checkpoint: str
    export_graphs: str
    make_goldens: str
    measure_accuracy: str
    transcribe: str | None = None

    def stage(self, step: str):
        """The function doing `step` (a field above) for this kind."""
        import importlib
        where = getattr(self, step)
        assert where is not None, (self.name, step)
        module, function = where.split(":")
        return getattr(importlib.import_module(module), function)


SPEECH_MODELS: dict[str, SpeechModel] = {
    "nemotron3_5_asr": SpeechModel(
        "Nemotron-3.5-ASR", "speech to text: an RNN-T transducer",
        "models/nemotron3_5_asr: audio/ (the encoder) and rnnt_decoder/ (the RNN-T step) ONNX",
        check_checkpoint="pipeline.workstation.transducer_checkpoint:check_transducer_checkpoint",
        export_graphs="pipeline.workstation.transducer_export:export_transducer",
        make_goldens="pipeline.graph.stages.goldens:transducer_goldens",
        measure_accuracy="pipeline.graph.stages.accuracy:transducer_accuracy_stage",
        transcribe="pipeline.workstation.transducer_gate:transcribe_recordings"),
    "qwen3_tts": SpeechModel(
        "Qwen3-TTS", "text to speech: a talker, a code predictor and Code2Wav",
        "models/qwen3_tts: llm/, code_predictor/ and audio/code2wav ONNX",
        check_checkpoint="pipeline.workstation.synthesis_checkpoint:check_synthesis_checkpoint",
        export_graphs="pipeline.workstation.synthesis_export:export_record",
        make_goldens="pipeline.graph.stages.goldens:synthesis_goldens",
        measure_accuracy="pipeline.graph.stages.accuracy:synthesis_accuracy_stage"),
}


def speech_model_of(config: object) -> SpeechModel | None:
    """The row of the speech model a config.json describes; None for any other model."""
    kind = config.get("model_type") if isinstance(config, dict) else None
    return SPEECH_MODELS.get(kind) if isinstance(kind, str) else None


def speech_model(config: dict) -> tuple[str, str] | None:
    """(model_type, why it is not taken as a decoder) for a speech model's config.json; None for any other."""
    row = speech_model_of(config)
    if row is None:
        return None
    return str(config["model_type"]), (
        f"{row.name} is a speech model ({row.what}), not a decoder: `python -m pipeline plan` plans it and `doit "
        "build` builds its kit through their own path; what asked for its decoder takes decoders only")


def prompt_dictionary(processor: dict, num_prompts: int, where: str) -> dict[str, int]:
    """The prompt dictionary (lower-cased language -> slot) as Edge-LLM's ASR server reads it, or an error."""
    values = processor.get("prompt_dictionary")
    if not isinstance(values, dict) or not values:
        raise PipelineError(f"{where}: prompt_dictionary must be a non-empty object (language -> prompt slot)",
                            "use the model's own processor_config.json")
    prompts: dict[str, int] = {}
    for name, slot in values.items():
        key = str(name).strip().lower()
        if not key or isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < num_prompts:
            raise PipelineError(f"{where}: prompt_dictionary entry {str(name)[:40]!r}: {str(slot)[:20]} is not a "
                                f"prompt slot in [0, {num_prompts})", "use the model's own processor_config.json")
        if prompts.get(key, slot) != slot:
            raise PipelineError(f"{where}: prompt_dictionary names {key!r} twice with different slots",
                                "use the model's own processor_config.json")
        prompts[key] = slot
    if "auto" not in prompts:
        raise PipelineError(f"{where}: prompt_dictionary has no 'auto' (automatic language detection)",
                            "use the model's own processor_config.json")
    return prompts

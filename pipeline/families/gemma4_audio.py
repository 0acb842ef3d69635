"""Gemma 4's audio tower as data (E2B / E4B: google/gemma-4-E2B-it, -E4B-it; the 26B-A4B and 31B have none, their
config's audio_config is null): how a recording becomes tokens on the board, and what the tower is made of.

    16 kHz audio, 128-bin log-mel frames every 10 ms (Gemma4AudioFeatureExtractor: 20 ms frames, a 512-point FFT, the
    waveform padded to a multiple of 128 samples and left-padded by half a frame), so a recording of L samples is
    (ceil(L / 128) x 128 + 160 - 321) // 160 + 1 frames. Two stride-2 3x3 convolutions (LayerNorm, ReLU; channels
    subsampling_conv_channels) leave a quarter of the frames; a linear takes channels x the 32 remaining mel bins to
    hidden_size. Then num_hidden_layers conformer blocks: a half-step SiLU feed-forward (4 x hidden), chunked local
    attention (chunks of attention_chunk_size frames, each query seeing attention_context_left - 1 frames back and
    attention_context_right ahead, relative position bias, logits soft-capped at attention_logit_cap), a light
    convolution (GLU, a causal depthwise conv of conv_kernel_size), a second feed-forward, RMSNorm. output_proj
    (hidden -> output_proj_dims, with bias), then the model's embed_audio (RMSNorm without scale, then a linear to the
    language model's hidden size) gives one soft token per four frames.

Edge-LLM 0.11 exports tower and embedder as one graph (models/gemma4/modeling_gemma4_audio.py Gemma4AudioWithEmbedder:
input_features [1, T, 128] FP16 and valid [1, T/4], out last_hidden_state [1, T/4, text hidden]), its attention one
Gemma4AudioAttentionPlugin per layer, and its audio runner (cpp/multimodal/gemma4/gemma4AudioRunner.cpp) pads the
frames to a multiple of four, marks every one of the ceil(T / 4) tokens valid and puts them between <|audio> and
<audio|> in place of the prompt's one audio token. transformers' processor counts a token per four frames of the
unpadded recording instead (processing_gemma4.py: the feature mask subsampled), which can be one fewer: the board's
count is the one planned and deployed here. Standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pipeline.families.audio import SAMPLE_RATE, AudioEncoderDesign, halved

PAD_SAMPLES = 128           # the runner (and transformers' extractor) pad the waveform to a multiple of this
FRAME = 320                 # samples per frame (20 ms); the extractor unfolds FRAME + 1 and left-pads FRAME // 2
HOP = 160
SUBSAMPLING = 4             # two stride-2 convolutions
MIN_FRAMES = 8              # the exported graph's least input (Edge-LLM 0.11: Dim("seq_len", min=8)): audio_build's
# Gemma 4's model card: "Audio supports a maximum length of 30 seconds" (its processor cuts a waveform there:
# Gemma4AudioFeatureExtractor max_length 480000 samples, audio_seq_length 750 tokens)
LONGEST_SECONDS = 30
# the model card's transcription instruction, the recording before it in the user turn: "Transcribe the following
# speech segment in {LANGUAGE} into {LANGUAGE} text.\n\nFollow these specific instructions for formatting the
# answer:\n* Only output the transcription, with no newlines.\n* When transcribing numbers, write the digits, i.e.
# write 1.7 and not one point seven, and write 3 instead of three." (~60 tokens with the turn markers, <|audio>
# and <audio|>); the answer is the transcript, then <turn|>
ASR_PROMPT_TOKENS = 64
ASR_ANSWER_TOKENS = 1
INSTRUCTION = ("Transcribe the following speech segment {}.\n\nFollow these specific instructions for formatting the "
               "answer:\n* Only output the transcription, with no newlines.\n* When transcribing numbers, write the "
               "digits, i.e. write 1.7 and not one point seven, and write 3 instead of three.")
# the tokenizer's audio tokens: the placeholder the chat template places, and what the runner puts around its copies
AUDIO_TOKEN, BOA, EOA = "<|audio|>", "<|audio>", "<audio|>"


def mel_frames(samples: int) -> int:
    """The log-mel frames the board computes of `samples` samples (the waveform padded to a multiple of 128)."""
    padded = -(-samples // PAD_SAMPLES) * PAD_SAMPLES
    return max(0, (padded + FRAME // 2 - (FRAME + 1)) // HOP + 1)


def tokens_of_frames(frames: int) -> int:
    """The soft tokens the board's runner makes of `frames` frames: the frames padded to a multiple of four."""
    return -(-frames // SUBSAMPLING)


@functools.cache
def fewest_samples(frames: int) -> int:
    """The fewest samples whose frames, padded to a multiple of four, are at least `frames` (asked per served
    recording: counted once)."""
    samples = 1
    while SUBSAMPLING * tokens_of_frames(mel_frames(samples)) < frames:
        samples += 1
    return samples


@dataclass(frozen=True)
class ConformerShape:
    """Gemma 4's audio tower as its config gives it (intermediate size: 4 x hidden, as Edge-LLM and transformers
    build it; the config has no key for it)."""
    mel_bins: int
    layers: int
    width: int                  # hidden_size
    heads: int
    conv_channels: tuple[int, int]
    conv_kernel: int            # the light convolution's depthwise kernel
    chunk: int                  # attention_chunk_size
    context_left: int
    context_right: int
    proj: int                   # output_proj_dims
    out: int                    # the language model's hidden size (embed_audio's output)

    @property
    def ffn(self) -> int:
        return 4 * self.width

    @property
    def context(self) -> int:
        """The keys one chunk's queries are scored against (the plugin's context_size)."""
        return self.chunk + self.context_left - 1 + self.context_right

    @property
    def params(self) -> int:
        """Every weight: the two convolutions and their norms, the input projection, the blocks (two feed-forwards,
        q/k/v/post, the relative-position key projection and per-dimension scale, the light convolution, five
        norms), output_proj with its bias and embed_audio's projection (each clipped linear's four bounds left out:
        scalars)."""
        c0, c1, d = *self.conv_channels, self.width
        subsample = 9 * c0 + c0 + 9 * c0 * c1 + c1 + c1 * (self.mel_bins // SUBSAMPLING) * d
        # two feed-forwards with their two norms; q, k, v, post, relative_k_proj and per_dim_scale; linear_start
        # (d -> 2d), the depthwise kernel, linear_end; five norms (around attention, in the light convolution, out)
        block = (2 * (2 * d * self.ffn + 2 * d) + 5 * d * d + d // self.heads
                 + 2 * d * d + d * self.conv_kernel + d * d + 5 * d)
        return subsample + self.layers * block + d * self.proj + self.proj + self.proj * self.out

    def flops_per_token(self) -> float:
        """FLOPs of one soft token: its four frames' share of the convolutions and the input projection, each
        block's linears, its scores against the chunk's context (content and relative position) and the value mix,
        the depthwise convolution, and the two output projections."""
        c0, c1, d = *self.conv_channels, self.width
        convs = (2 * 9 * c0 * halved(self.mel_bins, 1) * 2
                 + 2 * 9 * c0 * c1 * (self.mel_bins // SUBSAMPLING))
        linears = 2 * (2 * d * self.ffn) + 5 * d * d + 2 * d * d + d * d
        attention = 2 * d * (2 * self.context + self.context_left + self.context_right)
        blocks = self.layers * (2 * linears + attention + 2 * d * self.conv_kernel)
        return convs + 2 * c1 * (self.mel_bins // SUBSAMPLING) * d + blocks + 2 * (d * self.proj + self.proj * self.out)

    def flops(self, tokens: int) -> float:
        return tokens * self.flops_per_token()

    def activation_bytes(self, tokens: int, frames: int) -> int:
        """The largest live tensors (FP16) at a recording of `frames` frames: the first convolution's output beside
        the larger of a block's tensors and one layer's scores over every chunk's context (FP32)."""
        first = -(-frames // 2) * halved(self.mel_bins, 1) * self.conv_channels[0] * 2
        block = tokens * (6 * self.width + self.ffn) * 2
        scores = self.heads * tokens * self.context * 4
        return first + max(block, scores)

    def plan_window(self) -> int | None:
        return None         # no chunked front end: a recording's tokens follow from its samples alone


@dataclass(frozen=True)
class Gemma4AudioDesign(AudioEncoderDesign):
    """Gemma 4's audio tower: the same protocol as Qwen3-ASR's encoder (families/audio.py), its own arithmetic."""

    def read_shape(self, need, hidden: int) -> ConformerShape:       # type: ignore[override]
        channels = need.config.get("subsampling_conv_channels", [128, 32])
        listed = {f"subsampling_conv_channels[{i}]": v for i, v in enumerate(channels)} \
            if isinstance(channels, list) and len(channels) == 2 else {}
        return ConformerShape(
            mel_bins=need("num_mel_bins", 128), layers=need("num_hidden_layers"), width=need("hidden_size"),
            heads=need("num_attention_heads"),
            conv_channels=(need("subsampling_conv_channels[0]", where=listed),
                           need("subsampling_conv_channels[1]", where=listed)),
            conv_kernel=need("conv_kernel_size"), chunk=need("attention_chunk_size"),
            context_left=need("attention_context_left"), context_right=need("attention_context_right", 0, low=0),
            proj=need("output_proj_dims"), out=hidden)

    def shape_problems(self, shape: ConformerShape, _hidden: object  # type: ignore[override]
                       ) -> list[tuple[str, object, str]]:
        out: list[tuple[str, object, str]] = []
        if shape.width % shape.heads:
            out.append(("hidden_size", shape.width, f"must divide into num_attention_heads ({shape.heads}) heads"))
        if shape.mel_bins % SUBSAMPLING or shape.conv_channels[0] != shape.mel_bins:
            # transformers sizes the input projection from the first convolution's channels // 4, Edge-LLM from the
            # mel bins // 4: the two agree only where they are equal (they are, 128, in every released checkpoint)
            out.append(("subsampling_conv_channels", list(shape.conv_channels), f"must start with num_mel_bins "
                        f"({shape.mel_bins}), a multiple of 4: transformers and Edge-LLM size the input "
                        "projection from one and the other"))
        if shape.context != 2 * shape.chunk:
            # Edge-LLM's attention takes each chunk's context as its own chunk and the one before it
            out.append(("attention_context_left", shape.context_left, f"with attention_context_right "
                        f"({shape.context_right}) must make a context of two chunks ({2 * shape.chunk} frames: "
                        "attention_chunk_size + context_left - 1 + context_right), the only one Edge-LLM 0.11's "
                        "Gemma4AudioAttentionPlugin takes"))
        return out

    def tokens(self, seconds: float, _shape: Any) -> int:
        return tokens_of_frames(self.frames(seconds))

    def frames(self, seconds: float) -> int:
        return mel_frames(int(seconds * SAMPLE_RATE))

    def tokens_of_frames(self, frames: int, _n_window: int | None = None) -> int:
        return tokens_of_frames(frames)

    def tokens_of_samples(self, samples: int, _n_window: int | None) -> int:
        return tokens_of_frames(mel_frames(samples))

    def engine_frames(self, seconds: float) -> int:
        """The runner pads the frames to a multiple of four before the engine."""
        return SUBSAMPLING * self.tokens(seconds, None)

    def shortest_samples(self) -> int | None:
        """The runner gives the engine no fewer frames than the recording makes: the exported graph's least (8
        frames: models/gemma4 get_onnx_export_args, Dim("seq_len", min=8)) is the profile's, and a shorter recording
        cannot be encoded."""
        return fewest_samples(self.min_time_steps)

    def wrap(self) -> tuple[str, str] | None:
        return (BOA, EOA)

    def transcription_text(self, language: str | None, prompt: str | None) -> str | None:
        """The model card's instruction (the language by name, or "its original language"), then the request's
        prompt where it gives one."""
        said = f"in {language} into {language} text" if language else "in its original language"
        return INSTRUCTION.format(said) + (f"\n\n{prompt}" if prompt else "")

    def transcription_system(self, _language: str | None) -> str | None:
        return None             # the language is named in the instruction


# the languages a transcription request may name: the model card's instruction names one in English and lists no fixed
# set, so Qwen3-ASR's table (families/audio.py) is taken, ISO 639 code to English name
GEMMA4_AUDIO = Gemma4AudioDesign(
    name="gemma4-conformer", config_paths=("audio_config",), text_paths=("text_config",),
    modules=("model.audio_tower.", "model.embed_audio."), placeholder=AUDIO_TOKEN, transcript_marker="",
    optional=True, chunked=False, min_time_steps=MIN_FRAMES, prompt_tokens=ASR_PROMPT_TOKENS,
    answer_tokens=ASR_ANSWER_TOKENS, longest_seconds=LONGEST_SECONDS,
    export_step="pipeline.workstation.gemma4_audio_export:Gemma4AudioExport",
    recording_inputs="pipeline.workstation.gemma4_features:gemma4_frames")

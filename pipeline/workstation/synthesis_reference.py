"""Qwen3-TTS's generation, as the reference the goldens and the export check are computed with: text in, the talker's
and code predictor's codes out, Code2Wav's waveform from them.

The protocol is the official one (qwen-tts 0.1.1, Qwen3TTSForConditionalGeneration.generate, its non-streaming-text
default), written here for greedy decoding:
- the request's text is rendered "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"; the first
  three tokens are the role, the last five close the turn;
- the codec side opens with think, think_bos, the language's codec id, think_eos (nothink, think_bos, think_eos where
  the language is "auto"), then the speaker's codec id, then codec pad and bos; a dialect speaker asked in Chinese or
  auto speaks its dialect's language id;
- the prefill is the role's projected text embeddings, then tts_pad (one per codec token but the last two), tts_bos,
  each added to the codec tokens but the last, then the text's first token added to codec bos;
- each step the talker's last hidden state (after its final norm) picks codebook 0 through codec_head (the codec
  vocabulary's last 1024 ids suppressed but codec EOS, and EOS itself until two frames are out); the code predictor
  takes [that hidden state, codebook 0's embedding], its lm_head[0] picks codebook 1, then each next codebook is read
  by lm_head[k] after the previous one's codec_embedding[k - 1]; the talker's next input is the sum of the 16
  codebooks' embeddings plus the next text token's projected embedding (tts_eos after the last, tts_pad after that);
- codec EOS as codebook 0 ends the utterance; Code2Wav turns [1, 16, frames] codes into 1920 samples a frame.

The modules are TensorRT Edge-LLM 0.11's own: its calibration model (quantization/models/qwen3_tts, built from
transformers' Qwen3 decoder layers, its tensors named as the checkpoint's; with the 1.7B's talker-to-code-predictor
projection where the code predictor is narrower: synthesis_model.py) and its Code2Wav decoder (what its exporter
turns into code2wav/model.onnx), run in float32 here. Every row the code predictor reads (the talker's hidden state,
each codebook's embedding) goes through that projection first (an Identity in the 0.6B). transformers 5.14 has no
Qwen3-TTS; qwen-tts pins transformers 4.57.3, so it is not what the pipeline runs (tests/workstation compare this
loop with it where it is installed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SUPPRESSED_TAIL = 1024      # the codec vocabulary's last ids are control tokens codebook 0 never emits (but EOS)
MIN_FRAMES = 2              # EOS is masked until this many frames are out (qwen-tts: min_new_tokens=2)
TURN_END = 5                # "<|im_end|>\n<|im_start|>assistant\n" closes the rendered text


def render(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Voice:
    """Who speaks, in which language, as codec ids: the speaker's id (None: no speaker token) and the language's
    (None: "auto", the nothink opening)."""
    speaker: int | None
    language: int | None


def voice_of(talker: dict, speaker: str | None, language: str) -> Voice:
    """The codec ids of a speaker and language by name, as the official generate resolves them (lower-cased; a dialect
    speaker asked in Chinese or auto speaks its dialect). Unknown names raise KeyError naming what there is."""
    speakers, languages = talker.get("spk_id") or {}, talker.get("codec_language_id") or {}
    spk = None
    if speaker:
        if speaker.lower() not in speakers:
            raise KeyError(f"speaker {speaker!r} is not one of the model's: {', '.join(sorted(speakers)) or 'none'}")
        spk = int(speakers[speaker.lower()])
    lang = None
    if language.lower() != "auto":
        if language.lower() not in languages:
            raise KeyError(f"language {language!r} is not one of the model's: auto, {', '.join(sorted(languages))}")
        lang = int(languages[language.lower()])
    dialect = (talker.get("spk_is_dialect") or {}).get(speaker.lower()) if speaker else None
    if dialect and language.lower() in ("chinese", "auto"):
        lang = int(languages[dialect])
    return Voice(spk, lang)


@dataclass(frozen=True)
class Sampling:
    """How codebook 0 is chosen: greedy here (the goldens' and the device validation's setting), with the official
    repetition penalty over the codebook-0 ids already emitted (1.0: none)."""
    max_frames: int
    repetition_penalty: float = 1.0


def codebook0_scores(logits: np.ndarray, emitted: list[int], frames: int, vocab: int, eos: int,
                     sampling: Sampling) -> np.ndarray:
    """Codebook 0's logits as the talker's generation processes them before its choice (float32 copy)."""
    x = logits.astype(np.float32).copy()
    if sampling.repetition_penalty != 1.0 and emitted:
        seen = np.unique(np.asarray(emitted))
        x[seen] = np.where(x[seen] < 0, x[seen] * sampling.repetition_penalty, x[seen] / sampling.repetition_penalty)
    keep_eos = x[eos]
    x[vocab - SUPPRESSED_TAIL:] = -np.inf
    x[eos] = keep_eos if frames >= MIN_FRAMES else -np.inf
    return x


class ReferenceSynthesis:
    """The checkpoint at `model_dir` (hub layout) in float32: talker, code predictor and Code2Wav."""

    def __init__(self, model_dir: Path):
        import json

        import torch
        from tensorrt_edgellm.models.qwen3_tts.modeling_qwen3_tts_code2wav import build_qwen3_tts_code2wav
        from transformers import PreTrainedTokenizerFast

        from pipeline.workstation.synthesis_model import load

        self.config = json.loads((model_dir / "config.json").read_text())
        self.talker_config = c = self.config["talker_config"]
        self.model = load(model_dir)
        self.code2wav, decoder = build_qwen3_tts_code2wav(str(model_dir), torch.float32)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
        speech = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())
        self.groups = int(c["num_code_groups"])
        self.eos = int(c["codec_eos_token_id"])
        self.codebook_size = int(decoder.get("codebook_size", 2048))
        self.sample_rate = int(speech.get("output_sample_rate", 24_000))
        self.samples_per_frame = int(self.code2wav.total_upsample)

    # -- the prompt ---------------------------------------------------------------------------------------------
    def text_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(render(text), add_special_tokens=False)["input_ids"]
        if len(ids) < 3 + 1 + TURN_END:
            raise ValueError("the text renders to no token: give it at least one character")
        return ids

    def _projected(self, ids) -> Any:
        import torch
        talker = self.model.talker
        return talker.text_projection(talker.model.text_embedding(torch.tensor([list(ids)], dtype=torch.long)))

    def _codec(self, ids) -> Any:
        import torch
        return self.model.talker.model.codec_embedding(torch.tensor([list(ids)], dtype=torch.long))

    def prompt(self, ids: list[int], voice: Voice) -> tuple[Any, Any, Any]:
        """(the talker's prefill embeddings [1, L, H], the trailing text [1, M, H], tts_pad's embedding [1, 1, H])."""
        import torch
        c, t = self.talker_config, self.config
        bos, eos, pad = self._projected([t["tts_bos_token_id"], t["tts_eos_token_id"], t["tts_pad_token_id"]]) \
            .split(1, dim=1)
        opening = ([c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]] if voice.language is None
                   else [c["codec_think_id"], c["codec_think_bos_id"], voice.language, c["codec_think_eos_id"]])
        codec_ids = opening + ([voice.speaker] if voice.speaker is not None else []) + \
            [c["codec_pad_id"], c["codec_bos_id"]]
        codec = self._codec(codec_ids)
        body = torch.cat([pad.expand(-1, len(codec_ids) - 2, -1), bos], dim=1) + codec[:, :-1]
        first = self._projected(ids[3:4]) + codec[:, -1:]
        prefill = torch.cat([self._projected(ids[:3]), body, first], dim=1)
        trailing = torch.cat([self._projected(ids[4:-TURN_END]), eos], dim=1)
        return prefill, trailing, pad

    # -- the decoders -------------------------------------------------------------------------------------------
    def codes(self, text: str, voice: Voice, sampling: Sampling) -> np.ndarray:
        """[frames, num_code_groups] int64: the utterance's codes, codec EOS excluded."""
        return self.spoken(text, voice, sampling)[0]

    def spoken(self, text: str, voice: Voice, sampling: Sampling, tie: float = 0.0) \
            -> tuple[np.ndarray, list[tuple[int, int, int, float]]]:
        """(the utterance's codes as codes() gives them, its near ties: (frame, codebook, runner-up code, margin) for
        each code within `tie` of the one chosen, in logits, the talker's after its processing; codec EOS is a code
        of codebook 0 here, chosen or runner-up)."""
        import torch
        from tensorrt_edgellm.quantization.models.qwen3_tts.modeling_qwen3_tts import _CodePredictorInner
        from transformers.cache_utils import DynamicCache

        c = self.talker_config
        talker, cp = self.model.talker, self.model.talker.code_predictor
        groups, vocab, eos = int(c["num_code_groups"]), int(c["vocab_size"]), self.eos
        prefill, trailing, pad = self.prompt(self.text_ids(text), voice)
        # a Qwen3 stack over embeddings with its KV cache, final norm applied; the talker's inner module has the
        # same fields (plain RoPE serves it: its interleaved multimodal RoPE with three equal position rows, as a
        # text-only prompt has them, is plain RoPE)
        def stack(inner, embeds, cache, start: int):
            return _CodePredictorInner.forward(inner, embeds, cache, torch.arange(start, start + embeds.shape[1]))

        frames: list[list[int]] = []
        ties: list[tuple[int, int, int, float]] = []

        def choose(scores: np.ndarray, group: int) -> int:
            best = int(np.argmax(scores))
            if tie > 0:
                near = np.nonzero(scores[best] - scores <= tie)[0]
                ties.extend((len(frames), group, int(c), round(float(scores[best] - scores[c]), 6))
                            for c in near if c != best)
            return best

        with torch.no_grad():
            cache = DynamicCache()
            hidden = stack(talker.model, prefill, cache, 0)
            at = prefill.shape[1]
            while len(frames) < sampling.max_frames:
                last = hidden[:, -1:]
                scores = codebook0_scores(talker.codec_head(last)[0, -1].numpy(), [f[0] for f in frames],
                                          len(frames), vocab, eos, sampling)
                code0 = choose(scores, 0)
                if code0 == eos:
                    break
                frame = [code0]
                embeds = [talker.model.codec_embedding(torch.tensor([[code0]]))]
                cp_cache = DynamicCache()
                h = stack(cp.model, cp.small_to_mtp_projection(torch.cat([last, embeds[0]], dim=1)), cp_cache, 0)
                for k in range(groups - 1):
                    code = choose(cp.lm_head[k](h[:, -1])[0].numpy(), k + 1)
                    frame.append(code)
                    embeds.append(cp.model.codec_embedding[k](torch.tensor([[code]])))
                    if k < groups - 2:
                        h = stack(cp.model, cp.small_to_mtp_projection(embeds[-1]), cp_cache, 2 + k)
                frames.append(frame)
                step = len(frames) - 1
                text = trailing[:, step:step + 1] if step < trailing.shape[1] else pad
                hidden = stack(talker.model, torch.cat(embeds, dim=1).sum(1, keepdim=True) + text, cache, at)
                at += 1
        # ties at the frame after the last are EOS's: the reference ended where the runner-up would have spoken on
        return np.asarray(frames, dtype=np.int64).reshape(-1, groups), ties

    def frame_logits(self, text: str, voice: Voice, codes: np.ndarray):
        """The talker's codebook-0 logits [frames, vocab] (float32 tensor) for each of `codes`' frames, teacher-forced:
        the prompt, then each earlier frame's 16 codebook embeddings plus its text row, in one pass."""
        import torch
        talker, cp = self.model.talker, self.model.talker.code_predictor
        prefill, trailing, pad = self.prompt(self.text_ids(text), voice)
        rows = []
        with torch.no_grad():
            for step, frame in enumerate(codes[:-1]):
                e = talker.model.codec_embedding(torch.tensor([int(frame[0])]))[0]
                e = e + sum(cp.model.codec_embedding[k](torch.tensor([int(c)]))[0] for k, c in enumerate(frame[1:]))
                rows.append(e + (trailing[0, step] if step < trailing.shape[1] else pad[0, 0]))
            seq = torch.cat([prefill] + ([torch.stack(rows)[None]] if rows else []), dim=1)
            hidden = self.model.talker.model(seq, None)[-1]
            return talker.codec_head(hidden[0, prefill.shape[1] - 1:]).float()

    def waveform(self, codes: np.ndarray) -> np.ndarray:
        """Code2Wav's float32 samples in [-1, 1] at 24 kHz for [frames, groups] codes, computed on one thread: its
        convolutions sum in an order that depends on the thread count (two threads and one differed by one step of
        16 bits in 43 of 23040 samples), and the goldens, the accuracy stage and the served reference must give the
        same samples on any machine."""
        import torch
        if not len(codes):
            return np.zeros(0, np.float32)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                wav = self.code2wav(torch.from_numpy(np.ascontiguousarray(codes.T[None])))
        finally:
            torch.set_num_threads(threads)
        return wav[0, 0].numpy().astype(np.float32)

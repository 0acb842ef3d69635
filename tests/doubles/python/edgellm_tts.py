"""TEST DOUBLE of TensorRT Edge-LLM's Qwen3-TTS runtime (examples/omni/qwen3_tts_inference; TensorRT cannot exist in
CI), run on the engines the llm_build and audio_build doubles write (the exporter's ONNX graphs): the talker and the
code predictor through edgellm_engine.Engine (paged KV cache, its AttentionPlugin), Code2Wav through ONNX's reference
evaluator.

What it computes is Edge-LLM's published TTS contract (its TTS guide: "the Talker prefill switches to the
language-conditioned layout used by the PyTorch reference"), from the engine directories' files alone:
- the text rendered "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n" by the talker's tokenizer;
  text rows are text_embedding.safetensors rows through text_projection.safetensors (linear_fc1, SiLU, linear_fc2);
  codec rows are the talker's embedding.safetensors rows;
- the codec opening: think, think_bos, the language's id, think_eos (nothink, think_bos, think_eos for auto; an
  unknown language falls back to auto, as the guide says), the speaker's id (the config's default_speaker_id where a
  request names none; an unknown speaker fails the run), codec pad, bos; tts_pad rows under all but the last two,
  tts_bos, then the first text token over codec bos; a dialect speaker asked in auto or Chinese speaks its dialect;
- codebook 0 from the talker's logits with the codec vocabulary's last 1024 ids suppressed but EOS, EOS masked for
  the first two frames, the repetition penalty over the codebook-0 ids emitted; chosen greedily at top_k 1, else
  sampled (temperature, top-k, top-p; numpy's generator seeded with 0 per request);
- the code predictor fed [the talker's last post-norm hidden state, codebook 0's codec row], its head picked by
  lm_head_idx, each next codebook read after the previous one's codec_embeddings.safetensors row; every row it is fed
  first goes through small_to_mtp_projection.safetensors where its engine directory has one (the 1.7B's: a Linear
  from the talker's width to the code predictor's, FP16 weights, applied by the runtime before the graph; without it
  the rows go in as they are, and rows of another width than the graph's fail the run); the talker's next row is the
  sum of the frame's 16 codec rows plus the next text row (tts_eos after the text, tts_pad after that);
- Code2Wav on the whole utterance, or per --chunkFrames chunk with --streaming (each chunk alone, as the guide says);
  16-bit PCM WAVs at 24 kHz, the codes as int32 [frames, 16] in rvq_req{N}.safetensors.

The serving binding (tensorrt_edgellm.runtime's TTSRuntime, in the runtime double) runs the same frames, streamed
codec_chunk_frames at a time, each chunk vocoded alone.

TTS_DOUBLE_WRONG_FRAME=N makes codebook 0 of the N-th frame of every utterance another code (a miscompiled engine).
"""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

import numpy as np
import onnx
from edgellm_engine import PAGE, load_engine
from onnx.reference import ReferenceEvaluator
from safetensors.numpy import load_file, save_file

from pipeline.audio import wav_bytes
from pipeline.workstation.onnx_reference import exact_elementwise_ops, float32_accumulating_ops

SUPPRESSED_TAIL, MIN_FRAMES = 1024, 2


def _silu(x):
    return x / (1.0 + np.exp(-x))


class TTSRuntime:
    def __init__(self, talker_dir: Path, code_predictor_dir: Path, code2wav_dir: Path, tokenizer_dir: Path):
        from tokenizers import Tokenizer
        self.talker = load_engine(talker_dir, "llm.engine", "config.json")
        self.cp = load_engine(code_predictor_dir, "llm.engine", "config.json")
        self.cfg = c = self.talker.cfg
        self.groups, self.vocab = int(c["num_code_groups"]), int(c["vocab_size"])
        self.eos = int(c["codec_eos_token_id"])
        self.text_table = load_file(str(talker_dir / "text_embedding.safetensors"))["text_embedding"]
        self.projection = {k: v.astype(np.float32) for k, v in
                           load_file(str(talker_dir / "text_projection.safetensors")).items()}
        rows = load_file(str(code_predictor_dir / "codec_embeddings.safetensors"))
        self.cp_rows = [rows[f"embedding_{i}"] for i in range(self.groups - 1)]
        heads = load_file(str(code_predictor_dir / "lm_heads.safetensors"))
        self.heads = np.stack([heads[f"lm_head_{i}.weight"] for i in range(self.groups - 1)]).astype(np.float16)
        projection = code_predictor_dir / "small_to_mtp_projection.safetensors"
        self.projection_cp = {k: v.astype(np.float16).astype(np.float32) for k, v in
                              load_file(str(projection)).items()} if projection.is_file() else None
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.code2wav = ReferenceEvaluator(onnx.load(str(code2wav_dir / "code2wav.engine")),
                                           new_ops=[*float32_accumulating_ops(), *exact_elementwise_ops()])
        self.wrong_frame = int(os.environ.get("TTS_DOUBLE_WRONG_FRAME", "0"))

    # -- the prompt ---------------------------------------------------------------------------------------------
    def _text(self, ids) -> np.ndarray:
        x = self.text_table[np.asarray(ids, np.int64)].astype(np.float32)
        p = self.projection
        h = _silu(x @ p["linear_fc1.weight"].T + p["linear_fc1.bias"])
        return (h @ p["linear_fc2.weight"].T + p["linear_fc2.bias"]).astype(np.float32)

    def _into_predictor(self, rows: np.ndarray) -> np.ndarray:
        """Rows of the talker's width as the code predictor's graph takes them (its projection, where it has one)."""
        p = self.projection_cp
        if p is not None:
            rows = rows @ p["weight"].T + p.get("bias", 0.0)
        width = int(self.cp.cfg["hidden_size"])
        if rows.shape[-1] != width:
            raise SystemExit(f"qwen3_tts_inference: the code predictor takes rows of {width}, the talker's are "
                             f"{rows.shape[-1]} wide and its engine directory has no "
                             "small_to_mtp_projection.safetensors")
        return rows.astype(np.float32)

    def _codec(self, ids) -> np.ndarray:
        return self.talker.embedding[np.asarray(ids, np.int64)].astype(np.float32)

    def voice(self, speaker: str | None, language: str | None) -> tuple[int, int | None]:
        c = self.cfg
        speakers, languages = c.get("speaker_id") or {}, c.get("codec_language_id") or {}
        if speaker is None:
            spk = int(c["default_speaker_id"])
        elif speaker.lower() in speakers:
            spk = int(speakers[speaker.lower()])
        else:
            raise SystemExit(f"qwen3_tts_inference: unknown speaker {speaker!r}")
        name = (language or "auto").lower()
        lang = int(languages[name]) if name in languages else None      # unknown: a warning and auto
        by_id = {int(v): k for k, v in speakers.items()}
        dialect = (c.get("spk_is_dialect") or {}).get(by_id.get(spk, ""))
        if dialect and name in ("auto", "chinese") and dialect in languages:
            lang = int(languages[dialect])
        return spk, lang

    def prompt(self, text: str, spk: int, lang: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.cfg
        ids = self.tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                    add_special_tokens=False).ids
        bos, eos, pad = self._text([c["tts_bos_token_id"], c["tts_eos_token_id"], c["tts_pad_token_id"]])
        opening = ([c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]] if lang is None
                   else [c["codec_think_id"], c["codec_think_bos_id"], lang, c["codec_think_eos_id"]])
        codec = self._codec(opening + [spk, c["codec_pad_id"], c["codec_bos_id"]])
        body = np.concatenate([np.repeat(pad[None], len(codec) - 2, 0), bos[None]]) + codec[:-1]
        prefill = np.concatenate([self._text(ids[:3]), body, self._text(ids[3:4]) + codec[-1:]])
        trailing = np.concatenate([self._text(ids[4:-5]).reshape(-1, len(pad)), eos[None]])
        return prefill, trailing, pad

    # -- choosing -----------------------------------------------------------------------------------------------
    @staticmethod
    def _choose(scores: np.ndarray, temperature: float, top_k: int, top_p: float, rng) -> int:
        if top_k == 1 or temperature <= 0:
            return int(np.argmax(scores))
        x = scores.astype(np.float64) / temperature
        order = np.argsort(-x, kind="stable")[:top_k if top_k > 0 else None]
        p = np.exp(x[order] - x[order[0]])
        p /= p.sum()
        keep = np.searchsorted(np.cumsum(p), top_p) + 1
        p = p[:keep] / p[:keep].sum()
        return int(order[rng.choice(len(p), p=p)])

    def _codebook0(self, logits, emitted, frames, s) -> np.ndarray:
        x = logits[:self.vocab].astype(np.float32).copy()
        penalty = s.get("repetition_penalty", 1.05)
        if penalty != 1.0 and emitted:
            seen = np.unique(emitted)
            x[seen] = np.where(x[seen] < 0, x[seen] * penalty, x[seen] / penalty)
        keep = x[self.eos]
        x[self.vocab - SUPPRESSED_TAIL:] = -np.inf
        x[self.eos] = keep if frames >= MIN_FRAMES else -np.inf
        return x

    # -- one utterance ------------------------------------------------------------------------------------------
    def codes(self, text: str, speaker: str | None, language: str | None, s: dict) -> np.ndarray:
        return np.asarray(list(self.frames(text, speaker, language, s)), np.int64).reshape(-1, self.groups)

    def frames(self, text: str, speaker: str | None, language: str | None, s: dict, greedy_predictor: bool = False):
        """The utterance's frames, one at a time. greedy_predictor: the code predictor picks its argmax whatever the
        talker's sampling (the serving binding's TTSRuntime: OmniAudioParams has no code-predictor sampling, and its
        code predictor verifies speculative drafts, which needs its argmax)."""
        rng = np.random.default_rng(0)
        spk, lang = self.voice(speaker, language)
        prefill, trailing, pad = self.prompt(text, spk, lang)
        limit = int(s.get("max_audio_length", 4096))
        pages = -(-(len(prefill) + limit + 1) // PAGE)
        pools = self.talker.new_pools(pages)
        table = np.stack([np.arange(pages), np.arange(pages)])[None].astype(np.int32)
        logits = self.talker.step([], 0, pools, table, embeds=prefill)
        at, emitted = len(prefill), []
        while len(emitted) < limit:
            hidden = self.talker.hidden[-1].astype(np.float32)
            code0 = self._choose(self._codebook0(logits, emitted, len(emitted), s),
                                 s.get("talker_temperature", 0.9), s.get("talker_top_k", 50),
                                 s.get("talker_top_p", 1.0), rng)
            if self.wrong_frame and len(emitted) + 1 == self.wrong_frame and code0 != self.eos:
                code0 = (code0 + 1) % 2048
            if code0 == self.eos:
                return
            frame, rows = [code0], [self._codec([code0])[0]]
            cp_pools = self.cp.new_pools(1)
            cp_table = np.zeros((1, 2, 1), np.int32)
            feed = self._into_predictor(np.stack([hidden, rows[0]]))
            for k in range(self.groups - 1):
                cp_logits = self.cp.step([], 0 if k == 0 else k + 1, cp_pools, cp_table, embeds=feed,
                                         extra={"lm_heads": self.heads, "lm_head_idx": np.array([k], np.int64)})
                code = int(np.argmax(cp_logits)) if greedy_predictor else \
                    self._choose(cp_logits.astype(np.float32), s.get("subtalker_temperature", 1.0),
                                 s.get("subtalker_top_k", 50), s.get("subtalker_top_p", 0.8), rng)
                frame.append(code)
                rows.append(self.cp_rows[k][code].astype(np.float32))
                feed = self._into_predictor(rows[-1][None])
            emitted.append(code0)
            yield frame
            step = len(emitted) - 1
            text_row = trailing[step] if step < len(trailing) else pad
            logits = self.talker.step([], at, pools, table, embeds=(np.sum(rows, 0) + text_row)[None])
            at += 1

    def waveform(self, codes: np.ndarray, chunk: int | None) -> np.ndarray:
        if not len(codes):
            return np.zeros(0, np.float32)
        spans = [(i, i + chunk) for i in range(0, len(codes), chunk)] if chunk else [(0, len(codes))]
        parts = [self.code2wav.run(None, {"codes": np.ascontiguousarray(codes[a:b].T[None]).astype(np.int64)})[0]
                 for a, b in spans]
        return np.concatenate([np.asarray(p, np.float32).reshape(-1) for p in parts])


def run(talker_dir: Path, code2wav_dir: Path, tokenizer_dir: Path, input_file: Path, output_file: Path | None,
        audio_dir: Path, chunk: int | None) -> None:
    spec = json.loads(input_file.read_text())
    runtime = TTSRuntime(talker_dir, talker_dir.parent / "code_predictor", code2wav_dir, tokenizer_dir)
    audio_dir.mkdir(parents=True, exist_ok=True)
    responses = []
    for i, request in enumerate(spec["requests"]):
        text = "".join(m["content"] for m in request["messages"] if m.get("role") == "assistant")
        codes = runtime.codes(text, request.get("speaker", spec.get("speaker")),
                              request.get("language", spec.get("language")), spec)
        wav = runtime.waveform(codes, chunk)
        pcm = array("h", (np.clip(np.round(wav * 32767.0), -32768, 32767)).astype(np.int16).tolist())
        wav_path, rvq_path = audio_dir / f"audio_req{i}.wav", audio_dir / f"rvq_req{i}.safetensors"
        wav_path.write_bytes(wav_bytes(pcm, 24000))
        save_file({"rvq_codes": codes.astype(np.int32)}, str(rvq_path))
        responses.append({"request_idx": i, "messages": request["messages"], "audio_file": str(wav_path),
                          "audio_samples": len(pcm), "audio_sample_rate": 24000,
                          "audio_duration_ms": round(1000 * len(pcm) / 24000), "rvq_file": str(rvq_path)})
    if output_file is not None:
        output_file.write_text(json.dumps({"responses": responses}, indent=1))

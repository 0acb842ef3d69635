"""`serve RECIPE` of a text-to-speech recipe on the workstation: the reference synthesis the goldens were spoken by
(synthesis_reference.py, float32), greedy, one utterance at a time on a thread of its own.

It answers what Edge-LLM's TTS runtime answers, in the same pieces: the codes of the whole utterance, then Code2Wav
on each run of codec_chunk_frames frames alone (the runtime vocodes each chunk as it streams it), as 16-bit PCM. It
decodes greedily only (the reference exists to be exact): a request that asks for sampling is refused by the server
(`greedy_only`); its defaults are the goldens' (GREEDY), so a request in the goldens' voice answers the goldens'
waveform where its chunk covers the utterance.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from pipeline.runtime.session import Handle, Limits
from pipeline.runtime.speech import Audio, AudioEmit, SpeechParams, SpeechSession

STOP = None


class ReferenceSpeechSession(SpeechSession):
    backend = "reference"
    applies = frozenset({"repetition_penalty"})
    greedy_only = True

    def __init__(self, model_dir: Path, limits: Limits, threads: int | None = None):
        super().__init__()
        import torch

        from pipeline.workstation.synthesis_gate import GOLDEN_LANGUAGE, golden_speaker
        from pipeline.workstation.synthesis_reference import ReferenceSynthesis
        if threads:
            torch.set_num_threads(threads)
        self.reference = ReferenceSynthesis(model_dir)
        self.limits, self.language = limits, GOLDEN_LANGUAGE
        self.default_voice = golden_speaker(self.reference.talker_config, model_dir)
        self.voices = tuple(sorted(self.reference.talker_config.get("spk_id") or {}))
        self.sample_rate, self.samples_per_frame = self.reference.sample_rate, self.reference.samples_per_frame
        self._work: queue.Queue[tuple[Handle, str, SpeechParams, AudioEmit] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="reference-tts", daemon=True)
        self._thread.start()

    def speak(self, text: str, params: SpeechParams, emit: AudioEmit) -> Handle:
        handle = self._speech_handle()
        self._work.put((handle, text, params, emit))
        return handle

    def _loop(self) -> None:
        while (item := self._work.get()) is not STOP:
            handle, text, params, emit = item
            if handle.cancelled.is_set():
                continue
            try:
                self._one(handle, text, params, emit)
            except Exception as exc:        # noqa: BLE001 - the utterance fails; the session serves on
                emit(Audio(b"", True, f"{type(exc).__name__}: {str(exc)[:300]}"))

    def _one(self, handle: Handle, text: str, params: SpeechParams, emit: AudioEmit) -> None:
        import numpy as np

        from pipeline.audio import pcm_s16le
        from pipeline.workstation.synthesis_gate import pcm16
        from pipeline.workstation.synthesis_reference import Sampling, voice_of
        voice = voice_of(self.reference.talker_config, params.voice or self.default_voice, self.language)
        codes = self.reference.codes(text, voice, Sampling(params.max_audio_length, params.repetition_penalty))
        step = params.codec_chunk_frames
        for start in range(0, len(codes), step):
            if handle.cancelled.is_set():
                return
            wav = self.reference.waveform(codes[start:start + step])
            if not np.isfinite(wav).all():
                emit(Audio(b"", True, "the reference waveform holds a value that is not finite"))
                return
            emit(Audio(pcm_s16le(pcm16(wav)), final=start + step >= len(codes)))
        if not len(codes):
            emit(Audio(b"", True))

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()

    def close(self) -> None:
        self._work.put(STOP)
        self._thread.join(timeout=30)


"""What the server asks of a loaded text-to-speech model: a `SpeechSession` speaks one text at a time and reports its
16-bit PCM as the runtime vocodes it, through a callback from the session's own thread.

    reference   the reference synthesis on the workstation, greedy: the goldens' (workstation/synthesis_serve.py)
    edgellm     tensorrt_edgellm.runtime TTSRuntime on the bundle's three engines (EdgellmSpeechSession below)

Edge-LLM 0.11's binding, as its experimental server drives it (runtime/engine.py TTS, _stream_tts, _pump_channels;
the pybind names checked against the 0.11 wheel's _edgellm_runtime):

    rt = tensorrt_edgellm.runtime.load()
    runtime = rt.TTSRuntime(talker_engine_dir=, code_predictor_engine_dir=, code2wav_engine_dir=, tokenizer_dir=)
    runtime.get_speaker_names()                     # the voices `speaker_name` takes ("": the model's default)
    params = rt.OmniAudioParams(); params.speaker_name, .talker_temperature, .talker_top_k, .talker_top_p,
        .repetition_penalty, .max_audio_length (codec frames), .codec_chunk_frames, .talker_prefill_threshold
    channel = rt.AudioStreamChannel()
    runtime.handle_request_tts(text, params, channel)    # blocks until the utterance is spoken: a worker thread
    channel.wait_pop(timeout_ms=) / try_pop() -> AudioChunk(.pcm16 bytes, int16 LE mono at 24 kHz; .is_final),
        is_finished(), is_cancelled(), cancel()

Its server admits one TTS request at a time (a semaphore of 1: the standalone TTS runtime is not batched), which the
plan's max_batch_size 1 says here too. It takes no language (the goldens speak "auto" for that reason) and no
sampling of the code predictor.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.backends import edgellm as edgellm_backend
from pipeline.runtime.session import Emit, Generation, Handle, Limits, Sampling, Session

SAMPLE_RATE = 24_000        # Code2Wav's output rate (Qwen3-TTS 12 Hz: 1920 samples a codec frame)
POLL_MS = 100               # the experimental server's wait on the audio channel once no text flows


@dataclass(frozen=True)
class SpeechParams:
    """One utterance's voice and talker settings, in OmniAudioParams' names (what Edge-LLM's /v1/audio/speech takes
    at the top level of its body). The defaults are its AudioParams'."""
    voice: str = ""                     # a preset speaker's name; "": the model's default
    talker_temperature: float = 0.9
    talker_top_k: int = 50
    talker_top_p: float = 1.0
    repetition_penalty: float = 1.05
    max_audio_length: int = 4096        # codec frames the utterance may run to
    codec_chunk_frames: int = 10        # frames vocoded (and streamed) at a time
    talker_prefill_threshold: int = 4

    @property
    def greedy(self) -> bool:
        return self.talker_top_k == 1 or self.talker_temperature == 0.0

    def knobs(self) -> dict[str, float | int]:
        return {k: v for k, v in asdict(self).items() if k != "voice"}


# the knobs a request may set, with their type and least value (Edge-LLM's server's _TALKER_KNOBS)
KNOBS: dict[str, tuple[type, float]] = {f.name: (int if f.type in ("int", int) else float,
                                                 1 if f.name in ("max_audio_length", "codec_chunk_frames",
                                                                 "talker_prefill_threshold") else 0)
                                        for f in fields(SpeechParams) if f.name != "voice"}
# what the goldens and the device validation decode with: one answer per text
GREEDY = SpeechParams(talker_temperature=1.0, talker_top_k=1, repetition_penalty=1.0)
_UTTERANCE = Generation((), "", 0, Sampling(), ())     # what an utterance's Handle carries in its token fields


@dataclass
class Audio:
    """A piece of one utterance's waveform: 16-bit little-endian mono PCM; `final` on the last (its pcm may be
    empty), or an error (the utterance failed)."""
    pcm: bytes
    final: bool = False
    error: str | None = None


AudioEmit = Callable[[Audio], None]


class SpeechSession(Session):
    """A loaded text-to-speech model. It takes no token generations (`submit` refuses: the server sends a speech
    model's requests to `speak` only)."""
    sample_rate: int = SAMPLE_RATE
    samples_per_frame: int = 1920
    voices: tuple[str, ...] = ()

    @abstractmethod
    def speak(self, text: str, params: SpeechParams, emit: AudioEmit) -> Handle:
        """Queue one utterance; returns at once. `emit` is called from the session's thread, never after a final
        piece."""

    def submit(self, gen: Generation, emit: Emit) -> Handle:     # noqa: ARG002 - Session's signature
        raise RuntimeError("a text-to-speech model speaks texts (POST /v1/audio/speech); it generates no tokens")

    def _speech_handle(self) -> Handle:
        """A handle for an utterance (a failed engine takes none); its token fields are unused."""
        return self._handle(_UTTERANCE, lambda _event: None)

    def max_pcm_bytes(self, params: SpeechParams) -> int:
        """The most PCM an utterance may come to: its frame budget's samples (a runtime that sends more is wrong)."""
        return params.max_audio_length * self.samples_per_frame * 2


class EdgellmSpeechSession(SpeechSession):
    """Edge-LLM 0.11's TTSRuntime on a bundle's engines (engine/talker, engine/code_predictor, engine/code2wav, as
    the three builds write them; the tokenizer files beside the talker's engine)."""
    backend = edgellm_backend.BACKEND.name
    applies = frozenset({"repetition_penalty"})

    def __init__(self, engine_dir: Path, limits: Limits, runtime_module: Any = None):
        super().__init__()
        from pipeline.runtime.synthesis import CODE2WAV, CODE_PREDICTOR, TALKER
        if runtime_module is None:
            from tensorrt_edgellm import runtime as facade
            runtime_module = facade.load()
        self.rt, self.limits = runtime_module, limits
        talker = str(engine_dir / TALKER)
        self.runtime = self.rt.TTSRuntime(talker_engine_dir=talker,
                                          code_predictor_engine_dir=str(engine_dir / CODE_PREDICTOR),
                                          code2wav_engine_dir=str(engine_dir / CODE2WAV), tokenizer_dir=talker)
        self.voices = tuple(sorted(str(v) for v in self.runtime.get_speaker_names()))
        self._channels: dict[int, Any] = {}
        self._closed = False

    @classmethod
    def open(cls, engine_dir: Path, plan: contract.Plan, limits: Limits) -> EdgellmSpeechSession:  # noqa: ARG003
        return cls(engine_dir, limits)

    def speak(self, text: str, params: SpeechParams, emit: AudioEmit) -> Handle:
        native = self.rt.OmniAudioParams()
        native.speaker_name = params.voice
        for name, value in params.knobs().items():
            setattr(native, name, value)
        channel = self.rt.AudioStreamChannel()
        handle = self._speech_handle()
        self._channels[handle.id] = channel
        failed: list[str] = []

        def run() -> None:          # the blocking native call; a failure cancels the channel, as its server does
            try:
                self.runtime.handle_request_tts(text, native, channel)
            except Exception as exc:        # noqa: BLE001 - the utterance fails, the session serves on
                failed.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                channel.cancel()
        worker = threading.Thread(target=run, name=f"edgellm-tts-{handle.id}", daemon=True)
        worker.start()
        threading.Thread(target=self._pump, args=(handle, channel, worker, failed, emit, self.max_pcm_bytes(params)),
                         name=f"edgellm-tts-read-{handle.id}", daemon=True).start()
        return handle

    def _pump(self, handle: Handle, channel: Any, worker: threading.Thread, failed: list[str], emit: AudioEmit,
              most: int) -> None:
        """The channel read as its server reads it: a wait, then one more try_pop once the channel says it is done
        (the producer may finish between an empty pop and the check)."""
        sent = 0
        try:
            while not handle.cancelled.is_set() and not self._closed:
                chunk = channel.wait_pop(timeout_ms=POLL_MS)
                # the native call returned (a runtime that left its channel open must not hang the request)
                if chunk is None and (channel.is_finished() or channel.is_cancelled() or not worker.is_alive()):
                    chunk = channel.try_pop()
                    if chunk is None:
                        break
                if chunk is None:
                    continue
                pcm = bytes(chunk.pcm16 or b"")
                sent += len(pcm)
                if len(pcm) % 2 or sent > most:
                    channel.cancel()
                    emit(Audio(b"", True, "the Edge-LLM runtime sent " + ("an odd number of PCM bytes" if len(pcm) % 2
                                                                          else f"more than {most} bytes of PCM")))
                    return
                if chunk.is_final:
                    emit(Audio(pcm, True))
                    return
                if pcm:
                    emit(Audio(pcm))
            worker.join(timeout=30)
            if not handle.cancelled.is_set():
                emit(Audio(b"", True, failed[0] if failed else "the Edge-LLM runtime ended the utterance without "
                           "its final chunk"))
        finally:
            self._channels.pop(handle.id, None)

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()
        channel = self._channels.pop(handle.id, None)
        if channel is not None:
            channel.cancel()

    def close(self) -> None:
        self._closed = True
        for channel in list(self._channels.values()):
            channel.cancel()
        self._channels.clear()

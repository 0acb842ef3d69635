"""Speech to text through an RNN-T (Nemotron-3.5-ASR) on TensorRT Edge-LLM 0.11's runtime, driven as its own
transcription server drives it (experimental/nemotron3_5_asr/server.py; the pybind names of its native runtime):

    rt = tensorrt_edgellm.runtime.load()                  # the native module; its experimental models built in
    runtime = rt.NemotronAsrRuntime(engine_dir=RUN, tokenizer_dir=RUN)
    runtime.max_mel_frames                                # the encoder engine's profile: max_mel_frames x 10 ms
    runtime.transcribe(audio_bytes, prompt_id).text       # a WAV/MP3/FLAC file's bytes, greedy; blocking
        RuntimeError "Audio too long: ...", "Audio too short: ...", "Audio decode failed ...", "Mel extraction failed"

RUN is the flat bundle its guide assembles (device/transducer.py assemble_run_dir): audio_encoder.engine,
rnnt_step.engine, the exporter's config.json, tokenizer.json and processor_config.json, whose prompt_dictionary maps
a language (`en`, `en-US`, ... lower-cased) to the prompt slot the encoder is conditioned on (`auto`: the model names
the language itself). The answer carries the language as an `<xx-XX>` tag (pipeline/transcripts.py
tagged_transcript). The runtime is batch 1: one transcription at a time. Standard library only (the board's Python).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.backends import edgellm as edgellm_backend
from pipeline.errors import PipelineError
from pipeline.files import read_regular
from pipeline.runtime.session import Emit, Generation, Handle, Limits, Sampling, Session

_RECORDING = Generation((), "", 0, Sampling(), ())     # what a transcription's Handle carries in its token fields

MAX_CONFIG = 4 * 2**20
EXPERIMENTAL = ("the board's Edge-LLM runtime has no NemotronAsrRuntime: Nemotron-3.5-ASR is one of its experimental "
                "models, built only with -DBUILD_EXPERIMENTAL_MODELS=ON")


REBUILD = "use the model's own files, or rebuild the bundle from its kit"


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(read_regular(path, MAX_CONFIG))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PipelineError(f"{path}: not valid JSON ({str(exc)[:80]})", REBUILD) from None
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: not a JSON object", REBUILD)
    return data


def prompts_of(directory: Path) -> dict[str, int]:
    """The prompt dictionary of a directory holding the model's config.json and processor_config.json (a checkpoint,
    its export's audio/, a bundle's run directory), read bounded and checked as Edge-LLM's server checks it: its
    slots inside config.json's num_prompts."""
    from pipeline.families.audio import prompt_dictionary
    slots = _json_object(directory / "config.json").get("num_prompts", 128)
    if not isinstance(slots, int) or isinstance(slots, bool) or slots <= 0:
        raise PipelineError(f"{directory / 'config.json'}: num_prompts {str(slots)[:20]} is not a positive integer",
                            REBUILD)
    where = directory / "processor_config.json"
    return prompt_dictionary(_json_object(where), slots, str(where))


class EdgellmTranscriber:
    """Edge-LLM 0.11's NemotronAsrRuntime on a bundle's run directory."""

    def __init__(self, run_dir: Path, runtime_module: Any = None):
        if runtime_module is None:
            from tensorrt_edgellm import runtime as facade
            runtime_module = facade.load()
        native = getattr(runtime_module, "NemotronAsrRuntime", None)
        if native is None:
            raise PipelineError(EXPERIMENTAL, "build TensorRT Edge-LLM 0.11 on the board with "
                                "-DBUILD_EXPERIMENTAL_MODELS=ON and put its pybind directory on PYTHONPATH")
        self.prompts = prompts_of(run_dir)
        self.runtime = native(engine_dir=str(run_dir), tokenizer_dir=str(run_dir))
        self.max_seconds = float(self.runtime.max_mel_frames) * 0.01

    def slot(self, language: str | None) -> int | None:
        """The prompt slot a request's language asks for (None or "": auto); None where the model has none."""
        return self.prompts.get((language or "auto").strip().lower())

    def transcribe(self, audio: bytes, slot: int) -> str:
        """The runtime's answer (the transcript with its language tag) to one recording file's bytes; blocking."""
        return str(self.runtime.transcribe(audio, slot).text)

    def close(self) -> None:
        self.runtime = None


class TranscriberSession(Session):
    """A loaded RNN-T transcriber serving requests: one transcription at a time (its runtime is batch 1), each on the
    session's own thread, its answer (the runtime's text, or the error it raised) reported through the request's
    callback. A request cancelled while it runs is finished by the runtime (it cannot stop one) and its answer
    dropped. It takes no token generations (`submit` refuses)."""
    backend = edgellm_backend.BACKEND.name

    def __init__(self, transcriber: Any, limits: Limits):
        super().__init__()
        self.transcriber, self.limits = transcriber, limits
        self.prompts: dict[str, int] = transcriber.prompts
        self.max_seconds: float = transcriber.max_seconds
        self._work: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="transcriber", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, engine_dir: Path, plan: Any, limits: Limits) -> TranscriberSession:  # noqa: ARG003
        return cls(EdgellmTranscriber(engine_dir), limits)

    def submit(self, gen: Generation, emit: Emit) -> Handle:     # noqa: ARG002 - Session's signature
        raise RuntimeError("an RNN-T transcriber transcribes recordings (POST /v1/audio/transcriptions); it "
                           "generates no tokens")

    def transcribe(self, wav: bytes, slot: int, done: Callable[[str | None, str | None], None]) -> Handle:
        """Queue one recording (a WAV file's bytes) under a prompt slot; returns at once. `done(text, error)` is
        called once from the session's thread, unless the request was cancelled first."""
        handle = self._handle(_RECORDING, lambda _event: None)
        self._work.put((handle, wav, slot, done))
        return handle

    def _serve(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            handle, wav, slot, done = job
            if handle.cancelled.is_set():
                continue
            try:
                text, error = self.transcriber.transcribe(wav, slot), None
            except Exception as exc:        # noqa: BLE001 - the request fails, the session serves on
                text, error = None, f"{type(exc).__name__}: {str(exc)[:300]}"
            if not handle.cancelled.is_set():
                done(text, error)

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=30)
        self.transcriber.close()

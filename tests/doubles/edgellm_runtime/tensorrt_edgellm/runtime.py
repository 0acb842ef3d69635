"""TEST DOUBLE of tensorrt_edgellm.runtime (0.11): `load()` returns the native runtime module, here a Python one with
the names the 0.11 wheel's experimental server (experimental/server/runtime/engine.py) and
scripts/sweep_eagle3_configs.py use on the pybind module:

    RequestEngine(engine_dir, media_dir, lora_map, model_dir, ContextCacheConfig(), max_batch_size=N)
        .submit(LLMGenerationRequest) -> handle (.cancel()); .shutdown(ShutdownMode)
    StreamChannel.create() -> channel: set_skip_special_tokens(b), wait_pop(timeout_ms=) -> StreamChunk | None,
        is_finished(), is_cancelled(), cancel();  StreamChunk.token_ids / .finished / .reason (FinishReason)
    LLMGenerationRequest: requests, stream_channels, temperature, top_p, top_k, max_generate_length,
        apply_chat_template, add_generation_prompt, num_logprobs (StreamChunk.logprobs: per step the top-K
        entries, token_id / logprob / piece);  Request(messages=[...]): stop_strings, sampling_seed,
        guided_decoding = GuidedDecodingParams(GuideType, guide) (JSON_SCHEMA followed here through llguidance, as
        the real runtime follows it through its own grammar engine)
    create_text_message(role, text), ContextCacheConfig(), FinishReason, ShutdownMode
    Request.audio_buffers = [load_audio_buffer_from_bytes(bytes)] with media_dir the bundle root holding
        audio/audio_encoder.engine (its server's media/audio_preprocess.py and runtime/engine_layout.py); the audio
        runner (qwen3_omni/audioRunner.cpp) takes one clip per request and expands the request's <|audio_pad|> to the
        clip's token count (tests/doubles/python/edgellm_audio.py computes the encoder)

The engine is the llm_build double's (the exporter's ONNX graph), run by tests/doubles/python/edgellm_engine.py;
one driver thread advances every request in flight by one token per step, up to max_batch_size (in-flight batching).
A text prompt with apply_chat_template false is encoded with the engine directory's tokenizer.json and no special
tokens added (raw mode: addBos=false, FACTS.md). A speculative engine directory is refused, as the 0.11 server
refuses speculative decoding under in-flight batching.

    TTSRuntime(talker_engine_dir=, code_predictor_engine_dir=, code2wav_engine_dir=, tokenizer_dir=)
        .get_speaker_names(); .handle_request_tts(text, OmniAudioParams, AudioStreamChannel) (blocking: the
        caller's worker thread) pushes AudioChunk(pcm16 bytes, is_final, num_frames) per codec_chunk_frames frames;
        OmniAudioParams: speaker_name, talker_temperature / top_k / top_p, repetition_penalty, max_audio_length,
        codec_chunk_frames, talker_prefill_threshold (its experimental server's TTS and _pump_channels); the
        engines are computed by tests/doubles/python/edgellm_tts.py (TTS_DOUBLE_WRONG_FRAME as there)

    NemotronAsrRuntime(engine_dir=, tokenizer_dir=) .max_mel_frames; .transcribe(audio_bytes, prompt_id) -> .text
        (its experimental Nemotron-3.5-ASR runtime: experimental/nemotron3_5_asr/server.py), computed by
        tests/doubles/python/edgellm_rnnt.py

EDGELLM_RUNTIME_DOUBLE_WRONG_AT=N: a miscompiled engine (the N-th generated token of every request is off by one).
RUNTIME_DOUBLE_TAKES_BYTES / RUNTIME_DOUBLE_HOLD_S with FAKE_BOARD_ROOT: what loading takes from the fake board.
"""
import enum
import json
import os
import queue
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    CANCELLED = 4
    ERROR = 5


class ShutdownMode(enum.Enum):
    DRAIN = 0
    CANCEL = 1


class ContextCacheConfig:
    enabled = False


class Message:
    def __init__(self):
        self.role, self.contents = "", []


def create_text_message(role, text):
    m = Message()
    m.role, m.contents = role, [SimpleNamespace(type="text", content=text)]
    return m


class GuideType(enum.Enum):
    NONE = 0
    JSON_OBJECT = 1
    JSON_SCHEMA = 2
    REGEX = 3
    EBNF = 4
    STRUCTURAL_TAG = 5
    CHOICE = 6


class GuidedDecodingParams:
    def __init__(self, guide_type, guide):
        self.guide_type, self.guide = guide_type, guide


class Request:
    def __init__(self, messages=()):
        self.messages, self.stop_strings, self.sampling_seed = list(messages), [], 0
        self.guided_decoding = None
        self.image_buffers, self.audio_buffers = [], []


class AudioData:
    """What load_audio_buffer_from_bytes returns: the container's bytes (decoded here by the audio engine double)."""
    def __init__(self, data):
        self.data = bytes(data)


def load_audio_buffer_from_bytes(data):
    if not data:
        raise ValueError("load_audio_buffer_from_bytes: empty audio buffer")
    return AudioData(data)


class LLMGenerationRequest:
    def __init__(self):
        self.requests, self.stream_channels = [], []
        self.temperature, self.top_p, self.top_k, self.max_generate_length = 1.0, 1.0, 50, 128
        self.apply_chat_template, self.add_generation_prompt = True, True
        self.num_logprobs = 0


class StreamChunk:
    def __init__(self, token_ids, finished=False, reason=FinishReason.NOT_FINISHED, logprobs=()):
        self.token_ids, self.finished, self.reason, self.logprobs = token_ids, finished, reason, list(logprobs)


class StreamChannel:
    def __init__(self):
        self._q, self._finished, self._cancelled = queue.Queue(), False, False

    @staticmethod
    def create():
        return StreamChannel()

    def set_skip_special_tokens(self, skip):
        self.skip = skip

    def push(self, chunk):
        self._q.put(chunk)
        self._finished = self._finished or chunk.finished

    def wait_pop(self, timeout_ms=0):
        try:
            return self._q.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def is_finished(self):
        return self._finished and self._q.empty()

    def is_cancelled(self):
        return self._cancelled

    def cancel(self):
        self._cancelled = True


class _Handle:
    def __init__(self, engine, state):
        self._engine, self._state = engine, state

    def cancel(self):
        self._engine._cancel(self._state)


class RequestEngine:
    def __init__(self, engine_dir, media_dir, lora_map, model_dir, context_cache_config, max_batch_size=1):
        from edgellm_engine import PAGE, load_engine
        from stall import stall_if_asked
        from tokenizers import Tokenizer
        stall_if_asked("runtime")
        engine_dir = Path(engine_dir)
        if (engine_dir / "spec_base.engine").is_file():
            raise RuntimeError("speculative decoding is not supported under in-flight batching")
        if not (engine_dir / "llm.engine").is_file():
            raise RuntimeError(f"Failed to load engine from {engine_dir}: llm.engine not found")
        self.engine, self.page = load_engine(engine_dir, "llm.engine", "config.json"), PAGE
        self.tokenizer = Tokenizer.from_file(str(engine_dir / "tokenizer.json"))
        cfg = json.loads((engine_dir / "config.json").read_text())
        eos = cfg.get("eos_token_id")
        self.stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        built = cfg["builder_config"]       # what llm_build was asked for
        self.limits = (built["maxInputLen"], built["maxKVCacheCapacity"])
        self.max_batch = min(max_batch_size, built["maxBatchSize"])
        board, hold = os.environ.get("FAKE_BOARD_ROOT"), int(os.environ.get("RUNTIME_DOUBLE_TAKES_BYTES", "0"))
        if board and hold:
            from fakeboard import taking
            with taking(Path(board), hold, float(os.environ.get("RUNTIME_DOUBLE_HOLD_S", "0.8"))):
                pass
        self.wrong_at = int(os.environ.get("EDGELLM_RUNTIME_DOUBLE_WRONG_AT", "-1"))
        # the multimodal runners of media_dir (the bundle root holding audio/): the audio encoder here
        self.audio = None
        if media_dir and (Path(media_dir) / "audio" / "audio_encoder.engine").is_file():
            from edgellm_audio import audio_engine
            self.audio = audio_engine(Path(media_dir) / "audio")
        self._lock = threading.Condition()
        self._waiting, self._running, self._stop = [], [], False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def submit(self, request):
        if request.apply_chat_template:
            raise RuntimeError("the double models raw prompts only (apply_chat_template false)")
        (row,), (channel,) = request.requests, request.stream_channels
        text = "".join(c.content for m in row.messages for c in m.contents)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        state = {"ids": ids, "out": [], "req": request, "channel": channel, "past": 0,
                 "rng": np.random.default_rng(row.sampling_seed), "cancelled": False,
                 "matcher": self._matcher(row.guided_decoding), "media": None}
        if row.audio_buffers:
            try:
                state["ids"], state["media"] = self._audio(row.audio_buffers, ids)
            except (RuntimeError, ValueError) as exc:   # the runner's preprocess failed: the request ends in error
                print(f"[ERROR] {exc}", file=sys.stderr, flush=True)
                channel.push(StreamChunk([], True, FinishReason.ERROR))
                return _Handle(self, state)
        with self._lock:
            self._waiting.append(state)
            self._lock.notify_all()
        return _Handle(self, state)

    def _audio(self, buffers, ids):
        """The audio runner's preprocess (qwen3_omni/audioRunner.cpp): at most one clip per request, encoded, and the
        request's <|audio_pad|> placeholder expanded in place to the clip's token count (the audio markers come from
        the text); its features go in at those positions."""
        from edgellm_engine import ImageInputs
        if self.audio is None:
            raise RuntimeError("the request holds audio and the engine was loaded without an audio runner "
                               "(media_dir names no audio/audio_encoder.engine)")
        if len(buffers) > 1:
            raise RuntimeError(f"At most one audio clip per request is supported; got {len(buffers)}")
        encoded = self.audio.encode_bytes([(b.data, "audio buffer") for b in buffers])
        pad = self.audio.placeholder_id(self.tokenizer)
        return self.audio.expand(ids, pad, encoded.tokens), ImageInputs(pad, encoded.embeds, [], None)

    def _matcher(self, guided):
        if guided is None:
            return None
        if guided.guide_type != GuideType.JSON_SCHEMA:
            raise RuntimeError(f"the double follows JSON_SCHEMA guides only, not {guided.guide_type}")
        import llguidance
        if not hasattr(self, "_lltok"):
            self._lltok = llguidance.LLTokenizer(self.tokenizer.to_str(), eos_token=sorted(self.stops))
        grammar = llguidance.LLMatcher.grammar_from_json_schema(guided.guide)
        return llguidance.LLMatcher(self._lltok, grammar)

    def shutdown(self, mode=ShutdownMode.DRAIN):
        self._stop = True
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=5)

    def _cancel(self, state):
        with self._lock:
            state["cancelled"] = True

    def _loop(self):
        while not self._stop:
            with self._lock:
                while not (self._waiting or self._running) and not self._stop:
                    self._lock.wait(0.1)
                while self._waiting and len(self._running) < self.max_batch:
                    self._running.append(self._waiting.pop(0))
                batch = list(self._running)
            for s in batch:             # one step: every request in flight advances one token
                try:
                    done = s["cancelled"] or self._advance(s)
                except Exception:       # the engine failed this request: it ends with an error, as the runtime's do
                    import traceback
                    traceback.print_exc()
                    s["channel"].push(StreamChunk([], True, FinishReason.ERROR))
                    done = True
                if done:
                    with self._lock:
                        self._running.remove(s)

    def _advance(self, s):
        req, eng = s["req"], self.engine
        if s["past"] == 0:
            n = len(s["ids"])
            if n > self.limits[0] or n + req.max_generate_length > self.limits[1]:
                s["channel"].push(StreamChunk([], True, FinishReason.ERROR))
                return True
            pages = -(-(n + req.max_generate_length) // self.page)
            s["pools"] = eng.new_pools(pages)
            s["table"] = np.stack([np.arange(pages), np.arange(pages)])[None].astype(np.int32)
            logits = eng.step(s["ids"], 0, s["pools"], s["table"], image=s["media"])
            s["past"] = n
        else:
            logits = eng.step([s["out"][-1]], s["past"], s["pools"], s["table"])
            s["past"] += 1
        logits = logits[:eng.cfg["vocab_size"]].astype(np.float64)
        if s["matcher"] is not None:
            allowed = np.frombuffer(s["matcher"].compute_logit_bias(), dtype=np.uint8)[:len(logits)]
            logits = np.where(np.pad(allowed, (0, len(logits) - len(allowed))) != 0, logits, -np.inf)
        if req.top_k == 1 or req.temperature == 0:
            token = int(np.argmax(logits))
            if len(s["out"]) + 1 == self.wrong_at:
                token = (token + 1) % eng.cfg["vocab_size"]
        else:
            p = np.exp((logits - logits.max()) / req.temperature)
            token = int(s["rng"].choice(len(p), p=p / p.sum()))
        s["out"].append(token)
        if s["matcher"] is not None:
            s["matcher"].consume_token(token)
        logprobs = []
        if req.num_logprobs:
            logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            top = np.argsort(-logp)[:req.num_logprobs]
            logprobs = [[SimpleNamespace(token_id=int(t), logprob=float(logp[t]),
                                         piece=self.tokenizer.decode([int(t)]).encode()) for t in top]]
        if token in self.stops:
            reason = FinishReason.END_ID
        elif len(s["out"]) >= req.max_generate_length:
            reason = FinishReason.LENGTH
        else:
            s["channel"].push(StreamChunk([token], logprobs=logprobs))
            return False
        s["channel"].push(StreamChunk([token], True, reason, logprobs))
        return True


class OmniAudioParams:
    def __init__(self):
        self.speaker_name = ""
        self.talker_temperature, self.talker_top_k, self.talker_top_p = 0.9, 50, 1.0
        self.repetition_penalty, self.max_audio_length = 1.05, 4096
        self.codec_chunk_frames, self.talker_prefill_threshold = 10, 4


class AudioChunk:
    def __init__(self, pcm16, is_final, num_frames):
        self.pcm16, self.is_final, self.num_frames = pcm16, is_final, num_frames


class AudioStreamChannel(StreamChannel):
    def push(self, chunk):
        self._q.put(chunk)
        self._finished = self._finished or chunk.is_final

    def try_pop(self):
        try:
            return self._q.get_nowait()
        except queue.Empty:
            return None


class TTSRuntime:
    def __init__(self, talker_engine_dir, code_predictor_engine_dir, code2wav_engine_dir, tokenizer_dir=""):
        from edgellm_tts import TTSRuntime as Engines
        from stall import stall_if_asked
        stall_if_asked("runtime")
        for name, path in (("talker", talker_engine_dir), ("code_predictor", code_predictor_engine_dir),
                           ("code2wav", code2wav_engine_dir)):
            if not Path(path).is_dir():
                raise RuntimeError(f"{name} engine dir not found: {path}")
        self.engines = Engines(Path(talker_engine_dir), Path(code_predictor_engine_dir), Path(code2wav_engine_dir),
                               Path(tokenizer_dir or talker_engine_dir))
        board, hold = os.environ.get("FAKE_BOARD_ROOT"), int(os.environ.get("RUNTIME_DOUBLE_TAKES_BYTES", "0"))
        if board and hold:
            from fakeboard import taking
            with taking(Path(board), hold, float(os.environ.get("RUNTIME_DOUBLE_HOLD_S", "0.8"))):
                pass

    def get_speaker_names(self):
        return list(self.engines.cfg.get("speaker_id") or {})

    def handle_request_tts(self, text, params, channel):
        from pipeline.workstation.synthesis_gate import pcm16
        if params.speaker_name and params.speaker_name.lower() not in (self.engines.cfg.get("speaker_id") or {}):
            raise RuntimeError(f"Unknown speaker: {params.speaker_name}")
        knobs = {k: getattr(params, k) for k in ("talker_temperature", "talker_top_k", "talker_top_p",
                                                 "repetition_penalty", "max_audio_length")}
        chunk, pending = max(1, int(params.codec_chunk_frames)), []

        def push(final):
            pcm = pcm16(self.engines.waveform(np.asarray(pending, np.int64), None)).tobytes() if pending else b""
            channel.push(AudioChunk(pcm, final, len(pending)))
            pending.clear()
        for frame in self.engines.frames(text, params.speaker_name or None, None, knobs, greedy_predictor=True):
            if channel.is_cancelled():
                return
            pending.append(frame)
            if len(pending) == chunk:
                push(False)
        push(True)


class NemotronAsrRuntime:
    """Its experimental Nemotron-3.5-ASR runtime (built with -DBUILD_EXPERIMENTAL_MODELS=ON; its transcription
    server's NemotronAsr): computed by tests/doubles/python/edgellm_rnnt.py. EDGELLM_DOUBLE_NO_EXPERIMENTAL=1: a
    runtime built without it (the class absent)."""

    def __init__(self, engine_dir, tokenizer_dir):
        from edgellm_rnnt import NemotronAsrRuntime as Engines
        from stall import stall_if_asked
        stall_if_asked("runtime")
        self._engines = Engines(engine_dir, tokenizer_dir)
        self.max_mel_frames = self._engines.max_mel_frames
        board, hold = os.environ.get("FAKE_BOARD_ROOT"), int(os.environ.get("RUNTIME_DOUBLE_TAKES_BYTES", "0"))
        if board and hold:
            from fakeboard import taking
            with taking(Path(board), hold, float(os.environ.get("RUNTIME_DOUBLE_HOLD_S", "0.8"))):
                pass

    def transcribe(self, audio, prompt_id):
        return self._engines.transcribe(audio, int(prompt_id))


if os.environ.get("EDGELLM_DOUBLE_NO_EXPERIMENTAL") == "1":
    del NemotronAsrRuntime


def load():
    return sys.modules[__name__]

"""TensorRT Edge-LLM 0.11 on the device: its Python runtime binding with in-flight batching, on the engine directory
llm_build made from our kit.

Found in the 0.11 wheel (tensorrt_edgellm/runtime.py, the experimental server's runtime/engine.py, and
scripts/sweep_eagle3_configs.py, which loads an llm_build engine directory with no checkpoint): the server itself
refuses engine directories and rebuilds from a checkpoint into its own cache, but the binding under it does not.

    rt = tensorrt_edgellm.runtime.load()
    engine = rt.RequestEngine(engine_dir, media_dir, lora_map, model_dir, rt.ContextCacheConfig(),
                              max_batch_size=N)       # owns the runtime and the one thread driving it
    channel = rt.StreamChannel.create(); channel.set_skip_special_tokens(...)
    request = rt.LLMGenerationRequest(); request.requests = [rt.Request(messages=[rt.create_text_message(...)])]
    request.stream_channels = [channel]; temperature / top_p / top_k / max_generate_length / apply_chat_template /
    num_logprobs (top-K entries per step: StreamChunk.logprobs, [[entry(token_id, logprob, piece)]]);
    Request.guided_decoding = rt.GuidedDecodingParams(rt.GuideType.JSON_SCHEMA, schema_json) (its server's
    response_format, experimental/server/runtime/engine.py _make_generation_request)
    handle = engine.submit(request); channel.wait_pop(timeout_ms) -> StreamChunk(token_ids, finished, reason)
    handle.cancel(); channel.cancel(); engine.shutdown(rt.ShutdownMode.CANCEL)

The prompt goes as text with apply_chat_template false: the text the server rendered (or the raw prompt with its
special tokens written out), which Edge-LLM's raw mode encodes without adding any: the goldens' ids (FACTS.md).

A speech model's recording goes as its server sends one (experimental/server/media/audio_preprocess.py):
Request.audio_buffers = [rt.load_audio_buffer_from_bytes(wav bytes)], the engine opened with media_dir = the engine
directory, which holds audio/ (runtime/engine_layout.py: media_dir is the bundle root where it has an audio or visual
part). Its audio runner (cpp/multimodal/qwen3_omni/audioRunner.cpp) decodes it, computes the Whisper features,
encodes them, and expands the one <|audio_pad|> the rendered text holds to the clip's token count in place (the
markers around it are the text's); it takes one clip per request.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.backends import edgellm as edgellm_backend
from pipeline.runtime.session import Constraint, Emit, EngineSession, Event, Generation, Handle, Limits, TokenLogprob

POLL_MS = 50


def _logprobs(tokens: list[int], steps: Any, top: int) -> list[TokenLogprob]:
    """Per token, the runtime's top-K entries of its step (token_id, logprob): the chosen token's log-probability
    where it is among them (else None, as Edge-LLM's own server answers), and the `top` most likely."""
    out = []
    for token, step in zip(tokens, list(steps or []), strict=False):
        entries = [(int(e.token_id), float(e.logprob)) for e in step]
        chosen = next((lp for t, lp in entries if t == token), None)
        out.append(TokenLogprob(chosen, tuple(sorted(entries, key=lambda e: -e[1])[:top])))
    return out


class EdgellmSession(EngineSession):
    backend = edgellm_backend.BACKEND.name
    # LLMGenerationRequest.num_logprobs (it has no penalties); Request.audio_buffers
    applies = frozenset({"logprobs", "top_logprobs", "recordings"})
    recordings_per_request = 1      # its audio runner: "At most one audio clip per request is supported"

    @classmethod
    def open(cls, engine_dir: Path, plan: contract.Plan, limits: Limits) -> EdgellmSession:
        return cls(engine_dir, limits, media=plan.audio is not None)

    @classmethod
    def refuses(cls, plan: contract.Plan) -> str | None:
        if plan.speculative is not None:
            return (f"Edge-LLM 0.11's RequestEngine does not serve {plan.speculative.method} speculative engines: "
                    "speculative decoding is not supported under in-flight batching (its own server says so, "
                    "experimental/server/runtime/engine.py)")
        return None

    def __init__(self, engine_dir: Path, limits: Limits, runtime_module: Any = None, media: bool = False):
        """media: the engine directory holds a multimodal part (a speech model's audio/), given as media_dir."""
        super().__init__()
        if runtime_module is None:
            from tensorrt_edgellm import runtime as facade
            runtime_module = facade.load()
        self.rt, self.limits = runtime_module, limits
        self.engine = self.rt.RequestEngine(str(engine_dir), str(engine_dir) if media else "", {}, "",
                                            self.rt.ContextCacheConfig(), max_batch_size=limits.max_batch_size)
        self._channels: dict[int, Any] = {}
        self._closed = False

    def guide(self, constraint: Constraint) -> Any:
        """A JSON schema, as the runtime's guided decoding takes it (GuidedDecodingParams(GuideType.JSON_SCHEMA,
        schema text), as its server passes response_format). Fixed text around the JSON (a forced tool call in a
        Hermes, Mistral or Phi-4-mini format) would need its EBNF or structural-tag guides, which this server does not
        write for it yet."""
        if not constraint.plain:
            raise NotImplementedError("its runtime is given JSON schemas only here, and this model's tool-call "
                                      f"format has text around the JSON ({constraint.marker or constraint.prefix!r})")
        return json.dumps(constraint.schema, sort_keys=True)

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        rt, s = self.rt, gen.sampling
        channel = rt.StreamChannel.create()
        channel.set_skip_special_tokens(False)      # ids, not text, are read: the server detokenizes
        request = rt.LLMGenerationRequest()
        row = rt.Request(messages=[rt.create_text_message("user", gen.prompt_text)])
        row.stop_strings = []
        row.sampling_seed = s.seed if s.seed is not None else 0
        if gen.recordings:
            row.audio_buffers = [rt.load_audio_buffer_from_bytes(wav) for wav in gen.recordings]
        if gen.guide is not None:
            row.guided_decoding = rt.GuidedDecodingParams(rt.GuideType.JSON_SCHEMA, gen.guide)
        request.requests, request.stream_channels = [row], [channel]
        request.temperature = 1.0 if s.greedy else s.temperature
        request.top_p = 1.0 if s.greedy else s.top_p
        request.top_k = 1 if s.greedy else s.top_k
        request.max_generate_length = gen.max_new_tokens
        request.apply_chat_template = False
        request.add_generation_prompt = False
        # its runtime returns the top-K entries per step (K >= 1), the chosen token's among them where it is there
        request.num_logprobs = max(1, gen.logprobs) if gen.logprobs is not None else 0
        handle = self._handle(gen, emit)
        native = self.engine.submit(request)
        self._channels[handle.id] = (channel, native)
        threading.Thread(target=self._read, args=(handle, channel), name=f"edgellm-{handle.id}",
                         daemon=True).start()
        return handle

    def _read(self, handle: Handle, channel: Any) -> None:
        try:
            while not handle.cancelled.is_set() and not self._closed:
                chunk = channel.wait_pop(timeout_ms=POLL_MS)
                if chunk is None:
                    if channel.is_finished() or channel.is_cancelled():
                        break
                    continue
                tokens = [int(t) for t in chunk.token_ids]
                handle.last = tokens[-1] if tokens else handle.last
                logprobs = _logprobs(tokens, chunk.logprobs, handle.generation.logprobs) \
                    if handle.generation.logprobs is not None else None
                if chunk.finished:
                    # FinishReason: END_ID and STOP_WORDS are "stop" (as its own server maps them), LENGTH "length"
                    name = getattr(chunk.reason, "name", str(chunk.reason))
                    error = None if name in ("END_ID", "STOP_WORDS", "LENGTH") else \
                        f"the Edge-LLM runtime ended the request with {name}"
                    handle.emit(Event(tokens, final=True, reason="length" if name == "LENGTH" else "stop",
                                      error=error, logprobs=logprobs))
                    return
                if tokens:
                    handle.emit(Event(tokens, logprobs=logprobs))
            if not handle.cancelled.is_set():
                handle.emit(Event([], final=True, error="the Edge-LLM runtime ended the request without a result"))
        finally:
            self._channels.pop(handle.id, None)

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()
        pair = self._channels.pop(handle.id, None)
        if pair is not None:
            channel, native = pair
            native.cancel()
            channel.cancel()

    def close(self) -> None:
        self._closed = True
        self.engine.shutdown(self.rt.ShutdownMode.CANCEL)

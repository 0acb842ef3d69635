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
    request.stream_channels = [channel]; temperature / top_p / top_k / max_generate_length / apply_chat_template
    handle = engine.submit(request); channel.wait_pop(timeout_ms) -> StreamChunk(token_ids, finished, reason)
    handle.cancel(); channel.cancel(); engine.shutdown(rt.ShutdownMode.CANCEL)

The prompt goes as text with apply_chat_template false: the text the server rendered (or the raw prompt with its
special tokens written out), which Edge-LLM's raw mode encodes without adding any: the goldens' ids (FACTS.md).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.backends import edgellm as edgellm_backend
from pipeline.runtime.session import Emit, EngineSession, Event, Generation, Handle, Limits

POLL_MS = 50


class EdgellmSession(EngineSession):
    backend = edgellm_backend.BACKEND.name

    @classmethod
    def open(cls, engine_dir: Path, _plan: contract.Plan, limits: Limits) -> EdgellmSession:
        return cls(engine_dir, limits)

    @classmethod
    def refuses(cls, plan: contract.Plan) -> str | None:
        if plan.speculative is not None:
            return (f"Edge-LLM 0.11's RequestEngine does not serve {plan.speculative.method} speculative engines: "
                    "speculative decoding is not supported under in-flight batching (its own server says so, "
                    "experimental/server/runtime/engine.py)")
        return None

    def __init__(self, engine_dir: Path, limits: Limits, runtime_module: Any = None):
        super().__init__()
        if runtime_module is None:
            from tensorrt_edgellm import runtime as facade
            runtime_module = facade.load()
        self.rt, self.limits = runtime_module, limits
        self.engine = self.rt.RequestEngine(str(engine_dir), "", {}, "", self.rt.ContextCacheConfig(),
                                            max_batch_size=limits.max_batch_size)
        self._channels: dict[int, Any] = {}
        self._closed = False

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        rt, s = self.rt, gen.sampling
        channel = rt.StreamChannel.create()
        channel.set_skip_special_tokens(False)      # ids, not text, are read: the server detokenizes
        request = rt.LLMGenerationRequest()
        row = rt.Request(messages=[rt.create_text_message("user", gen.prompt_text)])
        row.stop_strings = []
        row.sampling_seed = s.seed if s.seed is not None else 0
        request.requests, request.stream_channels = [row], [channel]
        request.temperature = 1.0 if s.greedy else s.temperature
        request.top_p = 1.0 if s.greedy else s.top_p
        request.top_k = 1 if s.greedy else s.top_k
        request.max_generate_length = gen.max_new_tokens
        request.apply_chat_template = False
        request.add_generation_prompt = False
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
                if chunk.finished:
                    # FinishReason: END_ID and STOP_WORDS are "stop" (as its own server maps them), LENGTH "length"
                    name = getattr(chunk.reason, "name", str(chunk.reason))
                    error = None if name in ("END_ID", "STOP_WORDS", "LENGTH") else \
                        f"the Edge-LLM runtime ended the request with {name}"
                    handle.emit(Event(tokens, final=True, reason="length" if name == "LENGTH" else "stop",
                                      error=error))
                    return
                if tokens:
                    handle.emit(Event(tokens))
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

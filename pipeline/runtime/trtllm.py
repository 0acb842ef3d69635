"""TensorRT-LLM 0.12 on the device: the C++ executor with in-flight batching, on the engine directory we built.

tensorrt_llm.bindings.executor (0.12, FACTS.md "Serving the built engine"):
    Executor(engine_dir, ModelType.DECODER_ONLY, ExecutorConfig(max_beam_width=1, kv_cache_config=KvCacheConfig(
        max_tokens=...)))            the paged KV cache capped at the plan's max_batch_size x max_seq_len (without a
                                     cap 0.12 takes 90% of free memory: on a Jetson, of the board's RAM)
    Request(input_token_ids, max_new_tokens, streaming=True, sampling_config=SamplingConfig(beam_width=1, top_k,
            top_p, random_seed, temperature), end_id, pad_id, stop_words)
    enqueue_request(request) -> id; await_responses(timeout) -> [Response] of any request;
    Response.request_id / has_error() / error_msg / result.output_token_ids[beam] (new tokens only, streaming) /
    result.is_final; cancel_request(id); get_latest_iteration_stats() -> [IterationStats.kv_cache_stats]; shutdown()

Not ModelRunnerCpp: its streaming loop consumes every pending response, so it serves one caller at a time. 0.12 has
no finish reason: a final response ending in a stop id is "stop", else "length".
"""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.backends import trtllm012
from pipeline.runtime.session import Emit, Event, Generation, Handle, Limits, Session

POLL = datetime.timedelta(milliseconds=20)


class TrtllmSession(Session):
    backend = trtllm012.BACKEND.name

    def __init__(self, engine_dir: Path, limits: Limits, kv_tokens: int, executor_module: Any = None):
        super().__init__()
        if executor_module is None:
            import importlib
            executor_module = importlib.import_module("tensorrt_llm.bindings.executor")
        self.ex_mod, self.limits = executor_module, limits
        tle = executor_module
        config = tle.ExecutorConfig(max_beam_width=1, kv_cache_config=tle.KvCacheConfig(max_tokens=kv_tokens))
        self.executor = tle.Executor(Path(engine_dir), tle.ModelType.DECODER_ONLY, config)
        self._handles: dict[int, Handle] = {}
        self._map_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="trtllm-executor", daemon=True)
        self._thread.start()

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        if self.failure:
            raise RuntimeError(self.failure)
        tle, s = self.ex_mod, gen.sampling
        sampling = tle.SamplingConfig(beam_width=1, top_k=1 if s.greedy else (s.top_k or None),
                                      top_p=None if s.greedy else s.top_p, random_seed=s.seed,
                                      temperature=None if s.greedy else s.temperature)
        stops = list(gen.stop_ids)
        request = tle.Request(input_token_ids=list(gen.prompt_ids), max_new_tokens=gen.max_new_tokens,
                              streaming=True, sampling_config=sampling, end_id=stops[0] if stops else None,
                              pad_id=stops[0] if stops else None,
                              stop_words=[[t] for t in stops[1:]] or None)
        handle = self._handle(gen, emit)
        with self._map_lock:        # registered before a response for it can be awaited
            handle.id = self.executor.enqueue_request(request)
            self._handles[handle.id] = handle
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()
        with self._map_lock:
            known = self._handles.pop(handle.id, None) is not None
        if known:
            self.executor.cancel_request(handle.id)

    def stats(self) -> dict[str, float]:
        try:
            for it in reversed(list(self.executor.get_latest_iteration_stats())):
                kv = getattr(it, "kv_cache_stats", None)
                if kv is not None and kv.max_num_blocks:
                    return {"kv_cache_usage": kv.used_num_blocks / kv.max_num_blocks}
        except Exception:       # noqa: BLE001 - statistics are optional; serving is not
            return {}
        return {}

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=10)
        self.executor.shutdown()

    def _loop(self) -> None:
        while not self._closed:
            try:
                responses = self.executor.await_responses(timeout=POLL)
            except Exception as exc:    # noqa: BLE001 - the executor itself failed: every request fails with it
                self._fail(f"the TensorRT-LLM executor failed: {str(exc)[:300]}")
                return
            for r in responses:
                with self._map_lock:
                    handle = self._handles.get(r.request_id)
                if handle is None:      # cancelled: nothing more is said about it
                    continue
                if r.has_error():
                    self._finish(handle, Event([], final=True, error=str(r.error_msg)[:300]))
                    continue
                tokens = [int(t) for t in r.result.output_token_ids[0]]
                handle.last = tokens[-1] if tokens else handle.last
                if r.result.is_final:
                    reason = "stop" if handle.last in handle.generation.stop_ids else "length"
                    self._finish(handle, Event(tokens, final=True, reason=reason))
                elif tokens:
                    handle.emit(Event(tokens))

    def _finish(self, handle: Handle, event: Event) -> None:
        with self._map_lock:
            self._handles.pop(handle.id, None)
        handle.emit(event)

    def _fail(self, message: str) -> None:
        self.failure = message
        with self._map_lock:
            pending, self._handles = list(self._handles.values()), {}
        for h in pending:
            h.emit(Event([], final=True, error=message))


def open_session(engine_dir: Path, plan: contract.Plan, limits: Limits) -> TrtllmSession:
    return TrtllmSession(engine_dir, limits, kv_tokens=plan.limits.max_batch_size * plan.limits.max_seq_len)

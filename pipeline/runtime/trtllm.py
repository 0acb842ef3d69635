"""TensorRT-LLM 0.12 on the device: the C++ executor with in-flight batching, on the engine directory we built.

tensorrt_llm.bindings.executor (0.12, FACTS.md "Serving the built engine"):
    Executor(engine_dir, ModelType.DECODER_ONLY, ExecutorConfig(max_beam_width=1, kv_cache_config=KvCacheConfig(
        max_tokens=...)))            the paged KV cache capped at the plan's max_batch_size x max_seq_len (without a
                                     cap 0.12 takes 90% of free memory: on a Jetson, of the board's RAM)
    Request(input_token_ids, max_new_tokens, streaming=True, sampling_config=SamplingConfig(beam_width=1, top_k,
            top_p, random_seed, temperature, repetition_penalty, presence_penalty, frequency_penalty),
            output_config=OutputConfig(return_log_probs=True), end_id, pad_id, stop_words)
    enqueue_request(request) -> id; await_responses(timeout) -> [Response] of any request;
    Response.request_id / has_error() / error_msg / result.output_token_ids[beam] (new tokens only, streaming) /
    result.is_final / result.log_probs[beam] (the chosen tokens' log-probabilities, no alternatives);
    cancel_request(id); get_latest_iteration_stats() -> [IterationStats.kv_cache_stats]; shutdown()

Not ModelRunnerCpp: its streaming loop consumes every pending response, so it serves one caller at a time. 0.12 has
no finish reason: a final response ending in a stop id is "stop", else "length".

Structured output and forced tool calls go through 0.12's logits post-processor (ExecutorConfig(
logits_post_processor_map={name: callback}), Request(logits_post_processor_name=name); its
examples/bindings/executor/example_logits_processor.py constrains JSON this way): the callback gets the request id,
the step's logits (a torch tensor on the GPU), the beam's tokens and the CUDA stream, and masks every token the
request's llguidance grammar (runtime/grammar.py, over the bundle's tokenizer.json) does not allow next.
"""

from __future__ import annotations

import datetime
import re
import threading
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.backends import trtllm012
from pipeline.runtime.session import (
    Constraint,
    Emit,
    EngineSession,
    Event,
    Generation,
    Handle,
    Limits,
    TokenLogprob,
)

POLL = datetime.timedelta(milliseconds=20)

# TensorRT-LLM's KV cache manager, as it logs its allocation at INFO (newest wording first)
KV_ALLOCATED = re.compile(r"Allocated ([0-9.]+) GiB for max tokens in paged KV cache \((\d+)\)")
KV_BLOCKS = re.compile(r"Number of blocks in KV cache primary pool: (\d+)")
KV_TOKENS_PER_BLOCK = re.compile(r"Number of tokens per block: (\d+)")
KV_OLD = re.compile(r"Using (\d+) tokens in paged KV cache")
GUIDE = "jetson_pipeline_guide"      # our logits post-processor's name in the executor's map


class _Guided:
    """One guided request's grammar state: the prompt, how many of its generated tokens the grammar has taken."""

    def __init__(self, state: Any, prompt: tuple[int, ...]):
        self.state, self.prompt, self.taken = state, list(prompt), 0


class TrtllmSession(EngineSession):
    backend = trtllm012.BACKEND.name
    # SamplingConfig's penalties and OutputConfig.return_log_probs (the chosen token's only: no top_logprobs); it has
    # no min_p
    applies = frozenset({"repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs"})

    @classmethod
    def open(cls, engine_dir: Path, plan: contract.Plan, limits: Limits) -> TrtllmSession:
        return cls(engine_dir, limits, kv_tokens=plan.limits.max_batch_size * plan.limits.max_seq_len,
                   grammars=_bundle_grammars(Path(engine_dir)))

    @classmethod
    def reported_kv_allocation(cls, log: str, stats: dict[str, int] | None) -> dict[str, Any] | None:
        """From its log (TLLM_LOG_LEVEL=INFO): "[MemUsageChange] Allocated X GiB for max tokens in paged KV cache
        (N)", else its block-count lines, else the executor's KvCacheStats (max_num_blocks x tokens_per_block)."""
        m = KV_ALLOCATED.findall(log)
        if m:
            gib, tokens = m[-1]
            return {"tokens": int(tokens), "bytes": int(float(gib) * 2**30), "source": "TensorRT-LLM log: "
                    f"[MemUsageChange] Allocated {gib} GiB for max tokens in paged KV cache ({tokens})"}
        blocks, per_block = KV_BLOCKS.findall(log), KV_TOKENS_PER_BLOCK.findall(log)
        if blocks and per_block:
            return {"tokens": int(blocks[-1]) * int(per_block[-1]), "bytes": None,
                    "source": f"TensorRT-LLM log: {blocks[-1]} blocks of {per_block[-1]} tokens in the primary pool"}
        if isinstance(stats, dict) and isinstance(stats.get("max_num_blocks"), int) and \
                isinstance(stats.get("tokens_per_block"), int):
            return {"tokens": stats["max_num_blocks"] * stats["tokens_per_block"], "bytes": None,
                    "source": "the executor's KvCacheStats (max_num_blocks x tokens_per_block)"}
        old = KV_OLD.findall(log)
        if old:
            return {"tokens": int(old[-1]), "bytes": None, "source": f"TensorRT-LLM log: Using {old[-1]} tokens"}
        return None

    def __init__(self, engine_dir: Path, limits: Limits, kv_tokens: int, executor_module: Any = None,
                 grammars: Any = None):
        """grammars: runtime/grammar.Grammars over the served tokenizer (None: no structured output here)."""
        super().__init__()
        if executor_module is None:
            import importlib
            executor_module = importlib.import_module("tensorrt_llm.bindings.executor")
        self.ex_mod, self.limits, self.grammars = executor_module, limits, grammars
        self._guided: dict[int, _Guided] = {}
        tle = executor_module
        post = {"logits_post_processor_map": {GUIDE: self._mask_logits}} if grammars is not None else {}
        config = tle.ExecutorConfig(max_beam_width=1, kv_cache_config=tle.KvCacheConfig(max_tokens=kv_tokens),
                                    **post)
        self.executor = tle.Executor(Path(engine_dir), tle.ModelType.DECODER_ONLY, config)
        self._handles: dict[int, Handle] = {}
        self._map_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="trtllm-executor", daemon=True)
        self._thread.start()

    def guide(self, constraint: Constraint) -> Any:
        if self.grammars is None:
            raise NotImplementedError("it needs llguidance on the board (pip install 'llguidance>=1.0', the [serve] "
                                      "extra) and the bundle's tokenizer.json")
        return self.grammars.compile(constraint)

    def _mask_logits(self, req_id: int, logits: Any, beam_tokens: Any, stream_ptr: Any = None, *_rest: Any) -> None:
        """The executor's logits post-processor for guided requests: advance the request's grammar by the tokens
        generated since the last step, then set every logit it does not allow next to -inf, in place, on the
        executor's CUDA stream."""
        import torch
        with self._map_lock:
            g = self._guided.get(int(req_id))
        if g is None:
            return
        tokens = [int(t) for t in beam_tokens[0]]
        generated = tokens[len(g.prompt):] if tokens[:len(g.prompt)] == g.prompt else tokens
        for t in generated[g.taken:]:
            g.state.advance(t)
        g.taken = len(generated)
        allowed = torch.frombuffer(bytearray(g.state.allowed()), dtype=torch.uint8)
        vocab = logits.shape[-1]
        mask = torch.full((vocab,), float("-inf"))
        n = min(vocab, allowed.numel())
        mask[:n] = torch.where(allowed[:n] != 0, 0.0, float("-inf"))
        if getattr(logits, "is_cuda", False) and stream_ptr:
            with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr)):
                logits += mask.to(logits.device, non_blocking=True)
        else:
            logits += mask.to(logits.device)

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        tle, s = self.ex_mod, gen.sampling
        sampling = tle.SamplingConfig(beam_width=1, top_k=1 if s.greedy else (s.top_k or None),
                                      top_p=None if s.greedy else s.top_p, random_seed=s.seed,
                                      temperature=None if s.greedy else s.temperature,
                                      repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1.0 else None,
                                      presence_penalty=s.presence_penalty or None,
                                      frequency_penalty=s.frequency_penalty or None)
        stops = list(gen.stop_ids)
        request = tle.Request(input_token_ids=list(gen.prompt_ids), max_new_tokens=gen.max_new_tokens,
                              streaming=True, sampling_config=sampling, end_id=stops[0] if stops else None,
                              output_config=tle.OutputConfig(return_log_probs=True) if gen.logprobs is not None
                              else None, logits_post_processor_name=GUIDE if gen.guide is not None else None,
                              pad_id=stops[0] if stops else None,
                              stop_words=[[t] for t in stops[1:]] or None)
        handle = self._handle(gen, emit)
        with self._map_lock:        # registered before a response (or a logits callback) for it can come
            handle.id = self.executor.enqueue_request(request)
            self._handles[handle.id] = handle
            if gen.guide is not None:
                assert self.grammars is not None        # guide() compiled it
                self._guided[handle.id] = _Guided(self.grammars.start(gen.guide), gen.prompt_ids)
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()
        with self._map_lock:
            known = self._handles.pop(handle.id, None) is not None
            self._guided.pop(handle.id, None)
        if known:
            self.executor.cancel_request(handle.id)

    def kv_stats(self) -> dict[str, int] | None:
        try:
            for it in reversed(list(self.executor.get_latest_iteration_stats())):
                kv = getattr(it, "kv_cache_stats", None)
                if kv is not None:
                    return {k: int(getattr(kv, k)) for k in ("max_num_blocks", "free_num_blocks", "used_num_blocks",
                                                             "tokens_per_block") if hasattr(kv, k)}
        except Exception:       # noqa: BLE001 - statistics are optional; serving is not
            return None
        return None

    def stats(self) -> dict[str, float]:
        kv = self.kv_stats() or {}
        return {"kv_cache_usage": kv["used_num_blocks"] / kv["max_num_blocks"]} if kv.get("max_num_blocks") and \
            "used_num_blocks" in kv else {}

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
                logprobs = None
                if handle.generation.logprobs is not None:
                    # the last len(tokens) entries are these tokens' (whether the runtime sends all or the new ones)
                    values = list(r.result.log_probs[0])[-len(tokens):] if tokens else []
                    logprobs = [TokenLogprob(float(v)) for v in values]
                if r.result.is_final:
                    reason = "stop" if handle.last in handle.generation.stop_ids else "length"
                    self._finish(handle, Event(tokens, final=True, reason=reason, logprobs=logprobs))
                elif tokens:
                    handle.emit(Event(tokens, logprobs=logprobs))

    def _finish(self, handle: Handle, event: Event) -> None:
        with self._map_lock:
            self._handles.pop(handle.id, None)
            self._guided.pop(handle.id, None)
        handle.emit(event)

    def _fail(self, message: str) -> None:
        self.failure = message
        with self._map_lock:
            pending, self._handles = list(self._handles.values()), {}
        for h in pending:
            h.emit(Event([], final=True, error=message))


def _bundle_grammars(bundle_dir: Path) -> Any:
    """Grammars over the bundle's tokenizer (its serving/ part) with the goldens' stop ids, or None where llguidance
    is not installed or the bundle has no tokenizer.json (structured output is then refused by name)."""
    serving = bundle_dir / contract.SERVING_DIR
    try:
        from pipeline.files import read_regular
        from pipeline.runtime.grammar import Grammars
        text = read_regular(serving / contract.TOKENIZER_DIR / "tokenizer.json", 64 * 2**20).decode("utf-8")
        stops = contract.Goldens.load(serving / contract.GOLDENS).stop_ids
        from tokenizers import Tokenizer
        control = {t.content: i for i, t in Tokenizer.from_str(text).get_added_tokens_decoder().items() if t.special}
        return Grammars(text, stops, control)
    except Exception:        # noqa: BLE001 - optional: no llguidance, no tokenizer, an unreadable file
        return None

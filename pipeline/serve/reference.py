"""The workstation's session: the quantized model the goldens were computed with (the quantize stage's saved
ModelOpt state on the fetched checkpoint, state.load_quantized), run by PyTorch on the CPU or a GPU.

Each request keeps its own KV cache and runs the same forward calls transformers' generate() makes for the goldens
(the prompt, then one token at a time), so a greedy answer here is the golden answer token for token. Requests in
flight take turns one step each (up to max_batch_size at once): batched numerics would differ from the goldens'
in the last bits, and this backend exists to be exact, not fast.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pipeline.runtime.session import Constraint, Emit, Event, Generation, Handle, Limits, Session, TokenLogprob


@dataclass
class _Running:
    handle: Handle
    cache: Any = None
    last: int | None = None
    made: int = 0
    generator: Any = None
    grammar: Any = None     # grammar.Constrained: the answer's grammar state, where the request has one
    counts: Any = None      # how often each token came in the answer (for the penalties), where asked
    rope_deltas: Any = None     # Qwen's multimodal RoPE: this request's offset past its image (None: text only)


class ReferenceSession(Session):
    backend = "reference"
    applies = frozenset({"repetition_penalty", "presence_penalty", "frequency_penalty", "min_p", "logprobs",
                         "top_logprobs", "images", "recordings"})

    def __init__(self, model: Any, limits: Limits, device: str = "cpu",
                 thread_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 on_close: Callable[[], None] = lambda: None, grammars: Any = None,
                 pixels: Callable[[tuple[bytes, ...], list[int]], dict] | None = None,
                 new_cache: Callable[[Any], Any] = lambda _model: None,
                 audio: Callable[[tuple[bytes, ...], list[int]], dict] | None = None):
        """new_cache: the cache a request's first forward starts from where transformers cannot make it itself
        (None: it makes its own; workstation/models.new_cache). device: where the model's inputs go. thread_context:
        entered by the session's own thread around every forward (torch function modes such as the goldens'
        skinny_linears are per thread). on_close: releases the model after the thread stopped. grammars:
        grammar.Grammars of the served tokenizer, for requests with a grammar. pixels: a vision-language model's
        images and prompt ids made into its image inputs (workstation/image_prompts.PixelMaker); None for a text
        model. audio: a speech model's recordings made into its audio inputs (workstation/audio_prompts.AudioMaker)."""
        super().__init__()
        self.pixels, self.new_cache, self.audio = pixels, new_cache, audio
        # Qwen-VL keeps its multimodal RoPE offset on the model between forward calls: set per request, per step
        inner = getattr(model, "model", None)
        self._rope_holder = inner if hasattr(inner, "rope_deltas") else None
        self.model, self.limits, self.device = model, limits, device
        self._context, self._on_close = thread_context, on_close
        self.grammars = grammars
        self._pending: queue.Queue[Handle | None] = queue.Queue()
        self._cancelled: set[int] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="reference-session", daemon=True)
        self._thread.start()

    def guide(self, constraint: Constraint) -> Any:
        if self.grammars is None:
            raise NotImplementedError("structured output needs llguidance (pip install 'llguidance>=1.0', the [serve] "
                                      "extra has it)")
        return self.grammars.compile(constraint)

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        handle = self._handle(gen, emit)
        self._pending.put(handle)
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()

    def close(self) -> None:
        self._closed = True
        self._pending.put(None)
        self._thread.join(timeout=10)
        self._on_close()

    def _loop(self) -> None:
        with self._context():
            self._serve()

    def _serve(self) -> None:
        running: list[_Running] = []
        while not self._closed:
            while len(running) < self.limits.max_batch_size:
                try:
                    h = self._pending.get(block=not running, timeout=None)
                except queue.Empty:
                    break
                if h is None:
                    return
                running.append(_Running(h))
            for r in list(running):
                if r.handle.cancelled.is_set():
                    running.remove(r)
                    continue
                try:
                    event = self._step(r)
                except Exception as exc:        # noqa: BLE001 - the request fails, the session serves on
                    event = Event([], final=True, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                if event.final:
                    running.remove(r)
                if not r.handle.cancelled.is_set():
                    r.handle.emit(event)

    def _step(self, r: _Running) -> Event:
        import torch

        gen = r.handle.generation
        with torch.no_grad():
            if self._rope_holder is not None:       # a text request, or the first step: computed afresh
                self._rope_holder.rope_deltas = r.rope_deltas
            if r.cache is None:
                ids = torch.tensor([list(gen.prompt_ids)], device=self.device)
                cache = self.new_cache(self.model)      # a dense Nemotron-H's (transformers 5.14.1)
                out = self.model(input_ids=ids, use_cache=True,
                                 **({"past_key_values": cache} if cache is not None else {}), **self._image_inputs(gen))
                if gen.images and self._rope_holder is not None:
                    r.rope_deltas = self._rope_holder.rope_deltas
            else:
                ids = torch.tensor([[r.last]], device=self.device)
                out = self.model(input_ids=ids, past_key_values=r.cache, use_cache=True)
            r.cache = out.past_key_values
            # as generate() takes the next token: the last position's logits in fp32
            logits = out.logits[0, -1].to(dtype=torch.float32)
            logits = self._penalized(logits, r)
            if gen.guide is not None:
                logits = self._constrained(logits, r)
            token, logprobs = self._choose(logits, r)
        if r.grammar is not None:
            r.grammar.advance(token)
        if r.counts is not None:
            r.counts[token] += 1
        r.last, r.made = token, r.made + 1
        if token in gen.stop_ids:
            return Event([token], final=True, reason="stop", logprobs=logprobs)
        if r.made >= gen.max_new_tokens:
            return Event([token], final=True, reason="length", logprobs=logprobs)
        return Event([token], logprobs=logprobs)

    def _image_inputs(self, gen: Generation) -> dict[str, Any]:
        """The request's images (recordings) as the model's inputs (as the goldens made them), on the model's
        device."""
        if gen.recordings:
            if self.audio is None:
                raise RuntimeError("this session serves a model without an audio encoder: it takes no audio")
            return {k: v.to(self.device) for k, v in self.audio(gen.recordings, list(gen.prompt_ids)).items()}
        if not gen.images:
            return {}
        if self.pixels is None:
            raise RuntimeError("this session serves a text model: it takes no images")
        return {k: v.to(self.device) for k, v in self.pixels(gen.images, list(gen.prompt_ids)).items()}

    def _penalized(self, logits: Any, r: _Running) -> Any:
        """The repetition penalty over the prompt and the answer (as transformers' RepetitionPenaltyLogitsProcessor),
        presence and frequency penalties over the answer (as OpenAI defines them)."""
        import torch
        s = r.handle.generation.sampling
        if not s.extras():
            return logits
        if r.counts is None:
            r.counts = torch.zeros_like(logits)
        if s.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.handle.generation.prompt_ids)), dtype=torch.long, device=logits.device)
            seen = torch.cat([seen, (r.counts > 0).nonzero().flatten()]).clamp(max=logits.numel() - 1)
            picked = logits[seen]
            logits = logits.clone()
            logits[seen] = torch.where(picked > 0, picked / s.repetition_penalty, picked * s.repetition_penalty)
        if s.presence_penalty or s.frequency_penalty:
            logits = logits - s.frequency_penalty * r.counts - s.presence_penalty * (r.counts > 0).float()
        return logits

    def _constrained(self, logits: Any, r: _Running) -> Any:
        """The logits with every token the request's grammar does not allow next at -inf (ids past the
        tokenizer's vocabulary, which the model's padded embedding may have, included)."""
        import torch
        if r.grammar is None:
            if self.grammars is None:
                raise RuntimeError("this session was opened without the tokenizer's grammars")
            r.grammar = self.grammars.start(r.handle.generation.guide)
        allowed = torch.frombuffer(bytearray(r.grammar.allowed()), dtype=torch.uint8).to(logits.device) != 0
        keep = torch.zeros_like(logits, dtype=torch.bool)
        n = min(allowed.numel(), keep.numel())
        keep[:n] = allowed[:n]
        return logits.masked_fill(~keep, float("-inf"))

    def _choose(self, logits: Any, r: _Running) -> tuple[int, list[TokenLogprob] | None]:
        """The next token (greedy, or sampled from the logits as temperature, top-k, top-p and min-p leave them),
        and its log-probability under the model's distribution (after penalties and the grammar) where asked."""
        import torch

        gen = r.handle.generation
        s = gen.sampling
        if s.greedy:
            token = int(logits.argmax())
        else:
            if r.generator is None:
                r.generator = torch.Generator(device=logits.device)
                r.generator.manual_seed(s.seed if s.seed is not None else int(torch.seed() % 2**63))
            scaled = logits / s.temperature
            if s.top_k > 0:
                kth = torch.topk(scaled, min(s.top_k, scaled.numel())).values[-1]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            if s.top_p < 1.0:
                sorted_logits, order = torch.sort(scaled, descending=True)
                probs = torch.softmax(sorted_logits, -1)
                drop = probs.cumsum(-1) - probs > s.top_p     # keep the smallest set whose mass reaches top_p
                scaled[order[drop]] = float("-inf")
            if s.min_p > 0:
                probs = torch.softmax(scaled, -1)
                scaled = scaled.masked_fill(probs < s.min_p * probs.max(), float("-inf"))
            token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=r.generator))
        if gen.logprobs is None:
            return token, None
        logp = torch.log_softmax(logits, -1)
        top = torch.topk(logp, min(gen.logprobs, logp.numel())) if gen.logprobs else None
        alternatives = tuple((int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)) if top else ()
        return token, [TokenLogprob(float(logp[token]), alternatives)]

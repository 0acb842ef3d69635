"""What the server asks of a loaded model, whatever runs it: a `Session` takes generation requests from any thread
and reports each request's new token ids through its callback, from its own thread, with in-flight batching up to
the engine's max_batch_size. One session serves the HTTP server, the device's golden check and the benchmarks, so
what was validated is what is served.

    reference   PyTorch on the workstation: the quantized model the goldens were computed with (serve/reference.py)
    trtllm-0.12 tensorrt_llm.bindings.executor.Executor on the engine directory (trtllm.py)
    edgellm     tensorrt_edgellm.runtime RequestEngine on the engine directory (edgellm.py)
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import contract


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (top_k and top_p unused). top_k 0: no top-k cut. seed None: a fresh random seed.
    The rest are off at their defaults; a runtime that does not apply one is never asked with it (`extras`)."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0     # CTRL's: a seen token's logit divided (positive) or multiplied by it
    presence_penalty: float = 0.0       # OpenAI's: minus this once a token has appeared in the answer
    frequency_penalty: float = 0.0      # OpenAI's: minus this times how often it appeared in the answer
    min_p: float = 0.0                  # tokens below min_p x the top token's probability dropped

    def extras(self) -> tuple[str, ...]:
        """The request fields of the extras this sampling sets (what the runtime must apply, or the request is
        refused)."""
        return tuple(name for name, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                                            ("frequency_penalty", 0.0), ("min_p", 0.0))
                     if getattr(self, name) != off)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class Constraint:
    """What an answer must be: JSON following `schema` (response_format), or one tool call in the model's format:
    `marker` (where the format starts its calls: a control token where the tokenizer has it as one, else text), then
    `prefix`, the JSON, `suffix`. A session that constrains decoding compiles it (`Session.guide`)."""
    schema: dict[str, Any]
    marker: str = ""
    prefix: str = ""
    suffix: str = ""

    @property
    def plain(self) -> bool:
        """Only the JSON, nothing around it (what a runtime that takes a JSON schema alone can follow)."""
        return not (self.marker or self.prefix or self.suffix)


@dataclass(frozen=True)
class Generation:
    """One request as the engine takes it: the prompt as ids and as the text holding exactly those ids (runtimes
    that tokenize themselves take the text and add no special tokens), a token budget, sampling, stop ids."""
    prompt_ids: tuple[int, ...]
    prompt_text: str
    max_new_tokens: int
    sampling: Sampling
    stop_ids: tuple[int, ...]
    guide: Any = None               # a Constraint as this session compiled it (Session.guide); None: free text
    logprobs: int | None = None     # the chosen token's log-probability and this many alternatives (None: none)
    # a vision-language model's images (PNG, JPEG or WebP bytes, checked), one per run of its placeholder token in
    # prompt_ids, in order; the runtime makes their pixels as the model's processor does
    images: tuple[bytes, ...] = ()
    # a speech model's recordings (16 kHz mono 16-bit WAV bytes, checked: serve/recordings.py), one per run of its
    # placeholder token, in order; the runtime makes their features as the model's feature extractor does
    recordings: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability (as the runtime computed it; None where the runtime reported only
    alternatives it is not among), and the most likely alternatives."""
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Event:
    """New token ids of one request; `final` with the engine's reason ("stop" at a stop id, "length"), or an error
    message (the request failed; the session may still serve others)."""
    tokens: list[int]
    final: bool = False
    reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None      # one per token, where the request asked for them


Emit = Callable[[Event], None]


@dataclass(frozen=True)
class Limits:
    """What the engine was built for (the plan's build limits)."""
    max_batch_size: int
    max_input_len: int
    max_seq_len: int


@dataclass
class Handle:
    id: int
    generation: Generation
    emit: Emit
    cancelled: threading.Event = field(default_factory=threading.Event)
    last: int | None = None         # the last token id reported (a runtime that gives no finish reason)
    submitted: float = field(default_factory=time.monotonic)


class Session(ABC):
    """A loaded model serving requests. `failure` is set when the engine itself failed: no further request is
    taken and /health says so."""
    backend: str = ""
    limits: Limits
    # the request fields this runtime applies beyond temperature, top_p, top_k and seed (Sampling's extras, logprobs);
    # the server refuses the others with a 400 naming the field and the backend, never ignores them
    applies: frozenset[str] = frozenset()
    # how many recordings one request may hold where it takes them ("recordings" in applies); None: as the protocol
    recordings_per_request: int | None = None

    def __init__(self) -> None:
        self.failure: str | None = None
        self._next = 0
        self._lock = threading.Lock()

    def _handle(self, gen: Generation, emit: Emit) -> Handle:
        """A new request's handle; a failed engine takes no more requests (every session's submit asks here)."""
        if self.failure:
            raise RuntimeError(self.failure)
        with self._lock:
            self._next += 1
            return Handle(self._next, gen, emit)

    def guide(self, constraint: Constraint) -> Any:
        """The constraint as this runtime follows it (passed back as Generation.guide). ValueError: the schema cannot
        be compiled (the message says what in it); NotImplementedError: this runtime cannot follow it (why)."""
        raise NotImplementedError(f"the {self.backend} runtime here does not constrain decoding")

    def kv_stats(self) -> dict[str, int] | None:
        """The runtime's KV cache statistics at this moment, where it exposes them."""
        return None

    @abstractmethod
    def submit(self, gen: Generation, emit: Emit) -> Handle:
        """Queue a request; returns at once. `emit` is called from the session's thread, never after a final
        event."""

    @abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Stop a request (a client that went away): its slot is freed; no further event is emitted."""

    def stats(self) -> dict[str, float]:
        """What the runtime reports about itself (e.g. kv_cache_usage as a fraction); empty where it reports none."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Stop the engine's thread and release it."""


def generate_blocking(session: Session, gen: Generation, timeout: float | None = None,
                      on_tokens: Callable[[list[int]], None] | None = None) -> tuple[list[int], str]:
    """One request to the end, from a thread that may block: (ids, reason). Used by validation and benchmarks."""
    done = threading.Event()
    ids: list[int] = []
    outcome: dict[str, str | None] = {}

    def emit(ev: Event) -> None:
        ids.extend(ev.tokens)
        if ev.tokens and on_tokens is not None:
            on_tokens(ev.tokens)
        if ev.final or ev.error:
            outcome["reason"], outcome["error"] = ev.reason, ev.error
            done.set()

    handle = session.submit(gen, emit)
    if not done.wait(timeout):
        session.cancel(handle)
        raise TimeoutError(f"the {session.backend} session gave no answer within {timeout} s")
    if outcome.get("error"):
        raise RuntimeError(outcome["error"])
    return ids, outcome.get("reason") or "length"


class EngineSession(Session):
    """A session over an engine directory a backend built (SESSIONS in runtime/engines.py, by backend)."""

    @classmethod
    @abstractmethod
    def open(cls, engine_dir: Path, plan: contract.Plan, limits: Limits) -> Session:
        """Load the engine directory of a verified kit or bundle, within the plan's limits."""

    @classmethod
    def refuses(cls, _plan: contract.Plan) -> str | None:
        """Why this runtime cannot serve an engine built to this plan (asked before the engine is loaded)."""
        return None

    @classmethod
    def reported_kv_allocation(cls, _log: str, _stats: dict[str, int] | None) -> dict[str, Any] | None:
        """The paged KV cache the runtime said it allocated ({tokens, bytes, source}), read from its log and its
        own statistics; None where the runtime says nothing about it."""
        return None

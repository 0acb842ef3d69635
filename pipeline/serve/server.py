"""One served model: its session once loaded, its admission (max_batch_size running, --max-queue waiting) and its
metrics; several of them make a set (modelset.py), which loads and unloads them. The HTTP side is app.py."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.runtime.session import Event, Generation, Handle, Session
from pipeline.serve.errors import ApiError
from pipeline.serve.metrics import Metrics
from pipeline.serve.prepare import Preparer, Settings
from pipeline.serve.protocol import SamplingDefaults
from pipeline.serve.text import TextStream

if TYPE_CHECKING:
    from pipeline.serve.sources import Served

log = logging.getLogger("pipeline.serve")
LOGPROB_FLOOR = -9999.0     # what OpenAI reports for a token it would never choose
TIMED_OUT = Event([], final=True, error="--request-timeout")   # what a request's timer queues at its deadline


@dataclass
class Piece:
    """What `Server.run` yields: new text, the finish reason on the last piece, tokens so far, and the log-probability
    entries of the tokens since the last piece (chat's shape; None where not asked); on the last, the stop string that
    ended the answer, where one did."""
    text: str
    reason: str | None
    made: int
    logprobs: list[dict[str, Any]] | None = None
    stop_sequence: str | None = None


class Admission:
    """A request counted against the server's capacity from the moment it was admitted; released once."""

    def __init__(self, server: Server, session: Session):
        self.server, self.session, self.released = server, session, False
        self.started = time.monotonic()     # TTFT and the request's deadline count from here, queue time included

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.server.admitted -= 1
            self.server.last_active = time.monotonic()


class Server:
    """One served model, its session once loaded, admission and metrics."""

    def __init__(self, served: Served, settings: Settings, load: Callable[[], Session], metrics: Metrics):
        """metrics: the server's registry, whose children (labelled with this model's name) count its work."""
        self.served, self.settings, self._load = served, settings, load
        self.session: Session | None = None
        self.load_error: str | None = None
        self.slots = asyncio.Semaphore(served.limits.max_batch_size)
        self.admitted = 0           # requests admitted and not finished: running, waiting, or about to wait
        self.last_active = time.monotonic()     # the last admission or release: keep_alive counts from here
        self.defaults: SamplingDefaults = served.defaults   # what a request that omits a field gets (`load` checks)
        self.metrics = metrics.model(served.name, lambda: self.session.stats() if self.session else {},
                                     lambda: self.ready)
        self.prepare = Preparer(served, settings, self._session)

    @property
    def ready(self) -> bool:
        return self.session is not None and self.session.failure is None

    def load(self) -> None:
        """Open the session (blocking: a thread of its own); a failure is kept in load_error, never raised."""
        self.load_error = None
        try:
            self.session = self._load()
            _ = self.served.codec.max_token_chars     # computed here, not on the event loop at the first request
            d = self.defaults
            if d.repetition_penalty != 1.0 and "repetition_penalty" not in self.session.applies:
                self.defaults = SamplingDefaults(d.temperature, d.top_p, d.top_k, 1.0,
                                                 f"{d.source}; its repetition_penalty {d.repetition_penalty:g} is not "
                                                 f"applied: the {self.session.backend} runtime has none")
                log.warning("the model's repetition_penalty %g is not applied: the %s runtime has none",
                            d.repetition_penalty, self.session.backend)
            self.metrics.loads.inc()
            log.info("engine ready: %s (%s)", self.served.name, self.session.backend)
        except PipelineError as exc:
            self.load_error = exc.message
            log.error("engine failed to load: %s", exc.message)
        except Exception as exc:        # noqa: BLE001 - reported on /health and in the log, never a traceback
            self.load_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error("engine failed to load: %s", self.load_error)

    def unload(self) -> None:
        """Close the session (blocking); its memory is the runtime's to give back. Only an idle model is unloaded
        (modelset.py checks), so no request is cut off."""
        session, self.session = self.session, None
        if session is not None:
            session.close()

    def _session(self) -> Session:
        session = self.session
        if session is None or session.failure:
            raise ApiError(503, "the engine is not ready" if session is None else "the engine failed",
                           code="engine_unavailable", headers={"Retry-After": "5"})
        return session

    @property
    def capacity(self) -> int:
        """Requests admitted at once: max_batch_size running and --max-queue waiting."""
        return self.served.limits.max_batch_size + self.settings.max_queue

    def check_capacity(self) -> None:
        """A 429 now where `admit` would refuse (checked again there: the body is read in between)."""
        if self.admitted >= self.capacity:
            self.admit()        # raises its 429 with the figures

    def admit(self) -> Admission:
        """Admit a request now, counted at once (so a burst is decided before any stream starts): else 503 (not
        loaded, failed) or 429 (max_batch_size running and --max-queue waiting). Each admit is ended by `run`."""
        session = self._session()
        if self.admitted >= self.capacity:
            raise ApiError(429, f"the server is busy: {self.served.limits.max_batch_size} requests running and "
                           f"{self.admitted - self.served.limits.max_batch_size} waiting (--max-queue "
                           f"{self.settings.max_queue}); retry shortly", code="queue_full",
                           headers={"Retry-After": "1"})
        self.admitted += 1
        self.last_active = time.monotonic()
        return Admission(self, session)

    def logprob_entries(self, ev: Event, stop_ids: tuple[int, ...]) -> list[dict[str, Any]]:
        """The event's tokens' log-probabilities in chat's shape (a stop id, which the answer does not show, is
        left out)."""
        codec = self.served.codec

        def one(token: int, logprob: float | None) -> dict[str, Any]:
            text = codec.decode([token])
            if logprob is not None and not math.isfinite(logprob):
                # a token the grammar masked (-inf): OpenAI's and vLLM's floor, never -Infinity in JSON
                logprob = LOGPROB_FLOOR
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
        return [{**one(t, lp.logprob), "top_logprobs": [one(i, v) for i, v in lp.top]}
                for t, lp in zip(ev.tokens, ev.logprobs or [], strict=False) if t not in stop_ids]

    async def take_slot(self) -> None:
        """One of max_batch_size engine slots: counted as queued only where it waits; a free one is taken at once,
        without yielding to the loop. The caller releases it (self.slots)."""
        if self.slots.locked():
            self.metrics.queue.inc()
            try:
                await self.slots.acquire()
            finally:
                self.metrics.queue.dec()
        else:
            await self.slots.acquire()

    async def start(self, admission: Admission, gen: Generation) -> Started:
        """Wait for a slot, then submit: the engine works from here. A streamed request that finds a slot free
        starts before its 200 is written (the headers go out while the engine computes its first token). Submitted
        before its own bookkeeping (timer, metrics): the engine starts that much sooner, and the first token waits
        on none of it."""
        m, session = self.metrics, admission.session
        await self.take_slot()
        loop, events = asyncio.get_running_loop(), asyncio.Queue[Event]()

        def emit(ev: Event) -> None:        # from the session's thread
            loop.call_soon_threadsafe(events.put_nowait, ev)
        try:
            handle = session.submit(gen, emit)
        except BaseException as exc:
            self.slots.release()        # the admission is its callers' to release
            if isinstance(exc, RuntimeError):   # the engine's process went away since admission: /health says so
                raise ApiError(503, f"the engine failed: {exc}", code="engine_unavailable",
                               headers={"Retry-After": "5"}) from None
            raise
        m.running.inc()
        m.prompt_tokens.inc(len(gen.prompt_ids))
        # one timer for the whole request, not a wait_for per token: at the deadline it queues TIMED_OUT
        left = max(0.0, admission.started + self.settings.request_timeout - time.monotonic())
        return Started(admission, events, loop.call_later(left, events.put_nowait, TIMED_OUT), handle)

    def finish(self, started: Started) -> None:
        """End a started request once: its timer, its slot, its admission; the engine's work where it has not
        finished (the client went away, it timed out, a stop string ended it early, or its stream never began)."""
        if started.finished:
            return
        started.finished = True
        started.timer.cancel()
        if not started.done:
            started.admission.session.cancel(started.handle)
        self.metrics.running.dec()
        self.slots.release()
        started.admission.release()

    async def run(self, admission: Admission, gen: Generation, stop: tuple[str, ...],
                  keep: frozenset[int] = frozenset(), started: Started | None = None) -> AsyncGenerator[Piece, None]:
        """Run and stream one request `admit` admitted, as Pieces (the last with its finish reason); `started`: one
        `start` submitted already. `keep`: control tokens the text keeps (a tool-call marker). Its admission ends
        with it; its callers release it too, where this never started or never got a slot (release is once)."""
        m = self.metrics
        try:
            if started is None:
                started = await self.start(admission, gen)
            events, stream = started.events, TextStream(self.served.codec, gen.stop_ids, stop, keep)
            pending: list[dict[str, Any]] | None = [] if gen.logprobs is not None else None
            start = last = admission.started     # as a client sees it: the wait for a slot is part of its TTFT
            while True:
                ev = await events.get()
                if ev is TIMED_OUT:
                    raise ApiError(504, f"the request ran longer than --request-timeout "
                                   f"{self.settings.request_timeout:g} s", code="timeout")
                if ev.error:
                    raise ApiError(500, "the engine failed on this request", code="engine_error")
                now, first = time.monotonic(), not stream.ids
                if pending is not None:
                    pending += self.logprob_entries(ev, gen.stop_ids)
                delta = stream.feed(ev.tokens)
                final = bool(stream.finish_reason or ev.final)
                if final:
                    started.done = ev.final
                    delta += stream.finish(ev.reason or "length")
                try:
                    if final:
                        yield Piece(delta, stream.finish_reason, len(stream.ids), pending, stream.matched)
                    elif delta:
                        yield Piece(delta, None, len(stream.ids), pending)
                        pending = [] if pending is not None else None
                finally:        # counted once the piece is out: the client does not wait on the metrics
                    if ev.tokens:
                        if first:
                            m.ttft.observe(now - start)
                        else:
                            m.itl.observe((now - last) / len(ev.tokens))
                        last = now
                        m.completion_tokens.inc(len(ev.tokens))
                    if final:
                        m.duration.observe(now - start)
                if final:
                    return
        finally:
            if started is not None:
                self.finish(started)
            admission.release()


@dataclass
class Started:
    """A request given a slot and submitted to the session; `Server.finish` ends it, once."""
    admission: Admission
    events: asyncio.Queue[Event]
    timer: asyncio.TimerHandle
    handle: Handle
    done: bool = False          # the engine sent its final event
    finished: bool = False



"""The OpenAI-compatible HTTP server over one Session (FastAPI + uvicorn, as vLLM and trtllm-serve).

    GET  /v1/models             the one model served
    POST /v1/chat/completions   chat, rendered with the kit's chat template; streaming (SSE) or not
    POST /v1/completions        raw prompts (strings or token ids; several: batch.py); streaming or not
    POST /v1/messages           Anthropic's Messages API (anthropic.py): Claude Code, the anthropic SDK
    POST /v1/messages/count_tokens
    POST /v1/responses          OpenAI's Responses API, stateless (openai_responses.py): Codex, the Agents SDK
    GET  /health                200 ready; 503 while loading or after an engine failure
    GET  /metrics               Prometheus text format (metrics.py)
    GET|HEAD /                  200: what Claude Code probes before its first request

The APIs are front ends of one path: each parses its body into the same protocol.Request, which is prepared,
admitted, constrained, truncated and counted the same way; only the answer's shapes are the API's (an Endpoint).

Admission: at most max_batch_size requests run in the engine; up to `max_queue` more wait; past that a 429 with
Retry-After. Limits are checked before any work: a prompt longer than the engine's max_input_len, or max_tokens past
max_seq_len, is a 400 naming the limit. A client that disconnects mid-stream has its request cancelled in the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

from pipeline.errors import PipelineError
from pipeline.runtime.session import Event, Generation, Handle, Session
from pipeline.serve import anthropic, batch, openai_responses, protocol, responses
from pipeline.serve.gate import Gate, error_response
from pipeline.serve.guard import unless_gone
from pipeline.serve.metrics import Metrics
from pipeline.serve.prepare import Prepared, Preparer, Settings
from pipeline.serve.protocol import ApiError, SamplingDefaults
from pipeline.serve.text import TextStream
from pipeline.serve.toolcalls import CallStream

if TYPE_CHECKING:
    from pipeline.serve.sources import Served

log = logging.getLogger("pipeline.serve")
LOGPROB_FLOOR = -9999.0     # what OpenAI reports for a token it would never choose
BODY_BUDGET_BODIES = 4      # request bodies of the largest size held in memory at once (BodyBudget) ...
BODY_BUDGET_MIN = 64 * 2**20    # ... or this many bytes, the larger
PREPARE_WAIT_S = 10.0       # the longest a request waits for a preparation slot before a 503
TOKENIZER_THREADS = 2       # prompts rendered and tokenized at once, off the event loop
TRUNCATED_HEADER = "X-Truncated-Messages"      # chat messages dropped (oldest turns first) to fit max_input_len
CUT_HEADER = "X-Truncated-Tokens"              # tokens cut from the middle of an over-long prompt or message
CHARS_HEADER = "X-Truncated-Characters"        # characters cut before tokenizing (past what the tokenizer is given)
TOOLS_HEADER = "X-Tools-Ignored"               # why a request's tools were answered as a plain chat
TIMED_OUT = Event([], final=True, error="--request-timeout")   # what a request's timer queues at its deadline
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"  # the routes the Gate calls `generate` for
MESSAGES, RESPONSES, COUNT = "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"


@dataclass(frozen=True)
class Api:
    """One front end: how its body becomes the typed request, and the endpoint that shapes its answers."""
    parse: Callable[[dict[str, Any], SamplingDefaults], protocol.Request]
    endpoint: responses.Endpoint
    chat: bool = True       # the request is a chat (messages), not a raw prompt


APIS = {CHAT: Api(protocol.parse_chat, responses.CHAT),
        COMPLETIONS: Api(protocol.parse_completion, responses.COMPLETIONS, chat=False),
        MESSAGES: Api(anthropic.parse_messages, anthropic.MESSAGES),
        RESPONSES: Api(openai_responses.parse_responses, openai_responses.RESPONSES)}


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


class Server:
    """The served model, its session once loaded, admission and metrics."""

    def __init__(self, served: Served, settings: Settings, load: Callable[[], Session]):
        self.served, self.settings, self._load = served, settings, load
        self.session: Session | None = None
        self.load_error: str | None = None
        self.slots = asyncio.Semaphore(served.limits.max_batch_size)
        self.tokenizing = asyncio.Semaphore(TOKENIZER_THREADS)
        self.preparing = 0          # requests in a preparation slot now (/health: all of them busy is saturation)
        self.bodies = BodyBudget(max(BODY_BUDGET_BODIES * settings.max_body_bytes, BODY_BUDGET_MIN))
        self.admitted = 0           # requests admitted and not finished: running, waiting, or about to wait
        self.defaults: SamplingDefaults = served.defaults   # what a request that omits a field gets (`load` checks)
        self.metrics = Metrics(lambda: self.session.stats() if self.session else {}, lambda: self.ready)
        self.prepare = Preparer(served, settings, self._session)

    @property
    def ready(self) -> bool:
        return self.session is not None and self.session.failure is None

    def load(self) -> None:
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
            log.info("engine ready: %s (%s)", self.served.name, self.session.backend)
        except PipelineError as exc:
            self.load_error = exc.message
            log.error("engine failed to load: %s", exc.message)
        except Exception as exc:        # noqa: BLE001 - reported on /health and in the log, never a traceback
            self.load_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error("engine failed to load: %s", self.load_error)

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

    async def start(self, admission: Admission, gen: Generation) -> Started:
        """Wait for a slot, then submit: the engine works from here. A streamed request that finds a slot free
        starts before its 200 is written (the headers go out while the engine computes its first token). Submitted
        before its own bookkeeping (timer, metrics): the engine starts that much sooner, and the first token waits
        on none of it."""
        m, session = self.metrics, admission.session
        if self.slots.locked():         # counted as queued only where it waits
            m.queue.inc()
            try:
                await self.slots.acquire()
            finally:
                m.queue.dec()
        else:
            await self.slots.acquire()      # a free slot: taken at once, without yielding to the loop
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


class BodyBudget:
    """The bytes of request bodies held in memory at once, across requests: a body that would pass it is a 503 to
    retry (a few hundred slow 30 MB uploads to a vision-language server must not end in the OOM killer choosing the
    engine on an 8 GB board)."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise ApiError(503, f"the server holds {self.held} bytes of request bodies (at most {self.limit}); retry "
                           "shortly", code="bodies_over_budget", headers={"Retry-After": "2", "Connection": "close"})
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


async def _body(request, limit: int, budget: BodyBudget) -> dict[str, Any]:
    """The request's JSON body, read from the ASGI messages themselves (Starlette's stream is an async generator
    around the same reads), at most `limit` bytes, each chunk counted against the server's budget while held."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    data, receive = bytearray(), request.receive
    try:
        while True:
            message = await receive()
            if message["type"] != "http.request":   # the client left, or its body passed the deadline (guard.py)
                raise ApiError(400, "the client went away before its request body ended", code="client_disconnected")
            chunk = message.get("body", b"")
            if len(data) + len(chunk) > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
            budget.take(len(chunk))
            data += chunk
            if not message.get("more_body", False):
                return protocol.parse_json(bytes(data))
    finally:
        budget.give(len(data))


class Reply:
    """One admitted request answered through its endpoint (responses.py): whole (JSON) or streamed (SSE chunks as
    OpenAI frames them), its tool calls read in the model's format where the request offered tools."""

    def __init__(self, server: Server, req: protocol.Request, prepared: Prepared, endpoint: responses.Endpoint,
                 admission: Admission):
        self.server, self.req, self.prepared, self.ep, self.admission = server, req, prepared, endpoint, admission
        self.gen, self.fmt = prepared.generation, prepared.calls
        self.started: Started | None = None     # submitted before the stream began (`begin`)
        # a tool-call marker that is a control token stays in the text the parser reads (Mistral's [TOOL_CALLS])
        control = server.served.codec.control_tokens
        self.keep = frozenset({control[self.fmt.marker]}) if self.fmt is not None and self.fmt.marker in control \
            else frozenset()

    async def begin(self) -> None:
        """Submit a streamed request now where a slot is free (acquiring it does not wait then), so the engine
        computes its first token while the 200's headers are written; a request that must queue starts when its
        stream does, so a client that leaves while it waits costs no engine time."""
        if not self.server.slots.locked():
            self.started = await self.server.start(self.admission, self.gen)

    @functools.cached_property
    def ident(self) -> responses.Ident:
        """Made once the request is submitted: the engine does not wait on it."""
        return responses.Ident(f"{self.ep.id_prefix}{uuid.uuid4().hex}", self.server.served.name, int(time.time()),
                               self.req.echo)

    def close(self) -> None:
        """After the response, however it ended: a stream that never began (the client left first) frees what
        `begin` took."""
        if self.started is not None:
            self.server.finish(self.started)
        self.admission.release()

    def calls(self, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return found if self.req.parallel_tool_calls else found[:1]

    def usage(self, made: int) -> responses.Usage:
        return responses.Usage(len(self.gen.prompt_ids), made)

    async def collect(self) -> tuple[str, str, int, list[dict[str, Any]] | None, str | None]:
        text, reason, made, entries, stop = "", "length", 0, None, None
        async for piece in self.server.run(self.admission, self.gen, self.req.stop, self.keep):
            text += piece.text
            reason, made, stop = piece.reason or reason, piece.made, piece.stop_sequence
            if piece.logprobs is not None:
                entries = (entries or []) + piece.logprobs
        return text, reason, made, entries, stop

    async def whole(self, receive: Callable[[], Any], headers: dict[str, str]):
        """The whole answer as one JSON body; a client that leaves first has its request cancelled (499)."""
        from fastapi.responses import JSONResponse, Response
        try:        # a client that left frees its slot now (the run's finally cancels)
            done, result = await unless_gone(self.collect(), receive)
        finally:
            self.admission.release()    # where the run never started
        if not done:
            log.info("client went away: request cancelled")
            return Response(status_code=499)
        text, reason, made, entries, stop = result
        content: str | None = text
        calls = self.fmt.calls(text, self.req.tools) if self.fmt is not None else None
        if calls is not None:
            content, reason = calls[0], "tool_calls"
        elif self.prepared.forced:      # a forced call cut short (max_tokens): no call, and not text either
            content = ""
        out = responses.Output(content, reason, self.calls(calls[1]) if calls is not None else None, entries,
                               stop_sequence=stop)
        return JSONResponse(self.ep.whole(self.ident, out, self.usage(made)), headers=headers)

    async def events(self) -> AsyncGenerator[bytes, None]:
        """The SSE stream as the endpoint writes it (responses.Stream): its opening, content pieces, its closing
        (held-back text, tool calls, the finish reason, usage, the end marker); an engine failure after the 200 is
        its error event. The events one piece makes go out in one write, the last piece's with the closing: each
        write is a system call (on loopback it also delivers to the client), and a one-token answer took five."""
        req = self.req
        writer = self.ep.stream(self.ident, req.include_usage, len(self.gen.prompt_ids))
        pieces = self.server.run(self.admission, self.gen, req.stop, self.keep, self.started)
        sent = 0
        calls = CallStream(self.fmt, req.tools, self.prepared.forced) if self.fmt is not None else None
        try:
            opening = writer.opening()
            if opening:
                yield opening
            out = b""
            async for piece in pieces:
                text = calls.feed(piece.text) if calls is not None else piece.text
                out = writer.piece(responses.Output(text, piece.reason, None, piece.logprobs, sent))
                sent += len(text)
                if piece.reason:
                    rest, found = calls.finish() if calls is not None else ("", [])
                    closing = responses.Output(rest, "tool_calls" if found else piece.reason, self.calls(found),
                                               stop_sequence=piece.stop_sequence)
                    out += writer.closing(closing, self.usage(piece.made))
                elif out:
                    yield out
                    out = b""
            yield out
        except ApiError as exc:     # after the 200: the engine failed mid-answer
            yield writer.failed(exc)
        finally:
            await pieces.aclose()


def create_app(server: Server):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    class SSE(StreamingResponse):
        """A Reply's stream, which frees the Reply's slot and admission however the response ends, also where its
        body never began (StreamingResponse never starts the body of a client that left before its headers)."""

        def __init__(self, reply: Reply | batch.Closing, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.reply = reply

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.reply.close()
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=server.load, name="engine-load", daemon=True).start()
        yield
        if server.session is not None:
            server.session.close()

    app = FastAPI(title="jetson-trtllm-pipeline", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    served, settings, metrics = server.served, server.settings, server.metrics

    @app.exception_handler(ApiError)
    async def api_error(request, exc: ApiError):
        return error_response(exc, request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        code, type_ = {404: ("not_found", None), 405: ("method_not_allowed", "invalid_request_error")}.get(
            exc.status_code, (None, None))
        return error_response(ApiError(exc.status_code, str(exc.detail), code=code, type_=type_,
                                       headers=dict(exc.headers or {})), request.url.path)

    @app.exception_handler(Exception)
    async def internal(request, exc: Exception):
        return internal_error(exc, request.url.path)

    @app.get("/health")
    async def health():
        if server.ready:        # ok, with whether every preparation slot is taken (requests wait, then get 503s)
            return {"status": "ok", "preparing": server.preparing,
                    "saturated": server.preparing >= TOKENIZER_THREADS}
        state = "failed" if server.load_error or (server.session and server.session.failure) else "loading"
        return JSONResponse({"status": state}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def card() -> dict[str, Any]:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "jetson-trtllm-pipeline",
                "max_model_len": served.limits.max_seq_len, "max_batch_size": served.limits.max_batch_size,
                "sampling_defaults": server.defaults.to_dict(),
                "tool_calls": served.tool_format.name if served.tool_format and served.codec.supports_tools else None}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != served.name:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {served.name!r}", "model",
                           "model_not_found")
        return card()

    async def prepare(req: protocol.Request, chat: bool) -> Prepared:
        server.prepare.check_prompt_size(req, chat)     # before tokenizing: a huge prompt costs no tokenizer time
        if server.prepare.quick(req, chat):     # a short plain prompt: a thread hop would cost more than it
            return server.prepare.generation(req, chat)
        async with preparing():             # off the event loop, a few at a time: /health never waits on it
            return await asyncio.get_running_loop().run_in_executor(None, server.prepare.generation, req, chat)

    @asynccontextmanager
    async def preparing():
        """A preparation slot (tokenizing, images, grammars), waited for at most PREPARE_WAIT_S: slots held by slow
        work (an image host at its deadline) answer the others a 503 to retry, never a hang."""
        try:
            await asyncio.wait_for(server.tokenizing.acquire(), PREPARE_WAIT_S)
        except TimeoutError:
            raise ApiError(503, f"every request-preparation slot ({TOKENIZER_THREADS}) has been busy for "
                           f"{PREPARE_WAIT_S:g} s; retry shortly", code="preparation_busy",
                           headers={"Retry-After": "2"}) from None
        server.preparing += 1
        try:
            yield
        finally:
            server.preparing -= 1
            server.tokenizing.release()

    async def answer(request: Request, api: Api):
        server.check_capacity()         # a full queue is a 429 before the body is read, not after
        body = await _body(request, settings.max_body_bytes, server.bodies)
        req = api.parse(body, server.defaults)
        if req.batch:
            return await answer_batch(request, req)
        prepared = await prepare(req, api.chat)
        headers = notes(req, prepared)
        reply = Reply(server, req, prepared, api.endpoint, server.admit())  # a 429 or 503 now: never after a 200
        if not req.stream:
            return await reply.whole(request.receive, headers)
        try:
            await reply.begin()
        except BaseException:
            reply.close()
            raise
        return SSE(reply, reply.events(), media_type="text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})

    async def answer_batch(request: Request, req: protocol.Request):
        """A completion of several prompts (batch.py): each prepared, all admitted at once or none."""
        prepared = [await prepare(sub, False) for sub in req.batch]
        headers: dict[str, str] = {}
        for sub, p in zip(req.batch, prepared, strict=True):
            for name, value in notes(sub, p).items():
                headers[name] = str(int(headers.get(name, 0)) + int(value)) if value.isdigit() else value
        answers = [Reply(server, sub, prep, responses.COMPLETIONS, admission) for sub, prep, admission in
                   zip(req.batch, prepared, batch.admit_all(server, len(prepared)), strict=True)]
        if not req.stream:
            return await batch.whole(server, answers, request.receive, headers)
        return SSE(batch.Closing(answers), batch.events(server, req, answers), media_type="text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})

    def notes(req: protocol.Request, prepared: Prepared) -> dict[str, str]:
        """What was done to fit the request, as response headers, metrics and log lines."""
        headers = {}
        if prepared.dropped:
            headers[TRUNCATED_HEADER] = str(prepared.dropped)
            metrics.truncated.inc(prepared.dropped)
            log.info("chat of %d messages: its %d oldest dropped to fit max_input_len", len(req.messages),
                     prepared.dropped)
        if prepared.cut_chars:
            headers[CHARS_HEADER] = str(prepared.cut_chars)
            log.info("%d characters cut from the prompt before tokenizing", prepared.cut_chars)
        if prepared.cut:
            headers[CUT_HEADER] = str(prepared.cut)
            metrics.truncated_tokens.inc(prepared.cut)
            log.info("%d tokens cut from the middle of the prompt to fit max_input_len", prepared.cut)
        if prepared.tools:
            headers[TOOLS_HEADER] = prepared.tools
            log.info("%s: %s", served.name, prepared.tools)
        return headers

    # the Gate calls `generate` for a POST to these paths; FastAPI keeps them as routes, so that another method on
    # them is its typed 405 (http_error), not a 404
    for path in APIS:
        app.add_api_route(path, gate_answers, methods=["POST"])

    @app.post(COUNT)
    async def count_tokens(request: Request):
        """Anthropic's count_tokens: the prompt's tokens as the model reads it (the served model's tokenizer and
        chat template, its tools where it takes them), nothing generated."""
        req = anthropic.parse_count(await _body(request, settings.max_body_bytes, server.bodies), server.defaults)
        if req.model is not None and req.model != served.name:
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {served.name!r}",
                           "model", "model_not_found")
        # a count is of the prompt as sent: past the tokenizer's bound it is refused, not cut
        server.prepare.check_prompt_size(dataclasses.replace(req, truncate=False), True)
        async with preparing():
            n = await asyncio.get_running_loop().run_in_executor(None, server.prepare.count, req)
        return {"input_tokens": n}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root():
        """Claude Code probes HEAD / before its first request; a 200 says a server is here."""
        return {"status": "ok" if server.ready else "loading", "model": served.name}

    async def generate(scope: Any, receive: Any, send: Any) -> None:
        """A POST to one of the APIs' generation routes, called by the Gate itself: Starlette's error middleware
        and FastAPI's routing, dependency solving and exception middleware took ~0.2 ms of each request's time to
        first token on the 2-core workstation (traced hop by hop), and these routes need none of them. Errors
        are answered as the app's handlers answer them, in the API's own shape."""
        path = scope["path"]
        try:
            response = await answer(Request(scope, receive), APIS[path])
        except ApiError as exc:
            response = error_response(exc, path)
        except Exception as exc:        # noqa: BLE001 - the client gets a typed 500, the log says what failed
            response = internal_error(exc, path)
        await response(scope, receive, send)

    # outermost: every request passes the Gate's checks before any of FastAPI runs
    return Gate(app, api_key=settings.api_key, metrics=metrics, allowed_hosts=settings.allowed_hosts,
                cors_origins=settings.cors_origins, public_metrics=settings.public_metrics,
                posts=dict.fromkeys(APIS, generate))


async def gate_answers(request: Request):
    """The APIs' routes as FastAPI holds them: the Gate answers a POST to them before FastAPI runs (generate); what
    reaches FastAPI there is another method, its typed 405."""
    raise ApiError(500, f"{request.url.path} is answered by the Gate", code="internal_error")


def internal_error(exc: Exception, path: str = ""):
    """A failure of ours: logged by type and message (never a traceback for the client), a typed 500."""
    log.error("internal error: %s: %s", type(exc).__name__, str(exc)[:300])
    return error_response(ApiError(500, "internal server error", code="internal_error"), path)

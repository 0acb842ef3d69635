"""One admitted request answered through its API's endpoint (Reply), and the request body read under the server's
budget (BodyBudget): what app.py's routes do with a request once it is parsed."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from pipeline.serve import protocol, responses
from pipeline.serve.errors import ApiError
from pipeline.serve.guard import unless_gone
from pipeline.serve.prepare import Prepared
from pipeline.serve.server import Admission, Server, Started
from pipeline.serve.toolcalls import CallStream

log = logging.getLogger("pipeline.serve")


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
    """The request's JSON body (raw_body)."""
    return await raw_body(request, limit, budget, protocol.parse_json)


async def raw_body(request, limit: int, budget: BodyBudget, parse: Callable[[bytes], Any]) -> Any:
    """The request's body as `parse` makes it, read from the ASGI messages themselves (Starlette's stream is an async
    generator around the same reads), at most `limit` bytes, each chunk counted against the server's budget while
    held (parsing included)."""
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
                return parse(bytes(data))
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
        body = self.ep.whole(self.ident, out, self.usage(made))
        if isinstance(body, str):       # a plain-text answer (a transcription's response_format text)
            return Response(body, media_type="text/plain; charset=utf-8", headers=headers)
        return JSONResponse(body, headers=headers)

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

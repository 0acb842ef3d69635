"""A /v1/completions request of several prompts, as OpenAI's legacy API takes it: one choice per prompt (`index` in
the order sent), each prompt prepared, admitted and run as a request of its own (so they batch in the engine like
any other requests, and a burst past the queue is one 429 before any of them starts), the usage summed. Streamed,
each chunk is one prompt's piece with its index, as the pieces come; then the usage chunk where asked, and [DONE]."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.serve import responses
from pipeline.serve.errors import ApiError
from pipeline.serve.guard import unless_gone

if TYPE_CHECKING:
    from pipeline.serve.protocol import Request


class Admitted(Protocol):
    def release(self) -> None: ...


class Answer(Protocol):
    """One prompt's request as app.Reply holds it (the app imports this module, never the other way)."""
    admission: Any
    gen: Any
    req: Request

    async def collect(self) -> tuple[str, str, int, list[dict[str, Any]] | None, str | None]: ...

    def close(self) -> None: ...


class Host(Protocol):
    """The server as app.Server is to a batch: admission, the served model, running one request."""
    served: Any

    def admit(self) -> Any: ...

    def run(self, admission: Any, gen: Any, stop: tuple[str, ...]) -> AsyncIterator[Any]: ...


EP = responses.COMPLETIONS


def admit_all(server: Host, count: int) -> list[Any]:
    """`count` admissions, or none: a 429 (or 503) for the whole request before any prompt runs."""
    admitted: list[Any] = []
    try:
        for _ in range(count):
            admitted.append(server.admit())
    except ApiError:
        for a in admitted:
            a.release()
        raise
    return admitted


class Closing:
    """What the streamed response closes however it ends (a client gone before the body began included)."""

    def __init__(self, answers: Sequence[Answer]):
        self.answers = answers

    def close(self) -> None:
        for r in self.answers:
            r.close()


def _ident(server: Host) -> responses.Ident:
    return responses.Ident(f"{EP.id_prefix}{uuid.uuid4().hex}", server.served.name, int(time.time()))


async def whole(server: Host, answers: Sequence[Answer], receive: Callable[[], Any], headers: dict[str, str]):
    """Every prompt's answer as one body; a client that leaves first has them all cancelled (499)."""
    from fastapi.responses import JSONResponse, Response
    try:
        done, results = await unless_gone(asyncio.gather(*(r.collect() for r in answers)), receive)
    finally:
        for r in answers:
            r.admission.release()
    if not done:
        return Response(status_code=499)
    outs = [responses.Output(text, reason, None, entries, index=i)
            for i, (text, reason, _, entries, _) in enumerate(results)]
    usage = responses.Usage(sum(len(r.gen.prompt_ids) for r in answers), sum(made for _, _, made, _, _ in results))
    return JSONResponse(EP.whole_of(_ident(server), outs, usage), headers=headers)


async def events(server: Host, req: Request, answers: Sequence[Answer]) -> AsyncGenerator[bytes, None]:
    """The prompts' pieces as they come, each a chunk with its prompt's index."""
    ident, queue = _ident(server), asyncio.Queue[tuple[int, Any]]()

    async def pump(i: int, reply: Answer) -> None:
        try:
            async for piece in server.run(reply.admission, reply.gen, reply.req.stop):
                await queue.put((i, piece))
        finally:
            await queue.put((i, None))
    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(answers)]
    made, running, sent = [0] * len(answers), len(answers), [0] * len(answers)
    try:
        while running:
            i, piece = await queue.get()
            if piece is None:
                running -= 1
                continue
            made[i] = piece.made
            out = responses.Output(piece.text, piece.reason, None, piece.logprobs, sent[i], index=i)
            sent[i] += len(piece.text)
            data = responses.sse_all(EP.piece(ident, out, req.include_usage))
            if data:
                yield data
        for t in tasks:
            t.result()          # an engine failure in one of them: the error event below
        usage = responses.Usage(sum(len(r.gen.prompt_ids) for r in answers), sum(made))
        yield (responses.sse(EP.usage_chunk(ident, usage)) if req.include_usage else b"") + responses.sse("[DONE]")
    except ApiError as exc:
        yield responses.sse(exc.body())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in answers:
            r.admission.release()

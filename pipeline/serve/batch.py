"""A /v1/completions request of several prompts, as OpenAI's legacy API takes it: one choice per prompt (`index` in
the order sent), each prompt prepared, admitted and run as a request of its own (so they batch in the engine like
any other requests, and a burst past the queue is one 429 before any of them starts), the usage summed. Streamed,
each chunk is one prompt's piece with its index, as the pieces come; then the usage chunk where asked, and [DONE]."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from pipeline.serve import responses
from pipeline.serve.protocol import ApiError

if TYPE_CHECKING:
    from pipeline.serve.app import Admission, Piece, Reply, Server
    from pipeline.serve.prepare import Prepared
    from pipeline.serve.protocol import Request

EP = responses.COMPLETIONS


def admit_all(server: Server, count: int) -> list[Admission]:
    """`count` admissions, or none: a 429 (or 503) for the whole request before any prompt runs."""
    admitted: list[Admission] = []
    try:
        for _ in range(count):
            admitted.append(server.admit())
    except ApiError:
        for a in admitted:
            a.release()
        raise
    return admitted


def replies(server: Server, req: Request, prepared: list[Prepared]) -> list[Reply]:
    from pipeline.serve.app import Reply
    return [Reply(server, sub, prep, EP, admission)
            for sub, prep, admission in zip(req.batch, prepared, admit_all(server, len(prepared)), strict=True)]


class Closing:
    """What the streamed response closes however it ends (a client gone before the body began included)."""

    def __init__(self, answers: list[Reply]):
        self.answers = answers

    def close(self) -> None:
        for r in self.answers:
            r.close()


def _ident(server: Server) -> responses.Ident:
    return responses.Ident(f"{EP.id_prefix}{uuid.uuid4().hex}", server.served.name, int(time.time()))


async def whole(server: Server, answers: list[Reply], receive: Callable[[], Any], headers: dict[str, str]):
    """Every prompt's answer as one body; a client that leaves first has them all cancelled (499)."""
    from fastapi.responses import JSONResponse, Response

    from pipeline.serve.app import until_disconnect
    work = asyncio.ensure_future(asyncio.gather(*(r.collect() for r in answers)))
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, gone):
            if not task.done():
                task.cancel()
        for r in answers:
            r.admission.release()
    if not work.done() or work.cancelled():
        await asyncio.gather(work, return_exceptions=True)
        return Response(status_code=499)
    results = work.result()
    choices = [EP.choice(responses.Output(text, reason, None, entries, index=i))
               for i, (text, reason, _, entries, _) in enumerate(results)]
    usage = responses.Usage(sum(len(r.gen.prompt_ids) for r in answers), sum(made for _, _, made, _, _ in results))
    ident = _ident(server)
    return JSONResponse({"id": ident.id, "object": EP.object, "created": ident.created, "model": ident.model,
                         "choices": choices, "usage": usage.to_dict()}, headers=headers)


async def events(server: Server, req: Request, answers: list[Reply]) -> AsyncGenerator[bytes, None]:
    """The prompts' pieces as they come, each a chunk with its prompt's index."""
    ident, queue = _ident(server), asyncio.Queue[tuple[int, "Piece | None"]]()

    async def pump(i: int, reply: Reply) -> None:
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

"""The routes of /v1/audio/speech and the lists Open WebUI reads (speech.py says what they take and answer), added to
the server's app by app.py's create_app. Starlette's Request is imported at module level: FastAPI resolves a handler's
annotations in its module."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.requests import Request

from pipeline.audio import wav_header
from pipeline.serve.errors import ApiError
from pipeline.serve.guard import unless_gone
from pipeline.serve.speech import (
    MEDIA,
    MODELS,
    PROMPT_POSITIONS,
    ROUTE,
    VOICES,
    SpeechSide,
    parse,
    sse_events,
    utterance,
    voices_body,
)

log = logging.getLogger("pipeline.serve")


def add_routes(app: Any, models: Any, acquired: Callable[[Request], Awaitable[tuple[dict, Any, Any]]]) -> None:
    """POST /v1/audio/speech and the two lists Open WebUI reads, on the server's app (app.py's create_app; acquired:
    its JSON request's body, the model it names, held and loaded, as every generation route takes them)."""
    from fastapi.responses import Response, StreamingResponse

    class Closing(StreamingResponse):
        """A stream that ends its utterance however the response ends, also where its body never began."""

        def __init__(self, pcm: AsyncGenerator[bytes, None], admission: Any, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.pcm, self.admission = pcm, admission

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                await self.pcm.aclose()
                self.admission.release()

    async def speech(request: Request):
        body, member, server = await acquired(request)
        try:
            server.check_capacity()
            side = server.served.speech
            if side is None:
                raise ApiError(400, f"{server.served.name} is not a text-to-speech model", "model",
                               "unsupported_model")
            asked = parse(body, side)
            # the text is read one token a frame after a prompt of a dozen positions: it must fit the engines
            tokens = len(server.served.codec.tokenizer.encode(asked.text, add_special_tokens=False).ids)
            if tokens + PROMPT_POSITIONS > side.max_frames:
                raise ApiError(400, f"input is {tokens} tokens; the engines speak at most "
                               f"{side.max_frames - PROMPT_POSITIONS} at once (split the text)", "input",
                               "string_above_max_length")
            if models.only is not None and body.get("model") not in (None, server.served.name):
                raise ApiError(404, f"the model {str(body.get('model'))[:200]!r} does not exist; this server serves "
                               f"{server.served.name!r}", "model", "model_not_found")
            admission = server.admit()
        finally:
            models.release(member)
        pcm = utterance(server, admission, asked)
        rate = side.sample_rate
        if asked.response_format == "wav":     # the whole utterance; a client that leaves first frees the engine
            async def collect() -> bytes:
                return b"".join([piece async for piece in pcm])
            try:
                done, data = await unless_gone(collect(), request.receive)
            finally:
                await pcm.aclose()
                admission.release()
            if not done:
                log.info("client went away: speech cancelled")
                return Response(status_code=499)
            return Response(wav_header(len(data), rate) + data, media_type=MEDIA["wav"])
        try:        # the first audio before the status: a failure before it is its own status, never a broken 200
            first = await anext(pcm)
        except StopAsyncIteration:
            first = b""
        except BaseException:
            await pcm.aclose()
            admission.release()
            raise

        async def rest() -> AsyncGenerator[bytes, None]:
            if first:
                yield first
            try:
                async for piece in pcm:
                    yield piece
            except ApiError as exc:     # after the 200: the stream ends short, the log says why (SSE says it too)
                log.error("speech stream ended early: %s", exc.message)
                if asked.sse:
                    raise
        headers = {"X-Sample-Rate": str(rate), "X-Channels": "1", "X-Sample-Format": "s16le",
                   "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if asked.sse:
            return Closing(pcm, admission, sse_events(rest(), len(asked.text)), media_type="text/event-stream",
                           headers=headers)
        return Closing(pcm, admission, rest(), media_type=MEDIA["pcm"], headers=headers)

    app.add_api_route(ROUTE, speech, methods=["POST"])

    def sides() -> list[tuple[str, SpeechSide]]:
        return [(m.name, m.server.served.speech) for m in models.members.values() if m.server.served.speech]

    @app.get(VOICES)
    async def voices():
        return voices_body([s for _, s in sides()])

    @app.get(MODELS)
    async def speech_models():
        return {"models": [{"id": name} for name, _ in sides()]}

"""The OpenAI-compatible HTTP server over one model or a set of them (FastAPI + uvicorn, as vLLM and trtllm-serve).

    GET  /v1/models             the models served (a set's with their state: loaded, loading, unloaded, ...)
    POST /v1/chat/completions   chat, rendered with the kit's chat template; streaming (SSE) or not
    POST /v1/completions        raw prompts (strings or token ids; several: batch.py); streaming or not
    POST /v1/messages           Anthropic's Messages API (anthropic.py): Claude Code, the anthropic SDK
    POST /v1/messages/count_tokens
    POST /v1/responses          OpenAI's Responses API, stateless (openai_responses.py): Codex, the Agents SDK
    POST /v1/audio/transcriptions   a speech model's transcript of an uploaded recording (transcriptions.py)
    POST /v1/audio/speech       a text-to-speech model's waveform of a text (speech.py; GET /v1/audio/voices and
                                /v1/audio/models list what it speaks)
    GET  /health                200 ready; 503 while loading or after an engine failure
    GET  /metrics               Prometheus text format (metrics.py)
    GET|HEAD /                  200: what Claude Code probes before its first request
    POST /models/load           {"model": NAME}: load an on-demand model of a set now (llama.cpp's router mode)
    POST /models/unload         {"model": NAME}: unload an idle on-demand model

A request goes to the model its `model` names (modelset.py: a set loads on-demand models when asked and unloads them
when idle); each model has its own admission, queue and metrics (server.py).

The APIs are front ends of one path: each parses its body into the same protocol.Request, which is prepared,
admitted, constrained, truncated and counted the same way; only the answer's shapes are the API's (an Endpoint).

Admission: at most max_batch_size requests run in the engine; up to `max_queue` more wait; past that a 429 with
Retry-After. Limits are checked before any work: a prompt longer than the engine's max_input_len, or max_tokens past
max_seq_len, is a 400 naming the limit. A client that disconnects mid-stream has its request cancelled in the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

from pipeline.serve import (
    anthropic,
    batch,
    multipart,
    openai_responses,
    protocol,
    recordings,
    responses,
    speech,
    speech_routes,
    transcriptions,
)
from pipeline.serve.errors import ApiError
from pipeline.serve.gate import Gate, error_response
from pipeline.serve.modelset import FAILED, Member, ModelSet, keep_alive_of
from pipeline.serve.prepare import Prepared, Settings
from pipeline.serve.protocol import SamplingDefaults
from pipeline.serve.reply import BodyBudget, Reply, _body, raw_body
from pipeline.serve.server import Server

__all__ = ["Server", "Settings", "create_app"]
log = logging.getLogger("pipeline.serve")
BODY_BUDGET_BODIES = 4      # request bodies of the largest size held in memory at once (BodyBudget) ...
BODY_BUDGET_MIN = 64 * 2**20    # ... or this many bytes, the larger
PREPARE_WAIT_S = 10.0       # the longest a request waits for a preparation slot before a 503
TOKENIZER_THREADS = 2       # prompts rendered and tokenized at once, off the event loop
TRUNCATED_HEADER = "X-Truncated-Messages"      # chat messages dropped (oldest turns first) to fit max_input_len
CUT_HEADER = "X-Truncated-Tokens"              # tokens cut from the middle of an over-long prompt or message
CHARS_HEADER = "X-Truncated-Characters"        # characters cut before tokenizing (past what the tokenizer is given)
TOOLS_HEADER = "X-Tools-Ignored"               # why a request's tools were answered as a plain chat
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"  # the routes the Gate calls `generate` for
MESSAGES, RESPONSES, COUNT = "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"
LOAD, UNLOAD = "/models/load", "/models/unload"


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


class Shared:
    """What every request shares whatever its model: the preparation slots (tokenizing, images, grammars run a few
    at a time, off the event loop) and the bytes of request bodies held."""

    def __init__(self, max_body_bytes: int):
        self.tokenizing = asyncio.Semaphore(TOKENIZER_THREADS)
        self.preparing = 0          # requests in a preparation slot now (/health: all of them busy is saturation)
        self.max_body_bytes = max_body_bytes
        self.bodies = BodyBudget(max(BODY_BUDGET_BODIES * max_body_bytes, BODY_BUDGET_MIN))


def create_app(models: ModelSet):
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
        threading.Thread(target=models.load_resident, name="engine-load", daemon=True).start()
        sweeper = asyncio.create_task(models.sweep())
        yield
        sweeper.cancel()
        models.close()

    app = FastAPI(title="jetson-trtllm-pipeline", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    servers = [m.server for m in models.members.values()]
    shared = Shared(max(s.settings.max_body_bytes for s in servers))
    settings, metrics, several = servers[0].settings, models.metrics, models.only is None

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
        states = {"models": models.states(), **({"budget": models.budget, "budget_from": models.budget_said}
                                                if models.budget is not None else {})} if several else {}
        if models.ready:        # ok, with whether every preparation slot is taken (requests wait, then get 503s)
            return {"status": "ok", "preparing": shared.preparing,
                    "saturated": shared.preparing >= TOKENIZER_THREADS, **states}
        failed = any(models.state(m) == FAILED for m in models.members.values() if m.resident)
        return JSONResponse({"status": "failed" if failed else "loading", **states}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def card(member: Member) -> dict[str, Any]:
        server = member.server
        served = server.served
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "jetson-trtllm-pipeline",
                "max_model_len": served.limits.max_seq_len, "max_batch_size": served.limits.max_batch_size,
                "sampling_defaults": server.defaults.to_dict(),
                "tool_calls": served.tool_format.name if served.tool_format and served.codec.supports_tools else None,
                **({"speech": {"voices": list(served.speech.voices), "default_voice": served.speech.default_voice,
                               "sample_rate": served.speech.sample_rate, "formats": list(speech.FORMATS)}}
                   if served.speech else {}),
                **({"status": models.state(member), "residency": "resident" if member.resident else "on-demand",
                    "planned_bytes": served.planned_bytes} if several else {})}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [card(m) for m in models.members.values()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        return card(models.named(model))

    async def prepare(server: Server, req: protocol.Request, chat: bool) -> Prepared:
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
            await asyncio.wait_for(shared.tokenizing.acquire(), PREPARE_WAIT_S)
        except TimeoutError:
            raise ApiError(503, f"every request-preparation slot ({TOKENIZER_THREADS}) has been busy for "
                           f"{PREPARE_WAIT_S:g} s; retry shortly", code="preparation_busy",
                           headers={"Retry-After": "2"}) from None
        shared.preparing += 1
        try:
            yield
        finally:
            shared.preparing -= 1
            shared.tokenizing.release()

    async def acquired(request: Request) -> tuple[dict[str, Any], Member, Server]:
        """A JSON request's body, the model it names, and that model held and loaded within the request's deadline
        (a full single-model queue is a 429 before the body is read, not after). The caller releases the model
        (models.release) once the request is admitted or refused."""
        arrived = time.monotonic()
        if models.only is not None:
            models.only.check_capacity()
        body = await _body(request, shared.max_body_bytes, shared.bodies)
        member = models.pick(body.get("model"))
        keep_alive = keep_alive_of(body.pop("keep_alive", None))
        server = await models.acquire(member, keep_alive, arrived + member.server.settings.request_timeout)
        return body, member, server

    async def answer(request: Request, api: Api):
        body, member, server = await acquired(request)
        try:
            server.check_capacity()
            speaks_only(server)
            req = api.parse(body, server.defaults)
            if req.batch:
                return await answer_batch(server, request, req)
            prepared = await prepare(server, req, api.chat)
            headers = notes(server, req, prepared)
            reply = Reply(server, req, prepared, api.endpoint, server.admit())  # a 429 or 503 now: never after a 200
        finally:        # admitted (the admission keeps the model loaded from here) or refused
            models.release(member)
        if not req.stream:
            return await reply.whole(request.receive, headers)
        try:
            await reply.begin()
        except BaseException:
            reply.close()
            raise
        return SSE(reply, reply.events(), media_type="text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})

    async def answer_batch(server: Server, request: Request, req: protocol.Request):
        """A completion of several prompts (batch.py): each prepared, all admitted at once or none."""
        prepared = [await prepare(server, sub, False) for sub in req.batch]
        headers: dict[str, str] = {}
        for sub, p in zip(req.batch, prepared, strict=True):
            for name, value in notes(server, sub, p).items():
                headers[name] = str(int(headers.get(name, 0)) + int(value)) if value.isdigit() else value
        answers = [Reply(server, sub, prep, responses.COMPLETIONS, admission) for sub, prep, admission in
                   zip(req.batch, prepared, batch.admit_all(server, len(prepared)), strict=True)]
        if not req.stream:
            return await batch.whole(server, answers, request.receive, headers)
        return SSE(batch.Closing(answers), batch.events(server, req, answers), media_type="text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})

    def notes(server: Server, req: protocol.Request, prepared: Prepared) -> dict[str, str]:
        """What was done to fit the request, as response headers, metrics and log lines."""
        headers, m = {}, server.metrics
        if prepared.dropped:
            headers[TRUNCATED_HEADER] = str(prepared.dropped)
            m.truncated.inc(prepared.dropped)
            log.info("chat of %d messages: its %d oldest dropped to fit max_input_len", len(req.messages),
                     prepared.dropped)
        if prepared.cut_chars:
            headers[CHARS_HEADER] = str(prepared.cut_chars)
            log.info("%d characters cut from the prompt before tokenizing", prepared.cut_chars)
        if prepared.cut:
            headers[CUT_HEADER] = str(prepared.cut)
            m.truncated_tokens.inc(prepared.cut)
            log.info("%d tokens cut from the middle of the prompt to fit max_input_len", prepared.cut)
        if prepared.tools:
            headers[TOOLS_HEADER] = prepared.tools
            log.info("%s: %s", server.served.name, prepared.tools)
        return headers

    # the Gate calls `generate` for a POST to these paths; FastAPI keeps them as routes, so that another method on
    # them is its typed 405 (http_error), not a 404
    for path in APIS:
        app.add_api_route(path, gate_answers, methods=["POST"])

    @app.post(COUNT)
    async def count_tokens(request: Request):
        """Anthropic's count_tokens: the prompt's tokens as the model reads it (the named model's tokenizer and
        chat template, its tools where it takes them), nothing generated: no engine is loaded for it."""
        body = await _body(request, shared.max_body_bytes, shared.bodies)
        server = models.pick(body.get("model")).server
        speaks_only(server)
        req = anthropic.parse_count(body, server.defaults)
        if req.model is not None and req.model != server.served.name:     # a single model's server checks it here
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves "
                           f"{server.served.name!r}", "model", "model_not_found")
        # a count is of the prompt as sent: past the tokenizer's bound it is refused, not cut
        server.prepare.check_prompt_size(dataclasses.replace(req, truncate=False), True)
        async with preparing():
            n = await asyncio.get_running_loop().run_in_executor(None, server.prepare.count, req)
        return {"input_tokens": n}

    @app.post(transcriptions.ROUTE)
    async def transcribe(request: Request):
        """OpenAI's transcription upload, asked of a speech model as a chat with the recording (transcriptions.py):
        admitted, queued and counted as every chat is."""
        arrived = time.monotonic()
        if models.only is not None:
            models.only.check_capacity()
        form = await raw_body(request, shared.max_body_bytes, shared.bodies,
                              lambda raw: multipart.parse(raw, request.headers.get("content-type")))
        member = models.pick(transcriptions.model_of(form))
        server = await models.acquire(member, keep_alive_of(None), arrived + member.server.settings.request_timeout)
        if server.served.transcriber is not None:       # an RNN-T: the transcriber itself, no chat
            return await transcribe_recording(server, member, form)
        try:
            server.check_capacity()
            side = server.served.audio
            if side is None:
                raise ApiError(400, f"{server.served.name} is not a speech-to-text model (it has no audio encoder)",
                               "model", "unsupported_model")
            asked = transcriptions.parse(form, server.defaults, side.design)
            prepared = await prepare(server, asked.request, True)
            seconds = transcriptions.seconds_of(prepared.generation.recordings[0])
            endpoint = transcriptions.TranscriptionEndpoint(asked.response_format, seconds,
                                                            side.design.transcript_marker,
                                                            tuple(n for _, n in side.design.languages))
            reply = Reply(server, asked.request, prepared, endpoint, server.admit())
            control = server.served.codec.control_tokens    # the marker stays in the text where it is a control token
            if side.design.transcript_marker in control:
                reply.keep = reply.keep | {control[side.design.transcript_marker]}
        finally:
            models.release(member)
        return await reply.whole(request.receive, notes(server, asked.request, prepared))

    async def transcribe_recording(server: Server, member: Any, form: dict) -> Any:
        """An RNN-T's transcription (transcriptions.py parse_recording): the upload read and bounded as a chat's
        recording is (serve/recordings.py), admitted and queued as every request is, answered by its session."""
        from fastapi.responses import PlainTextResponse
        try:
            server.check_capacity()
            side = server.served.transcriber
            assert side is not None
            asked = transcriptions.parse_recording(form, side)
            async with preparing():
                wav, seconds = await asyncio.get_running_loop().run_in_executor(
                    None, recordings.canonical_wav, asked.data, side.limits(), "file")
            admission = server.admit()
        finally:
            models.release(member)
        try:
            answer = await transcriptions.transcribed(server, admission, wav, asked.slot)
        finally:
            admission.release()
        body = transcriptions.recording_answer(asked.response_format, seconds, answer, asked.language)
        return PlainTextResponse(body) if isinstance(body, str) else body

    speech_routes.add_routes(app, models, acquired)

    @app.post(LOAD)
    async def load_model(request: Request):
        """Load an on-demand model now (a resident one is loaded with the server): 200 once it is loaded."""
        body = await _body(request, shared.max_body_bytes, shared.bodies)
        member = models.named(body.get("model"))
        state = await models.load(member, keep_alive_of(body.get("keep_alive")))
        return {"success": state == "loaded", "model": member.name, "status": state}

    @app.post(UNLOAD)
    async def unload_model(request: Request):
        """Unload an idle on-demand model now."""
        member = models.named((await _body(request, shared.max_body_bytes, shared.bodies)).get("model"))
        await models.unload(member)
        return {"success": True, "model": member.name, "status": models.state(member)}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root():
        """Claude Code probes HEAD / before its first request; a 200 says a server is here."""
        return {"status": "ok" if models.ready else "loading", "model": models.default.name}

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


def speaks_only(server: Server) -> None:
    """A text-to-speech model answers /v1/audio/speech alone, an RNN-T transcriber /v1/audio/transcriptions alone: a
    chat or a prompt to either is a 400 saying so."""
    if server.served.speech is not None:
        raise ApiError(400, f"{server.served.name} is a text-to-speech model: POST its text to /v1/audio/speech",
                       "model", "unsupported_model")
    if server.served.transcriber is not None:
        raise ApiError(400, f"{server.served.name} is a speech-to-text model (an RNN-T): POST a recording to "
                       "/v1/audio/transcriptions", "model", "unsupported_model")


async def gate_answers(request: Request):
    """The APIs' routes as FastAPI holds them: the Gate answers a POST to them before FastAPI runs (generate); what
    reaches FastAPI there is another method, its typed 405."""
    raise ApiError(500, f"{request.url.path} is answered by the Gate", code="internal_error")


def internal_error(exc: Exception, path: str = ""):
    """A failure of ours: logged by type and message (never a traceback for the client), a typed 500."""
    log.error("internal error: %s: %s", type(exc).__name__, str(exc)[:300])
    return error_response(ApiError(500, "internal server error", code="internal_error"), path)

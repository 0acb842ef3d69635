"""OpenAI's /v1/audio/speech for a served text-to-speech model, with what Edge-LLM 0.11's own server adds to it (its
api_server.py audio_speech: the talker knobs at the top level of the body, voices checked against the model's).

    POST /v1/audio/speech   {"model", "input" (1..4096 characters), "voice" (a preset speaker's name, or {"id": NAME};
                            omitted or "": the model's default), "response_format" (wav, the default here, or pcm:
                            16-bit little-endian mono at 24 kHz), "stream_format" ("audio", or "sse" with pcm:
                            speech.audio.delta events then speech.audio.done), "speed" (1.0 only), the talker knobs
                            talker_temperature, talker_top_k, talker_top_p, repetition_penalty, max_audio_length
                            (codec frames), codec_chunk_frames, talker_prefill_threshold}
    GET  /v1/audio/voices   {"voices": [{"id", "name"}]}: what Open WebUI lists in its voice setting
    GET  /v1/audio/models   {"models": [{"id"}]}: the text-to-speech models served

pcm is streamed as the runtime vocodes it (each codec_chunk_frames frames); wav is the whole utterance with its
length in the header. OpenAI's default format is mp3 and it offers opus, aac and flac: this server has no encoder for
them on the board, so an unasked format is wav (which every browser and Open WebUI's read-aloud play) and an asked
encoded one is refused saying what to ask. `instructions` (a voice description) and `speed` other than 1 are refused:
Edge-LLM's runtime takes neither.

A speech request is admitted, queued and timed as every request is (server.py: max_batch_size 1 speaking, --max-queue
waiting, 429 past that, --request-timeout), its input bounded before anything runs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from pipeline.runtime.speech import KNOBS, Audio, SpeechParams, SpeechSession
from pipeline.serve.errors import ApiError

ROUTE, VOICES, MODELS = "/v1/audio/speech", "/v1/audio/voices", "/v1/audio/models"
MAX_INPUT_CHARS = 4096          # OpenAI's and Edge-LLM's bound on `input`
FORMATS = ("wav", "pcm")
ENCODED = ("mp3", "opus", "aac", "flac")
FIELDS = ("model", "input", "voice", "response_format", "stream_format", "speed", "instructions", *KNOBS)
MAX_KNOB = {"talker_top_k": 1 << 16, "max_audio_length": 1 << 16, "codec_chunk_frames": 1 << 12,
            "talker_prefill_threshold": 1 << 12, "talker_temperature": 100.0, "repetition_penalty": 100.0,
            "talker_top_p": 1.0}
MEDIA = {"wav": "audio/wav", "pcm": "audio/pcm"}
PROMPT_POSITIONS = 12       # the talker's prefill: the role, the codec opening, the speaker, pad, bos, the first token


@dataclass(frozen=True)
class SpeechSide:
    """A text-to-speech model as the server speaks it: its voices (the default first named), its waveform's rate,
    the knobs a request that omits them gets, and whether it decodes greedily only (the reference)."""
    voices: tuple[str, ...]
    default_voice: str
    sample_rate: int
    defaults: SpeechParams
    max_frames: int             # the longest utterance its engines were built for, in codec frames
    greedy_only: bool = False


@dataclass(frozen=True)
class Speech:
    """A speech request as its body gave it, checked."""
    text: str
    params: SpeechParams
    response_format: str
    sse: bool


def parse(body: dict[str, Any], side: SpeechSide) -> Speech:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:40]!r} (this endpoint takes {', '.join(FIELDS)})",
                       unknown[0][:40], "unknown_parameter")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "input must be the text to speak (a non-empty string)", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise ApiError(400, f"input is {len(text)} characters; at most {MAX_INPUT_CHARS} are spoken at once (split "
                       "the text)", "input", "string_above_max_length")
    fmt = body.get("response_format", "wav")
    if fmt in ENCODED:
        raise ApiError(400, f"response_format {fmt!r} needs an audio encoder this server does not run: ask wav or "
                       "pcm (16-bit mono at 24 kHz)", "response_format", "unsupported_value")
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise ApiError(400, "stream_format must be \"audio\" or \"sse\"", "stream_format")
    if stream_format == "sse" and fmt != "pcm":
        raise ApiError(400, "stream_format \"sse\" sends pcm deltas: ask response_format \"pcm\"", "stream_format",
                       "unsupported_value")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed != 1.0:
        raise ApiError(400, "speed: only 1.0 is served (the model has no speaking-rate control)", "speed",
                       "unsupported_value")
    if body.get("instructions"):
        raise ApiError(400, "instructions: Edge-LLM's TTS runtime takes no voice description; choose a voice",
                       "instructions", "unsupported_value")
    params = replace(side.defaults, voice=_voice(body.get("voice"), side), **_knobs(body))
    if params.max_audio_length > side.max_frames:
        raise ApiError(400, f"max_audio_length {params.max_audio_length} is past the {side.max_frames} frames the "
                       "engines were built for", "max_audio_length")
    if side.greedy_only and not params.greedy:
        raise ApiError(400, "the reference backend decodes greedily only (it exists to be exact): ask talker_top_k "
                       "1, or serve the board's bundle", "talker_top_k", "unsupported_value")
    return Speech(text, params, fmt, stream_format == "sse")


def _voice(value: Any, side: SpeechSide) -> str:
    if isinstance(value, dict):         # OpenAI's custom-voice object
        value = value.get("id")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ApiError(400, "voice must be a voice's name", "voice")
    if value not in side.voices:
        raise ApiError(400, f"voice {value[:40]!r} is not one of this model's: {', '.join(side.voices)}", "voice",
                       "unsupported_value")
    return value


def _knobs(body: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, (kind, least) in KNOBS.items():
        if name not in body:
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)) or \
                not math.isfinite(value):
            raise ApiError(400, f"{name} must be {'an integer' if kind is int else 'a number'}", name)
        if not least <= value <= MAX_KNOB[name]:
            raise ApiError(400, f"{name} must be within {least} and {MAX_KNOB[name]:g}", name)
        out[name] = kind(value)
    return out


def voices_body(sides: list[SpeechSide]) -> dict[str, Any]:
    names = sorted({v for s in sides for v in s.voices})
    return {"voices": [{"id": v, "name": v} for v in names]}


async def utterance(server: Any, admission: Any, speech: Speech) -> AsyncGenerator[bytes, None]:
    """One admitted utterance's PCM as the session makes it: a slot (max_batch_size speaking), the request's deadline
    (--request-timeout from admission), the engine's work cancelled however the caller stops reading."""
    session: SpeechSession = admission.session
    m = server.metrics
    await server.take_slot()
    loop, pieces = asyncio.get_running_loop(), asyncio.Queue[Audio | None]()
    handle = None
    done = False
    try:

        def emit(piece: Audio) -> None:         # from the session's thread
            loop.call_soon_threadsafe(pieces.put_nowait, piece)
        handle = session.speak(speech.text, speech.params, emit)
        m.running.inc()
        timer = loop.call_later(max(0.0, admission.started + server.settings.request_timeout - time.monotonic()),
                                pieces.put_nowait, None)
        first = True
        try:
            while True:
                piece = await pieces.get()
                if piece is None:
                    raise ApiError(504, f"the request ran longer than --request-timeout "
                                   f"{server.settings.request_timeout:g} s", code="timeout")
                if piece.error:
                    raise ApiError(500, f"the engine failed on this request: {piece.error[:200]}",
                                   code="engine_error")
                if first and piece.pcm:
                    m.ttft.observe(time.monotonic() - admission.started)
                    first = False
                if piece.pcm:
                    yield piece.pcm
                if piece.final:
                    done = True
                    m.duration.observe(time.monotonic() - admission.started)
                    return
        finally:
            timer.cancel()
            m.running.dec()
    except RuntimeError as exc:         # a failed session takes no request
        raise ApiError(503, f"the engine failed: {exc}", code="engine_unavailable",
                       headers={"Retry-After": "5"}) from None
    finally:
        if handle is not None and not done:
            session.cancel(handle)
        server.slots.release()
        admission.release()


def sse_events(pcm: AsyncGenerator[bytes, None], chars: int) -> AsyncGenerator[bytes, None]:
    """OpenAI's speech SSE: speech.audio.delta per piece (base64 pcm), then speech.audio.done with its usage (the
    input's characters as its input figure, the samples' 24 kHz seconds as its output figure: no tokens here)."""
    async def events() -> AsyncGenerator[bytes, None]:
        samples = 0
        try:
            async for piece in pcm:
                samples += len(piece) // 2
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode("ascii")})
        except ApiError as exc:
            yield _event({"type": "error", "error": exc.body()["error"]})
            return
        yield _event({"type": "speech.audio.done", "usage": {"input_tokens": chars, "output_tokens": samples,
                                                             "total_tokens": chars + samples}})
    return events()


def _event(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


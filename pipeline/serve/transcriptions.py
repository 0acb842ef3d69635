"""OpenAI's /v1/audio/transcriptions for a served speech-to-text model: a multipart upload asked as Edge-LLM 0.11's own
transcription server asks Qwen3-ASR (experimental/server/api/serving_audio.py): the language, where given, as its
English name in a system turn; the user turn holds the recording, then the request's `prompt` where given; greedy
unless `temperature` says otherwise. The answer reads "language NAME<asr_text>TRANSCRIPT": the transcript is what
follows the marker, the language what precedes it.

    form fields       file (required: WAV at 16 kHz as is; other containers or rates through ffmpeg,
                      serve/transcode.py), model, prompt, language (ISO 639, one of the model's), temperature (0..2),
                      response_format: json (default) {"text", "usage"}, text (the transcript alone, text/plain),
                      verbose_json {"task", "language", "duration", "text", "usage"} (no segments: the model gives
                      none; srt and vtt, which need them, are refused), stream (false only)

It is a chat underneath (the same preparation, admission, queue, metrics and limits as /v1/chat/completions), so a
recording longer than the audio engine's profile, or whose tokens do not fit max_input_len, is the same 400.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pipeline.serve import multipart, protocol, responses
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import SamplingDefaults

ROUTE = "/v1/audio/transcriptions"
FORMATS = ("json", "text", "verbose_json")
TIMED = ("srt", "vtt")
FIELDS = ("file", "model", "prompt", "language", "temperature", "response_format", "stream",
          "timestamp_granularities[]", "chunking_strategy", "include[]")


@dataclass(frozen=True)
class Transcription:
    """A transcription request as the form gave it, checked."""
    request: protocol.Request
    response_format: str
    language: str | None


def model_of(form: dict[str, list[multipart.Part]]) -> str | None:
    """The model the form names (which of a set's models answers), before the rest is read."""
    parts = form.get("model")
    return parts[-1].text() if parts else None


def upload(form: dict[str, list[multipart.Part]]) -> tuple[multipart.Part, dict[str, str]]:
    """(the recording's part, the other fields' last values) of a transcription form: only this endpoint's fields,
    exactly one file with a filename."""
    unknown = sorted(set(form) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown form field {unknown[0][:40]!r} (this endpoint takes {', '.join(FIELDS)})",
                       unknown[0][:40], "unknown_parameter")
    files = form.get("file") or []
    if len(files) != 1 or files[0].filename is None:
        raise ApiError(400, "the form needs exactly one `file` part with a filename (the recording)", "file",
                       "missing_file")
    return files[0], {name: parts[-1].text() for name, parts in form.items()
                      if name != "file" and not name.endswith("[]")}


def parse(form: dict[str, list[multipart.Part]], defaults: SamplingDefaults, design) -> Transcription:
    """A transcription form as the chat the model is asked (design: the served model's audio encoder design, which
    says where the language and the prompt go: families/audio.py)."""
    languages = dict(design.languages)
    part, field = upload(form)
    if not part.data:
        raise ApiError(400, "file: the audio is empty", "file", "invalid_audio")
    fmt = field.get("response_format", "json") or "json"
    if fmt in TIMED:
        raise ApiError(400, f"response_format {fmt!r} needs timestamped segments, which this model does not give: "
                       "ask json, text or verbose_json", "response_format", "unsupported_value")
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    if field.get("stream", "false").lower() not in ("false", "0", ""):
        raise ApiError(400, "stream: streamed transcription is not served; ask for the whole transcript", "stream",
                       "unsupported_value")
    language = (field.get("language") or "").strip().lower() or None
    if language is not None and language not in languages:
        raise ApiError(400, f"language {language[:20]!r} is not one this model transcribes (ISO 639 codes: "
                       f"{', '.join(sorted(languages))})", "language", "unsupported_value")
    # the chat Edge-LLM's server asks (the recording as an input_audio part, base64 as a chat carries it): one path
    # through parsing, preparation and admission for both APIs
    audio = {"data": base64.b64encode(part.data).decode("ascii"),
             "format": ((part.filename or "").rsplit(".", 1)[-1].lower() or "wav")[:16]}
    content: list[dict[str, Any]] = [{"type": "input_audio", "input_audio": audio}]
    named = languages[language] if language else None
    text = design.transcription_text(named, field.get("prompt") or None)
    if text:
        content.append({"type": "text", "text": text})
    system = design.transcription_system(named)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    chat: dict[str, Any] = {"messages": messages, "temperature": _number(field.get("temperature", "0"),
                                                                        "temperature")}
    if "model" in field:
        chat["model"] = field["model"]
    req = protocol.parse_chat(chat, defaults)
    return Transcription(dataclasses.replace(req, recordings=tuple(
        dataclasses.replace(r, param="file") for r in req.recordings)), fmt, language)


def _number(value: str, name: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise ApiError(400, f"{name} must be a number", name) from None
    if not 0.0 <= v <= 2.0:
        raise ApiError(400, f"{name} must be within 0 and 2", name)
    return v


def seconds_of(wav: bytes) -> float:
    """A canonical recording's length (serve/recordings.py hands the engine 16 kHz mono 16-bit WAV)."""
    from pipeline.audio import read_wav
    return read_wav(wav).seconds


def split(answer: str, marker: str, names: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """(the language the model named, the transcript) of an answer in Qwen3-ASR's format (transcripts.py)."""
    from pipeline.transcripts import answer_transcript
    return answer_transcript(answer, marker, names)


class TranscriptionEndpoint(responses.Endpoint):
    """The whole answer in the form response_format asks (a stream is refused at parse)."""
    id_prefix = "transcription-"

    def __init__(self, fmt: str, seconds: float, marker: str, names: tuple[str, ...] = ()):
        self.fmt, self.seconds, self.marker, self.names = fmt, seconds, marker, names

    def whole(self, ident: responses.Ident, out: responses.Output,  # noqa: ARG002 - the Endpoint's signature
              usage: responses.Usage) -> Any:  # noqa: ARG002
        language, text = split(out.text or "", self.marker, self.names)
        used = {"type": "duration", "seconds": math.ceil(self.seconds)}
        if self.fmt == "text":
            return text
        if self.fmt == "verbose_json":
            return {"task": "transcribe", "language": language or "", "duration": round(self.seconds, 3),
                    "text": text, "usage": used}
        return {"text": text, "usage": used}

    def stream(self, ident: responses.Ident, include_usage: bool,  # noqa: ARG002 - the Endpoint's signature
               prompt_tokens: int) -> responses.Stream:  # noqa: ARG002
        raise ApiError(400, "stream: streamed transcription is not served", "stream", "unsupported_value")


# ------------------------------------------------------------------------------------------------ an RNN-T's answers
@dataclass(frozen=True)
class TranscriberSide:
    """What a served RNN-T transcriber (Nemotron-3.5-ASR) takes: its prompt dictionary (language or locale,
    lower-cased -> prompt slot; `auto`: the model names the language) and the longest recording its encoder engine
    takes. Its requests go to the transcriber itself, not through a chat (it has no language model)."""
    prompts: dict[str, int]
    max_seconds: int
    min_seconds: float          # the encoder engine's least profile (shorter: its runtime refuses it)

    def limits(self):
        from pipeline.audio import AudioLimits
        return AudioLimits(max_seconds=float(self.max_seconds), min_seconds=self.min_seconds)


@dataclass(frozen=True)
class RecordingAsked:
    """An RNN-T transcription request, checked: the recording as uploaded, the prompt slot, the answer's form."""
    data: bytes
    slot: int
    language: str | None
    response_format: str


def parse_recording(form: dict[str, list[multipart.Part]], side: TranscriberSide) -> RecordingAsked:
    """The form as Edge-LLM's own Nemotron-3.5-ASR server takes it: a recording, the language (a key of the model's
    prompt dictionary: `en`, `en-US`, `auto`; none: auto), greedy only (a temperature other than 0 is refused, as a
    text `prompt` is: the model takes none), json, text or verbose_json."""
    part, field = upload(form)
    fmt = field.get("response_format", "json") or "json"
    if fmt in TIMED or fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)} (this model gives no timestamped "
                       "segments)", "response_format", "unsupported_value")
    if field.get("stream", "false").lower() not in ("false", "0", ""):
        raise ApiError(400, "stream: streamed transcription is not served; ask for the whole transcript", "stream",
                       "unsupported_value")
    if field.get("prompt"):
        raise ApiError(400, "prompt: this model (an RNN-T) takes no text prompt", "prompt", "unsupported_value")
    if _number(field.get("temperature", "0") or "0", "temperature") != 0.0:
        raise ApiError(400, "temperature: this model decodes greedily (an RNN-T): ask with temperature 0",
                       "temperature", "unsupported_value")
    language = (field.get("language") or "").strip().lower() or None
    slot = side.prompts.get(language or "auto")
    if slot is None:
        named = ", ".join(sorted(k for k in side.prompts if "-" not in k)[:40])
        raise ApiError(400, f"language {str(language)[:20]!r} is not one this model is prompted with ({named}, or "
                       "a locale such as en-US; none: auto)", "language", "unsupported_value")
    return RecordingAsked(part.data, slot, language, fmt)


def recording_answer(fmt: str, seconds: float, answer: str, asked_language: str | None) -> Any:
    """The runtime's answer in the form asked: its language tag taken out (the language verbose_json names)."""
    from pipeline.transcripts import tagged_transcript
    named, text = tagged_transcript(answer)
    used = {"type": "duration", "seconds": math.ceil(seconds)}
    if fmt == "text":
        return text
    if fmt == "verbose_json":
        return {"task": "transcribe", "language": named or asked_language or "", "duration": round(seconds, 3),
                "text": text, "usage": used}
    return {"text": text, "usage": used}


async def transcribed(server: Any, admission: Any, wav: bytes, slot: int) -> str:
    """One admitted recording's answer from the server's TranscriberSession: an engine slot, the request's deadline
    (--request-timeout from admission), its answer dropped however the caller stops waiting."""
    import asyncio
    import time
    session = admission.session
    m = server.metrics
    await server.take_slot()
    loop = asyncio.get_running_loop()
    answered: asyncio.Future = loop.create_future()

    def answer(text: str | None, error: str | None) -> None:
        if not answered.done():
            answered.set_result((text, error))

    def done(text: str | None, error: str | None) -> None:         # from the session's thread
        loop.call_soon_threadsafe(answer, text, error)
    handle = None
    m.running.inc()
    try:
        handle = session.transcribe(wav, slot, done)
        left = max(0.0, admission.started + server.settings.request_timeout - time.monotonic())
        try:
            text, error = await asyncio.wait_for(asyncio.shield(answered), left)
        except TimeoutError:
            raise ApiError(504, f"the request ran longer than --request-timeout {server.settings.request_timeout:g} "
                           "s", code="timeout") from None
        if error is not None:
            raise ApiError(500, f"the engine failed on this request: {error[:200]}", code="engine_error")
        m.duration.observe(time.monotonic() - admission.started)
        return text or ""
    except RuntimeError as exc:         # a failed session takes no request
        raise ApiError(503, f"the engine failed: {exc}", code="engine_unavailable",
                       headers={"Retry-After": "5"}) from None
    finally:
        m.running.dec()
        if handle is not None and not answered.done():
            session.cancel(handle)
        server.slots.release()

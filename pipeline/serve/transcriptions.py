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
from pipeline.serve.protocol import ApiError, SamplingDefaults

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


def parse(form: dict[str, list[multipart.Part]], defaults: SamplingDefaults,
          languages: dict[str, str]) -> Transcription:
    unknown = sorted(set(form) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown form field {unknown[0][:40]!r} (this endpoint takes {', '.join(FIELDS)})",
                       unknown[0][:40], "unknown_parameter")
    files = form.get("file") or []
    if len(files) != 1 or files[0].filename is None:
        raise ApiError(400, "the form needs exactly one `file` part with a filename (the recording)", "file",
                       "missing_file")
    if not files[0].data:
        raise ApiError(400, "file: the audio is empty", "file", "invalid_audio")
    field = {name: parts[-1].text() for name, parts in form.items() if name != "file" and not name.endswith("[]")}
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
    audio = {"data": base64.b64encode(files[0].data).decode("ascii"),
             "format": (files[0].filename.rsplit(".", 1)[-1].lower() or "wav")[:16]}
    content: list[dict[str, Any]] = [{"type": "input_audio", "input_audio": audio}]
    if field.get("prompt"):
        content.append({"type": "text", "text": field["prompt"]})
    messages = ([{"role": "system", "content": languages[language]}] if language else []) + \
        [{"role": "user", "content": content}]
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

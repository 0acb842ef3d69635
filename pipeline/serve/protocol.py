"""OpenAI's wire format: request bodies parsed into typed requests (every refusal an `ApiError` in OpenAI's error
shape, raised before any work), and the response and stream-chunk objects clients read.

Refused with a 400 that names the parameter, rather than ignored: what the engines cannot do (n > 1, logprobs, tools,
structured output, penalties, logit_bias, echo, suffix, best_of). Unknown keys are ignored, as OpenAI does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pipeline.runtime.session import Sampling

UNSUPPORTED = {
    "logprobs": "log-probabilities are not returned by this server",
    "top_logprobs": "log-probabilities are not returned by this server",
    "tools": "tool calling is not supported by this server",
    "tool_choice": "tool calling is not supported by this server",
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
    "logit_bias": "logit_bias is not supported by the engine runtimes this server drives",
    "presence_penalty": "penalties are not supported by this server",
    "frequency_penalty": "penalties are not supported by this server",
    "echo": "echo is not supported by this server",
    "suffix": "suffix is not supported by this server",
    "best_of": "best_of is not supported by this server",
}
MAX_STOP = 4                # OpenAI's own limit on stop sequences
MAX_STOP_CHARS = 256
SEED_MAX = 2**63 - 1
MIN_TEMPERATURE = 1e-5      # below this, sampling is greedy (as vLLM): logits / 1e-320 is inf, not a distribution


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                              404: "not_found_error", 413: "invalid_request_error", 415: "invalid_request_error",
                              429: "rate_limit_error"}.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


@dataclass(frozen=True)
class Request:
    """A chat or completion request, checked. `messages` for chat, `prompt` for a completion."""
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    messages: tuple[dict[str, str], ...] = ()
    prompt: str | None = None


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise _bad("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise _bad(f"{name} must be a number from {lo} to {hi}, not {str(v)[:40]}", name)
    return float(v)


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise _bad(f"{name} must be an integer{f' from {lo}' if hi is None else f' from {lo} to {hi}'}, "
                   f"not {str(v)[:40]}", name)
    return v


def text(value: str, param: str) -> str:
    """A string the tokenizer can take: JSON's \\ud800 escapes decode to lone surrogates, which UTF-8 cannot
    hold (a 400 naming the parameter, not a tokenizer error)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(f"{param}: text with a lone surrogate (U+{ord(value[exc.start]):04X} at character {exc.start}) "
                   "cannot be encoded as UTF-8", param, "invalid_text") from None
    return value


def _text_content(content: Any, at: str) -> str:
    """A message's content: a string, or a list of text parts (what the openai client sends for typed content)."""
    if isinstance(content, str):
        return text(content, f"{at}.content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{at}.content[{j}]: only text parts are supported", f"{at}.content")
            parts.append(text(part["text"], f"{at}.content[{j}].text"))
        return "".join(parts)
    raise _bad(f"{at}.content must be a string or a list of text parts", f"{at}.content")


def _common(body: dict) -> dict[str, Any]:
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, False, 0, [], {}):
            raise _bad(f"{name}: {why}", name, "unsupported_parameter")
    n = _int(body, "n", 1)
    if n is not None and n != 1:
        raise _bad("n must be 1: the engine generates one answer per request (send several requests)", "n",
                   "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad("response_format: only {\"type\": \"text\"} is supported", "response_format",
                   "unsupported_parameter")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise _bad("stream_options is only allowed with stream: true, as an object", "stream_options")
    include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else () if stop is None \
        else None
    if stops is None or len(stops) > MAX_STOP or \
            not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise _bad(f"stop must be a string or a list of at most {MAX_STOP} non-empty strings of at most "
                   f"{MAX_STOP_CHARS} characters", "stop")
    stops = tuple(text(s, "stop") for s in stops)
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    sampling = Sampling(temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,
                        top_p=_number(body, "top_p", 0.0, 1.0, 1.0), top_k=_int(body, "top_k", 0, 2**31 - 1) or 0,
                        seed=_int(body, "seed", 0, SEED_MAX))
    if sampling.top_p == 0.0:
        raise _bad("top_p must be greater than 0", "top_p")
    return {"model": model, "stream": stream, "include_usage": include_usage, "max_tokens": max_tokens,
            "sampling": sampling, "stop": stops}


def parse_chat(body: dict[str, Any]) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}]: each message needs a role of system, user or assistant", "messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _text_content(m.get("content", ""), f"messages[{i}]")})
    return Request(messages=tuple(out), **_common(body))


def parse_completion(body: dict[str, Any]) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt must be one string (send several requests for several prompts)", "prompt")
    return Request(prompt=text(prompt, "prompt"), **_common(body))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(chat: bool, rid: str, model: str, created: int, text: str, reason: str,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(chat: bool, rid: str, model: str, created: int, text: str | None, reason: str | None,
               include_usage: bool, first: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": created, "model": model, "choices": [choice]}
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(chat: bool, rid: str, model: str, created: int, prompt: int, completion: int) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage(prompt, completion)}


def sse(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def now() -> int:
    return int(time.time())

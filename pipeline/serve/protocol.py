"""OpenAI's wire format: request bodies parsed into typed requests (every refusal an `ApiError` (errors.py) in
OpenAI's error shape, raised before any work), and the response and stream-chunk objects clients read.

Refused with a 400 that names the parameter, rather than ignored: what no engine here does (n > 1, logit_bias,
echo, suffix, best_of). Penalties, min_p and logprobs are parsed into the request; a backend that does not apply one
refuses it by name (app.py, from Session.applies). `response_format` (json_object, json_schema) is the schema the
answer is constrained to (or a peer server's way of saying it), and other servers' extensions are honoured or refused
by name (answer_format.py); other unknown keys are ignored. `tools`, `tool_choice` and
`parallel_tool_calls` are checked here; what the server does with them is the application's (app.py, toolcalls.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pipeline.runtime.session import Sampling
from pipeline.serve.answer_format import peer_schema, refuse_peer_extensions
from pipeline.serve.errors import bad_request as _bad

UNSUPPORTED = {
    "functions": "the legacy `functions` are not supported: send `tools`",
    "function_call": "the legacy `function_call` is not supported: send `tool_choice`",
    "logit_bias": "logit_bias is not supported by the engine runtimes this server drives",
    "echo": "echo is not supported by this server",
    "suffix": "suffix is not supported by this server",
    "best_of": "best_of is not supported by this server",
}
MAX_TOP_LOGPROBS = 20       # OpenAI's own limit (chat); completions' `logprobs` at most 5
MAX_STOP = 4                # OpenAI's own limit on stop sequences
MAX_STOP_CHARS = 256
SEED_MAX = 2**63 - 1
MIN_TEMPERATURE = 1e-5      # below this, sampling is greedy (as vLLM): logits / 1e-320 is inf, not a distribution


@dataclass(frozen=True)
class Request:
    """A chat or completion request, checked. `messages` for chat, `prompt` for a completion."""
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    schema: dict[str, Any] | None = None   # response_format's JSON schema: the answer is constrained to it
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"           # auto | none | required | the name of one function
    parallel_tool_calls: bool = True
    logprobs: int | None = None         # None: none; n: the chosen token's and the n most likely alternatives
    images: tuple[ImagePart, ...] = ()  # the chat's image_url parts, in order (each a {"type": "image"} part)
    recordings: tuple[AudioPart, ...] = ()  # its input_audio parts, in order (each an {"type": "audio"} part)
    prompt_ids: tuple[int, ...] | None = None   # a completion's prompt given as token ids
    truncate: bool = True               # the request lets an over-long prompt be cut to fit (else a 400)
    echo: dict[str, Any] | None = None  # what the API's answer repeats of its request (the Responses object)
    ignored: str | None = None          # what of the request was not used, and why (a response header says it)
    batch: tuple[Request, ...] = ()     # a completion of several prompts: one request per prompt, answered together



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


MAX_JSON_DEPTH = 64         # nesting of a schema or of a tool call's arguments (OpenAI's schemas stop at 10 objects)


def json_value(value: Any, param: str) -> Any:
    """A schema or a tool call's arguments, checked before anything compiles or renders it: nested at most
    MAX_JSON_DEPTH deep (deeper is a RecursionError somewhere downstream), every key and string UTF-8 (no lone
    surrogate); a 400 naming the parameter, else the value as it was."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH and isinstance(v, (dict, list)):
            raise _bad(f"{param} is nested more than {MAX_JSON_DEPTH} levels deep", param, "invalid_schema")
        if isinstance(v, dict):
            for k, x in v.items():
                text(str(k), param)
                stack.append((x, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, str):
            text(v, param)
    return value


@dataclass(frozen=True)
class ImagePart:
    """An `image_url` part as the request holds it: its URL and the parameter that names it in an error."""
    url: str
    param: str


@dataclass(frozen=True)
class AudioPart:
    """An `input_audio` part as the request holds it: its base64 data, its declared format, and the parameter that
    names it in an error (serve/recordings.py decodes and checks it)."""
    data: str
    format: str
    param: str


MAX_IMAGE_PARTS = 16        # per request; each is bounded in bytes and tokens too (serve/images.py)
MAX_AUDIO_PARTS = 4         # per request; each is bounded in bytes, seconds and tokens too (serve/recordings.py)


def _content(content: Any, at: str, media: list[ImagePart | AudioPart]) -> str | list[dict[str, Any]]:
    """A message's content: a string, or a list of text parts (what the openai client sends for typed content),
    joined; with `image_url` or `input_audio` parts, the parts as the chat template takes them ({"type": "image"} or
    {"type": "audio"} where each goes, the goldens' shape), each image's URL or recording added to `media` in
    order."""
    if isinstance(content, str):
        return text(content, f"{at}.content")
    if not isinstance(content, list):
        raise _bad(f"{at}.content must be a string or a list of text, image_url and input_audio parts",
                   f"{at}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": text(part["text"], f"{at}.content[{j}].text")})
        elif kind == "image_url":
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref       # {"url": ...}, or the URL alone
            if not isinstance(url, str) or not url:
                raise _bad(f"{at}.content[{j}].image_url must be {{\"url\": \"data:image/png;base64,...\"}}",
                           f"{at}.content[{j}].image_url")
            if sum(isinstance(m, ImagePart) for m in media) == MAX_IMAGE_PARTS:
                raise _bad(f"{at}.content[{j}]: at most {MAX_IMAGE_PARTS} images per request",
                           f"{at}.content[{j}]")
            media.append(ImagePart(url, f"{at}.content[{j}].image_url"))
            parts.append({"type": "image"})
        elif kind == "input_audio":
            ref = part.get("input_audio")
            data, fmt = (ref.get("data"), ref.get("format")) if isinstance(ref, dict) else (None, None)
            if not isinstance(data, str) or not data or not isinstance(fmt, str) or not 0 < len(fmt) <= 16:
                raise _bad(f"{at}.content[{j}].input_audio must be {{\"data\": \"<base64>\", \"format\": \"wav\"}}",
                           f"{at}.content[{j}].input_audio")
            if sum(isinstance(m, AudioPart) for m in media) == MAX_AUDIO_PARTS:
                raise _bad(f"{at}.content[{j}]: at most {MAX_AUDIO_PARTS} recordings per request",
                           f"{at}.content[{j}]")
            media.append(AudioPart(data, fmt.lower(), f"{at}.content[{j}].input_audio"))
            parts.append({"type": "audio"})
        else:
            raise _bad(f"{at}.content[{j}]: only text, image_url and input_audio parts are supported",
                       f"{at}.content")
    if any(p["type"] in ("image", "audio") for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def content_chars(content: str | list[dict[str, Any]]) -> int:
    """The characters of a message's text (its image parts counted apart, in tokens)."""
    return len(content) if isinstance(content, str) else sum(len(p.get("text", "")) for p in content)


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that omits a sampling field gets: the model's generation_config.json where it says, else
    OpenAI's defaults (temperature 1, top_p 1, no top-k)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    source: str = "OpenAI's defaults"

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "repetition_penalty": self.repetition_penalty, "source": self.source}


OPENAI_DEFAULTS = SamplingDefaults()


def _common(body: dict, defaults: SamplingDefaults) -> dict[str, Any]:
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, False, 0, [], {}):
            raise _bad(f"{name}: {why}", name, "unsupported_parameter")
    refuse_peer_extensions(body)
    n = _int(body, "n", 1)
    if n is not None and n != 1:
        raise _bad("n must be 1: the engine generates one answer per request (send several requests)", "n",
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
    temperature = _number(body, "temperature", 0.0, 2.0, defaults.temperature)
    top_k = _int(body, "top_k", 0, 2**31 - 1)
    sampling = Sampling(temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,
                        top_p=_number(body, "top_p", 0.0, 1.0, defaults.top_p),
                        top_k=defaults.top_k if top_k is None else top_k,
                        seed=_int(body, "seed", 0, SEED_MAX),
                        repetition_penalty=_number(body, "repetition_penalty", 0.01, 10.0,
                                                   defaults.repetition_penalty),
                        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
                        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
                        min_p=_number(body, "min_p", 0.0, 1.0, 0.0))
    if sampling.top_p == 0.0:
        raise _bad("top_p must be greater than 0", "top_p")
    return {"model": model, "stream": stream, "include_usage": include_usage, "max_tokens": max_tokens,
            "sampling": sampling, "stop": stops, "schema": json_value(peer_schema(body), "response_format")}


ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's names are at most 64 characters, Anthropic's 128 (Claude Code's MCP tools: mcp__<server>__<tool>)
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _parallel(body: dict) -> bool:
    v = body.get("parallel_tool_calls", True)
    if not isinstance(v, bool):
        raise _bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return v


def _chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (true/false) and `top_logprobs` (0-20, only with logprobs), as OpenAI checks them."""
    on = body.get("logprobs", False)
    if on is None:
        on = False
    if not isinstance(on, bool):
        raise _bad("logprobs must be true or false (top_logprobs says how many alternatives)", "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not on:
        raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if on else None


def _tools(body: dict) -> tuple[tuple[dict[str, Any], ...], str]:
    """`tools` (OpenAI's function tools) and `tool_choice`, checked: (tools, auto | none | required | a name)."""
    tools = body.get("tools")
    if tools in (None, []):
        tools = []
    if not isinstance(tools, list):
        raise _bad("tools must be a list of function tools", "tools")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not TOOL_NAME.fullmatch(fn["name"]):
            raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} with a name of "
                       "letters, digits, '_', '.' or '-' (at most 128)", "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        json_value(fn.get("parameters"), f"tools[{i}].function.parameters")
        if isinstance(fn.get("description"), str):
            text(fn["description"], f"tools[{i}].function.description")
        names.append(fn["name"])
    choice = body.get("tool_choice")
    if choice is None:          # null is omitted, as OpenAI reads it (the Agents SDK sends it so)
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise _bad(f"tool_choice names function {str(name)[:64]!r}, which is not one of the tools", "tool_choice")
        return tuple(tools), str(name)
    if choice not in ("auto", "none", "required"):
        raise _bad("tool_choice must be auto, none, required or {\"type\": \"function\", ...}", "tool_choice")
    if choice == "required" and not tools:
        raise _bad("tool_choice required needs tools", "tool_choice")
    return tuple(tools), choice


def _message(m: Any, i: int, images: list[ImagePart | AudioPart]) -> dict[str, Any]:
    """One chat message as the chat template takes it: an assistant's tool calls and a tool's result included; a
    user's images and recordings as parts (added to `images` in order)."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise _bad(f"messages[{i}]: each message needs a role of system, user, assistant or tool", "messages")
    role = "system" if m["role"] == "developer" else m["role"]
    content = m.get("content")
    before = len(images)
    out: dict[str, Any] = {"role": role,
                           "content": "" if content is None else _content(content, f"messages[{i}]", images)}
    if len(images) > before and role != "user":
        raise _bad(f"messages[{i}]: only user messages may hold images or audio (this one is {m['role']!r})",
                   f"messages[{i}].content")
    calls = m.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise _bad(f"messages[{i}].tool_calls must be a list of function calls", "messages")
        out["tool_calls"] = [{"id": str(c.get("id", "")), "type": "function",
                              "function": {"name": text(str(c["function"].get("name", "")), "messages"),
                                           "arguments": _arguments(c["function"].get("arguments"), i)}}
                             for c in calls]
    if role == "tool":
        out["tool_call_id"] = text(str(m.get("tool_call_id", "")), "messages")
    return out


def _arguments(value: Any, i: int) -> Any:
    """A tool call's arguments as templates take them: the JSON object OpenAI sends as a string, parsed."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError):
            raise _bad(f"messages[{i}].tool_calls: arguments are not JSON", "messages") from None
    return json_value(value, f"messages[{i}].tool_calls") if isinstance(value, dict) else {}


def parse_chat(body: dict[str, Any], defaults: SamplingDefaults = OPENAI_DEFAULTS) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    tools, choice = _tools(body)
    media: list[ImagePart | AudioPart] = []
    parsed = tuple(_message(m, i, media) for i, m in enumerate(messages))
    return Request(messages=parsed, tools=tools, tool_choice=choice, parallel_tool_calls=_parallel(body),
                   logprobs=_chat_logprobs(body), images=tuple(m for m in media if isinstance(m, ImagePart)),
                   recordings=tuple(m for m in media if isinstance(m, AudioPart)), **_common(body, defaults))


MAX_PROMPTS = 16        # prompts in one /v1/completions request (each is admitted as a request of its own)


def parse_completion(body: dict[str, Any], defaults: SamplingDefaults = OPENAI_DEFAULTS) -> Request:
    """OpenAI's legacy prompt: a string, token ids (a list of integers), or a list of several of either, answered as
    one choice per prompt (`index`), each prompt admitted and run as a request of its own."""
    common = _common(body, defaults)
    logprobs = _int(body, "logprobs", 0, 5)
    prompts = _prompts(body.get("prompt"))
    one = [Request(prompt="", prompt_ids=p, logprobs=logprobs, **common) if isinstance(p, tuple)
           else Request(prompt=text(p, f"prompt[{i}]" if len(prompts) > 1 else "prompt"), logprobs=logprobs, **common)
           for i, p in enumerate(prompts)]
    if len(one) == 1:
        return one[0]
    return Request(prompt="", logprobs=logprobs, batch=tuple(one), **common)


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def _prompts(prompt: Any) -> list[str | tuple[int, ...]]:
    if isinstance(prompt, str):
        return [prompt]
    ids = _ids(prompt)
    if ids is not None:
        return [ids]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _ids(p) is not None for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise _bad(f"prompt holds {len(prompt)} prompts: at most {MAX_PROMPTS} per request", "prompt")
        return [p if isinstance(p, str) else _ids(p) or () for p in prompt]
    raise _bad("prompt must be a string, a list of token ids, or a list of several of either", "prompt")

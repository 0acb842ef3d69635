"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), what Claude Code and the anthropic SDK
speak, translated to the one typed request the server runs (protocol.Request, through parse_chat: the same checks,
admission, grammar, truncation and metrics as chat completions), and its answers in Anthropic's shapes: a message of
content blocks (text, tool_use), streamed as message_start, content_block_start/delta/stop, message_delta,
message_stop, with a ping after the start. Errors are {"type": "error", "error": {"type", "message"}} (gate.py).

What the request may hold that this server cannot do is a 400 naming the field (server-side tools, MCP servers, a
container, documents); what only tunes Anthropic's own service is accepted and has no effect here, said in the
docs (metadata, cache_control, service_tier, context_management's thinking edits, thinking and effort: a model that
thinks does so in its text)."""

from __future__ import annotations

import json
from typing import Any

from pipeline.serve import protocol
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import SamplingDefaults
from pipeline.serve.responses import Endpoint, Ident, Output, Stream, Usage, named

REFUSED = {
    "mcp_servers": "MCP servers are not reachable from this server: run the MCP tools in the client",
    "container": "code-execution containers are Anthropic's service, not this server's",
    "citations": "citations are not supported",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
MAX_STOP_SEQUENCES = protocol.MAX_STOP


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param, "invalid_value")


def _text_of(blocks: Any, at: str) -> str:
    """A string, or text blocks joined (a system prompt, a tool_result's content)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(f"{at} must be a string or a list of text blocks", at)
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{at}[{j}]: only text blocks are supported here", at)
        out.append(b["text"])
    return "\n".join(out) if at == "system" else "".join(out)


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An image block as chat's image_url part (the image's own checks and limits apply: serve/images.py)."""
    src = block.get("source")
    if not isinstance(src, dict):
        src = {}
    kind = src.get("type")
    if kind == "base64" and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{src['media_type']};base64,{src['data']}"}}
    if kind == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise _bad(f"{at}.source must be {{\"type\": \"base64\", \"media_type\", \"data\"}} or {{\"type\": \"url\"}}",
               f"{at}.source")


def _messages(messages: Any) -> list[dict[str, Any]]:
    """Anthropic's turns as chat messages: a user turn's tool_result blocks become tool messages (in order, before
    its text and images), an assistant turn's tool_use blocks its tool calls; thinking blocks are dropped (the model
    reads its own answers, not Anthropic's signed reasoning)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise _bad(f"{at}.role must be user, assistant or system", f"{at}.role")
        content = m.get("content")
        if m["role"] == "system":       # Claude Code's environment, sent as a message: see to_chat
            out.append({"role": "system", "content": _text_of(content, f"{at}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{at}.content must be a string or a list of content blocks", f"{at}.content")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        results = 0
        for j, b in enumerate(content):
            kind, where = b.get("type") if isinstance(b, dict) else None, f"{at}.content[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                parts.append({"type": "text", "text": b["text"]})
            elif kind == "image" and m["role"] == "user":
                parts.append(_image(b, where))
            elif kind == "tool_result" and m["role"] == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise _bad(f"{where}.tool_use_id must be a string", f"{where}.tool_use_id")
                result = _text_of(b.get("content", ""), f"{where}.content")
                results += 1
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": f"Error: {result}" if b.get("is_error") is True else result})
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise _bad(f"{where} must be {{\"type\": \"tool_use\", \"id\", \"name\", \"input\": {{...}}}}",
                               where)
                calls.append({"id": str(b.get("id", "")), "type": "function",
                              "function": {"name": b["name"], "arguments": b.get("input", {})}})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue
            else:
                raise _bad(f"{where}: a {str(kind)[:40]!r} block is not supported from the {m['role']} (text, "
                           "image and tool_result from the user; text, tool_use and thinking from the assistant)",
                           where)
        if parts or calls or not results:      # a turn of tool results only is those tool messages
            msg: dict[str, Any] = {"role": m["role"], "content": parts if any(p["type"] != "text" for p in parts)
                                   else "".join(p["text"] for p in parts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Anthropic's client tools as function tools (a tool with defer_loading is not shown to the model: Claude
    Code's tool search loads it when asked) and tool_choice in chat's terms."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, dict) else None
            raise _bad(f"tools[{i}]: {str(kind)[:60]!r} is one of Anthropic's server tools, which run on Anthropic's "
                       "service; this server runs the model only: give it client tools (name, input_schema)",
                       f"tools[{i}].type")
        if not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema", {}), dict):
            raise _bad(f"tools[{i}] must be {{\"name\", \"description\", \"input_schema\": {{...}}}}", f"tools[{i}]")
        if t.get("defer_loading") is True:
            continue
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    choice, parallel = body.get("tool_choice"), True
    if choice is None:
        return out, (None, parallel)
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice")
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "tool":
        return out, ({"type": "function", "function": {"name": choice.get("name")}}, parallel)
    return out, ({"auto": "auto", "any": "required", "none": "none"}[kind], parallel)


def _schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """output_config.format (Anthropic's structured outputs: {"type": "json_schema", "schema"}), as response_format."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _bad("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                   "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def to_chat(body: dict[str, Any], count_only: bool = False) -> dict[str, Any]:
    """The Messages request as a chat completions body (checked field by field under Anthropic's names first)."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, [], {}):
            raise ApiError(400, f"{name}: {why}", name, "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model must be a string (GET /v1/models lists the one served)", "model")
    max_tokens = body.get("max_tokens")
    if not count_only and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _bad(f"max_tokens must be an integer of at least 1, not {str(max_tokens)[:40]}", "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 1):
        raise _bad(f"temperature must be a number from 0 to 1, not {str(temperature)[:40]}", "temperature")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES or \
            not all(isinstance(s, str) and 0 < len(s) <= protocol.MAX_STOP_CHARS for s in stops):
        raise _bad(f"stop_sequences must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings of at most "
                   f"{protocol.MAX_STOP_CHARS} characters", "stop_sequences")
    system = [_text_of(body["system"], "system")] if body.get("system") else []
    turns = _messages(body.get("messages"))
    # system messages among the turns (Claude Code sends its environment so) join the system prompt: chat templates
    # take one system message, first
    system += [m["content"] for m in turns if m["role"] == "system"]
    messages = ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + \
        [m for m in turns if m["role"] != "system"]
    tools, (choice, parallel) = _tools(body)
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens if not count_only else None,
                            "stream": body.get("stream", False), "stop": stops or None, "tools": tools,
                            "tool_choice": choice, "parallel_tool_calls": parallel, "response_format": _schema(body)}
    for name in ("temperature", "top_p", "top_k"):
        chat[name] = body.get(name)
    return chat


def parse_messages(body: dict[str, Any], defaults: SamplingDefaults = protocol.OPENAI_DEFAULTS) -> protocol.Request:
    return protocol.parse_chat(to_chat(body), defaults)


def parse_count(body: dict[str, Any], defaults: SamplingDefaults = protocol.OPENAI_DEFAULTS) -> protocol.Request:
    return protocol.parse_chat(to_chat(body, count_only=True), defaults)


def _blocks(out: Output) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": out.text}] if out.text else []
    return blocks + [_tool_use(c) for c in out.tool_calls or []]


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def _usage(usage: Usage) -> dict[str, int]:
    # no prompt cache here: nothing was written to or read from one
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def stop_reason(out: Output) -> str | None:
    if out.reason == "stop" and out.stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(out.reason or "", out.reason)


class MessagesEndpoint(Endpoint):
    id_prefix = "msg_"

    def message(self, ident: Ident, content: list[dict[str, Any]], reason: str | None, stop: str | None,
                usage: Usage) -> dict[str, Any]:
        return {"id": ident.id, "type": "message", "role": "assistant", "model": ident.model, "content": content,
                "stop_reason": reason, "stop_sequence": stop, "usage": _usage(usage)}

    def whole(self, ident: Ident, out: Output, usage: Usage) -> dict[str, Any]:
        return self.message(ident, _blocks(out), stop_reason(out), out.stop_sequence, usage)

    def stream(self, ident: Ident, include_usage: bool, prompt_tokens: int) -> Stream:  # noqa: ARG002
        return MessagesStream(self, ident, prompt_tokens)


class MessagesStream(Stream):
    """Anthropic's event sequence: message_start, ping, a text block opened at the first text and closed at the end,
    then one tool_use block per call (its input as one input_json_delta), message_delta (stop reason, usage),
    message_stop."""

    def __init__(self, ep: MessagesEndpoint, ident: Ident, prompt_tokens: int):
        self.ep, self.ident, self.prompt_tokens = ep, ident, prompt_tokens
        self.text_open, self.index = False, 0

    def opening(self) -> bytes:
        start = self.ep.message(self.ident, [], None, None, Usage(self.prompt_tokens, 0))
        return named("message_start", {"type": "message_start", "message": start}) + \
            named("ping", {"type": "ping"})

    def _text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if not self.text_open:
            self.text_open = True
            out = named("content_block_start", {"type": "content_block_start", "index": self.index,
                                                "content_block": {"type": "text", "text": ""}})
        return out + named("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                   "delta": {"type": "text_delta", "text": text}})

    def _stop_block(self) -> bytes:
        out = named("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.index += 1
        return out

    def piece(self, out: Output) -> bytes:
        return self._text(out.text or "")

    def closing(self, out: Output, usage: Usage) -> bytes:
        data = self._text(out.text or "")
        if self.text_open:
            data += self._stop_block()
        for call in out.tool_calls or []:
            block = {**_tool_use(call), "input": {}}
            data += named("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})
            data += named("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": call["function"]["arguments"]}})
            data += self._stop_block()
        return data + named("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason(out), "stop_sequence": out.stop_sequence},
            "usage": {"output_tokens": usage.completion_tokens}}) + named("message_stop", {"type": "message_stop"})

    def failed(self, exc: ApiError) -> bytes:
        return named("error", exc.anthropic_body())


MESSAGES = MessagesEndpoint()

"""OpenAI's Responses API (`POST /v1/responses`), what Codex CLI and the OpenAI Agents SDK speak, stateless as
llama.cpp's and Ollama's: the request (input items, instructions, function tools, text.format) translated to the one
typed request the server runs (protocol.Request, through parse_chat), the answer as a response object of output
items (a message with output_text, function_call items), streamed as response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta ... response.output_item.done,
response.function_call_arguments.delta/done, and response.completed or response.incomplete.

Nothing is stored: `previous_response_id` (and a conversation, item references, background runs) is a 400 saying to
send the whole conversation; `store` is answered as false. Hosted tools (web search, file search, code interpreter,
...) run on OpenAI's service, not here: they are not offered to the model, said in the X-Tools-Ignored header (Codex
sends web_search with every turn)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from pipeline.serve import protocol
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import SamplingDefaults
from pipeline.serve.responses import Endpoint, Ident, Output, Stream, Usage, named

REFUSED = {
    "previous_response_id": "this server stores no responses: send the whole conversation in `input` (as Codex "
                            "does with store: false)",
    "conversation": "this server stores no conversations: send the whole conversation in `input`",
    "background": "background responses need stored responses, which this server does not keep",
    "prompt": "stored prompt templates are OpenAI's service, not this server's",
    "top_logprobs": "log-probabilities are served by /v1/chat/completions (logprobs, top_logprobs)",
}
ECHOED = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "temperature", "top_p",
          "tool_choice", "truncation", "user")


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param, "invalid_value")


def _text(content: Any, at: str, images: bool) -> Any:
    """A message item's content as chat's: a string, or input_text / output_text / refusal / input_image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{at}.content must be a string or a list of content parts", f"{at}.content")
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        kind, where = p.get("type") if isinstance(p, dict) else None, f"{at}.content[{j}]"
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append({"type": "text", "text": p["refusal"]})
        elif kind == "input_image" and images and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            raise _bad(f"{where}: a {str(kind)[:40]!r} part is not supported here (input_text, input_image as a "
                       "data: URL, output_text)", where)
    if any(p["type"] != "text" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _input(body: dict[str, Any]) -> list[dict[str, Any]]:
    """instructions and input as chat messages: function_call items join the assistant message before them (or start
    one), function_call_output items are tool messages, reasoning items are dropped (this server makes none)."""
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions must be a string", "instructions")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("input must be a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        at = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ("user", "system", "developer", "assistant"):
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _text(item.get("content"), at, role == "user")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise _bad(f"{at}: a function_call item needs call_id, name and arguments", at)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and (out[-1].get("tool_calls") or not out[-1]["content"]):
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"{at}: a function_call_output item needs its call_id", at)
            text = output if isinstance(output, str) else _text(output, at, False)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise _bad(f"{at}: a {str(kind)[:40]!r} item is not supported (message, function_call, "
                       "function_call_output)", f"{at}.type")
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(function tools in chat's shape, the kinds of hosted tools not offered)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    out, hosted = [], []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            if not isinstance(kind, str):
                raise _bad(f"tools[{i}] must be a tool object with a type", f"tools[{i}]")
            hosted.append(kind[:40])
            continue
        if not isinstance(t.get("name"), str):
            raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"name\", \"parameters\": {{...}}}}",
                       f"tools[{i}]")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out, hosted


def _choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise _bad("tool_choice must be auto, none, required or {\"type\": \"function\", \"name\"}", "tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(body: dict[str, Any]) -> dict[str, Any] | None:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt


def parse_responses(body: dict[str, Any], defaults: SamplingDefaults = protocol.OPENAI_DEFAULTS) -> protocol.Request:
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False, 0, ""):
            raise ApiError(400, f"{name}: {why}", name, "unsupported_parameter")
    tools, hosted = _tools(body)
    truncation = body.get("truncation")
    if truncation not in (None, "auto", "disabled"):
        raise _bad("truncation must be auto or disabled", "truncation")
    chat = {"model": body.get("model"), "messages": _input(body), "stream": body.get("stream", False),
            "max_tokens": body.get("max_output_tokens"), "tools": tools,
            "tool_choice": _choice(body.get("tool_choice")),
            "parallel_tool_calls": body.get("parallel_tool_calls"), "response_format": _format(body),
            "temperature": body.get("temperature"), "top_p": body.get("top_p")}
    if chat["parallel_tool_calls"] is None:
        del chat["parallel_tool_calls"]
    req = protocol.parse_chat(chat, defaults)
    echo = {k: body.get(k) for k in ECHOED}
    echo.update(tools=[t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"],
                text={"format": body.get("text", {}).get("format") or {"type": "text"}}
                if isinstance(body.get("text"), dict) else {"format": {"type": "text"}})
    return dataclasses.replace(req, echo=echo, truncate=truncation != "disabled",
                            ignored=f"tools not offered: {', '.join(hosted)} (hosted tools run on OpenAI's service, "
                                    "not here)" if hosted else None)


def _usage(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _call(call: dict[str, Any], status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if status == "completed" else "", "status": status}


class ResponsesEndpoint(Endpoint):
    id_prefix = "resp_"

    def response(self, ident: Ident, output: list[dict[str, Any]], reason: str | None,
                 usage: Usage | None) -> dict[str, Any]:
        status = "in_progress" if reason is None else "incomplete" if reason == "length" else "completed"
        return {"id": ident.id, "object": "response", "created_at": ident.created, "model": ident.model,
                "status": status, "error": None, "output": output,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "usage": _usage(usage) if usage is not None else None, "store": False,
                "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
                **(ident.echo or {})}

    def whole(self, ident: Ident, out: Output, usage: Usage) -> dict[str, Any]:
        items = [_message(f"msg_{uuid.uuid4().hex}", out.text, "completed")] if out.text else []
        items += [_call(c, "completed") for c in out.tool_calls or []]
        return self.response(ident, items, out.reason, usage)

    def stream(self, ident: Ident, include_usage: bool, prompt_tokens: int) -> Stream:  # noqa: ARG002
        return ResponsesStream(self, ident)


class ResponsesStream(Stream):
    """The Responses event sequence, each event numbered (sequence_number) as OpenAI's are."""

    def __init__(self, ep: ResponsesEndpoint, ident: Ident):
        self.ep, self.ident, self.seq = ep, ident, 0
        self.items: list[dict[str, Any]] = []
        self.message_id: str | None = None
        self.text = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = named(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return data

    def opening(self) -> bytes:
        snapshot = self.ep.response(self.ident, [], None, None)
        return self._event("response.created", response=snapshot) + \
            self._event("response.in_progress", response=snapshot)

    def _delta(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self.message_id is None:
            self.message_id = f"msg_{uuid.uuid4().hex}"
            out += self._event("response.output_item.added", output_index=0,
                               item=_message(self.message_id, "", "in_progress"))
            out += self._event("response.content_part.added", item_id=self.message_id, output_index=0,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        self.text += text
        return out + self._event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                 content_index=0, delta=text, logprobs=[])

    def piece(self, out: Output) -> bytes:
        return self._delta(out.text or "")

    def closing(self, out: Output, usage: Usage) -> bytes:
        data = self._delta(out.text or "")
        if self.message_id is not None:
            part = {"type": "output_text", "text": self.text, "annotations": []}
            item = _message(self.message_id, self.text, "completed")
            data += self._event("response.output_text.done", item_id=self.message_id, output_index=0,
                                content_index=0, text=self.text, logprobs=[])
            data += self._event("response.content_part.done", item_id=self.message_id, output_index=0,
                                content_index=0, part=part)
            data += self._event("response.output_item.done", output_index=0, item=item)
            self.items.append(item)
        for call in out.tool_calls or []:
            index, item = len(self.items), _call(call, "completed")
            data += self._event("response.output_item.added", output_index=index, item=_call(call, "in_progress"))
            data += self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                delta=item["arguments"])
            data += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                name=item["name"], arguments=item["arguments"])
            data += self._event("response.output_item.done", output_index=index, item=item)
            self.items.append(item)
        final = self.ep.response(self.ident, self.items, out.reason, usage)
        return data + self._event(f"response.{final['status']}", response=final)

    def failed(self, exc: ApiError) -> bytes:
        snapshot = {**self.ep.response(self.ident, self.items, "failed", None), "status": "failed",
                    "error": {"code": exc.code or "server_error", "message": exc.message}}
        return self._event("response.failed", response=snapshot)


RESPONSES = ResponsesEndpoint()

"""The response bodies and event streams of the server's APIs, each an `Endpoint` that knows its own shapes, built
from typed parts: the answer's identity (`Ident`), what a choice says (`Output`), and `Usage`. Nothing upstream
threads an API flag through them. OpenAI's two here (chat's message and deltas with tool calls, completions' text and
its log-probability layout); Anthropic's Messages (anthropic.py) and OpenAI's Responses (openai_responses.py) beside
them. A streamed answer is written by the endpoint's `Stream`, one per request (it may keep state: which
content block is open).

    whole answer     {"id", "object", "created", "model", "choices": [choice], "usage"}
    stream chunk     {"id", "object", "created", "model", "choices": [delta choice], "usage": null where asked}
    usage chunk      {..., "choices": [], "usage"} (stream_options.include_usage)
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.serve.errors import ApiError


@dataclass(frozen=True)
class Ident:
    """One answer's identity, the same in each of its chunks."""
    id: str
    model: str
    created: int
    echo: dict[str, Any] | None = None      # what the answer repeats of its request (the Responses object)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass(frozen=True)
class Output:
    """What one choice (or one chunk of it) says: text (None: chat's `content: null`), the finish reason where it
    ended, tool calls (whole ones, or a chunk's deltas), and log-probability entries in chat's shape ({"token",
    "logprob", "bytes", "top_logprobs": [...]}) with `offset`, the answer's characters before them."""
    text: str | None = None
    reason: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None
    offset: int = 0
    stop_sequence: str | None = None    # the stop string that ended the answer, where one did
    index: int = 0                      # the choice's index (a completion of several prompts: one per prompt)


class Stream(ABC):
    """One streamed answer's events, as bytes for one write each: what goes out before any token, per piece, after
    the last piece (held-back text, tool calls, the finish reason, usage, the end marker), and on a failure after
    the 200."""

    @abstractmethod
    def opening(self) -> bytes: ...

    @abstractmethod
    def piece(self, out: Output) -> bytes: ...

    @abstractmethod
    def closing(self, out: Output, usage: Usage) -> bytes: ...

    @abstractmethod
    def failed(self, exc: ApiError) -> bytes: ...


class Endpoint(ABC):
    id_prefix: str      # the answer's id is this and a random hex

    @abstractmethod
    def whole(self, ident: Ident, out: Output, usage: Usage) -> dict[str, Any]:
        """The whole answer's body."""

    @abstractmethod
    def stream(self, ident: Ident, include_usage: bool, prompt_tokens: int) -> Stream:
        """A new stream for one answer."""


class OpenAIEndpoint(Endpoint):
    """OpenAI's chat and completions: chunks of one shape, a usage chunk where asked, then [DONE]."""
    object: str
    chunk_object: str

    @abstractmethod
    def logprobs(self, out: Output) -> dict[str, Any] | None:
        """The choice's `logprobs` field."""

    @abstractmethod
    def choice(self, out: Output) -> dict[str, Any]:
        """A whole answer's choice."""

    @abstractmethod
    def delta(self, out: Output, first: bool) -> dict[str, Any]:
        """A stream chunk's choice (`first`: the stream's first chunk)."""

    def opening(self, ident: Ident, include_usage: bool) -> Iterator[dict[str, Any]]:  # noqa: ARG002
        """The chunks a stream starts with, before any token (none, unless the endpoint says so)."""
        return iter(())

    @abstractmethod
    def piece(self, ident: Ident, out: Output, include_usage: bool) -> Iterator[dict[str, Any]]:
        """The chunks one piece of the answer makes (none where it says nothing this endpoint sends)."""

    def closing(self, ident: Ident, out: Output, include_usage: bool) -> Iterator[dict[str, Any]]:  # noqa: ARG002
        """The chunks after the last piece: text held back until the end, tool calls, the finish reason (none,
        unless the endpoint says so)."""
        return iter(())

    def stream(self, ident: Ident, include_usage: bool, prompt_tokens: int) -> Stream:  # noqa: ARG002
        return ChunkStream(self, ident, include_usage)

    def whole(self, ident: Ident, out: Output, usage: Usage) -> dict[str, Any]:
        return self.whole_of(ident, [out], usage)

    def whole_of(self, ident: Ident, outs: list[Output], usage: Usage) -> dict[str, Any]:
        """A whole answer of several choices (a completion of several prompts: serve/batch.py)."""
        return {"id": ident.id, "object": self.object, "created": ident.created, "model": ident.model,
                "choices": [self.choice(out) for out in outs], "usage": usage.to_dict()}

    def chunk(self, ident: Ident, out: Output, include_usage: bool, first: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"id": ident.id, "object": self.chunk_object, "created": ident.created,
                                "model": ident.model, "choices": [self.delta(out, first)]}
        if include_usage:       # OpenAI: "usage": null on every chunk but the last when the client asked for usage
            body["usage"] = None
        return body

    def usage_chunk(self, ident: Ident, usage: Usage) -> dict[str, Any]:
        return {"id": ident.id, "object": self.chunk_object, "created": ident.created, "model": ident.model,
                "choices": [], "usage": usage.to_dict()}


class ChatEndpoint(OpenAIEndpoint):
    """/v1/chat/completions: a message; streamed as deltas (the role first, then content, then tool calls, then a
    last chunk with the finish reason)."""
    id_prefix, object, chunk_object = "chatcmpl-", "chat.completion", "chat.completion.chunk"

    def logprobs(self, out: Output) -> dict[str, Any] | None:
        return None if out.logprobs is None else {"content": out.logprobs, "refusal": None}

    def choice(self, out: Output) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": out.text}
        if out.tool_calls:
            message["tool_calls"] = out.tool_calls
        return {"index": 0, "finish_reason": out.reason, "logprobs": self.logprobs(out), "message": message}

    def delta(self, out: Output, first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if out.text is not None:
            delta["content"] = out.text
        if out.tool_calls:
            delta["tool_calls"] = out.tool_calls
        return {"index": 0, "finish_reason": out.reason, "logprobs": self.logprobs(out) if out.logprobs else None,
                "delta": delta}

    def opening(self, ident: Ident, include_usage: bool) -> Iterator[dict[str, Any]]:
        yield self.chunk(ident, Output(""), include_usage, first=True)

    def piece(self, ident: Ident, out: Output, include_usage: bool) -> Iterator[dict[str, Any]]:
        if out.text or out.logprobs:
            yield self.chunk(ident, Output(out.text or None, logprobs=out.logprobs), include_usage)

    def closing(self, ident: Ident, out: Output, include_usage: bool) -> Iterator[dict[str, Any]]:
        if out.text:
            yield self.chunk(ident, Output(out.text), include_usage)
        for delta in tool_call_deltas(out.tool_calls or []):
            yield self.chunk(ident, Output(None, tool_calls=delta), include_usage)
        yield self.chunk(ident, Output(None, out.reason), include_usage)


class CompletionsEndpoint(OpenAIEndpoint):
    """/v1/completions: text; streamed as text chunks, the last carrying the finish reason."""
    id_prefix, object, chunk_object = "cmpl-", "text_completion", "text_completion"

    def logprobs(self, out: Output) -> dict[str, Any] | None:
        """Completions' layout: {"tokens", "token_logprobs", "top_logprobs" (token -> logprob), "text_offset"}."""
        if out.logprobs is None:
            return None
        offsets, at = [], out.offset
        for e in out.logprobs:
            offsets.append(at)
            at += len(e["token"])
        return {"tokens": [e["token"] for e in out.logprobs], "token_logprobs": [e["logprob"] for e in out.logprobs],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in out.logprobs],
                "text_offset": offsets}

    def choice(self, out: Output) -> dict[str, Any]:
        return {"index": out.index, "finish_reason": out.reason, "logprobs": self.logprobs(out),
                "text": out.text or ""}

    def delta(self, out: Output, first: bool) -> dict[str, Any]:  # noqa: ARG002 - a text chunk has no role
        return {"index": out.index, "finish_reason": out.reason,
                "logprobs": self.logprobs(out) if out.logprobs else None, "text": out.text or ""}

    def piece(self, ident: Ident, out: Output, include_usage: bool) -> Iterator[dict[str, Any]]:
        if out.text or out.reason:
            yield self.chunk(ident, out, include_usage)


class ChunkStream(Stream):
    def __init__(self, ep: OpenAIEndpoint, ident: Ident, include_usage: bool):
        self.ep, self.ident, self.include_usage = ep, ident, include_usage

    def opening(self) -> bytes:
        return sse_all(self.ep.opening(self.ident, self.include_usage))

    def piece(self, out: Output) -> bytes:
        return sse_all(self.ep.piece(self.ident, out, self.include_usage))

    def closing(self, out: Output, usage: Usage) -> bytes:
        tail = sse(self.ep.usage_chunk(self.ident, usage)) if self.include_usage else b""
        return sse_all(self.ep.closing(self.ident, out, self.include_usage)) + tail + sse("[DONE]")

    def failed(self, exc: ApiError) -> bytes:
        return sse(exc.body())      # as vLLM sends an engine failure after the 200


CHAT, COMPLETIONS = ChatEndpoint(), CompletionsEndpoint()


def tool_call_deltas(calls: list[dict[str, Any]], fragment: int = 32) -> list[list[dict[str, Any]]]:
    """The delta `tool_calls` of each stream chunk that carries these calls: per call, its header (index, id, type,
    name, arguments ""), then its arguments in fragments, as OpenAI streams them."""
    out = []
    for i, c in enumerate(calls):
        out.append([{"index": i, "id": c["id"], "type": "function",
                     "function": {"name": c["function"]["name"], "arguments": ""}}])
        args = c["function"]["arguments"]
        out += [[{"index": i, "function": {"arguments": args[k:k + fragment]}}] for k in range(0, len(args), fragment)]
    return out


# one encoder for every event: json.dumps(..., ensure_ascii=False) builds a JSONEncoder per call
_encode = json.JSONEncoder(ensure_ascii=False).encode


def sse(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else _encode(obj)}\n\n".encode()


def named(event: str, obj: dict[str, Any]) -> bytes:
    """An SSE event with its name (Anthropic's and the Responses API's streams: `event:` then `data:`)."""
    return f"event: {event}\ndata: {_encode(obj)}\n\n".encode()


def sse_all(objs: Iterable[dict[str, Any] | str]) -> bytes:
    """Several events as one write's bytes."""
    return b"".join(sse(obj) for obj in objs)

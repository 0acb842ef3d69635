"""Tool calls in the formats model families are trained to write, one small parser per format, chosen by data
(the family record's `tool_calls`, pipeline/families/records.py), as vLLM's tool parsers are:

    llama3_json   Llama 3.1-3.3: the answer is the call, {"name": ..., "parameters": {...}} (after <|python_tag|>
                  where the model writes one), several joined by ";"
    hermes        Qwen 2.5 / Qwen3 (Hermes-style templates): one block per call, after any text,
                  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    mistral       Mistral 7B v0.3: [TOOL_CALLS] (a control token) then a JSON list of {"name", "arguments"}
    phi4_mini     Phi-4-mini: functools[{"name": ..., "arguments": {...}}, ...]

Parsing works on the answer's text, whatever backend made it. A forced call (tool_choice required or a named
function) is the same format as a `Constraint`: the JSON of one call between the format's fixed text, which a session
that constrains decoding follows token by token, so even a small model's forced call parses.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.runtime.grammar import closed_schema, embedded_schema
from pipeline.runtime.session import Constraint

Call = dict[str, Any]       # {"id", "type": "function", "function": {"name", "arguments": a JSON string}}
Parsed = tuple[str, list[tuple[str, Any]]]     # (text before the calls, [(name, arguments object)])


def _objects(text: str, separators: str = "") -> list[Any] | None:
    """The JSON values `text` consists of (whitespace and `separators` between them), or None if anything else is
    in it."""
    decoder, i = json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while i < len(text) and (text[i].isspace() or text[i] in separators):
            i += 1
        if i == len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        out.append(value)


def _calls(values: list[Any] | None, key: str) -> list[tuple[str, Any]] | None:
    """(name, arguments) of each {"name": str, key: object} ("arguments" accepted for either key); None if any is
    not such an object."""
    if not values:
        return None
    out = []
    for v in values:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            return None
        args = v.get(key, v.get("arguments", v.get("parameters", {})))
        if isinstance(args, str):        # some fine-tunes write the arguments as a JSON string, as OpenAI sends them
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        out.append((v["name"], args))
    return out


def _llama3(text: str) -> Parsed | None:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):]
    if not body.lstrip().startswith("{"):
        return None
    calls = _calls(_objects(body, ";"), "parameters")
    return None if calls is None else ("", calls)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _hermes(text: str) -> Parsed | None:
    start = text.find("<tool_call>")
    if start < 0:
        return None
    values = []
    for block in _HERMES.findall(text[start:]):
        found = _objects(block)
        if found is None or len(found) != 1:
            return None
        values.extend(found)
    calls = _calls(values, "arguments")
    return None if calls is None else (text[:start].strip(), calls)


def _listed(marker: str) -> Callable[[str], Parsed | None]:
    def parse(text: str) -> Parsed | None:
        start = text.find(marker)
        if start < 0:
            return None
        found = _objects(text[start + len(marker):])
        if found is None or len(found) != 1:
            return None
        values = found[0] if isinstance(found[0], list) else [found[0]]
        calls = _calls(values, "arguments")
        return None if calls is None else (text[:start].strip(), calls)
    return parse


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    marker: str             # where the calls start; "" for a format whose answer is the call itself (Llama 3 JSON)
    open: str               # around one call's JSON in a forced call, after the marker
    close: str
    arguments_key: str      # "parameters" (Llama 3) or "arguments"
    parse: Callable[[str], Parsed | None] = field(repr=False, compare=False)
    id_length: int | None = None    # Mistral's chat templates take only 9-character alphanumeric call ids
    starts: tuple[str, ...] = ()    # for a marker-less format: what the answer begins with when it is a call

    def call_id(self) -> str:
        if self.id_length:
            return uuid.uuid4().hex[:self.id_length]
        return f"call_{uuid.uuid4().hex[:24]}"

    def calls(self, text: str, tools: tuple[dict[str, Any], ...]) -> tuple[str | None, list[Call]] | None:
        """(content, OpenAI tool calls) of an answer, or None when it holds no call (or names a function the request
        did not offer: then it is plain text)."""
        parsed = self.parse(text)
        if parsed is None:
            return None
        offered = {t["function"]["name"] for t in tools}
        content, found = parsed
        if not all(name in offered for name, _ in found):
            return None
        return content or None, [{"id": self.call_id(), "type": "function",
                                   "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                                  for name, args in found]

    def forced(self, tools: tuple[dict[str, Any], ...], name: str | None) -> Constraint:
        """One call of the named function (None: any of `tools`), as a constraint on the answer. Its arguments are
        the declared ones only (an object schema that does not say otherwise is closed, as in OpenAI's strict
        mode): else a small model forced into a call could add keys until max_tokens."""
        options = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
        schemas, defs = [], {}
        for n, fn in enumerate(options):
            # each tool's own definitions lifted to the wrapper's root, under names of their own (embedded_schema)
            arguments, own = embedded_schema(closed_schema(fn.get("parameters") or {"type": "object",
                                                                                    "properties": {}}), f"t{n}_")
            defs.update(own)
            schemas.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                             self.arguments_key: arguments},
                            "required": ["name", self.arguments_key], "additionalProperties": False})
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        if defs:
            schema = {**schema, "$defs": defs}
        return Constraint(schema, marker=self.marker, prefix=self.open, suffix=self.close)


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    ToolCallFormat("llama3_json", "", "", "", "parameters", _llama3, starts=("{", "<|python_tag|>")),
    ToolCallFormat("hermes", "<tool_call>", "\n", "\n</tool_call>", "arguments", _hermes),
    ToolCallFormat("mistral", "[TOOL_CALLS]", "[", "]", "arguments", _listed("[TOOL_CALLS]"), id_length=9),
    ToolCallFormat("phi4_mini", "functools", "[", "]", "arguments", _listed("functools")),
)}


class CallStream:
    """Text deltas of a streamed answer in, content deltas out; from where the calls start, the text is held until
    the answer ends and then parsed (`finish`). What may still become the marker is held back, as stop strings are.
    An answer whose held text is no call after all gets that text as content at the end."""

    def __init__(self, fmt: ToolCallFormat, tools: tuple[dict[str, Any], ...], forced: bool = False):
        self.fmt, self.tools, self.forced = fmt, tools, forced    # forced: a call cut short is not given as text
        self.seen = ""          # all text so far
        self.sent = 0           # characters of it given out as content
        self.held: int | None = None    # where the calls start, once known

    def feed(self, delta: str) -> str:
        self.seen += delta
        if self.held is not None:
            return ""
        if not self.fmt.marker:         # the answer is the call, or it is not
            head = self.seen.lstrip()
            if not head:
                return ""
            if any(head.startswith(s) or s.startswith(head) for s in self.fmt.starts):
                self.held = 0
                return ""
            return self._give(len(self.seen))
        at = self.seen.find(self.fmt.marker, self.sent)
        if at >= 0:
            self.held = at
            return self._give(at)
        m = self.fmt.marker
        hold = max((k for k in range(1, len(m)) if self.seen.endswith(m[:k])), default=0)
        return self._give(len(self.seen) - hold)

    def _give(self, upto: int) -> str:
        out, self.sent = self.seen[self.sent:upto], max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[Call]]:
        """(the content not given out yet, the calls): no calls when the held text is not one."""
        if self.held is None:
            return self._give(len(self.seen)), []
        found = self.fmt.calls(self.seen, self.tools)
        if found is None:
            if self.forced:     # the server's call format never reaches the client as text (max_tokens cut it)
                self.sent = len(self.seen)
                return "", []
            return self._give(len(self.seen)), []
        # the text before the calls not given out yet (feed gives it up to the marker; this is what it held back)
        rest, self.sent = self.seen[self.sent:self.held], len(self.seen)
        return rest, found[1]

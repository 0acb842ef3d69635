"""Structured output: an answer constrained, token by token, to a JSON schema (`response_format`), through
llguidance (Microsoft's Rust grammar engine behind Guidance; a wheel per platform, no torch, Python 3.10 on aarch64
included, so the board can run it too).

The schema is compiled against the served model's own tokenizer.json into a grammar once per request; at each step
the grammar says which tokens may come next (every other logit is set to -inf before the token is chosen, greedy or
sampled), and the chosen token advances it. When the JSON is complete only the model's stop tokens remain allowed,
so the answer ends there: even a tiny random model's answer parses. An answer cut by max_tokens is cut JSON
(finish_reason "length"), as with every server that constrains this way.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.errors import PipelineError
from pipeline.runtime.session import Constraint


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise PipelineError("structured output needs llguidance", "pip install 'llguidance>=1.0' (the [serve] "
                            "extra has it)") from None
    return llguidance


def closed_schema(schema: Any) -> Any:
    """The schema with every object that lists its properties and says nothing of others closed to others (OpenAI's
    strict mode; a forced tool call's arguments): else a small model may add keys until max_tokens."""
    if isinstance(schema, list):
        return [closed_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
            out[k] = {name: closed_schema(sub) for name, sub in v.items()}     # a map of names to schemas
        elif k in ("enum", "const", "default", "examples"):
            out[k] = v
        else:
            out[k] = closed_schema(v)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def embedded_schema(schema: dict, prefix: str) -> tuple[dict, dict]:
    """`schema` made to sit inside another (a forced tool call's arguments inside the call's wrapper): its own
    definitions (`$defs`, `definitions`) lifted out, renamed `<prefix><name>`, and every local `$ref` ("#/$defs/X",
    "#/definitions/X", "#" itself) rewritten to them, since a pointer resolves against the outermost schema
    (Pydantic's nested models come as $defs + $ref; left in place they failed: "Pointer '/$defs/Slot' does not
    exist"). Returns (the schema, the definitions for the outer schema's $defs)."""
    defs: dict[str, Any] = {}
    root = f"{prefix}root"

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                if v == "#":
                    defs.setdefault(root, None)
                    v = f"#/$defs/{root}"
                else:
                    for local in ("#/$defs/", "#/definitions/"):
                        if v.startswith(local):
                            v = f"#/$defs/{prefix}{v[len(local):]}"
                out[k] = v
            elif k in ("enum", "const", "default", "examples"):
                out[k] = v
            else:
                out[k] = rewrite(v)
        return out

    own = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update({f"{prefix}{name}": rewrite(sub) for name, sub in schema[key].items()})
    body = rewrite(own)
    if root in defs:
        defs[root] = body
    return body, defs


def _literal(text: str) -> str:
    """A Lark string literal of `text` (JSON's escaping is Lark's for these characters)."""
    return json.dumps(text, ensure_ascii=True)


class Grammars:
    """The served model's tokenizer as llguidance sees it (built once: ~10 ms for 1k tokens, ~1 s for 150k), and
    the constraints compiled against it. `special`: the tokenizer's control tokens by text, so a tool-call marker
    that is one (Mistral's [TOOL_CALLS]) is asked for as that token, never spelled out in text."""

    def __init__(self, tokenizer_json: str, stop_ids: tuple[int, ...], special: dict[str, int] | None = None):
        self.tokenizer = _llguidance().LLTokenizer(tokenizer_json, eos_token=list(stop_ids))
        self.special, self.stop_ids = special or {}, frozenset(stop_ids)

    def compile(self, constraint: Constraint) -> str:
        """The grammar of the constraint, or a ValueError saying what in the schema cannot be compiled."""
        llg = _llguidance()
        # compact JSON (a schema's own x-guidance may say otherwise): random whitespace costs tokens and time
        schema = {**constraint.schema, "x-guidance": {"whitespace_flexible": False,
                                                      **constraint.schema.get("x-guidance", {})}}
        try:
            if constraint.plain:
                grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            else:
                m = constraint.marker
                marker = f"<[{self.special[m]}]>" if m in self.special else _literal(m) if m else ""
                parts = [p for p in (marker, _literal(constraint.prefix) if constraint.prefix else "", "call",
                                     _literal(constraint.suffix) if constraint.suffix else "") if p]
                grammar = llg.LLMatcher.grammar_from_lark(f"start: {' '.join(parts)}\ncall: %json {json.dumps(schema)}")
        except ValueError as exc:
            raise ValueError(str(exc)[:300]) from None
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            raise ValueError("; ".join(messages)[:300])
        # a grammar that compiles can still fail at its first token (its lexer's limits), or admit nothing but the
        # end of the answer (a schema no JSON value satisfies): refused here, not answered with "" and "stop"
        matcher = llg.LLMatcher(self.tokenizer, grammar)
        first = matcher.compute_logit_bias()
        if matcher.is_error():
            raise ValueError(f"it fails at its first token: {matcher.get_error()[:200]}")
        if len(first) - first.count(0) == sum(1 for i in self.stop_ids if i < len(first) and first[i]):
            raise ValueError("no JSON value satisfies it (no first token is allowed)")
        return grammar

    def start(self, grammar: str) -> Constrained:
        return Constrained(_llguidance().LLMatcher(self.tokenizer, grammar))


class Constrained:
    """One answer's grammar state: which tokens may come next, and the token that came."""

    def __init__(self, matcher: Any):
        self.matcher = matcher

    def allowed(self) -> bytes:
        """One byte per token of the tokenizer's vocabulary: 0 where the token may not come next."""
        return self.matcher.compute_logit_bias()

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()[:200]}")

"""What an answer is constrained to, however a client says it: OpenAI's `response_format` and the JSON-schema ways
of other servers (vLLM, llama.cpp) whose clients are ported here; and those servers' other extensions, each refused by
name unless sent at its default (an ignored constraint or sampling rule would answer 200 with output the client did
not ask for)."""

from __future__ import annotations

import json
from typing import Any

from pipeline.serve.errors import bad_request as _bad

# Other servers' extensions to OpenAI's requests, which clients ported from them send: each honoured where it maps
# onto what this server does (a JSON schema for the answer: peer_schema), else a 400 naming it; never ignored, since
# an ignored constraint or sampling rule answers 200 with output the client did not ask for. Their default values
# (what the peer does when the field is absent) are accepted.
PEER_REFUSED = {
    "grammar": "llama.cpp's GBNF grammars are not supported: send a JSON schema (response_format)",
    "guided_regex": "vLLM's guided_regex is not supported: send a JSON schema (response_format)",
    "guided_grammar": "vLLM's guided_grammar is not supported: send a JSON schema (response_format)",
    "guided_choice": "vLLM's guided_choice is not supported: send a JSON schema with an enum (response_format)",
    "guided_decoding_backend": "this server has one grammar engine (llguidance)",
    "prompt_logprobs": "the engines here compute no log-probabilities of the prompt",
    "min_tokens": "the engine runtimes here cannot hold back the end of an answer",
    "continue_final_message": "the chat is always answered with a new assistant turn",
    "add_generation_prompt": "the chat template's generation prompt is always added",
    "ignore_eos": "an answer always ends at the model's end-of-sequence token",
    "include_stop_str_in_output": "stop strings are never part of the answer",
    "skip_special_tokens": "special tokens are never part of the answer",
    "bad_words": "not supported by the engine runtimes here",
    "allowed_token_ids": "not supported by the engine runtimes here",
    "truncate_prompt_tokens": "prompts are fitted by the server (it drops the oldest turns; see --no-truncate)",
    "chat_template": "the model's own chat template is the one the kit was validated with",
    "chat_template_kwargs": "the chat template is rendered with its defaults, as the goldens were",
    "n_probs": "llama.cpp's n_probs: send logprobs and top_logprobs",
    "mirostat": "mirostat sampling is not supported", "typical_p": "typical sampling is not supported",
    "tfs_z": "tail-free sampling is not supported", "dry_multiplier": "DRY sampling is not supported",
    "xtc_probability": "XTC sampling is not supported",
}
PEER_DEFAULTS: dict[str, Any] = {"min_tokens": 0, "continue_final_message": False, "add_generation_prompt": True,
                                 "ignore_eos": False, "include_stop_str_in_output": False, "skip_special_tokens": True,
                                 "mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "dry_multiplier": 0.0,
                                 "xtc_probability": 0.0, "n_probs": 0}


def refuse_peer_extensions(body: dict) -> None:
    """A 400 naming the first extension of another server that this one does not apply (its default is accepted)."""
    for name, why in PEER_REFUSED.items():
        value = body.get(name)
        if value is not None and (name not in PEER_DEFAULTS or value != PEER_DEFAULTS[name]):
            raise _bad(f"{name}: {why} (another server's extension; this server refuses what it does not apply "
                       "rather than ignore it)", name, "unsupported_parameter")


def peer_schema(body: dict) -> dict[str, Any] | None:
    """The answer's JSON schema from response_format or from one of the peers' ways of saying it: vLLM's
    structured_outputs {"json": schema} / {"json_object": true} and guided_json, llama.cpp's top-level json_schema and
    response_format {"type": "json_object", "schema": ...}. Two of them at once is a 400."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema") and "schema" in fmt \
            and "json_schema" not in fmt:       # llama.cpp's own shape
        found.append(("response_format.schema", _schema_value(fmt["schema"], "response_format.schema")))
    else:
        schema = response_schema(fmt)
        if schema is not None:
            found.append(("response_format", schema))
    structured = body.get("structured_outputs")
    if structured is not None:
        keys = set(structured) if isinstance(structured, dict) else set()
        if isinstance(structured, dict) and keys <= {"json", "json_object"} and len(keys) == 1:
            found.append(("structured_outputs", {"type": "object"} if "json_object" in keys
                          else _schema_value(structured["json"], "structured_outputs.json")))
        else:
            raise _bad("structured_outputs: only vLLM's {\"json\": schema} and {\"json_object\": true} are supported "
                       "(regex, choice and grammar are not)", "structured_outputs", "unsupported_parameter")
    for name in ("guided_json", "json_schema"):
        if body.get(name) is not None:
            found.append((name, _schema_value(body[name], name)))
    if len(found) > 1:
        raise _bad(f"{found[0][0]} and {found[1][0]} both constrain the answer: send one", found[1][0])
    return found[0][1] if found else None


def _schema_value(value: Any, param: str) -> dict[str, Any]:
    """A JSON schema given as an object or as its JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise _bad(f"{param} is not JSON", param, "invalid_schema") from None
    if not isinstance(value, dict):
        raise _bad(f"{param} must be a JSON schema object", param, "invalid_schema")
    return value or {"type": "object"}


def response_schema(fmt: Any) -> dict[str, Any] | None:
    """The JSON schema the answer must follow (`response_format` json_object: any object; json_schema: its
    schema), or None for free text."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict) or not isinstance(spec.get("name", ""), str):
            raise _bad("response_format.json_schema must be {\"name\": ..., \"schema\": {...}}",
                       "response_format.json_schema")
        if spec.get("strict") is True:      # OpenAI's strict mode: an object has the properties it lists, no others
            from pipeline.runtime.grammar import closed_schema
            return closed_schema(schema or {"type": "object"})
        return schema or {"type": "object"}
    raise _bad("response_format.type must be text, json_object or json_schema", "response_format")

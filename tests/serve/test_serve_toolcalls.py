"""Tool calls in each family's format (serve/toolcalls.py): parsed from an answer's text, streamed as OpenAI frames
them, and forced through a grammar that even random token choices cannot leave (llguidance over a real BPE
tokenizer trained here, with Mistral's [TOOL_CALLS] as a control token)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from pipeline.families import family
from pipeline.families.records import FAMILIES
from pipeline.serve.responses import tool_call_deltas
from pipeline.serve.toolcalls import FORMATS, CallStream

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 10}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}}}}}
TOOLS = (WEATHER, ADD)


@pytest.mark.parametrize("fmt,text,content,calls", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("get_weather", {"city": "Oslo"})]),
    ("llama3_json", '<|python_tag|>{"name": "add", "arguments": {"a": 1}}; {"name": "add", "parameters": {"a": 2}}',
     None, [("add", {"a": 1}), ("add", {"a": 2})]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 3}"}\n</tool_call>', "Let me look.",
     [("get_weather", {"city": "Rome"}), ("add", {"a": 3})]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 4}}', None, [("add", {"a": 4})]),    # cut before </..>
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 5}}, {"name": "get_weather", "arguments": {}}]',
     None, [("add", {"a": 5}), ("get_weather", {})]),
    ("phi4_mini", 'Sure. functools[{"name": "add", "arguments": {"a": 6}}]', "Sure.", [("add", {"a": 6})]),
])
def test_each_formats_calls_are_parsed(fmt, text, content, calls):
    found = FORMATS[fmt].calls(text, TOOLS)
    assert found is not None
    got_content, got = found
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"] for c in got)


@pytest.mark.parametrize("fmt,text", [
    ("llama3_json", "The weather is fine."),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}} and more words'),
    ("llama3_json", '{"name": "launch_rocket", "parameters": {}}'),       # not one of the request's tools
    ("llama3_json", '{"title": "Bread"}'),                                 # JSON, not a call
    ("hermes", "<tool_call>\nnot json\n</tool_call>"),
    ("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": [1]}]'),
    ("phi4_mini", "no calls here"),
])
def test_what_is_not_a_call_stays_text(fmt, text):
    assert FORMATS[fmt].calls(text, TOOLS) is None


def test_mistral_call_ids_are_the_nine_characters_its_templates_take():
    _, calls = FORMATS["mistral"].calls('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]', TOOLS)
    assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
    _, calls = FORMATS["hermes"].calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', TOOLS)
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) == 29


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7])
def test_the_stream_gives_content_until_the_marker_even_split_across_deltas_and_holds_the_calls(cut):
    text = 'Checking <tool_call>\n{"name": "add", "arguments": {"a": 7}}\n</tool_call>'
    stream = CallStream(FORMATS["hermes"], TOOLS)
    given = "".join(stream.feed(text[i:i + cut]) for i in range(0, len(text), cut))
    assert given == "Checking "              # never a piece of the marker
    rest, calls = stream.finish()
    assert rest == "" and [c["function"]["name"] for c in calls] == ["add"]


def test_a_stream_that_turns_out_not_to_be_a_call_gives_its_text_at_the_end():
    stream = CallStream(FORMATS["llama3_json"], TOOLS)
    assert stream.feed('{"title": ') == ""     # a Llama 3 answer that starts with { may be a call: held
    assert stream.feed('"Bread"}') == ""
    assert stream.finish() == ('{"title": "Bread"}', [])
    plain = CallStream(FORMATS["llama3_json"], TOOLS)
    assert plain.feed("  Bread") == "  Bread" and plain.finish() == ("", [])
    partial = CallStream(FORMATS["hermes"], TOOLS)
    assert partial.feed("a <tool_c") == "a " and partial.finish() == ("<tool_c", [])


def test_streamed_tool_calls_are_framed_as_openai_frames_them():
    calls = [{"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a": ' + "1" * 70 + "}"}}]
    deltas = tool_call_deltas(calls, fragment=32)
    assert deltas[0] == [{"index": 0, "id": "call_x", "type": "function",
                          "function": {"name": "add", "arguments": ""}}]
    assert all(set(d[0]) == {"index", "function"} and set(d[0]["function"]) == {"arguments"} for d in deltas[1:])
    assert "".join(d[0]["function"]["arguments"] for d in deltas[1:]) == calls[0]["function"]["arguments"]
    assert len(deltas) == 1 + 3


def test_every_registered_familys_format_exists():
    assert {f.tool_calls for f in FAMILIES if f.tool_calls} <= set(FORMATS)
    assert family("LlamaForCausalLM").tool_calls == "llama3_json"
    assert family("Qwen3ForCausalLM").tool_calls == "hermes"


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained on the shipped corpus, with a Mistral-style control token."""
    from pipeline.workstation.tinymodel import train_tokenizer
    tok = train_tokenizer(600)
    tok.add_special_tokens(["[TOOL_CALLS]"])
    return tok


def _random_forced_calls(tokenizer, fmt: str, tools, choice) -> None:
    """Tokens chosen at random among those the forced call's grammar allows (a random model's worst case), four
    times: each answer is one call of an offered (or the named) function whose arguments validate against its
    schema as the client sent it."""
    from pipeline.runtime.grammar import Grammars
    from pipeline.serve.text import TextCodec

    codec = TextCodec(tokenizer, {})
    eos = tokenizer.token_to_id("<|eos|>")
    grammars = Grammars(tokenizer.to_str(), (eos,), codec.control_tokens)
    f = FORMATS[fmt]
    marker = codec.control_tokens.get(f.marker)
    keep = frozenset({marker}) if marker is not None else frozenset()
    names = [t["function"]["name"] for t in tools]
    for seed in range(4):
        rng = random.Random(seed)
        state = grammars.start(grammars.compile(f.forced(tools, choice)))
        ids: list[int] = []
        for _ in range(400):
            allowed = [i for i, b in enumerate(state.allowed()) if b]
            token = rng.choice(allowed)
            if token == eos:
                break
            state.advance(token)
            ids.append(token)
        else:
            pytest.fail(f"no end after 400 tokens: {codec.decode(ids, keep)!r}")
        text = codec.decode(ids, keep)
        found = f.calls(text, tools)
        assert found is not None, text
        (call,) = found[1]
        name = call["function"]["name"]
        assert name == (choice or name) and name in names
        schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        if marker is not None:      # the control token itself, never its spelling in text
            assert ids[0] == marker


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("choice", [None, "add"])
def test_a_forced_call_parses_and_validates_whatever_tokens_are_chosen(tokenizer, fmt, choice):
    _random_forced_calls(tokenizer, fmt, TOOLS, choice)


# what Pydantic (and so the OpenAI Agents SDK) sends for nested models: $defs beside $ref pointers, two tools each
# with a definition of the same name, one of them recursive through "#"
SLOT = {"type": "object", "properties": {"day": {"type": "string", "enum": ["mon", "tue"]},
                                         "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
        "required": ["day", "hour"]}
DEFS_TOOLS = (
    {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"slot": {"$ref": "#/$defs/Slot"}}, "required": ["slot"],
        "$defs": {"Slot": SLOT}}}},
    {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"to": {"$ref": "#/definitions/Slot"},
                                         "then": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["to", "then"],
        "definitions": {"Slot": {"type": "object", "properties": {"room": {"type": "string", "maxLength": 4}},
                                 "required": ["room"]}}}}},
)


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
@pytest.mark.parametrize("choice", [None, "book", "move"])
def test_a_forced_call_whose_parameters_use_defs_and_refs_compiles_and_validates(tokenizer, fmt, choice):
    """Forced calls of tools whose parameters point into their own $defs / definitions (and at their own root): each
    tool's definitions are lifted to the call wrapper's root under names of their own, so "#/$defs/Slot" no longer
    resolves against the wrapper (it was a 400: "Pointer '/$defs/Slot' does not exist") and two tools' "Slot"s stay
    apart; the answers validate against the schemas as sent."""
    from pipeline.runtime.grammar import embedded_schema

    body, defs = embedded_schema(DEFS_TOOLS[1]["function"]["parameters"], "t1_")
    assert body["properties"]["to"] == {"$ref": "#/$defs/t1_Slot"} and set(defs) == {"t1_Slot", "t1_root"}
    assert body["properties"]["then"]["anyOf"][0] == {"$ref": "#/$defs/t1_root"} and defs["t1_root"] == body
    _random_forced_calls(tokenizer, fmt, DEFS_TOOLS, choice)


def test_a_forced_calls_arguments_are_closed_where_the_schema_says_nothing_and_kept_where_it_does():
    from pipeline.runtime.grammar import closed_schema as _closed
    schema = {"type": "object", "properties": {"properties": {"type": "object", "properties": {"x": {}}},
                                               "free": {"type": "object", "additionalProperties": True,
                                                        "properties": {}}},
              "$defs": {"d": {"type": "object", "properties": {}}}, "enum": [{"properties": 1}]}
    closed = _closed(schema)
    assert closed["additionalProperties"] is False
    assert set(closed["properties"]) == {"properties", "free"}          # a property named "properties" stays one
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert closed["properties"]["free"]["additionalProperties"] is True
    assert closed["$defs"]["d"]["additionalProperties"] is False and closed["enum"] == [{"properties": 1}]

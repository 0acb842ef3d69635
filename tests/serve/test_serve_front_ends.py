"""The three front ends' requests, parsed into the one typed request (serve/anthropic.py, openai_responses.py,
protocol.py): what each API's shapes become, and the peer servers' extension fields honoured or refused by name."""

from __future__ import annotations

import pytest

from pipeline.serve.anthropic import parse_count, parse_messages
from pipeline.serve.errors import ApiError
from pipeline.serve.openai_responses import parse_responses
from pipeline.serve.protocol import parse_chat, parse_completion

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
USER = [{"role": "user", "content": "x"}]


def test_an_anthropic_conversation_becomes_the_chat_the_template_renders():
    req = parse_messages({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "A"},
                                                                     {"type": "text", "text": "B"}],
                          "tools": [{"name": "get", "input_schema": {"type": "object"}},
                                    {"name": "later", "input_schema": {"type": "object"}, "defer_loading": True}],
                          "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                          "stop_sequences": ["END"], "top_k": 5, "temperature": 0.5,
                          "messages": [
                              {"role": "user", "content": "Weather?"},
                              {"role": "system", "content": [{"type": "text", "text": "env"}]},
                              {"role": "assistant", "content": [
                                  {"type": "thinking", "thinking": "hmm", "signature": "s"},
                                  {"type": "text", "text": "Let me look."},
                                  {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": 1}}]},
                              {"role": "user", "content": [
                                  {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                   "content": [{"type": "text", "text": "timeout"}]},
                                  {"type": "text", "text": "Again", "cache_control": {"type": "ephemeral"}}]}]})
    assert req.messages == (
        {"role": "system", "content": "A\nB\n\nenv"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": {"q": 1}}}]},
        {"role": "tool", "content": "Error: timeout", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "Again"})
    assert [t["function"]["name"] for t in req.tools] == ["get"]        # a deferred tool is not shown
    assert req.tool_choice == "required" and req.parallel_tool_calls is False
    assert req.stop == ("END",) and req.sampling.top_k == 5 and req.sampling.temperature == 0.5
    assert req.max_tokens == 9 and parse_count({"model": "m", "messages": USER}).max_tokens is None


@pytest.mark.parametrize("body,param,message", [
    ({"model": "m", "messages": USER}, "max_tokens", "max_tokens must be an integer of at least 1, not None"),
    ({"model": "m", "max_tokens": 4, "messages": USER, "temperature": 1.5}, "temperature", "from 0 to 1"),
    ({"model": "m", "max_tokens": 4, "messages": USER, "mcp_servers": [{"url": "x"}]}, "mcp_servers",
     "MCP servers are not reachable"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages[0].content[0]", "a 'document' block is not supported from the user"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t"}]}]}, "messages[0].content[0]", "not supported from the assistant"),
])
def test_anthropic_refusals_name_its_own_fields(body, param, message):
    with pytest.raises(ApiError) as err:
        parse_messages(body)
    assert err.value.param == param and message in err.value.message, err.value.message
    assert err.value.anthropic_body()["error"]["type"] == "invalid_request_error"


def test_a_responses_input_becomes_the_chat_with_its_calls_and_results():
    req = parse_responses({"model": "m", "instructions": "Be brief.", "max_output_tokens": 7, "store": False,
                           "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
                           "tools": [{"type": "function", "name": "sh", "parameters": {"type": "object"}},
                                     {"type": "web_search"}],
                           "input": [
                               {"type": "message", "role": "developer",
                                "content": [{"type": "input_text", "text": "Rules."}]},
                               {"role": "user", "content": "List files"},
                               {"type": "reasoning", "id": "rs_1", "summary": []},
                               {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{\"a\": 1}"},
                               {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": "{}"},
                               {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                               {"type": "function_call_output", "call_id": "c2",
                                "output": [{"type": "input_text", "text": "b.txt"}]}],
                           "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}})
    assert [m["role"] for m in req.messages] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in req.messages[3]["tool_calls"]] == ["c1", "c2"]
    assert req.messages[3]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert req.messages[5] == {"role": "tool", "content": "b.txt", "tool_call_id": "c2"}
    assert req.max_tokens == 7 and req.schema == SCHEMA and [t["function"]["name"] for t in req.tools] == ["sh"]
    assert req.ignored == "tools not offered: web_search (hosted tools run on OpenAI's service, not here)"
    assert req.echo["instructions"] == "Be brief." and req.truncate
    assert not parse_responses({"model": "m", "input": "x", "truncation": "disabled"}).truncate


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ({"input": []}, "input"),
])
def test_responses_refusals(body, param):
    with pytest.raises(ApiError) as err:
        parse_responses({"model": "m", **body})
    assert err.value.param == param and err.value.status == 400


@pytest.mark.parametrize("extra,schema", [
    ({"structured_outputs": {"json": SCHEMA}}, SCHEMA),
    ({"structured_outputs": {"json": '{"type": "array"}'}}, {"type": "array"}),
    ({"structured_outputs": {"json_object": True}}, {"type": "object"}),
    ({"guided_json": SCHEMA}, SCHEMA),
    ({"json_schema": SCHEMA}, SCHEMA),                                       # llama.cpp
    ({"response_format": {"type": "json_object", "schema": SCHEMA}}, SCHEMA),    # llama.cpp
    ({"min_tokens": 0, "add_generation_prompt": True, "skip_special_tokens": True}, None),    # their defaults
])
def test_peer_extensions_that_map_onto_a_schema_are_honoured(extra, schema):
    assert parse_chat({"messages": USER, **extra}).schema == schema


@pytest.mark.parametrize("extra,param", [
    ({"grammar": "root ::= \"a\""}, "grammar"), ({"min_tokens": 3}, "min_tokens"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"), ({"continue_final_message": True}, "continue_final_message"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "guided_json"),
])
def test_peer_extensions_it_does_not_apply_are_a_400_naming_them(extra, param):
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": USER, **extra})
    assert err.value.param == param and err.value.status == 400


def test_completion_prompts_as_token_ids():
    assert parse_completion({"prompt": [1, 2, 3]}).prompt_ids == (1, 2, 3)
    assert parse_completion({"prompt": [[4, 5]]}).prompt_ids == (4, 5)
    assert parse_completion({"prompt": ["one"]}).prompt == "one"
    several = parse_completion({"prompt": ["a", [7, 8]], "max_tokens": 3})
    assert [(r.prompt, r.prompt_ids, r.max_tokens) for r in several.batch] == [("a", None, 3), ("", (7, 8), 3)]
    for bad in ([1, "a"], [True], [[1], "a", 5], []):
        with pytest.raises(ApiError):
            parse_completion({"prompt": bad})


def _junk(rng, depth: int = 0):
    """A JSON value of any shape: what a careless or hostile client puts where a field should be."""
    kind = rng.randrange(8 if depth < 3 else 5)
    makers = [lambda: None, lambda: True, lambda: rng.randint(-3, 10**6), lambda: "x" * rng.randrange(3),
              lambda: 1.5, lambda: [_junk(rng, depth + 1) for _ in range(rng.randrange(3))],
              lambda: {k: _junk(rng, depth + 1) for k in rng.sample(
                  ["type", "text", "content", "role", "name", "id", "input", "source", "format", "schema", "json"], 3)},
              lambda: [{"type": t, "text": _junk(rng, depth + 1)} for t in ("text", "image", "tool_use")]]
    return makers[kind]()


@pytest.mark.parametrize("parse,valid", [
    (parse_messages, {"model": "m", "max_tokens": 4, "system": "s", "messages": USER, "tools": [],
                      "tool_choice": {"type": "auto"}, "stop_sequences": ["x"], "output_config": {}}),
    (parse_responses, {"model": "m", "input": "x", "instructions": "s", "tools": [], "text": {},
                       "tool_choice": "auto", "truncation": "auto"}),
    (parse_chat, {"messages": USER, "structured_outputs": None, "response_format": None, "guided_json": None}),
    (parse_completion, {"prompt": "x", "max_tokens": 2}),
], ids=["messages", "responses", "chat", "completions"])
def test_junk_in_any_field_is_a_400_never_a_traceback(parse, valid):
    import random
    rng = random.Random(7)
    for _ in range(3000):
        body = dict(valid)
        for key in rng.sample(sorted(body), rng.randrange(1, 3)):
            body[key] = _junk(rng)
        if rng.random() < 0.3 and isinstance(body.get("messages"), list):
            body["messages"] = [{"role": rng.choice(["user", "assistant", "system"]), "content": _junk(rng)}]
        try:
            parse(body)
        except ApiError as exc:
            assert exc.status == 400 and exc.message


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("body,param,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(70)}}},
     "response_format", "nested more than 64 levels deep"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(70)}}]},
     "tools[0].function.parameters", "nested more than 64 levels deep"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"ci\ud800ty": {"type": "string"}}}}}]},
     "tools[0].function.parameters", "lone surrogate (U+D800"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                            "function": {"name": "f", "arguments": {
                                                                                "city": "Os\udc00lo"}}}]},
                   {"role": "user", "content": "x"}]}, "messages[0].tool_calls", "lone surrogate (U+DC00"),
])
def test_what_would_fail_downstream_is_a_400_here(body, param, message):
    """#66: schemas nested past what the compilers recurse through, and text UTF-8 cannot hold anywhere in a schema
    or a call's arguments, are the client's mistakes: 400s naming the field, not 500s from the renderer or grammar."""
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": USER, **body})
    assert err.value.param == param and message in err.value.message and err.value.status == 400
    parse_chat({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _nested(63)}}})      # 64 levels of JSON: taken


def test_bodies_in_flight_are_held_to_a_budget_and_released_however_the_read_ends():
    """#66: a vision-language server read each body whole (32 MiB) before admission: a few hundred slow uploads could
    hold gigabytes. Bodies held at once are budgeted; a read past the budget is a 503 to retry."""
    import asyncio
    import json as _json
    from types import SimpleNamespace

    from pipeline.serve.reply import BodyBudget, _body

    def request(chunks: list[bytes], gate: asyncio.Event):
        async def receive():
            if len(chunks) == 1:
                await gate.wait()           # the last chunk waits: the body is held meanwhile
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        return SimpleNamespace(headers={}, receive=receive)

    async def run():
        budget, gate, free = BodyBudget(1000), asyncio.Event(), asyncio.Event()
        free.set()
        body = _json.dumps({"prompt": "x" * 600}).encode()
        first = asyncio.ensure_future(_body(request([body[:400], body[400:]], gate), 10_000, budget))
        await asyncio.sleep(0.01)
        assert budget.held == 400
        with pytest.raises(ApiError) as err:
            await _body(request([b"y" * 700], free), 10_000, budget)
        assert err.value.status == 503 and err.value.headers["Retry-After"] == "2" and budget.held == 400
        gate.set()
        assert (await first)["prompt"] == "x" * 600 and budget.held == 0
        with pytest.raises(ApiError):       # a body that is not JSON: released too
            await _body(request([b"{not json"], free), 10_000, budget)
        assert budget.held == 0
    asyncio.run(run())


def test_claude_codes_long_mcp_tool_names_are_taken_up_to_anthropics_limit():
    name = "mcp__" + "kiosk_inventory_server__" + "x" * 99
    assert len(name) == 128
    req = parse_messages({"model": "m", "max_tokens": 4, "messages": USER,
                          "tools": [{"name": name, "input_schema": {"type": "object"}}]})
    assert req.tools[0]["function"]["name"] == name
    with pytest.raises(ApiError, match="at most 128"):
        parse_messages({"model": "m", "max_tokens": 4, "messages": USER,
                        "tools": [{"name": name + "y", "input_schema": {"type": "object"}}]})

"""OpenAI's request shapes as agent frameworks and chat UIs send them, parsed (serve/protocol.py): tools and
tool_choice checked, assistant tool calls and tool results in the history, penalties, min_p and logprobs parsed with
their bounds named (whether a backend applies them is the server's check: test_serve_tools.py)."""

from __future__ import annotations

import pytest

from pipeline.serve import protocol
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import parse_chat

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_tools_and_a_replayed_tool_conversation_are_taken():
    req = parse_chat({"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
        {"role": "user", "content": "Thanks"}], "tools": [TOOL]})
    assert req.tool_choice == "auto" and req.tools[0]["function"]["name"] == "get_weather"
    call = req.messages[1]
    assert call["content"] == "" and call["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert req.messages[2] == {"role": "tool", "content": "-3 C", "tool_call_id": "call_1"}
    assert parse_chat({"messages": [{"role": "user", "content": "x"}]}).tool_choice == "none"
    # "tool_choice": null is omitted (OpenAI's reading; the Agents SDK sends it): auto with tools, none without
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": None}) \
        .tool_choice == "auto"
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "tool_choice": None}).tool_choice == "none"
    named = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.tool_choice == "get_weather"


@pytest.mark.parametrize("extra,param,message", [
    ({"tools": {"a": 1}}, "tools", "tools must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools", "JSON schema object"),
    ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice", "auto, none, required"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice",
     "'other', which is not one of the tools"),
    ({"tool_choice": "required"}, "tool_choice", "required needs tools"),
    ({"repetition_penalty": 0}, "repetition_penalty", "from 0.01 to 10.0"),
    ({"min_p": 1.5}, "min_p", "from 0.0 to 1.0"),
    ({"presence_penalty": -2.5}, "presence_penalty", "from -2.0 to 2.0"),
    ({"frequency_penalty": "1"}, "frequency_penalty", "from -2.0 to 2.0"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
    ({"logprobs": 1}, "logprobs", "true or false"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
    ({"functions": [{"name": "f"}]}, "functions", "send `tools`"),
])
def test_bad_tool_fields_and_unapplied_parameters_are_a_400_naming_them(extra, param, message):
    with pytest.raises(ApiError) as exc:
        parse_chat({"messages": [{"role": "user", "content": "x"}], **extra})
    assert exc.value.status == 400 and exc.value.param == param and message in exc.value.message


def test_a_bad_message_in_the_history_is_a_400():
    with pytest.raises(ApiError, match="role of system, user, assistant or tool"):
        parse_chat({"messages": [{"role": "robot", "content": "x"}]})
    with pytest.raises(ApiError, match="arguments are not JSON"):
        parse_chat({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "function": {"name": "f", "arguments": "{oops"}}]}]})


def test_penalties_min_p_and_logprobs_are_parsed_at_their_edges():
    base = {"messages": [{"role": "user", "content": "x"}]}
    req = parse_chat(dict(base, repetition_penalty=10.0, presence_penalty=-2.0, frequency_penalty=2.0, min_p=1.0,
                          logprobs=True, top_logprobs=20, parallel_tool_calls=False))
    s = req.sampling
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.min_p) == (10.0, -2.0, 2.0, 1.0)
    assert s.extras() == ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")
    assert req.logprobs == 20 and req.parallel_tool_calls is False
    plain = parse_chat(base)
    assert plain.sampling.extras() == () and plain.logprobs is None and plain.parallel_tool_calls is True
    assert parse_chat(dict(base, logprobs=True)).logprobs == 0
    from pipeline.serve.protocol import parse_completion
    assert parse_completion({"prompt": "x", "logprobs": 5}).logprobs == 5
    with pytest.raises(ApiError) as exc:
        parse_completion({"prompt": "x", "logprobs": 6})
    assert exc.value.param == "logprobs"


def test_stream_chunks_carry_usage_null_when_the_client_asked_for_usage():
    """As OpenAI streams with stream_options.include_usage: every content chunk has "usage": null, and the last chunk
    (no choices) the counts; without it no chunk has the key."""
    from pipeline.serve.responses import CHAT, COMPLETIONS, Ident, Output, Usage
    ident = Ident("id", "m", 1)
    (opening,) = CHAT.opening(ident, include_usage=True)
    assert "usage" in opening and opening["usage"] is None and opening["choices"][0]["delta"] == {"role": "assistant",
                                                                                                 "content": ""}
    (piece,) = CHAT.piece(ident, Output("Hi", "stop"), include_usage=False)
    assert "usage" not in piece and piece["choices"][0] == {"index": 0, "finish_reason": None, "logprobs": None,
                                                            "delta": {"content": "Hi"}}    # the reason comes last
    *_, last = CHAT.closing(ident, Output("", "stop"), include_usage=True)
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["delta"] == {}
    (text,) = COMPLETIONS.piece(ident, Output("Hi", "stop"), include_usage=True)
    assert text["usage"] is None and (text["choices"][0]["text"], text["choices"][0]["finish_reason"]) == ("Hi", "stop")
    assert list(COMPLETIONS.opening(ident, True)) == [] and list(COMPLETIONS.closing(ident, Output(), True)) == []
    usage = CHAT.usage_chunk(ident, Usage(3, 4))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_each_endpoint_lays_out_log_probabilities_as_openai_does():
    from pipeline.serve.responses import CHAT, COMPLETIONS, Output
    entries = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}, {"token": "Ho", "logprob": -1.5, "bytes": [72, 111]}]},
        {"token": "!", "logprob": -0.25, "bytes": [33], "top_logprobs": []}]
    assert CHAT.logprobs(Output(logprobs=entries)) == {"content": entries, "refusal": None}
    assert COMPLETIONS.logprobs(Output(logprobs=entries, offset=7)) == {
        "tokens": ["Hi", "!"], "token_logprobs": [-0.5, -0.25], "top_logprobs": [{"Hi": -0.5, "Ho": -1.5}, {}],
        "text_offset": [7, 9]}
    assert CHAT.logprobs(Output()) is None and COMPLETIONS.logprobs(Output()) is None


def test_a_strict_json_schema_is_closed_to_properties_it_does_not_list_as_openai_strict_mode_is():
    base = {"messages": [{"role": "user", "content": "x"}]}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    strict = parse_chat(dict(base, response_format={"type": "json_schema", "json_schema": {
        "name": "p", "strict": True, "schema": schema}})).schema
    loose = parse_chat(dict(base, response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": schema}})).schema
    assert strict == dict(schema, additionalProperties=False) and loose == schema


def test_only_a_short_plain_prompt_is_prepared_on_the_event_loop():
    from pipeline.serve.prepare import QUICK_CHARS, Preparer

    def quick(body: dict, chat: bool = False) -> bool:
        req = (protocol.parse_chat if chat else protocol.parse_completion)({"model": "m", **body})
        return Preparer.quick(None, req, chat)      # it reads only the request
    assert quick({"prompt": "x" * QUICK_CHARS}) and not quick({"prompt": "x" * (QUICK_CHARS + 1)})
    half = {"role": "user", "content": "y" * (QUICK_CHARS // 2)}
    assert quick({"messages": [half, half]}, chat=True)
    assert not quick({"messages": [half, half, {"role": "user", "content": "z"}]}, chat=True)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert not quick({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}, chat=True)
    assert not quick({"prompt": "hi", "response_format": {"type": "json_object"}})  # a schema waits on the session

"""OpenAI's request shapes as agent frameworks and chat UIs send them, parsed (serve/protocol.py): tools and
tool_choice checked, assistant tool calls and tool results in the history, penalties and min_p refused by name."""

from __future__ import annotations

import pytest

from pipeline.serve.protocol import ApiError, parse_chat

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
    ({"repetition_penalty": 1.1}, "repetition_penalty", "not applied"),
    ({"min_p": 0.05}, "min_p", "not applied"),
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

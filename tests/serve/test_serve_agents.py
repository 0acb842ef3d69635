"""The APIs agents speak, through their own clients against `python -m pipeline serve` on the default recipe's build:
Anthropic's Messages API with the anthropic SDK (plain, streamed, a forced tool_use whose input validates, count_tokens,
its error shape, x-api-key), OpenAI's Responses API with the openai SDK (plain, streamed, a function call, a JSON
schema) and the OpenAI Agents SDK's default model. (The anthropic SDK of 2026 has no sampling parameters: they go in
extra_body, as the Messages API still takes them.) One generation path: the same greedy answer through all three."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.serving import serving

pytestmark = pytest.mark.integration
MODEL = "tiny-llama-cpu"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "required": ["city"], "additionalProperties": False,
                            "properties": {"city": {"type": "string", "maxLength": 12}}}}


@pytest.fixture(scope="module")
def server(kit, tmp_path_factory):
    with serving(kit, tmp_path_factory.mktemp("serve-agents") / "server.log", "--api-key", "k3y") as s:
        yield s


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="k3y", max_retries=0)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0)


def test_one_greedy_answer_through_the_three_apis(claude, oai):
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "You bake."},
                                                              {"role": "user", "content": "Bread?"}],
                                       max_tokens=8, temperature=0)
    msg = claude.messages.create(model=MODEL, system="You bake.", max_tokens=8, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": "Bread?"}])
    resp = oai.responses.create(model=MODEL, instructions="You bake.", input="Bread?", max_output_tokens=8,
                                temperature=0)
    text = chat.choices[0].message.content
    assert text and msg.content[0].text == text and resp.output_text == text
    assert msg.usage.input_tokens == chat.usage.prompt_tokens == resp.usage.input_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens == resp.usage.output_tokens
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert resp.id.startswith("resp_") and resp.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                                                           else "completed")


def test_anthropic_stream_is_its_event_sequence_and_adds_up_to_the_whole_answer(claude):
    whole = claude.messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": "Tell me about flour"}])
    events = []
    with claude.messages.stream(model=MODEL, max_tokens=12, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Tell me about flour"}]) as stream:
        for ev in stream:
            events.append(ev.type)
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events[1] == "content_block_start" or "ping" in events[:2]
    assert events.count("content_block_start") == events.count("content_block_stop") == 1
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_anthropic_forced_tool_use_validates_and_its_result_is_read_back(claude):
    msg = claude.messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 1.0}, tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather"},
                                 messages=[{"role": "user", "content": "Weather in Oslo?"}])
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    follow = claude.messages.create(model=MODEL, max_tokens=4, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 20 C"}]}])
    assert follow.usage.input_tokens > msg.usage.input_tokens
    with claude.messages.stream(model=MODEL, max_tokens=60, extra_body={"temperature": 1.0}, tools=[WEATHER],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather?"}]) as stream:
        final = stream.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER["input_schema"])


def test_a_forced_call_cut_by_max_tokens_is_no_call_and_no_text_in_every_api(claude, oai):
    """Defect 3 of #65: the server's call format never reaches a client as text."""
    tool = {"type": "function", "function": {"name": WEATHER["name"], "parameters": WEATHER["input_schema"]}}
    forced = {"type": "function", "function": {"name": "get_weather"}}
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Oslo?"}], max_tokens=3,
                                       tools=[tool], tool_choice=forced)
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content == ""
    assert not chat.choices[0].message.tool_calls
    chunks = list(oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Oslo?"}],
                                              max_tokens=3, tools=[tool], tool_choice=forced, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    msg = claude.messages.create(model=MODEL, max_tokens=3, tools=[WEATHER], tool_choice={"type": "any"},
                                 messages=[{"role": "user", "content": "Oslo?"}])
    assert msg.content == [] and msg.stop_reason == "max_tokens"
    resp = oai.responses.create(model=MODEL, input="Oslo?", max_output_tokens=3, tool_choice="required",
                                tools=[{"type": "function", "name": "get_weather",
                                        "parameters": WEATHER["input_schema"]}])
    assert resp.output == [] and resp.status == "incomplete"


def test_anthropic_count_tokens_head_probe_errors_and_keys(server, claude):
    counted = claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Bread?"}])
    made = claude.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Bread?"}])
    assert counted.input_tokens == made.usage.input_tokens
    assert httpx.head(server.url + "/").status_code == 200          # Claude Code's probe, no key needed
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert err.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message":
                                                         "max_tokens must be an integer of at least 1, not 0"}}
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert err.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=server.url, auth_token="k3y", max_retries=0)     # Authorization: Bearer
    assert bearer.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}]).content


def test_responses_stream_events_and_function_calls(oai):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"]}]
    kinds, final = [], None
    with oai.responses.stream(model=MODEL, input="Weather in Rome?", tools=tools, tool_choice="required",
                              max_output_tokens=60) as stream:
        for ev in stream:
            kinds.append(ev.type)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
    (call,) = [o for o in final.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["input_schema"])
    # the call's result sent back as Codex and the Agents SDK do: function_call, then function_call_output
    again = oai.responses.create(model=MODEL, max_output_tokens=4, temperature=0, tools=tools, input=[
        {"role": "user", "content": "Weather in Rome?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert again.usage.input_tokens > final.usage.input_tokens
    # the tiny model never ends a turn by itself: cut by max_output_tokens, the stream ends in response.incomplete
    # (which the SDK's stream helper refuses to call final, as it would from OpenAI)
    events = list(oai.responses.create(model=MODEL, input="Bread?", max_output_tokens=8, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and last.response.output_text == text and last.response.usage.output_tokens == 8


def test_responses_json_schema_and_what_it_refuses(oai):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    resp = oai.responses.create(model=MODEL, input="A digit?", max_output_tokens=40, text={"format": {
        "type": "json_schema", "name": "digit", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(resp.output_text), schema)
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert err.value.body["param"] == "previous_response_id" and "stores no responses" in err.value.body["message"]
    # hosted tools are not offered to the model, and the answer says so (Codex sends web_search every turn)
    r = httpx.post(str(oai.base_url) + "responses", headers={"Authorization": "Bearer k3y"}, timeout=60, json={
        "model": MODEL, "input": "x", "max_output_tokens": 2, "tools": [{"type": "web_search"}]})
    assert r.status_code == 200 and "web_search" in r.headers["x-tools-ignored"]


def test_the_agents_sdks_default_model_runs_an_agent_that_calls_a_tool(server):
    """The Agents SDK's default model is OpenAIResponsesModel: the agent's forced call is a function_call item, the
    SDK runs the tool, and the tool's answer is the run's output (stop_on_first_tool: the tiny model never ends a
    turn by itself)."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0),
                              use_for_tracing=False)
    asked: list[str] = []

    @function_tool
    def get_weather(city: Literal["Oslo", "Rome", "Lima"]) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"Sunny in {city}"
    agent = Agent(name="weather", instructions="Answer with the tool.", model=MODEL, tools=[get_weather],
                  model_settings=ModelSettings(max_tokens=60, tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "Weather in Oslo?")
    assert len(asked) == 1 and result.final_output == f"Sunny in {asked[0]}"
    (call,) = [o for o in result.raw_responses[0].output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": asked[0]}

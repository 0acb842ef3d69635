"""`python -m pipeline serve tiny-llama-cpu` driven the way Open WebUI and agent frameworks drive it: Open WebUI's own
request shapes (its default chat with its built-in tools, title generation, a second turn with a long history, from
its source: backend/open_webui/tools/builtin.py, routers/tasks.py, config.py), tool calls through the openai SDK
(forced, named, streamed as OpenAI frames them), LangChain's bind_tools and with_structured_output in its three
methods, log-probabilities, and penalties. The tiny model's weights are random: only constrained decoding makes its
forced calls and JSON valid, which is what these tests check."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.serving import serving

pytestmark = pytest.mark.integration
MODEL = "tiny-llama-cpu"


def _fn(name: str, description: str, properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


# Open WebUI's built-in tools as it sends them with every chat under native function calling (the specs it makes
# from backend/open_webui/tools/builtin.py's signatures and docstrings)
OPEN_WEBUI_TOOLS = [
    _fn("get_current_timestamp", "Get the current Unix timestamp in seconds.", {}),
    _fn("calculate_timestamp", "Get the current Unix timestamp, optionally adjusted by days, weeks, months, or years.",
        {k: {"type": "integer", "description": f"Number of {k.split('_')[0]} to subtract from current time "
             "(default: 0)", "default": 0} for k in ("days_ago", "weeks_ago", "months_ago", "years_ago")}),
    _fn("search_web", "Search the public web for information. Best for current events, external references, or topics "
        "not covered in internal documents.",
        {"query": {"type": "string", "description": "The search query to look up"},
         "count": {"type": "integer", "description": "Number of results to return"}}, ("query",)),
    _fn("fetch_url", "Fetch and extract the main text content from a web page URL.",
        {"url": {"type": "string", "description": "The URL to fetch content from"}}, ("url",)),
]
WEATHER = _fn("get_weather", "Weather in a city", {"city": {"type": "string", "maxLength": 16},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
              ("city", "unit"))
ADD = _fn("add", "Add two numbers", {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                     "b": {"type": "integer", "minimum": -99, "maximum": 99}}, ("a", "b"))
# Open WebUI's default title prompt (backend/open_webui/config.py), {{MESSAGES:END:2}} filled as it fills it
TITLE_PROMPT = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Use emojis that enhance understanding of the topic, but avoid quotation marks or special formatting.
- Write the title in the chat's primary language; default to English if multilingual.
- Prioritize accuracy over excessive creativity; keep it clear and simple.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: Tell me about bread
ASSISTANT: Bread is flour and water.
</chat_history>"""


@pytest.fixture(scope="module")
def server(kit, tmp_path_factory):
    with serving(kit, tmp_path_factory.mktemp("serve-tools") / "server.log") as s:
        yield s


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def sse(r: httpx.Response) -> list[dict]:
    text = r.read().decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    return [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]


def args_of(call, tools) -> dict:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    value = json.loads(call.function.arguments)
    jsonschema.validate(value, schema)
    return value


def test_the_model_card_says_how_its_tool_calls_are_read(server):
    card = httpx.get(server.url + "/v1/models/" + MODEL, timeout=10).json()
    assert card["tool_calls"] == "llama3_json"
    assert card["sampling_defaults"]["repetition_penalty"] == 1.0


def test_open_webuis_default_chat_with_its_built_in_tools_and_a_second_turn_past_max_input_len(server):
    """Its tools' definitions alone are more than this engine's 128-token max_input_len: the chat is answered as a
    plain chat, said in a header. The second turn resends the whole history with the tools: the oldest turns are
    dropped to fit, said in another header."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Tell me about bread"}],
            "tools": OPEN_WEBUI_TOOLS}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["x-tools-ignored"] == "tools ignored: their definitions do not fit max_input_len = 128 " \
            "with the chat; answered as a plain chat"
        chunks = sse(r)
    first = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and first
    history = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(10):
        history += [{"role": "user", "content": f"Question {i}: how long does dough rise at room temperature?"},
                    {"role": "assistant", "content": f"Answer {i}: about an hour, until it doubles."}]
    history += [{"role": "user", "content": "Tell me about bread"}, {"role": "assistant", "content": first},
                {"role": "user", "content": "And rye?"}]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=dict(body, messages=history),
                      timeout=60) as r:
        assert r.status_code == 200
        assert int(r.headers["x-truncated-messages"]) >= 20 and "x-tools-ignored" in r.headers
        chunks = sse(r)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_open_webuis_title_request(server):
    """Its task request (title; follow-up and tags have the same shape): one user message, stream false,
    max_completion_tokens 1000 (clamped to the room left), its metadata (ignored). The default title prompt alone is
    longer than this engine's max_input_len: its middle is cut (head and tail kept, the count in a header) and it is
    answered, as llama.cpp's server answers it (a 400 left the chat without a title); a short one is answered within
    max_seq_len."""
    task = {"model": MODEL, "stream": False, "max_completion_tokens": 1000,
            "metadata": {"task": "title_generation", "chat_id": "c1"}}
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json=dict(
        task, messages=[{"role": "user", "content": TITLE_PROMPT}]))
    assert r.status_code == 200, r.text
    assert int(r.headers["x-truncated-tokens"]) > 0 and r.json()["usage"]["prompt_tokens"] <= 128
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json=dict(
        task, messages=[{"role": "user", "content": "Title for: bread"}], temperature=0))
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["total_tokens"] <= 256 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_tool_choice_required_makes_a_call_that_parses_and_validates(server):
    c = client(server)
    for temperature in (0, 1.0):
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                      tools=[WEATHER, ADD], tool_choice="required", temperature=temperature, seed=5)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        args_of(call, [WEATHER, ADD])


def test_a_named_tool_call_streams_as_openai_frames_it(server):
    c = client(server)
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "2 + 3?"}],
                                       tools=[WEATHER, ADD], stream=True, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "add"}},
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    head, rest = deltas[0], deltas[1:]
    assert head.index == 0 and head.id and head.type == "function" and head.function.name == "add"
    assert head.function.arguments == ""
    assert rest and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    value = json.loads("".join(d.function.arguments for d in rest))
    jsonschema.validate(value, ADD["function"]["parameters"])
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["tool_calls"] and chunks[-1].usage.completion_tokens > 0
    assert not any(ch.choices[0].delta.content for ch in chunks if ch.choices)
    # the same request unstreamed gives the same call
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "2 + 3?"}], tools=[WEATHER, ADD],
                                  tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0)
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == value


def test_a_tool_conversation_replays_through_the_template(server):
    """The assistant's call (content null) and the tool's result render through the model's template (the prompt
    grows by them), and the model answers."""
    c = client(server)
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    replay = ask + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                           "function": {"name": "get_weather",
                                                                                        "arguments": '{"city": "Oslo", '
                                                                                        '"unit": "celsius"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "-3"}]
    short = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, tools=[WEATHER], tool_choice="none")
    long = c.chat.completions.create(model=MODEL, messages=replay, max_tokens=2, tools=[WEATHER], tool_choice="none")
    assert long.usage.prompt_tokens > short.usage.prompt_tokens + 10


def test_langchain_bind_tools_and_structured_output_in_its_three_methods(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=MODEL, temperature=0, max_retries=0)
    msg = llm.bind_tools([multiply], tool_choice="required").invoke("What is 3 times 4?")
    (call,) = msg.tool_calls
    assert call["name"] == "multiply" and isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)
    assert multiply.invoke(call["args"]) == call["args"]["a"] * call["args"]["b"]
    place = {"title": "place", "description": "a place", "type": "object", "additionalProperties": False,
             "required": ["city", "count"], "properties": {"city": {"type": "string", "maxLength": 12},
                                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}}}
    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(place, method=method).invoke("Name a city.")
        jsonschema.validate(out, {k: v for k, v in place.items() if k not in ("title", "description")})
    anything = llm.with_structured_output(None, method="json_mode").bind(max_tokens=200)
    try:
        assert isinstance(anything.invoke("Return an object."), dict)
    except Exception as exc:        # cut by max_tokens before the object closed: the parser says so
        assert "Invalid json output" in str(exc) or "OUTPUT_PARSING_FAILURE" in str(exc), exc


def test_logprobs_are_the_models_and_greedy_picks_the_most_likely(server):
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Bread"}], temperature=0,
                                  max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert e.logprob == tops[0] and e.token == e.top_logprobs[0].token
        assert bytes(e.bytes).decode() == e.token
    streamed = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Bread"}],
                                              temperature=0, max_tokens=8, logprobs=True, stream=True))
    got = [e for ch in streamed if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in content]
    done = c.completions.create(model=MODEL, prompt="Bread", temperature=0, max_tokens=5, logprobs=2)
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.top_logprobs[0]) == 2
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


def test_penalties_and_min_p_are_applied_here(server):
    """The reference backend applies all of them (their numerics: tests/serve/test_serve_reference.py)."""
    c = client(server)
    plain = c.completions.create(model=MODEL, prompt="Bread bread bread", temperature=0, max_tokens=12)
    pushed = c.completions.create(model=MODEL, prompt="Bread bread bread", temperature=0, max_tokens=12,
                                  presence_penalty=2.0, frequency_penalty=2.0,
                                  extra_body={"repetition_penalty": 5.0})
    assert pushed.choices[0].text != plain.choices[0].text
    sampled = c.completions.create(model=MODEL, prompt="Bread", temperature=1.0, max_tokens=4, seed=1,
                                   extra_body={"min_p": 0.2})
    assert sampled.usage.completion_tokens >= 1

"""`python -m pipeline serve` as chat UIs and agent frameworks drive it: overload decided before a stream starts (64
concurrent openai-SDK streams), long chats fitted by dropping the oldest turns, max_tokens past the room clamped,
/v1/models/{id}, the Bearer scheme in any case, CORS for an allowed origin, a 405 typed as the client's error."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from tests.serving import serving

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(kit, tmp_path_factory):
    with serving(kit, tmp_path_factory.mktemp("serve-clients") / "server.log",
                 "--max-queue", "4", "--cors-origin", "http://kiosk.local:3000") as s:
        yield s


def test_64_concurrent_streams_each_stream_to_done_or_get_a_429_the_sdk_retries(server):
    """max_batch_size 2 + --max-queue 4: six admitted at a time. Every other stream is a 429 with Retry-After before
    any byte of a 200, which the openai SDK retries; with its retries all 64 complete, and no 200 is without a
    token."""
    before = server.metrics()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=40, timeout=120)
    expected = client.completions.create(model="tiny-llama-cpu", prompt="Bread", max_tokens=6,
                                         temperature=0).choices[0].text
    texts: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            stream = client.completions.create(model="tiny-llama-cpu", prompt="Bread", max_tokens=6, temperature=0,
                                               stream=True)
            texts.append("".join(ch.choices[0].text for ch in stream if ch.choices))
        except BaseException as exc:        # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=one) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    assert texts == [expected] * 64
    after = server.metrics()
    key = 'jetson_llm_requests_total{endpoint="/v1/completions",status="%s"}'
    assert after[key % 200] - before.get(key % 200, 0) == 65            # the 64 streams and the first request
    assert after[key % 429] - before.get(key % 429, 0) > 0             # overload was a status, retried
    assert after["jetson_llm_requests_running"] == 0 and after["jetson_llm_queue_depth"] == 0


def test_a_chat_longer_than_max_input_len_drops_its_oldest_turns_and_says_so(server, kit, tmp_path):
    long = [{"role": "system", "content": "You bake."}]
    for i in range(12):
        long += [{"role": "user", "content": f"Question {i} about bread and flour and water"},
                 {"role": "assistant", "content": f"Answer {i}: knead the dough and let it rise"}]
    long.append({"role": "user", "content": "And the oven?"})
    before = server.metrics().get("jetson_llm_truncated_messages_total", 0)
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": long, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    dropped = int(r.headers["x-truncated-messages"])
    assert dropped % 2 == 0 and 0 < dropped < len(long) - 1         # whole turns; the system message and newest kept
    assert r.json()["usage"]["prompt_tokens"] <= 128
    assert server.metrics()["jetson_llm_truncated_messages_total"] - before == dropped
    with serving(kit, tmp_path / "s.log", "--no-truncate", "--strict-limits") as strict:
        r = httpx.post(strict.url + "/v1/chat/completions", json={"messages": long, "max_tokens": 4}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = httpx.post(strict.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 1000}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_max_tokens_past_the_room_left_is_clamped_to_it(server):
    """Open WebUI's title request asks max_tokens 1000 of a model with max_seq_len 256: it gets what fits."""
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    n = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=1).usage.prompt_tokens
    r = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=1000, temperature=0, stop=None)
    free = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", temperature=0, stop=None)
    assert r.usage.total_tokens <= 256 and r.choices[0].text == free.choices[0].text
    if r.usage.completion_tokens == 256 - n:
        assert r.choices[0].finish_reason == "length"


def test_model_by_id_cors_and_405(server):
    assert httpx.get(server.url + "/v1/models/tiny-llama-cpu", timeout=10).json()["id"] == "tiny-llama-cpu"
    r = httpx.get(server.url + "/v1/models/gpt-4", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(server.url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    # CORS: the allowed origin's preflight and its answers carry the headers; another origin is refused
    pre = httpx.options(server.url + "/v1/chat/completions", timeout=10, headers={
        "Origin": "http://kiosk.local:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "http://kiosk.local:3000"
    assert "Authorization" in pre.headers["access-control-allow-headers"]
    rebound = httpx.options(server.url + "/v1/chat/completions", timeout=10, headers={
        "Host": "kiosk.local", "Origin": "http://kiosk.local:3000", "Access-Control-Request-Method": "POST"})
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 2}, timeout=30,
                   headers={"Origin": "http://kiosk.local:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://kiosk.local:3000"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 2}, timeout=30,
                   headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # the Bearer scheme in any case: tests/serve/test_serve_hostile.py (its keyed server)


CITY = {"type": "object", "additionalProperties": False, "required": ["city", "count", "ok"],
        "properties": {"city": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "minimum": 0,
                                                                              "maximum": 99},
                       "ok": {"type": "boolean"}}}


def test_json_schema_and_json_object_answers_always_parse_even_from_a_tiny_random_model(server):
    """The tiny model's weights are random: only the grammar makes its answer JSON. Greedy and sampled, streamed
    and not, through the openai SDK; the answer validates against the schema."""
    import json

    import jsonschema
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "strict": True, "schema": CITY}}
    ask = [{"role": "user", "content": "Name a city."}]
    for temperature in (0, 1.0):
        r = c.chat.completions.create(model="tiny-llama-cpu", messages=ask, response_format=fmt, seed=3,
                                      temperature=temperature)
        jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
        assert r.choices[0].finish_reason == "stop"
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="tiny-llama-cpu", messages=ask, response_format=fmt, seed=3, temperature=temperature, stream=True))
        assert streamed == r.choices[0].message.content
    obj = c.chat.completions.create(model="tiny-llama-cpu", messages=ask, response_format={"type": "json_object"},
                                    temperature=0, max_tokens=200)
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:           # cut by max_tokens: what was made is a prefix of an object
        assert obj.choices[0].message.content.startswith("{")
    free = c.chat.completions.create(model="tiny-llama-cpu", messages=ask, temperature=0, max_tokens=12)
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)         # the grammar, not the model, made it JSON


def test_a_schema_that_does_not_compile_is_a_400_naming_it(server):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "response_format": bad})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "response_format.json_schema.schema"
    assert "cannot be compiled" in err["message"] and "frobnicate" in err["message"]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


LONG = {"type": "json_schema", "json_schema": {"name": "long", "schema": {
    "type": "object", "required": ["t"], "additionalProperties": False,
    "properties": {"t": {"type": "string", "minLength": 300, "maxLength": 300}}}}}


def test_a_request_past_request_timeout_is_a_504_and_a_stream_ends_with_its_error_event(kit, tmp_path):
    """A 300-character JSON string (the grammar allows no end before it) takes the tiny model far longer than
    --request-timeout 0.05: a 504 before any body, or after a stream's 200 an error event in OpenAI's shape and no
    [DONE]; the engine slot is freed either way."""
    with serving(kit, tmp_path / "s.log", "--request-timeout", "0.05") as s:
        body = {"messages": [{"role": "user", "content": "x"}], "response_format": LONG, "max_tokens": 250}
        r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert "--request-timeout 0.05 s" in r.json()["error"]["message"]
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=dict(body, stream=True), timeout=60) as r:
            assert r.status_code == 200
            events = [e for e in r.read().decode().split("\n\n") if e]
        assert events[-1].startswith("data: {") and "[DONE]" not in events[-1]
        last = json.loads(events[-1][6:])
        assert last["error"]["code"] == "timeout" and last["error"]["type"] == "server_error"
        m = s.metrics()
        assert m["jetson_llm_requests_running"] == 0 and m["jetson_llm_queue_depth"] == 0


def test_time_to_first_token_counts_the_wait_for_a_slot(server):
    """max_batch_size 2: two long answers hold both slots while a third waits in the queue; its TTFT, as its client
    sees it, includes that wait (the histogram's sum grows by at least the wait the client measured, less a
    margin)."""
    import time
    s = server
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": LONG, "max_tokens": 250}
    before = s.metrics().get("jetson_llm_time_to_first_token_seconds_sum", 0.0)
    longs = [threading.Thread(target=lambda: httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120))
             for _ in range(2)]
    for t in longs:
        t.start()
    deadline = time.monotonic() + 30
    while s.metrics().get("jetson_llm_requests_running", 0) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 1}, timeout=120)
    waited = time.monotonic() - t0
    for t in longs:
        t.join(120)
    assert r.status_code == 200 and waited > 0.1, waited       # it did wait for a slot
    grown = s.metrics()["jetson_llm_time_to_first_token_seconds_sum"] - before
    assert grown >= 0.8 * waited, (grown, waited)

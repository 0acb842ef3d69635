"""`python -m pipeline serve RECIPE` on the default recipe's build (the reference backend: the quantized model in the
goldens' numerics), driven by the real `openai` client and by raw HTTP for the SSE framing."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time

import httpx
import openai
import pytest

from pipeline import contract
from tests.serving import REPO, Served

pytestmark = pytest.mark.integration
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(kit, tmp_path_factory):
    project, _, _ = kit
    s = Served(["tiny-llama-cpu"], project.env, REPO, tmp_path_factory.mktemp("serve") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def one_slot(kit, tmp_path_factory):
    """A keyed server with no queue: max_batch_size (2) requests at a time, a third is a 429. Its tests each leave
    every slot free again (what they prove), so they share it."""
    project, _, _ = kit
    s = Served(["tiny-llama-cpu", "--max-queue", "0", "--api-key", KEY], project.env, REPO,
               tmp_path_factory.mktemp("one-slot") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def goldens(kit) -> contract.Goldens:
    project, _, _ = kit
    return contract.Goldens.load(project.artifacts / "tiny-llama-cpu" / "goldens" / contract.GOLDENS)


def client(s: Served, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def test_health_said_loading_before_ready_and_models_lists_the_recipe(server):
    assert server.seen[-1] == (200, {"status": "ok", "preparing": 0, "saturated": False})
    assert (503, {"status": "loading"}) in server.seen       # it listened while the model loaded
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny-llama-cpu"]


def test_greedy_completions_are_the_goldens_token_for_token(server, goldens):
    c = client(server)
    for p in goldens.prompts:
        r = c.completions.create(model="tiny-llama-cpu", prompt=p.prompt, max_tokens=goldens.max_new_tokens,
                                 temperature=0)
        assert r.choices[0].text == p.text
        assert r.usage.completion_tokens == len(p.output_ids) and r.usage.prompt_tokens == len(p.input_ids)
        stopped = p.output_ids[-1] in goldens.stop_token_ids
        assert r.choices[0].finish_reason == ("stop" if stopped else "length")


def test_streamed_deltas_concatenate_to_the_answer(server, goldens):
    c = client(server)
    for p in goldens.prompts:
        whole = c.completions.create(model="tiny-llama-cpu", prompt=p.prompt, max_tokens=40, temperature=0)
        chunks = list(c.completions.create(model="tiny-llama-cpu", prompt=p.prompt, max_tokens=40, temperature=0,
                                           stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert text == whole.choices[0].text and len([ch for ch in chunks if ch.choices]) > 3
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason


def test_sse_framing_on_the_wire(server):
    body = {"model": "tiny-llama-cpu", "messages": [{"role": "user", "content": "Tell me about bread"}],
            "max_tokens": 12, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(p["object"] == "chat.completion.chunk" and p["id"] == payloads[0]["id"] for p in payloads)
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 12
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"


def test_chat_is_rendered_with_the_kits_template_as_transformers_renders_it(server, kit):
    from transformers import AutoTokenizer
    project, _, _ = kit
    tok = AutoTokenizer.from_pretrained(project.artifacts / "tiny-llama-cpu" / "fetch" / "model")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is bread made of?"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    c = client(server)
    chat = c.chat.completions.create(model="tiny-llama-cpu", messages=messages, max_tokens=20, temperature=0)
    # the same ids asked raw: the answer to the rendered conversation (this tokenizer adds no BOS of its own)
    assert tok(rendered)["input_ids"] == tok(rendered, add_special_tokens=False)["input_ids"]
    raw = c.completions.create(model="tiny-llama-cpu", prompt=rendered, max_tokens=20, temperature=0)
    assert chat.choices[0].message.content == raw.choices[0].text and chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == len(tok(rendered)["input_ids"])


def test_sixteen_concurrent_clients_each_get_their_own_answer(server):
    prompts = [f"{w} the bread and the {x}" for w in ("Bake", "Cut", "Eat", "Sell") for x in ("oven", "shelf",
                                                                                              "table", "window")]
    c = client(server, timeout=120)
    alone = {p: c.completions.create(model="tiny-llama-cpu", prompt=p, max_tokens=24 + i % 5, temperature=0)
             .choices[0].text for i, p in enumerate(prompts)}
    assert len(set(alone.values())) > 8       # different prompts, different answers: a crossed stream would show
    got: dict[str, str] = {}

    def ask(i: int, p: str) -> None:
        if i % 2:
            got[p] = "".join(ch.choices[0].text for ch in c.completions.create(
                model="tiny-llama-cpu", prompt=p, max_tokens=24 + i % 5, temperature=0, stream=True))
        else:
            got[p] = c.completions.create(model="tiny-llama-cpu", prompt=p, max_tokens=24 + i % 5,
                                          temperature=0).choices[0].text
    threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == alone


def test_sampling_is_seeded_and_stop_strings_end_the_answer(server, goldens):
    c = client(server)
    p = goldens.prompts[1]
    ask = {"model": "tiny-llama-cpu", "prompt": "Zebra quantum", "max_tokens": 30, "temperature": 2.0,
           "top_p": 0.99, "extra_body": {"top_k": 200}}
    a = [c.completions.create(seed=7, **ask).choices[0].text for _ in range(2)]
    b = c.completions.create(seed=8, **ask).choices[0].text
    assert a[0] == a[1] != b
    # the golden answer " flour, water, salt and yeast. ..." ends before the stop string, streamed or not
    stop = p.text[10:14]
    whole = c.completions.create(model="tiny-llama-cpu", prompt=p.prompt, max_tokens=16, temperature=0, stop=[stop])
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny-llama-cpu", prompt=p.prompt, max_tokens=16, temperature=0, stop=[stop], stream=True))
    assert whole.choices[0].text == streamed == p.text[:p.text.index(stop)]
    assert whole.choices[0].finish_reason == "stop"


def _error(s: Served, path: str, body, **kw) -> tuple[int, dict, httpx.Headers]:
    r = httpx.post(s.url + path, content=body if isinstance(body, bytes) else json.dumps(body).encode(),
                   headers={"content-type": "application/json", **kw.pop("headers", {})}, timeout=30)
    return r.status_code, r.json(), r.headers


@pytest.mark.parametrize("path,body,status,param,message", [
    ("/v1/completions", {"prompt": "bread", "min_tokens": 4}, 400, "min_tokens",
     "min_tokens: the engine runtimes here cannot hold back the end of an answer (another server's extension"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\""}, 400,
     "grammar", "llama.cpp's GBNF grammars are not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "structured_outputs": {"regex": "a+"}},
     400, "structured_outputs", "only vLLM's {\"json\": schema}"),
    ("/v1/completions", {"prompt": ["a"] * 17}, 400, "prompt", "prompt holds 17 prompts: at most 16 per request"),
    ("/v1/completions", {"prompt": [5, 10**9]}, 400, "prompt", "token id 1000000000 is not in the vocabulary"),
    ("/v1/completions", b'{"prompt": "bread", ', 400, None, "not valid JSON"),
    ("/v1/completions", {"prompt": "bread", "model": "llama-70b"}, 404, "model", "'llama-70b' does not exist"),
    ("/v1/completions", {"prompt": "bread", "n": 2}, 400, "n", "n must be 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}}, 400,
     "logit_bias", "logit_bias is not supported"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "non-empty list"),
    ("/v1/completions", {"prompt": "bread", "temperature": 9}, 400, "temperature", "from 0.0 to 2.0"),
    ("/v1/completions", {"prompt": "x" * (3 * 2**20)}, 413, None, "larger than 2097152 bytes"),
])
def test_errors_in_openais_shape_before_any_work(server, path, body, status, param, message):
    before = server.metrics().get("jetson_llm_prompt_tokens_total", 0)
    code, answer, _ = _error(server, path, body)
    assert code == status and set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param",
                                                                                    "code"}
    assert message in answer["error"]["message"] and answer["error"]["param"] == param
    assert server.metrics().get("jetson_llm_prompt_tokens_total", 0) == before     # nothing reached the engine


def test_token_id_prompts_and_an_over_long_prompt_cut_in_the_middle(server, kit):
    """A prompt of token ids is the prompt those ids are; one past max_input_len keeps its head and tail (the count
    cut in a header and a metric): it answers exactly as the head and tail sent alone."""
    c = client(server)
    ids = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=1).usage.prompt_tokens
    as_text = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=6, temperature=0)
    from tokenizers import Tokenizer
    project, _, _ = kit
    tok = Tokenizer.from_file(str(next(p for p in project.artifacts.rglob("tokenizer.json")
                                       if p.parent.name == "model")))
    prompt_ids = tok.encode("Zebra bread").ids
    assert len(prompt_ids) == ids
    as_ids = c.completions.create(model="tiny-llama-cpu", prompt=prompt_ids, max_tokens=6, temperature=0)
    assert as_ids.choices[0].text == as_text.choices[0].text and as_ids.usage == as_text.usage
    long = [(i * 7919) % 500 + 10 for i in range(200)]
    before = server.metrics().get("jetson_llm_truncated_tokens_total", 0)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": long, "max_tokens": 6, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200 and r.headers["x-truncated-tokens"] == "72"
    assert r.json()["usage"]["prompt_tokens"] == 128
    alone = c.completions.create(model="tiny-llama-cpu", prompt=long[:64] + long[-64:], max_tokens=6, temperature=0)
    assert r.json()["choices"][0]["text"] == alone.choices[0].text
    assert server.metrics()["jetson_llm_truncated_tokens_total"] - before == 72


def test_several_prompts_are_one_choice_each_as_each_alone(server, kit):
    """OpenAI's legacy list of prompts (strings and token ids): choice i answers prompt i exactly as it would alone
    (greedy), whole and streamed, the usage summed."""
    c = client(server)
    prompts = ["Zebra bread", "To bake bread you need", [5, 17, 33]]
    alone = [c.completions.create(model="tiny-llama-cpu", prompt=p, max_tokens=5, temperature=0) for p in prompts]
    together = c.completions.create(model="tiny-llama-cpu", prompt=prompts, max_tokens=5, temperature=0)
    assert [ch.index for ch in together.choices] == [0, 1, 2]
    assert [ch.text for ch in together.choices] == [a.choices[0].text for a in alone]
    assert together.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert together.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    texts = ["", "", ""]
    usage = None
    for chunk in c.completions.create(model="tiny-llama-cpu", prompt=prompts, max_tokens=5, temperature=0,
                                      stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
        usage = chunk.usage or usage
    assert texts == [a.choices[0].text for a in alone] and usage.total_tokens == together.usage.total_tokens


def test_max_tokens_at_the_edge_of_max_seq_len(server):
    c = client(server)
    n = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=1).usage.prompt_tokens
    at_edge = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=256 - n, temperature=0,
                                   stop=None)
    assert at_edge.usage.total_tokens <= 256
    # one past the edge: clamped to the room left (serve --strict-limits makes it a 400)
    past = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", max_tokens=257 - n, temperature=0,
                                stop=None)
    assert past.choices[0].text == at_edge.choices[0].text and past.usage == at_edge.usage
    # no max_tokens: as much as fits in max_seq_len, not a small constant
    free = c.completions.create(model="tiny-llama-cpu", prompt="Zebra bread", temperature=0)
    assert free.usage.completion_tokens == at_edge.usage.completion_tokens


def test_the_openai_client_raises_its_own_errors(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="GBNF grammars are not supported"):
        c.completions.create(model="tiny-llama-cpu", prompt="bread", max_tokens=4, extra_body={"grammar": "x"})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_metrics_count_what_was_sent(server):
    before = server.metrics()
    c = client(server)
    made = 0
    for n in (3, 5, 7):
        made += c.completions.create(model="tiny-llama-cpu", prompt="Flour and water", max_tokens=n,
                                     temperature=0).usage.completion_tokens
    _error(server, "/v1/completions", {"prompt": "bread", "n": 3})
    after = server.metrics()
    key = 'jetson_llm_requests_total{endpoint="/v1/completions",status="%s"}'
    assert after[key % 200] - before.get(key % 200, 0) == 3 and after[key % 400] - before.get(key % 400, 0) == 1
    assert after["jetson_llm_completion_tokens_total"] - before["jetson_llm_completion_tokens_total"] == made == 15
    assert after["jetson_llm_time_to_first_token_seconds_count"] - \
        before["jetson_llm_time_to_first_token_seconds_count"] == 3
    assert after["jetson_llm_requests_running"] == 0 and after["jetson_llm_queue_depth"] == 0
    assert after["jetson_llm_engine_ready"] == 1


def test_a_full_queue_is_429_with_retry_after_and_auth_is_required(one_slot):
    s = one_slot
    assert httpx.get(s.url + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client(s, api_key="wrong").models.list()
    c = client(s, api_key=KEY)
    body = {"model": "tiny-llama-cpu", "prompt": "Bread", "max_tokens": 250, "temperature": 0, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as a, \
            httpx.stream("POST", s.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as b:
        assert a.status_code == b.status_code == 200
        code, answer, h = _error(s, "/v1/completions", body, headers=AUTH)
        assert code == 429 and h["retry-after"] == "1" and answer["error"]["code"] == "queue_full"
    # the server frees a slot when it sees the disconnect (at its next write): within Retry-After's second
    s.drained(5)
    assert c.completions.create(model="tiny-llama-cpu", prompt="Bread", max_tokens=3).usage.completion_tokens


def test_a_public_address_needs_a_key_or_no_auth(kit):
    project, _, _ = kit
    proc = project.cli("serve", "tiny-llama-cpu", "--host", "0.0.0.0")
    assert proc.returncode == 2 and "without an API key" in proc.stderr and "--api-key" in proc.stderr


def test_a_server_killed_mid_stream_fails_the_client_and_a_restarted_one_serves(kit, tmp_path):
    project, _, _ = kit
    s = Served(["tiny-llama-cpu"], project.env, REPO, tmp_path / "server.log")
    c = client(s)
    stream = c.completions.create(model="tiny-llama-cpu", prompt="Bread", max_tokens=250, temperature=0,
                                  stream=True)
    first = next(iter(stream))
    assert first.choices[0].text
    os.kill(s.proc.pid, signal.SIGKILL)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in stream:
            pass
    s.proc.wait()
    again = Served(["tiny-llama-cpu"], project.env, REPO, tmp_path / "again.log")
    try:
        assert client(again).completions.create(model="tiny-llama-cpu", prompt="Bread", max_tokens=4,
                                                temperature=0).usage.completion_tokens == 4
    finally:
        again.stop()


def test_a_client_that_disconnects_mid_stream_frees_its_slot(one_slot):
    s = one_slot
    made = s.drained()["jetson_llm_completion_tokens_total"]
    body = {"model": "tiny-llama-cpu", "prompt": "Bread", "max_tokens": 250, "temperature": 0, "stream": True}
    for _ in range(3):          # more than max_batch_size (2) streams dropped after their first event
        with httpx.stream("POST", s.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as r:
            assert r.status_code == 200
            next(r.iter_lines())
    m = s.drained()
    assert m["jetson_llm_requests_running"] == 0
    assert m["jetson_llm_completion_tokens_total"] - made < 3 * 250      # cancelled, not run to the end


def test_streams_whose_clients_leave_before_the_headers_free_their_slots(one_slot):
    """A streamed request that finds a slot free is submitted before its 200 is written; a client gone by then
    (its body never began) still gets its engine work cancelled, its slot and its admission back."""
    s = one_slot
    before = s.drained()
    body = json.dumps({"model": "tiny-llama-cpu", "prompt": "Bread", "max_tokens": 250, "temperature": 0,
                       "stream": True}).encode()
    host, port = s.url.removeprefix("http://").split(":")
    for _ in range(5):          # more than max_batch_size (2) + --max-queue (0): a leaked admission is a 429
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
                         % (host.encode(), port.encode(), KEY.encode(), len(body), body))
            # gone at once (a reset): it may be seen before or after the stream's first byte
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.05)
    m = s.drained()
    assert m["jetson_llm_requests_running"] == 0
    # admitted (their prompts counted), then cancelled, not run to the end
    assert m["jetson_llm_prompt_tokens_total"] > before["jetson_llm_prompt_tokens_total"]
    assert m["jetson_llm_completion_tokens_total"] - before["jetson_llm_completion_tokens_total"] < 5 * 250
    for _ in range(3):      # all capacity is back: no 429
        r = httpx.post(s.url + "/v1/completions", json={**json.loads(body), "stream": False, "max_tokens": 3},
                       headers=AUTH, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_bench_loads_the_server_at_1_4_and_max_batch_size(server, kit, tmp_path):
    """`python -m pipeline bench URL`: levels 1, 4 and the server's max_batch_size (2) from /v1/models; every
    request counted by the server's own metrics; tokens as its usage chunks said."""
    project, _, _ = kit
    before = server.metrics()
    proc = project.cli("bench", server.url, "--requests", "4", "--max-tokens", "6", "--json", str(tmp_path / "b.json"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "b.json").read_text())
    assert out["model"] == "tiny-llama-cpu" and out["max_batch_size"] == 2
    runs = out["runs"]
    assert [(r["concurrency"], r["batch"], r["requests"]) for r in runs] == [(1, 1, 4), (2, 2, 4), (4, 2, 4)]
    after = server.metrics()
    key = 'jetson_llm_requests_total{endpoint="/v1/completions",status="200"}'
    assert after[key] - before.get(key, 0) == 12
    made = after["jetson_llm_completion_tokens_total"] - before["jetson_llm_completion_tokens_total"]
    assert made == pytest.approx(sum(r["tok_s"] * r["seconds"] for r in runs), rel=0.01)
    assert all(0 < r["ttft_p50_s"] <= r["ttft_p95_s"] for r in runs)
    assert "clients batch  req/s" in proc.stdout and len(proc.stdout.strip().splitlines()) == 5


def test_bench_on_a_url_where_nothing_listens_says_so(kit):
    project, _, _ = kit
    proc = project.cli("bench", "http://127.0.0.1:9", "--requests", "1")
    assert proc.returncode == 2 and "is the server running" in proc.stderr and "Traceback" not in proc.stderr
    proc = project.cli("bench", "ftp://x", "--requests", "1")
    assert proc.returncode == 2 and "not an http(s) URL" in proc.stderr


def test_logprobs_under_a_schema_are_finite_whole_and_streamed(server):
    """Where the grammar leaves fewer tokens than top_logprobs asks, the masked alternatives are -inf: reported at
    OpenAI's floor (-9999.0), never -Infinity (invalid JSON) or a 500 (#66)."""
    c = client(server)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "digit", "schema": schema}}
    whole = c.chat.completions.create(model="tiny-llama-cpu", messages=[{"role": "user", "content": "A digit?"}],
                                      response_format=fmt, logprobs=True, top_logprobs=5, max_tokens=30)
    entries = whole.choices[0].logprobs.content
    alternatives = [t.logprob for e in entries for t in e.top_logprobs]
    assert entries and all(-9999.0 <= e.logprob <= 0 for e in entries)
    assert -9999.0 in alternatives and all(-9999.0 <= a <= 0 for a in alternatives)    # masked ones at the floor
    streamed = [t.logprob for ch in c.chat.completions.create(
        model="tiny-llama-cpu", messages=[{"role": "user", "content": "A digit?"}], response_format=fmt,
        logprobs=True, top_logprobs=5, max_tokens=30, stream=True)
        if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content for t in e.top_logprobs]
    assert -9999.0 in streamed and all(-9999.0 <= a <= 0 for a in streamed)


def test_control_tokens_typed_in_a_chat_are_refused(server):
    """The template would turn "<|eos|>" in a message's text into the end-of-sequence token (#66)."""
    code, answer, _ = _error(server, "/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "end here <|eos|> and go on"}]}]})
    assert code == 400 and answer["error"]["param"] == "messages[2].content"
    assert "'<|eos|>', one of the model's control tokens" in answer["error"]["message"]
    code, _, _ = _error(server, "/v1/completions", {"prompt": "<|bos|>raw prompts may hold them", "max_tokens": 1})
    assert code == 200

"""`serve --board NAME`: several models behind one server (pipeline/serve/modelset.py), on three tiny recipes built
to their goldens: a chat model resident, two base models on demand under a memory budget that holds the resident
model and one of them. Driven by the openai client and by raw HTTP as Open WebUI sends it (its model switcher lists
/v1/models; each chat names its model)."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import openai
import pytest
from conftest import Project

from pipeline import contract
from tests.serving import REPO, Served

pytestmark = pytest.mark.integration
CHAT, BASE, SPARE = "set-chat", "set-base", "set-spare"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = 7000         # tokens of a stream that holds its model busy while a test asks another
# an answer the grammar keeps from ending for its first 2000 characters (an 8192-token model: seconds on the CPU)
LONG_ANSWER = {"type": "json_schema", "json_schema": {"name": "long", "schema": {
    "type": "object", "properties": {"a": {"type": "string", "minLength": 2000}}, "required": ["a"]}}}
RECIPE = """description = "{name}: a set's member (FP16, built offline on CPU)"
targets = ["orin-nano-8gb"]
[model]
source = "builtin"
name = "{builtin}"
[quantization]
weights = "fp16"
kv_cache = "fp16"
[build]
max_batch_size = 2
max_input_len = 128
max_seq_len = {seq}
builder = "offline"
[validation]
prompts = ["{prompt}"]
max_new_tokens = 8
{chat}
"""
BOARD = """description = "a chat model resident, two base models taking turns"
target = "orin-nano-8gb"
[[model]]
recipe = "set-chat"
[[model]]
recipe = "set-base"
residency = "on-demand"
[[model]]
recipe = "set-spare"
residency = "on-demand"
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The three recipes built to their goldens, the board file, and the plan `plan --board` makes of it."""
    project = Project(tmp_path_factory.mktemp("set") / "proj")
    # the chat model and SPARE take 8192-token sequences: a stream of LONG tokens keeps them busy for seconds
    for name, builtin, prompt, chat, seq in ((CHAT, "tiny-llama-agent", "say hi", "", 8192),
                                             (BASE, "tiny-llama", "To bake bread you need", "chat_template = false",
                                              256),
                                             (SPARE, "tiny-llama-agent", "The small computer sat on a shelf",
                                              "chat_template = false", 8192)):
        (project.recipes / f"{name}.toml").write_text(RECIPE.format(name=name, builtin=builtin, prompt=prompt,
                                                                    chat=chat, seq=seq))
    board = project.root / "boards" / "pair.toml"
    board.parent.mkdir()
    board.write_text(BOARD)
    for name in (CHAT, BASE, SPARE):
        project.doit("goldens", f"recipe={name}", timeout=900)
    plan = project.cli("plan", "--board", str(board), "--json")
    assert plan.returncode == 0, plan.stderr
    totals = {m["recipe"]: m["total"] for m in json.loads(plan.stdout)["models"]}
    return project, board, totals


def goldens(project, name) -> contract.GoldenPrompt:
    return contract.Goldens.load(project.artifacts / name / "goldens" / contract.GOLDENS).prompts[0]


def serve(built, tmp, *args) -> Served:
    """The board served with a budget that holds the resident model and the larger on-demand one by plan, and not
    a byte more than their sum plus 1 KB: the two on-demand models take turns."""
    project, board, totals = built
    budget = (totals[CHAT] + max(totals[BASE], totals[SPARE]) + 1000) / 1e9
    assert totals[BASE] + totals[SPARE] > 1000
    return Served(["--board", str(board), "--memory-budget", repr(budget), "--api-key", KEY, *args], project.env,
                  REPO, tmp / "server.log")


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    s = serve(built, tmp_path_factory.mktemp("serve-set"), "--max-queue", "0")
    yield s
    s.stop()


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)


def states(s: Served) -> dict[str, str]:
    r = httpx.get(s.url + "/v1/models", headers=AUTH, timeout=10)
    return {m["id"]: m["status"] for m in r.json()["data"]}


def complete(s: Served, model: str, prompt: str, n: int = 8, **extra) -> httpx.Response:
    return httpx.post(s.url + "/v1/completions", headers=AUTH, timeout=60,
                      json={"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, **extra})


@contextlib.contextmanager
def busy(s: Served, model: str):
    """A streamed chat to `model` that is still answering while the block runs (its first event read)."""
    with httpx.stream("POST", s.url + "/v1/chat/completions", headers=AUTH, timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": "write"}], "max_tokens": LONG,
                            "stream": True, "response_format": LONG_ANSWER}) as stream:
        assert stream.status_code == 200, stream.read()
        lines = stream.iter_lines()     # held: a discarded iterator closes the stream, and the server cancels it
        next(lines)
        yield
        del lines


def until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_the_set_lists_every_model_with_its_state_and_answers_each_by_name(server, built):
    project = built[0]
    assert [m.id for m in client(server).models.list().data] == [CHAT, BASE, SPARE]    # Open WebUI's switcher
    assert states(server) == {CHAT: "loaded", BASE: "unloaded", SPARE: "unloaded"}
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["models"] == states(server)
    g = goldens(project, CHAT)
    c = client(server).chat.completions.create(model=CHAT, messages=[{"role": "user", "content": g.prompt}],
                                               max_tokens=len(g.output_ids), temperature=0)
    assert (c.model, c.choices[0].message.content) == (CHAT, g.text)
    b = goldens(project, BASE)
    r = client(server).completions.create(model=BASE, prompt=b.prompt, max_tokens=len(b.output_ids), temperature=0)
    assert (r.model, r.choices[0].text) == (BASE, b.text)       # loaded on demand, then answered
    assert states(server)[BASE] == "loaded"
    m = server.metrics()
    assert m[f'jetson_llm_model_loads_total{{model="{BASE}"}}'] == 1
    assert m[f'jetson_llm_completion_tokens_total{{model="{BASE}"}}'] >= len(b.output_ids)
    assert m["jetson_llm_planned_bytes_loaded"] == sum(built[2][n] for n in (CHAT, BASE))


def test_open_webuis_model_switcher_and_a_chat_that_switches_models(server):
    """What Open WebUI sends: the model list with its key, then its default streamed chat (its built-in tools, which
    do not fit these 128-token engines: answered as plain chats) to the model picked, then the same conversation
    continued on another model picked from the switcher."""
    from tests.serve.test_serve_tools import OPEN_WEBUI_TOOLS, sse
    listed = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=10).json()["data"]
    assert [m["id"] for m in listed] == [CHAT, BASE, SPARE] and {m["residency"] for m in listed} == \
        {"resident", "on-demand"}
    history = [{"role": "user", "content": "say hi"}]
    for model in (SPARE, CHAT):
        body = {"model": model, "stream": True, "messages": history, "tools": OPEN_WEBUI_TOOLS,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60) as r:
            assert r.status_code == 200 and "x-tools-ignored" in r.headers
            chunks = sse(r)
        assert {c["model"] for c in chunks} == {model} and chunks[-1]["usage"]["completion_tokens"] > 0
        history += [{"role": "assistant", "content": "".join(c["choices"][0]["delta"].get("content") or ""
                                                             for c in chunks if c["choices"])},
                    {"role": "user", "content": "and again"}]
    assert states(server)[SPARE] == "loaded"


def test_an_unknown_model_is_a_404_naming_the_served_ones(server):
    r = complete(server, "llama-70b", "hi")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert all(repr(n) in r.json()["error"]["message"] for n in (CHAT, BASE, SPARE))


def test_the_least_recently_used_idle_model_makes_room_and_a_busy_one_is_never_evicted(server, built):
    project = built[0]
    assert complete(server, BASE, "To bake").status_code == 200
    s = goldens(project, SPARE)
    r = complete(server, SPARE, s.prompt, len(s.output_ids))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == s.text
    assert states(server) == {CHAT: "loaded", BASE: "unloaded", SPARE: "loaded"}     # BASE evicted for it
    assert server.metrics()[f'jetson_llm_model_unloads_total{{model="{BASE}",reason="evicted"}}'] >= 1
    # SPARE busy (a stream held open): BASE cannot load, and SPARE is not taken from its client
    with busy(server, SPARE):
        r = complete(server, BASE, "To bake")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_does_not_fit", r.text
        assert r.headers["retry-after"] == "5" and SPARE in r.json()["error"]["message"]
        # the resident model answers meanwhile
        assert complete(server, CHAT, "say hi").status_code == 200
    assert until(lambda: complete(server, BASE, "To bake").status_code == 200)


def test_a_full_queue_of_one_model_does_not_touch_another(server):
    with busy(server, CHAT), busy(server, CHAT):       # its max_batch_size, and --max-queue 0
        r = complete(server, CHAT, "say hi")
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
        assert complete(server, BASE, "To bake").status_code == 200
        assert server.metrics()[f'jetson_llm_requests_running{{model="{CHAT}"}}'] == 2


def test_load_and_unload_endpoints_and_their_refusals(server):
    post = lambda path, body, **kw: httpx.post(server.url + path, json=body, timeout=60, **kw)  # noqa: E731
    assert post("/models/load", {"model": SPARE}).status_code == 401       # under the API key like /v1/*
    until(lambda: states(server)[BASE] == "loaded" or complete(server, BASE, "x").status_code == 200)
    r = post("/models/unload", {"model": BASE}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"success": True, "model": BASE, "status": "unloaded"}, r.text
    r = post("/models/load", {"model": SPARE}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "loaded", r.text
    r = post("/models/unload", {"model": CHAT}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_resident", r.text
    r = post("/models/load", {"model": "nope"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = post("/models/load", {"model": 7}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_keep_alive_zero_unloads_once_idle_and_a_bad_one_is_a_400(server):
    r = complete(server, SPARE, "The small", keep_alive=0)
    assert r.status_code == 200, r.text
    assert until(lambda: states(server)[SPARE] == "unloaded", 10)
    assert server.metrics()[f'jetson_llm_model_unloads_total{{model="{SPARE}",reason="keep_alive"}}'] >= 1
    r = complete(server, SPARE, "The small", keep_alive="soon")
    assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive", r.text


def test_a_request_for_a_loading_model_gets_a_503_with_retry_after_never_a_hang(built, tmp_path):
    s = serve(built, tmp_path, "--load-wait", "0.05")
    try:
        t0 = time.monotonic()
        r = complete(s, BASE, "To bake")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        assert r.headers["retry-after"] == "5" and time.monotonic() - t0 < 5
        assert until(lambda: complete(s, BASE, "To bake").status_code == 200, 60)    # it went on loading
    finally:
        s.stop()


def test_a_set_whose_plan_passes_its_budget_is_refused_before_anything_loads(built, tmp_path):
    project, board, totals = built
    proc = project.cli("serve", "--board", str(board), "--memory-budget", repr((totals[CHAT] - 1) / 1e9))
    assert proc.returncode != 0 and "the resident models are planned at" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value,seconds", [(None, None), (0, 0.0), (90, 90.0), (2.5, 2.5), ("5m", 300.0),
                                           ("30s", 30.0), ("1h", 3600.0), ("500ms", 0.5), ("-1", -1.0), ("45", 45.0)])
def test_keep_alive_takes_seconds_or_ollamas_durations(value, seconds):
    from pipeline.serve.modelset import keep_alive_of
    assert keep_alive_of(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", True, [5], {"s": 1}])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    from pipeline.serve.errors import ApiError
    from pipeline.serve.modelset import keep_alive_of
    with pytest.raises(ApiError) as e:
        keep_alive_of(value)
    assert e.value.status == 400 and e.value.param == "keep_alive"


@pytest.mark.parametrize("args,said", [
    ([], "nothing to serve"),
    (["set-chat", "--memory-budget", "1"], "--memory-budget 1: applies to --board"),
    (["--board", "pair", "--keep-alive", "later"], "--keep-alive 'later'"),
    (["--board", "nope"], "no board 'nope'"),
])
def test_serve_refuses_a_set_it_cannot_serve_naming_the_flag(built, args, said):
    proc = built[0].cli("serve", *args)
    assert proc.returncode != 0 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_serve_refuses_a_model_named_twice_or_one_its_board_does_not_hold(built, tmp_path):
    project, _, _ = built
    proc = project.cli("serve", CHAT, CHAT)
    assert proc.returncode != 0 and f"{CHAT}: {CHAT} is given twice" in proc.stderr, proc.stderr
    small = tmp_path / "one.toml"
    small.write_text(f'target = "orin-nano-8gb"\n[[model]]\nrecipe = "{CHAT}"\n')
    proc = project.cli("serve", "--board", str(small), CHAT, BASE)
    assert proc.returncode != 0 and f"{BASE}: {BASE} is not a model of board {small} ({CHAT})" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr

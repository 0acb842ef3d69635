"""`python -m pipeline serve BUNDLE` on the bundle `device` made from the default recipe's kit: verified, gated and
served through the TensorRT-LLM 0.12 executor. The executor is a TEST DOUBLE (tests/doubles/python/tensorrt_llm/
bindings/executor.py, 0.12's published interface) computing with the engine's weights; everything else is
production code."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from conftest import board_copy, device_command

from pipeline import contract
from tests.serving import Served, health

pytestmark = pytest.mark.integration


def serve_bundle(bundle, tmp, board="orin-nano-8gb-jp62-super", wait=True, **env) -> Served:
    project, kit_dir, dev_tmp, b = bundle
    _, denv = device_command(project, kit_dir, dev_tmp)
    root = board_copy(tmp, board)
    return Served([str(b), "--root", str(root), "--work", str(tmp / "serve"), "--pubkey",
                   str(project.root / "home" / "signing.pub")], dict(denv, **env), tmp, tmp / "server.log", wait)


def test_the_bundle_serves_the_goldens_through_the_executor(bundle, tmp_path):
    project, _, _, b = bundle
    goldens = contract.Goldens.load(project.artifacts / "tiny-llama-cpu" / "goldens" / contract.GOLDENS)
    s = serve_bundle(bundle, tmp_path)
    try:
        assert "verified and unpacked" in s.log.read_text()
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in c.models.list().data] == ["tiny-llama-cpu@orin-nano-8gb"]
        for p in goldens.prompts:
            r = c.completions.create(model="tiny-llama-cpu@orin-nano-8gb", prompt=p.prompt,
                                     max_tokens=goldens.max_new_tokens, temperature=0)
            assert r.choices[0].text == p.text and r.usage.completion_tokens == len(p.output_ids)
        # in-flight batching: 4 clients at once (max_batch_size 2), each its own answer
        prompts = [p.prompt for p in goldens.prompts] + ["Zebra quantum"]
        alone = {p: c.completions.create(prompt=p, model="tiny-llama-cpu@orin-nano-8gb", max_tokens=12,
                                         temperature=0).choices[0].text for p in prompts}
        got: dict[str, str] = {}
        threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, "".join(
            ch.choices[0].text for ch in c.completions.create(prompt=p, model="tiny-llama-cpu@orin-nano-8gb",
                                                               max_tokens=12, temperature=0, stream=True))))
            for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == alone and len(set(alone.values())) > 1
        assert s.metrics()["jetson_llm_kv_cache_usage_ratio"] == 0.0      # the executor's KvCacheStats, idle
        # structured output and forced tool calls through 0.12's logits post-processor, masked by the request's grammar
        import jsonschema
        schema = {"type": "object", "additionalProperties": False, "required": ["n"],
                  "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
        r = c.chat.completions.create(model="tiny-llama-cpu@orin-nano-8gb", messages=[{"role": "user", "content": "n"}],
                                      temperature=0, response_format={"type": "json_schema", "json_schema": {
                                          "name": "n", "schema": schema}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        tool = {"type": "function", "function": {"name": "count", "parameters": schema}}
        r = c.chat.completions.create(model="tiny-llama-cpu@orin-nano-8gb", temperature=0, tools=[tool],
                                      tool_choice="required", messages=[{"role": "user", "content": "Count"}])
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "count"
        jsonschema.validate(json.loads(call.function.arguments), schema)
        free = c.chat.completions.create(model="tiny-llama-cpu@orin-nano-8gb", temperature=0, max_tokens=8,
                                         messages=[{"role": "user", "content": "n"}])
        with pytest.raises(ValueError):
            json.loads(free.choices[0].message.content)        # the grammar, not the model, made it JSON
        # what 0.12's SamplingConfig and OutputConfig have is applied; what they lack is refused by name
        with pytest.raises(openai.BadRequestError, match="min_p: the trtllm-0.12 runtime does not apply it"):
            c.completions.create(model="tiny-llama-cpu@orin-nano-8gb", prompt="x", max_tokens=4,
                                 extra_body={"min_p": 0.1})
        with pytest.raises(openai.BadRequestError, match="logprobs: the trtllm-0.12 runtime does not apply it"):
            c.completions.create(model="tiny-llama-cpu@orin-nano-8gb", prompt="x", max_tokens=4, logprobs=2)
        p = goldens.prompts[0]
        r = c.completions.create(model="tiny-llama-cpu@orin-nano-8gb", prompt=p.prompt, temperature=0,
                                 max_tokens=goldens.max_new_tokens, logprobs=0)
        lp = r.choices[0].logprobs
        assert r.choices[0].text == p.text and "".join(lp.tokens) == p.text
        assert len(lp.token_logprobs) == len(lp.tokens) and all(v <= 0 for v in lp.token_logprobs)
        penalized = c.completions.create(model="tiny-llama-cpu@orin-nano-8gb", prompt=p.prompt, temperature=0,
                                         max_tokens=goldens.max_new_tokens, presence_penalty=2.0,
                                         frequency_penalty=2.0, extra_body={"repetition_penalty": 1.5})
        assert penalized.choices[0].finish_reason in ("stop", "length")
    finally:
        s.stop()


def test_a_different_board_is_refused_naming_what_differs(bundle, tmp_path):
    s = serve_bundle(bundle, tmp_path, board="agx-thor-jp70", wait=False)
    assert s.proc.wait(120) == 2
    out = s.log.read_text()
    assert "error:" in out and "8.7" in out and "Traceback" not in out
    assert not (tmp_path / "serve").exists() or not any((tmp_path / "serve").iterdir())     # nothing unpacked


def resigned(bundle_dir, tmp_path):
    """A copy of the bundle whose SHA256SUMS is signed again, same trusted comment, by a key nobody trusts."""
    import shutil

    from pipeline.kit.signing import SecretKey
    copy = tmp_path / "resigned" / bundle_dir.name
    shutil.copytree(bundle_dir, copy)
    sig = (copy / "SHA256SUMS.minisig").read_text().splitlines()
    (copy / "SHA256SUMS.minisig").write_text(SecretKey.generate().sign_bytes(
        (copy / "SHA256SUMS").read_bytes(), sig[2][len("trusted comment: "):]))
    return copy


def test_a_bundle_signed_by_an_untrusted_key_is_refused_before_anything_is_unpacked(bundle, tmp_path):
    copy = resigned(bundle[3], tmp_path)
    s = serve_bundle((*bundle[:3], copy), tmp_path, wait=False)
    assert s.proc.wait(120) == 2
    out = s.log.read_text()
    assert "which is not trusted here" in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "serve").exists() or not any((tmp_path / "serve").iterdir())


def test_serve_on_a_machine_that_is_not_a_jetson_refuses_before_unpacking(bundle, tmp_path):
    """The same opening as `device` and `install` (device/opening.py): a root whose device tree names no Jetson SoC
    is refused with one error, nothing unpacked."""
    project, kit_dir, dev_tmp, b = bundle
    _, denv = device_command(project, kit_dir, dev_tmp)
    (tmp_path / "root" / "proc").mkdir(parents=True)
    s = Served([str(b), "--root", str(tmp_path / "root"), "--work", str(tmp_path / "serve"), "--pubkey",
                str(project.root / "home" / "signing.pub")], denv, tmp_path, tmp_path / "server.log", wait=False)
    assert s.proc.wait(120) == 2
    out = s.log.read_text()
    assert "error: this is not a Jetson" in out and "Traceback" not in out
    assert not (tmp_path / "serve").exists()


def test_an_engine_that_fails_to_load_says_so_on_health_and_refuses_requests(bundle, tmp_path):
    s = serve_bundle(bundle, tmp_path, wait=False, EXECUTOR_DOUBLE_FAIL_LOAD="1")
    try:
        import time
        deadline = time.monotonic() + 120
        while (state := health(s.url)) is None or state[1].get("status") == "loading":
            assert time.monotonic() < deadline and s.proc.poll() is None, s.log.read_text()
            time.sleep(0.2)
        assert state == (503, {"status": "failed"})
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        out = s.log.read_text()
        assert "engine failed to load: RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: Failed to deserialize" \
            in out and "Traceback" not in out
    finally:
        s.stop()


def test_a_damaged_bundle_is_refused_before_anything_loads(bundle, tmp_path):
    import shutil
    _, _, _, b = bundle
    copy = tmp_path / b.name
    shutil.copytree(b, copy)
    part = sorted(p for p in copy.iterdir() if ".tar" in p.name)[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    s = serve_bundle((*bundle[:3], copy), tmp_path, wait=False)
    assert s.proc.wait(120) == 2
    out = s.log.read_text()
    assert "sha256" in out or "damaged" in out or "does not match" in out, out
    assert "Traceback" not in out


def test_an_engine_failure_is_a_500_without_paths_and_health_says_so(bundle, tmp_path):
    s = serve_bundle(bundle, tmp_path, EXECUTOR_DOUBLE_FAIL_AFTER="3")
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 20, "temperature": 0},
                       timeout=30)
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
        assert "/" not in r.json()["error"]["message"]
        assert health(s.url) == (503, {"status": "failed"})
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Bread", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and json.loads(r.text)["error"]["code"] == "engine_unavailable"
    finally:
        s.stop()


def test_an_edgellm_bundle_serves_the_goldens_through_the_request_engine(thor_bundle, tmp_path):
    """The Thor kit's bundle, served through Edge-LLM 0.11's RequestEngine (a TEST DOUBLE running the exported ONNX
    graph): greedy answers equal the goldens token for token; concurrent streams stay their own."""
    project = thor_bundle[0]
    s = serve_bundle(thor_bundle, tmp_path, board="agx-thor-jp70")
    try:
        goldens = contract.Goldens.load(project.artifacts / "tiny-thor" / "goldens" / contract.GOLDENS)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for p in goldens.prompts:
            r = c.completions.create(model="tiny-thor@agx-thor", prompt=p.prompt, max_tokens=goldens.max_new_tokens,
                                     temperature=0)
            assert r.choices[0].text == p.text and r.usage.completion_tokens == len(p.output_ids)
        prompts = [p.prompt for p in goldens.prompts]
        got: dict[str, str] = {}
        threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, "".join(
            ch.choices[0].text for ch in c.completions.create(prompt=p, model="tiny-thor@agx-thor",
                                                               max_tokens=goldens.max_new_tokens, temperature=0,
                                                               stream=True)))) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == {p.prompt: p.text for p in goldens.prompts}
        # its runtime's guided decoding (GuideType.JSON_SCHEMA) and top-K log-probabilities; no penalties
        import jsonschema
        schema = {"type": "object", "additionalProperties": False, "required": ["n"],
                  "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
        # Its JSON grammar lets whitespace in between (the double's llguidance does so by default, as xgrammar
        # does): a random model at greedy can pick whitespace forever, so these are sampled, with a seed
        r = c.chat.completions.create(model="tiny-thor@agx-thor", messages=[{"role": "user", "content": "n?"}],
                                      temperature=1.0, seed=7, max_tokens=200, response_format={
                                          "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content[:200]
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        tool = {"type": "function", "function": {"name": "count", "parameters": schema}}
        r = c.chat.completions.create(model="tiny-thor@agx-thor", messages=[{"role": "user", "content": "Count"}],
                                      temperature=1.0, seed=7, max_tokens=200, tools=[tool], tool_choice="required")
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "count"
        jsonschema.validate(json.loads(call.function.arguments), schema)
        r = c.chat.completions.create(model="tiny-thor@agx-thor", messages=[{"role": "user", "content": "Bread"}],
                                      temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
        for e in r.choices[0].logprobs.content:
            assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
            assert e.logprob == e.top_logprobs[0].logprob        # greedy: the chosen token is the most likely
        for extra in ({"repetition_penalty": 1.2}, {"min_p": 0.1}, {"presence_penalty": 1.0}):
            with pytest.raises(openai.BadRequestError, match="the edgellm runtime does not apply it"):
                c.chat.completions.create(model="tiny-thor@agx-thor", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=2, extra_body=extra)
    finally:
        s.stop()


def _board_with(root, available: int) -> None:
    """The recorded board's /proc/meminfo saying `available` bytes are available (what the OS and other services
    left before the server starts)."""
    import re
    meminfo = root / "proc" / "meminfo"
    meminfo.write_text(re.sub(r"^MemAvailable:\s+\d+ kB", f"MemAvailable:   {available // 1024} kB",
                              meminfo.read_text(), flags=re.M))


def test_a_boards_set_of_bundles_is_budgeted_by_the_boards_own_memory(two_bundles, tmp_path):
    """`serve --board` on the board (its bundles): what its kernel says is available before any engine loads bounds
    the set where that is less than the table's figure; a set that cannot fit in it is refused at start."""
    from conftest import SECOND
    project, kit_dir, dev_tmp, both = two_bundles
    _, denv = device_command(project, kit_dir, dev_tmp)
    root = board_copy(tmp_path, "orin-nano-8gb-jp62-super")
    board = tmp_path / "pair.toml"
    board.write_text(f'target = "orin-nano-8gb-super"\n[[model]]\nrecipe = "tiny-llama-cpu"\n[[model]]\n'
                     f'recipe = "{SECOND}"\nresidency = "on-demand"\n')
    args = ["--board", str(board), *map(str, both), "--root", str(root), "--work", str(tmp_path / "serve"),
            "--pubkey", str(project.root / "home" / "signing.pub")]
    _board_with(root, 3 * 10**9)
    s = Served(args, dict(denv), tmp_path, tmp_path / "server.log")
    try:
        h = health(s.url)[1]
        assert h["budget"] == 3 * 10**9 // 1024 * 1024 and h["budget_from"] == f"MemAvailable of {root}/proc/meminfo"
        first, second = "tiny-llama-cpu@orin-nano-8gb", f"{SECOND}@orin-nano-8gb"     # served by their kits' names
        assert h["models"] == {first: "loaded", second: "unloaded"}
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        assert c.completions.create(model=second, prompt="Bread", max_tokens=4).usage.completion_tokens == 4
        assert health(s.url)[1]["models"][second] == "loaded"
    finally:
        s.stop()
    _board_with(root, int(1.5 * 10**9))      # less than the two plans together (about 1.07 GB each)
    import subprocess

    from tests.zygote import warm_python
    proc = subprocess.run([warm_python(), "-m", "pipeline", "serve", *args], env=denv, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "cannot load beside the resident models" in proc.stderr, proc.stderr
    assert f"(MemAvailable of {root}/proc/meminfo)" in proc.stderr and "Traceback" not in proc.stderr

"""The engine sessions' own logic against a RECORDING DOUBLE of each runtime's Python interface (TensorRT-LLM 0.12's
executor bindings, Edge-LLM 0.11's runtime module), no engine: what each request is turned into (sampling, penalties,
log-probabilities, guides), that a cancel reaches the runtime, and what the runtime's answers become."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.runtime.edgellm import EdgellmSession
from pipeline.runtime.session import Constraint, Event, Generation, Limits, Sampling
from pipeline.runtime.trtllm import TrtllmSession

LIMITS = Limits(2, 64, 128)


class Recorded:
    """Keeps a constructor's keyword arguments, as the pybind classes hold their fields."""

    def __init__(self, *args, **kwargs):
        self.args, self.__dict__["kw"] = args, kwargs
        self.__dict__.update(kwargs)


class RecordingExecutor:
    """TEST DOUBLE of tensorrt_llm.bindings.executor.Executor: records requests and cancels; answers only what the test
    puts in `responses`."""

    def __init__(self, *args):
        self.args = args            # (engine directory, model type, ExecutorConfig)
        self.requests, self.cancelled, self.responses = [], [], []
        self.lock = threading.Lock()

    def enqueue_request(self, request):
        with self.lock:
            self.requests.append(request)
            return len(self.requests)

    def cancel_request(self, rid):
        self.cancelled.append(rid)

    def await_responses(self, timeout=None):
        time.sleep(0.01)
        with self.lock:
            out, self.responses = self.responses, []
        return out

    def get_latest_iteration_stats(self):
        return []

    def shutdown(self):
        pass


def executor_module():
    return SimpleNamespace(ExecutorConfig=Recorded, KvCacheConfig=Recorded, Executor=RecordingExecutor,
                           ModelType=SimpleNamespace(DECODER_ONLY=0), SamplingConfig=Recorded, OutputConfig=Recorded,
                           Request=Recorded)


def response(rid, tokens, final, log_probs=()):
    result = SimpleNamespace(output_token_ids=[tokens], is_final=final, log_probs=[list(log_probs)])
    return SimpleNamespace(request_id=rid, has_error=lambda: False, error_msg=None, result=result)


def wait_for(events, n, timeout=5.0):
    end = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < end:
        time.sleep(0.01)
    return events


def test_trtllm_a_cancel_reaches_the_executor_and_its_later_answers_are_dropped(tmp_path):
    s = TrtllmSession(tmp_path, LIMITS, kv_tokens=256, executor_module=executor_module())
    try:
        events: list[Event] = []
        h = s.submit(Generation((1, 2), "", 8, Sampling(), (0,)), events.append)
        s.executor.responses.append(response(h.id, [5], False))
        wait_for(events, 1)
        s.cancel(h)
        assert s.executor.cancelled == [h.id]
        s.executor.responses.append(response(h.id, [6], True))
        time.sleep(0.1)
        assert [e.tokens for e in events] == [[5]]          # nothing after the cancel
    finally:
        s.close()


def test_trtllm_requests_carry_penalties_and_log_probabilities_as_0_12_takes_them(tmp_path):
    s = TrtllmSession(tmp_path, LIMITS, kv_tokens=256, executor_module=executor_module())
    try:
        events: list[Event] = []
        plain = s.submit(Generation((1,), "", 4, Sampling(), (0, 7)), events.append)
        asked = s.submit(Generation((1,), "", 4, Sampling(temperature=0.7, top_p=0.9, seed=3, repetition_penalty=1.3,
                                                          presence_penalty=0.5, frequency_penalty=-0.5), (0,),
                                    logprobs=0), events.append)
        r0, r1 = s.executor.requests
        assert r0.sampling_config.kw == {"beam_width": 1, "top_k": 1, "top_p": None, "random_seed": None,
                                         "temperature": None, "repetition_penalty": None, "presence_penalty": None,
                                         "frequency_penalty": None}
        assert r0.output_config is None and r0.end_id == 0 and r0.stop_words == [[7]]
        assert r1.sampling_config.kw == {"beam_width": 1, "top_k": None, "top_p": 0.9, "random_seed": 3,
                                         "temperature": 0.7, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                                         "frequency_penalty": -0.5}
        assert r1.output_config.kw == {"return_log_probs": True}
        # the result's log_probs hold the beam's values so far: the last len(tokens) are these tokens'
        s.executor.responses.append(response(asked.id, [4, 0], True, log_probs=[-0.5, -0.25, -1.5]))
        wait_for(events, 1)
        (final,) = events
        assert final.final and final.reason == "stop" and [lp.logprob for lp in final.logprobs] == [-0.25, -1.5]
        assert plain.id != asked.id
    finally:
        s.close()


class Channel:
    """TEST DOUBLE of Edge-LLM's StreamChannel: the chunks the test pushes, then finished."""

    def __init__(self):
        self.chunks, self.cancelled = [], False

    @staticmethod
    def create():
        return Channel()

    def set_skip_special_tokens(self, _skip):
        pass

    def wait_pop(self, timeout_ms=0):
        time.sleep(0.005)
        return self.chunks.pop(0) if self.chunks else None

    def is_finished(self):
        return False

    def is_cancelled(self):
        return self.cancelled

    def cancel(self):
        self.cancelled = True


def edgellm_module():
    class Engine:
        def __init__(self, *_args, **_kw):
            self.submitted = []

        def submit(self, request):
            self.submitted.append(request)
            return SimpleNamespace(cancel=lambda: None)

        def shutdown(self, _mode):
            pass

    def message(role, text):
        return SimpleNamespace(role=role, text=text)
    return SimpleNamespace(RequestEngine=Engine, ContextCacheConfig=SimpleNamespace, StreamChannel=Channel,
                           LLMGenerationRequest=SimpleNamespace, Request=lambda messages: SimpleNamespace(
                               messages=messages), create_text_message=message,
                           GuidedDecodingParams=lambda kind, guide: (kind, guide),
                           GuideType=SimpleNamespace(JSON_SCHEMA="JSON_SCHEMA"),
                           ShutdownMode=SimpleNamespace(CANCEL=1))


def test_edgellm_guides_json_schemas_reports_top_k_log_probabilities_and_refuses_text_around_the_json(tmp_path):
    s = EdgellmSession(tmp_path, LIMITS, runtime_module=edgellm_module())
    try:
        guide = s.guide(Constraint({"type": "object", "b": 1, "a": 2}))
        assert guide == '{"a": 2, "b": 1, "type": "object"}'
        with pytest.raises(NotImplementedError, match="text around the JSON"):
            s.guide(Constraint({"type": "object"}, marker="<tool_call>", prefix="\n", suffix="\n</tool_call>"))
        events: list[Event] = []
        h = s.submit(Generation((1,), "<|user|>x", 4, Sampling(), (0,), guide=guide, logprobs=2), events.append)
        (request,) = s.engine.submitted
        assert request.requests[0].guided_decoding == ("JSON_SCHEMA", guide) and request.num_logprobs == 2
        channel = request.stream_channels[0]
        entry = lambda t, lp: SimpleNamespace(token_id=t, logprob=lp, piece=b"x")       # noqa: E731
        channel.chunks.append(SimpleNamespace(token_ids=[9], finished=True, reason=SimpleNamespace(name="END_ID"),
                                              logprobs=[[entry(3, -0.1), entry(9, -2.5), entry(4, -1.0)]]))
        wait_for(events, 1)
        (lp,) = events[0].logprobs
        assert lp.logprob == -2.5 and lp.top == ((3, -0.1), (4, -1.0))
        assert h.id == 1
        s.submit(Generation((1,), "x", 4, Sampling(), (0,)), events.append)
        assert s.engine.submitted[1].num_logprobs == 0 and not hasattr(s.engine.submitted[1].requests[0],
                                                                        "guided_decoding")
    finally:
        s.close()


class ScriptedEngine:
    """TEST DOUBLE of an engine runtime behind the Session interface: answers every request at once with the tokens
    1, 2, ..., max_new_tokens, one per event (what a streaming runtime reports)."""
    backend = "scripted"
    failure = None

    def submit(self, gen, emit):
        for i in range(1, gen.max_new_tokens + 1):
            emit(Event([i], final=i == gen.max_new_tokens, reason="length" if i == gen.max_new_tokens else None))
        return SimpleNamespace(id=1)

    def cancel(self, handle):
        pass


def test_the_measured_decode_rate_counts_the_tokens_after_the_first(monkeypatch):
    """With a clock that ticks one second per reading, n tokens arrive over n - 1 seconds: the decode rate is the
    n - 1 tokens after the first over that span, exactly 1.0 tok/s (the first token is TTFT's)."""
    from pipeline import contract
    from pipeline.device import session_runner
    ticks = iter(range(10_000))
    monkeypatch.setattr(session_runner.time, "perf_counter", lambda: float(next(ticks)))
    prompt = contract.GoldenPrompt(prompt="p", input_ids=[5], output_ids=[1, 2, 3, 4, 5, 6], top_logprobs=[],
                                   text="")
    goldens = contract.Goldens(max_new_tokens=6, min_token_agreement=1.0, top_k=1, eos_token_id=None,
                               prompts=[prompt])
    (result,) = session_runner.golden_results(ScriptedEngine(), goldens)
    assert result.output_ids == [1, 2, 3, 4, 5, 6] and result.decode_tok_s == 1.0
    assert result.ttft_s == 1.0         # sent at one tick, the first token at the next


def test_trtllm_a_guided_request_goes_through_the_logits_post_processor_that_masks_by_its_grammar(tmp_path):
    """0.12's logits post-processor: the session registers its callback in ExecutorConfig's map and names it on a
    guided request; the callback advances the request's grammar by the beam's generated tokens and sets every token
    the grammar does not allow next to -inf in place."""
    import torch

    from pipeline.runtime.grammar import Grammars
    from pipeline.runtime.trtllm import GUIDE
    from pipeline.workstation.tinymodel import train_tokenizer

    tok = train_tokenizer(400)
    eos = tok.token_to_id("<|eos|>")
    grammars = Grammars(tok.to_str(), (eos,))
    mod = executor_module()
    s = TrtllmSession(tmp_path, LIMITS, kv_tokens=256, executor_module=mod, grammars=grammars)
    try:
        assert set(s.executor.args[2].logits_post_processor_map) == {GUIDE}      # ExecutorConfig(..., map)
        guide = s.guide(Constraint({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                    "additionalProperties": False}))
        h = s.submit(Generation((5, 6), "", 16, Sampling(), (eos,), guide=guide), lambda _e: None)
        plain = s.submit(Generation((5, 6), "", 16, Sampling(), (eos,)), lambda _e: None)
        assert s.executor.requests[0].logits_post_processor_name == GUIDE
        assert s.executor.requests[1].logits_post_processor_name is None
        vocab = tok.get_vocab_size()
        logits = torch.zeros(1, 1, vocab)
        s._mask_logits(h.id, logits, [[5, 6]], 0, None)
        allowed = {i for i in range(vocab) if logits[0, 0, i] == 0}
        assert allowed and all(tok.decode([i]).startswith("{") for i in allowed)       # only an object may start
        brace = tok.token_to_id("{")
        logits = torch.zeros(1, 1, vocab)
        s._mask_logits(h.id, logits, [[5, 6, brace]], 0, None)                         # the beam went on with "{"
        after = {tok.decode([i]) for i in range(vocab) if logits[0, 0, i] == 0}
        assert after and all(t.startswith('"') for t in after)                          # then the key's quote
        untouched = torch.zeros(1, 1, vocab)
        s._mask_logits(plain.id, untouched, [[5, 6]], 0, None)
        assert torch.equal(untouched, torch.zeros(1, 1, vocab))                        # an unguided request
    finally:
        s.close()

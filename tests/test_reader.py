"""The CPU linear of reference forwards (and the reader)."""

import pytest
import torch

from pipeline import cpu_linear


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

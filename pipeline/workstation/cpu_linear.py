"""Reference forward passes on a CPU: linears over a few tokens computed as (W @ x^T)^T, which runs faster there.

The export's reader check, goldens and accuracy run the calibrated model over a few dozen tokens in fp32. For such
skinny inputs torch's CPU linear (x @ W^T through MKL) is slow: on the 2-core AMD EPYC workstation, 32 tokens through
a Llama-3.2-3B-shaped model's linears ran at 40-55 GFLOPS as x @ W^T and 70-98 GFLOPS as (W @ x^T)^T (the same sums
in another order: fp32 results equal to ~1e-6). `bench/linear.py` measures both on the machine at hand.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

MAX_ROWS = 64     # up to this many rows (tokens) the transposed form is faster here; at 256 the two are even


def _skinny(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == torch.float32
            and w.dtype == torch.float32 and w.dim() == 2 and x.dim() >= 1
            and x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and not torch.is_grad_enabled())


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, bias), computed as (w @ x^T)^T for a few fp32 rows on the CPU."""
    if not _skinny(x, w):
        return torch.nn.functional.linear(x, w, bias)
    rows = x.reshape(-1, x.shape[-1])
    y = torch.mm(w, rows.T).T.contiguous()
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], w.shape[0])


class _SkinnyLinearMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear and len(args) >= 2 and not kwargs:
            return linear(*args)
        return func(*args, **kwargs)


@contextlib.contextmanager
def skinny_linears():
    """Every F.linear (nn.Linear, ModelOpt's quantized linears) inside takes the faster form where it applies."""
    with _SkinnyLinearMode():
        yield

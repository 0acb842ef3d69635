"""ONNX's reference evaluator (onnx.reference) at the sizes this project runs it: the independent check of an exported
tower (visual_check.py) and the Edge-LLM runtime doubles in tests/ evaluate graphs with it. What it lacks or does one
element at a time in Python is given here as OpRun classes to pass as `new_ops`: Edge-LLM's ViTAttentionPlugin,
MatMul/Gemm accumulating FP16 in float32 (as the GPU's tensor cores do), and Sigmoid/Erf over whole arrays with the
reference's own numerics."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def vit_attention_op() -> Any:
    from onnx.reference.op_run import OpRun

    class ViTAttentionPlugin(OpRun):
        op_domain = "trt_edgellm"

        def _run(self, q, k, v, cu_seqlens, _max_seqlen_carrier, attention_scale=None, **_shape_attributes):
            out = np.zeros_like(q)
            bounds = cu_seqlens.tolist()
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                if b <= a:
                    continue
                # heads first, as batched matmuls (BLAS): numpy's einsum does not reach BLAS for these two
                # contractions and took 6-18x longer on a tower's 1-4k patches
                qq, kk, vv = (t[a:b].astype(np.float32).transpose(1, 0, 2) for t in (q, k, v))
                att = np.matmul(qq, kk.transpose(0, 2, 1)) * attention_scale
                att = np.exp(att - att.max(-1, keepdims=True))
                att /= att.sum(-1, keepdims=True)
                out[a:b] = np.matmul(att, vv).transpose(1, 0, 2).astype(q.dtype)
            return (out,)
    return ViTAttentionPlugin


def float32_accumulating_ops() -> list:
    """MatMul and Gemm on FP16 inputs accumulated in float32 (numpy's FP16 matmul accumulates in FP16)."""
    from onnx.reference.op_run import OpRun

    class MatMul(OpRun):
        def _run(self, a, b):
            return (np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype),)

    class Gemm(OpRun):
        def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 (ONNX's names)
            a32, b32 = a.astype(np.float32), b.astype(np.float32)
            y = alpha * np.matmul(a32.T if transA else a32, b32.T if transB else b32)
            if c is not None:
                y = y + beta * c.astype(np.float32)
            return (y.astype(a.dtype),)
    return [MatMul, Gemm]


def tower_ops() -> list:
    """What a visual tower's graph needs under the reference evaluator: its attention plugin, FP32-accumulating
    MatMul/Gemm, whole-array Sigmoid/Erf (the tower check here and the visual engine double in tests/)."""
    return [vit_attention_op(), *float32_accumulating_ops(), *exact_elementwise_ops()]


def encoder_ops() -> list:
    """What an audio encoder's graph needs under the reference evaluator (plain ONNX, explicit attention):
    FP32-accumulating MatMul/Gemm and whole-array Sigmoid/Erf (the encoder check here and the audio engine double)."""
    return [*float32_accumulating_ops(), *exact_elementwise_ops()]


def exact_elementwise_ops() -> list:
    """Sigmoid and Erf as ONNX's reference evaluator computes them (each element in float64, rounded to the input's
    dtype), bit for bit, over whole arrays: the reference calls a Python function per element (np.vectorize), and a
    SiLU or GELU over a step's activations took most of the evaluator's time. Erf of FP16 (a tower's graph) is read
    from a table of every FP16 value; other dtypes keep the reference's own per-element path."""
    import math

    from onnx.reference.ops._op import OpRunUnaryNum

    class Sigmoid(OpRunUnaryNum):
        def _run(self, x):
            wide = np.asarray(x, np.float64)
            positive = wide > 0
            e = np.exp(np.where(positive, -wide, wide))     # the reference's two branches: never above exp(0)
            return (np.where(positive, 1 / (1 + e), e / (1 + e)).astype(x.dtype),)

    class Erf(OpRunUnaryNum):
        def _run(self, x):
            if x.dtype == np.float16:
                return (_erf_fp16_table()[x.view(np.uint16)],)
            return (np.vectorize(math.erf, otypes=["f"])(x).astype(x.dtype),)
    return [Sigmoid, Erf]


@functools.cache
def _erf_fp16_table() -> np.ndarray:
    """erf of every FP16 bit pattern, as the reference rounds it (float64 -> float32 -> float16)."""
    import math
    every = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        return np.vectorize(math.erf, otypes=["f"])(every).astype(np.float16)

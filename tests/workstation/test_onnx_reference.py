"""The whole-array Sigmoid and Erf given to ONNX's reference evaluator compute exactly what its own per-element ops
compute (bit for bit, edges included), and the ViTAttentionPlugin's batched matmuls what plain softmax attention
does within each cu_seqlens segment."""

import math

import numpy as np
import pytest
from onnx import ModelProto, helper
from onnx.reference import ReferenceEvaluator

from pipeline.workstation.onnx_reference import exact_elementwise_ops, vit_attention_op

EDGES = [0.0, -0.0, 1e-3, -1e-3, 0.5, -0.5, 6.0, -6.0, 17.0, -17.0, 40.0, -40.0, 700.0, -700.0, np.inf, -np.inf, np.nan]


def _unary(op: str, dtype: int) -> ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", dtype, None)],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["Sigmoid", "Erf"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_sigmoid_and_erf_are_the_references_bit_for_bit(op, dtype):
    model = _unary(op, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    x = np.concatenate([np.array(EDGES), np.random.default_rng(0).normal(0, 8, 4000)]).astype(dtype)
    if dtype == np.float16:     # every FP16 value, subnormals and the largest finite ones included
        x = np.concatenate([x, np.arange(2 ** 16, dtype=np.uint16).view(np.float16)])
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        ours = ReferenceEvaluator(model, new_ops=exact_elementwise_ops())
        got = ours.run(None, {"x": x})[0]
    assert type(ours.rt_nodes_[0]).__qualname__ == f"exact_elementwise_ops.<locals>.{op}"     # ours ran
    bits = np.uint16 if dtype == np.float16 else np.uint32
    assert got.dtype == want.dtype == dtype and got.shape == x.shape
    same = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]
    assert float(got[EDGES.index(17.0)]) == (1.0 if op == "Erf" else pytest.approx(1 / (1 + math.exp(-17)), rel=1e-3))


def test_vit_attention_is_softmax_attention_within_each_segment():
    rng = np.random.default_rng(1)
    t, h, d = 11, 3, 8
    q, k, v = (rng.normal(size=(t, h, d)).astype(np.float16) for _ in range(3))
    cu = np.array([0, 4, 4, 11], np.int32)      # an empty segment between two images
    (out,) = vit_attention_op()._run(None, q, k, v, cu, np.zeros(7, np.int32), attention_scale=0.25)
    assert out.dtype == np.float16 and out.shape == (t, h, d)
    for a, b in ((0, 4), (4, 11)):
        for head in range(h):
            s = q[a:b, head].astype(np.float64) @ k[a:b, head].astype(np.float64).T * 0.25
            p = np.exp(s - s.max(-1, keepdims=True))
            want = (p / p.sum(-1, keepdims=True)) @ v[a:b, head].astype(np.float64)
            np.testing.assert_allclose(out[a:b, head].astype(np.float64), want, atol=2e-3)
    # a segment sees nothing of the other: changing the first image's keys leaves the second's answer
    k2 = k.copy()
    k2[:4] += 5
    (again,) = vit_attention_op()._run(None, q, k2, v, cu, np.zeros(7, np.int32), attention_scale=0.25)
    assert np.array_equal(again[4:], out[4:]) and not np.array_equal(again[:4], out[:4])

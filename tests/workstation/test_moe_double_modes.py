"""The runtime double's Nvfp4MoePlugin in the modes Nemotron-H's and Gemma 4's MoE blocks export to (Edge-LLM 0.11:
models/nemotron_h relu2 experts with routing mode 1, models/gemma4 GeGLU experts with routing mode 2), against
transformers' own routers and experts: NVFP4 expert weights written in ModelOpt's checkpoint format, packed by
Edge-LLM's own repacking (checkpoint/repacking.py), run by the double. The full path (calibrated on a GPU, exported,
built through doit) is tests/workstation/test_moe_nvfp4_build.py."""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4_linear(w: torch.Tensor) -> tuple[types.SimpleNamespace, torch.Tensor]:
    """w [out, in] as ModelOpt's unified NVFP4 checkpoint holds it (weight: two E2M1 codes a byte, the low nibble the
    even element; weight_scale: E4M3 per 16 inputs; weight_scale_2: the global scale), and its dequantized value."""
    g = w.abs().max() / (6.0 * 448.0)
    blocks = w.reshape(w.shape[0], -1, 16)
    s = (blocks.abs().amax(-1) / 6.0 / g).to(torch.float8_e4m3fn)
    scaled = blocks / (s.float() * g).clamp_min(1e-30)[..., None]
    code = (scaled.abs()[..., None] - E2M1).abs().argmin(-1) + 8 * (scaled < 0)
    code = code.reshape(w.shape).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    value = (E2M1[(code % 8).long()] * torch.where(code >= 8, -1.0, 1.0)).reshape(blocks.shape)
    value = (value * s.float()[..., None] * g).reshape(w.shape)
    return types.SimpleNamespace(weight=packed, weight_scale=s, weight_scale_2=g.reshape(())), value


@contextlib.contextmanager
def the_double():
    """The runtime double's MoE module, importable while the block is open (it imports its engine beside it when it
    runs)."""
    sys.path.insert(0, str(REPO / "tests" / "doubles" / "python"))
    try:
        import edgellm_moe
        yield edgellm_moe
    finally:
        sys.path.remove(str(REPO / "tests" / "doubles" / "python"))


def nvfp4_experts(projections: dict[str, tuple[int, int]], count: int = 8) -> tuple[list, dict[str, torch.Tensor]]:
    """`count` experts of random NVFP4 linears, each projection [out, in] as named: (their ModelOpt-format
    namespaces, as Edge-LLM's repacking takes them; {projection: the dequantized weights [count, out, in]})."""
    linears, values = [], {name: [] for name in projections}
    for _ in range(count):
        expert = {}
        for name, shape in projections.items():
            expert[name], value = nvfp4_linear(torch.randn(*shape) * 0.1)
            values[name].append(value)
        linears.append(types.SimpleNamespace(**expert))
    return linears, {name: torch.stack(v) for name, v in values.items()}


def _plugin(inputs: list[np.ndarray], **attrs) -> np.ndarray:
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{n}" for n in range(len(inputs))]
    node = helper.make_node("Nvfp4MoePlugin", names, ["y"], domain="trt_edgellm", **attrs)
    graph = helper.make_graph([node], "moe", [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
                                              for n in names], [helper.make_tensor_value_info("y", TensorProto.FLOAT16,
                                                                                              None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("trt_edgellm", 1)], ir_version=onnx.IR_VERSION)
    with the_double() as moe:
        return ReferenceEvaluator(model, new_ops=moe.OPS).run(None, dict(zip(names, inputs, strict=True)))[0]


def experts_as_the_plugin_quantizes(experts, x, idx, weights) -> np.ndarray:
    """transformers' experts with every GEMM input through NVFP4 at a global scale of 1 as the plugin takes it (by
    Edge-LLM's own eager mirror of TRT_FP4DynamicQuantize: models/ops.py): what the double must compute, to its
    fp16 roundings."""
    from tensorrt_edgellm.models.ops import _nvfp4_act_qdq_eager

    linear, one = torch.nn.functional.linear, torch.tensor(1.0)
    torch.nn.functional.linear = lambda a, w, b=None: linear(_nvfp4_act_qdq_eager(a.half(), one).float(), w, b)
    try:
        with torch.no_grad():
            return experts(x, idx, weights).numpy()
    finally:
        torch.nn.functional.linear = linear


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture
def edgellm_packer(monkeypatch):
    """Edge-LLM's repacking, taking these ModelOpt-format namespaces for its NVFP4 linears (its type check asks for
    its own NVFP4Linear class, which only its model loader builds)."""
    import tensorrt_edgellm.models.linear as linear
    from tensorrt_edgellm.checkpoint import repacking
    monkeypatch.setattr(linear, "is_nvfp4_linear", lambda m: hasattr(m, "weight_scale_2"))
    return repacking


def _plugin_inputs(packed, logits, hidden, bias) -> list[np.ndarray]:
    fc1_q, fc1_s, fc1_a, fc2_q, fc2_s, fc2_a = (t.numpy() for t in packed[:6])
    e = fc1_q.shape[0]
    return [logits.numpy().astype(np.float32), hidden.numpy().astype(np.float16), fc1_q, fc1_s, fc1_a, fc2_q,
            fc2_s, fc2_a, np.ones(e, np.float32), np.ones(e, np.float32), bias.numpy().astype(np.float32)]


def test_relu2_experts_routed_by_sigmoid_with_a_score_correction_compute_nemotron_h(edgellm_packer):
    """Nemotron-H's MoE (transformers' NemotronHTopkRouter and relu2 experts, 8 experts in 2 groups, the best group
    only, 2 per token, renormalized, x 2.5; experts 64 wide, which Edge-LLM pads to 128): the double picks the
    router's experts with its weights, and computes the experts to the NVFP4 activations' rounding (a routing
    without the correction, or by softmax, misses by far)."""
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

    torch.manual_seed(0)
    cfg = NemotronHConfig(hidden_size=128, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                          moe_shared_expert_intermediate_size=64, n_group=2, topk_group=1, norm_topk_prob=True,
                          routed_scaling_factor=2.5, layers_block_type=["moe"])
    block = NemotronHMoE(cfg).float()
    block.gate.weight.data.normal_(0, 0.3)
    block.gate.e_score_correction_bias.normal_(0, 0.2)
    linears, w = nvfp4_experts({"up_proj": (64, 128), "down_proj": (128, 64)})
    block.experts.up_proj.data[:], block.experts.down_proj.data[:] = w["up_proj"], w["down_proj"]
    packed = edgellm_packer.repack_nvfp4_moe_experts(linears, 128, 64, 16)
    assert packed[6:] == (128, 128)                 # the padded intermediate width, the hidden width as it is
    x = torch.randn(24, 128)
    with torch.no_grad():
        logits, weights, idx = block.gate(x)
    want = experts_as_the_plugin_quantizes(block.experts, x, idx, weights)
    attrs = dict(num_experts=8, top_k=2, hidden_size=128, moe_inter_size=128, activation_type=4, n_group=2,
                 topk_group=1, norm_topk_prob=1, routed_scaling_factor=2.5, routing_mode=1, backend=0, io_dtype=1,
                 max_routed_rows=0)
    inputs = _plugin_inputs(packed, logits, x, block.gate.e_score_correction_bias)

    with the_double() as moe:
        got_idx, got_w = moe.route_nvfp4(inputs[0], inputs[-1], 2, 1, 2, 1, True, 2.5)
    order = np.argsort(got_idx, -1), idx.numpy().argsort(-1)
    assert np.array_equal(np.take_along_axis(got_idx, order[0], -1), np.take_along_axis(idx.numpy(), order[1], -1))
    np.testing.assert_allclose(np.take_along_axis(got_w, order[0], -1),
                               np.take_along_axis(weights.numpy(), order[1], -1), rtol=1e-6)
    assert len(set(map(tuple, np.sort(got_idx, -1)))) > 3      # the tokens are spread over the experts

    got = _plugin(inputs, **attrs)
    assert got.dtype == np.float16 and got.shape == x.shape
    # measured: 0.99988; without the score correction 0.655; softmax routing in place of the sigmoid's 0.523
    assert _cosine(got, want) > 0.9995, _cosine(got, want)
    assert _cosine(_plugin(inputs[:-1] + [np.zeros(8, np.float32)], **attrs), want) < 0.9
    assert _cosine(_plugin(inputs, **{**attrs, "routing_mode": 0}), want) < 0.9


def test_geglu_experts_scaled_per_expert_after_renormalizing_compute_gemma4(edgellm_packer):
    """Gemma 4 26B-A4B's MoE (transformers' Gemma4TextRouter and experts: softmax, top 2 of 8, renormalized, then
    the router's per-expert scale; GeGLU experts 64 wide in Edge-LLM's 64-row [up, gate] chunks): the double's
    routing mode 2 gives the router's weights from its logits and the scales in the bias slot, and its GeGLU
    computes the experts (without the per-expert scales, or with SiLU, it misses)."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts, Gemma4TextRouter

    torch.manual_seed(1)
    cfg = Gemma4TextConfig(hidden_size=128, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
                           enable_moe_block=True, hidden_activation="gelu_pytorch_tanh")
    router, experts = Gemma4TextRouter(cfg).float(), Gemma4TextExperts(cfg).float()
    router.proj.weight.data.normal_(0, 0.3)
    router.per_expert_scale.data.uniform_(0.5, 2.0)
    linears, w = nvfp4_experts({"gate_proj": (64, 128), "up_proj": (64, 128), "down_proj": (128, 64)})
    experts.gate_up_proj.data[:] = torch.cat([w["gate_proj"], w["up_proj"]], dim=1)
    experts.down_proj.data[:] = w["down_proj"]
    packed = edgellm_packer.repack_nvfp4_gated_moe_experts(linears, 128, 64, 16, fc1_layout="interleave",
                                                           moe_inter_size_alignment=64)
    x = torch.randn(24, 128)
    captured = {}
    router.proj.register_forward_hook(lambda _m, _i, out: captured.update(logits=out.detach().float()))
    with torch.no_grad():
        _probs, weights, idx = router(x)
    want = experts_as_the_plugin_quantizes(experts, x, idx, weights)
    attrs = dict(num_experts=8, top_k=2, hidden_size=128, moe_inter_size=64, activation_type=5, n_group=1,
                 topk_group=1, norm_topk_prob=1, routed_scaling_factor=1.0, routing_mode=2, backend=0, io_dtype=1,
                 max_routed_rows=0)
    inputs = _plugin_inputs(packed, captured["logits"], x, router.per_expert_scale.detach())
    got = _plugin(inputs, **attrs)
    assert got.dtype == np.float16 and got.shape == x.shape
    # measured: 0.9986 (each token's NVFP4 rounding of the GeGLU output sits on the engine's fp16 gate and up);
    # without the per-expert scales 0.927; SiLU in place of GeGLU 0.987
    assert _cosine(got, want) > 0.998, _cosine(got, want)
    assert _cosine(_plugin(inputs, **{**attrs, "routing_mode": 0}), want) < 0.95
    assert _cosine(_plugin(inputs, **{**attrs, "activation_type": 2}), want) < 0.995

"""TEST DOUBLE of TensorRT Edge-LLM 0.11's mixture-of-experts plugins (TensorRT and its plugins cannot exist in CI).

Computed from their published interface: the op signatures in tensorrt_edgellm/models/ops.py, the weight layouts
its loader writes (checkpoint/repacking.py, models/qwen3_moe), and the plugin sources (cpp/plugins/int4MoePlugin:
moeTopkSoftmax(..., renormalize=true), gate/up GEMM, SwiGLU, down GEMM with the routing weight in its epilogue,
slots summed per token):

    routing            softmax over the router logits (fp32), the top-k experts, their weights renormalized to sum 1
                       (Int4MoePlugin always renormalizes; Fp16MoePlugin as its norm_topk_prob attribute says)
    Int4MoePlugin      Marlin-packed INT4 per expert: fc_gate_up_qweights [E, K/16, 2N] (int32 viewed as int8),
                       scales [E, groups, N] in Marlin's permuted order; W = (nibble - 8) * scale; FC1 rows are
                       [gate | up]
    Fp16MoePlugin      fc1_weights [E, 2I, H] in 64-row chunks [up 0:64, gate 0:64, up 64:128, ...], fc2 [E, H, I]
    Nvfp4MoePlugin     FC1 [E, 2I, H/2] FP4 bytes (two E2M1 codes a byte, the low nibble first) in the same 64-row
                       chunks, FC2 [E, H, I/2]; E4M3 block scales (16 along K) in CuTeDSL's 6-D MMA layout
                       [E, m_tiles, k_tiles, 32, 4, 4] (128-row x 4-block tiles); W = E2M1 x block scale, each GEMM
                       times its expert's alpha (weight_scale_2); the FC1 input and the FC2 input (the SwiGLU output)
                       quantized to NVFP4 per block of 16 with input_global_scale / down_input_scale as the global
                       scale (Edge-LLM's loader writes ones there). Its activation_type: 2 SwiGLU, 5 GeGLU (Gemma 4:
                       gelu with tanh, as its hidden_activation gelu_pytorch_tanh, in the same 64-row chunks), 4 relu2
                       (Nemotron-H: not gated, FC1 [E, I, H/2]); moe_inter_size is the padded width the loader packed
                       (zero rows and columns past the checkpoint's). Its routing_mode:
                         0  softmax, top-k, renormalized as norm_topk_prob says, x routed_scaling_factor
                         1  sigmoid; the top-k of sigmoid + e_score_correction_bias among the topk_group best of
                            n_group groups (a group's score: its two best); the sigmoid's weights of those, renormalized
                            (+1e-20) as norm_topk_prob says, x routed_scaling_factor (Nemotron-H's router, as
                            Edge-LLM's NemotronHTopkRouter and transformers compute it)
                         2  softmax, top-k, renormalized, then x the per-expert scale given in the bias input
                            (Gemma 4's router.per_expert_scale: "applied post-renorm by plugin")

The Marlin layout is undone from its definition (below), which a test checks against Edge-LLM's own packer.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


def route(logits: np.ndarray, top_k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indices [T, k], weights [T, k] fp32) as moeTopkSoftmax computes them; ties go to the lower expert."""
    z = logits.astype(np.float32)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, idx, -1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    return idx, w.astype(np.float32)


def route_nvfp4(logits: np.ndarray, bias: np.ndarray, top_k: int, mode: int, n_group: int, topk_group: int,
                norm_topk_prob: bool, scaling: float) -> tuple[np.ndarray, np.ndarray]:
    """Nvfp4MoePlugin's routing (its modes in the module docstring): (indices [T, k], weights [T, k] fp32)."""
    z = logits.astype(np.float32)
    if mode in (0, 2):
        idx, w = route(z, top_k, renormalize=bool(norm_topk_prob) or mode == 2)
        if mode == 2:
            w = w * bias.astype(np.float32)[idx]
        return idx, (w * np.float32(scaling)).astype(np.float32)
    if mode != 1:
        raise NotImplementedError(f"Nvfp4MoePlugin routing mode {mode}")
    scores = np.float32(1.0) / (np.float32(1.0) + np.exp(-z))
    choice = scores + bias.astype(np.float32)[None, :]
    tokens, experts = choice.shape
    grouped = choice.reshape(tokens, n_group, experts // n_group)
    group_score = -np.sort(-grouped, axis=-1)[..., :2].sum(-1)
    best_groups = np.argsort(-group_score, axis=-1, kind="stable")[:, :topk_group]
    allowed = np.zeros((tokens, n_group), bool)
    np.put_along_axis(allowed, best_groups, True, -1)
    masked = np.where(np.repeat(allowed, experts // n_group, axis=-1), choice, -np.inf)
    idx = np.argsort(-masked, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(scores, idx, -1)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + np.float32(1e-20))
    return idx, (w * np.float32(scaling)).astype(np.float32)


def _gelu_tanh(x):
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(np.float32(0.7978845608028654)
                                                          * (x + np.float32(0.044715) * x ** 3)))


# Nvfp4MoePlugin's activation types: (gated, the function of FC1's output)
_NVFP4_ACTIVATIONS = {2: (True, lambda g, u: _silu(g) * u), 5: (True, lambda g, u: _gelu_tanh(g) * u),
                      4: (False, lambda u, _: np.square(np.maximum(u, np.float32(0.0))))}


def _silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


def experts_forward(hidden: np.ndarray, idx: np.ndarray, weights: np.ndarray, gate_up, down) -> np.ndarray:
    """Every token through its top-k experts (gate_up(e) -> [T, 2I] rows [gate | up], down(e) -> [T, H] fp32 weights
    per expert), each GEMM rounded to fp16 as the kernels write it, the routing weight applied in the down GEMM's
    epilogue, the slots summed per token."""
    x = hidden.astype(np.float16)
    out = np.zeros(x.shape, np.float32)
    for e in np.unique(idx):
        rows, slot = np.nonzero(idx == e)
        gu = (x[rows].astype(np.float32) @ gate_up(e).T).astype(np.float16).astype(np.float32)
        inter = gu.shape[1] // 2
        act = (_silu(gu[:, :inter]) * gu[:, inter:]).astype(np.float16).astype(np.float32)
        y = ((act @ down(e).T) * weights[rows, slot][:, None]).astype(np.float16)
        np.add.at(out, rows, y.astype(np.float32))
    return out.astype(np.float16)


# Marlin's INT4 layout (the format of IST-DASLab's Marlin kernels, as Edge-LLM's packer writes it for Int4MoePlugin):
# each 16 x 64 tile of the [K, N] nibbles becomes 128 words of 8 nibbles. Word j of a tile is stored at column
# OUT[j] of the tile's 128; its nibble slot i holds the element gathered at position PACK[i] of the word's 8 picks;
# pick c of word j is tile element (ROW[j, c], COL[j, c]). Written here as the formulas of that layout, and checked
# against Edge-LLM's own packer (tests/workstation/test_moe_build.py).
_PACK = np.array([0, 2, 4, 6, 1, 3, 5, 7])
_OUT = np.array([4 * (j % 32) + j // 32 for j in range(128)])
_ROW = np.array([[2 * (j % 4) + d for d in (0, 1, 8, 9, 0, 1, 8, 9)] for j in range(128)])
_COL = np.array([[(j // 4) % 8 + 16 * (j // 32) + (8 if c >= 4 else 0) for c in range(8)] for j in range(128)])
# the scales' column order inside each 64 (grouped) or 32 (one group per row: group size = K) columns
_SCALE_PERM = np.array([i + 8 * j for i in range(8) for j in range(8)])
_SCALE_PERM_SINGLE = np.array([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])


def marlin_nibbles(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """One expert's Marlin words ([K/16, 2N] int32, here as int8 bytes) -> nibbles [N, K] (0..15)."""
    kt, nt = k // 16, n // 64
    words = np.ascontiguousarray(packed).view(np.uint32).reshape(kt, nt, 128)[:, :, _OUT]      # [kt, nt, 128]
    nib = np.stack([(words >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], -1)       # [kt, nt, 128, 8]
    gathered = np.empty_like(nib)
    gathered[..., _PACK] = nib
    tiles = np.empty((kt, nt, 16, 64), np.uint32)
    tiles[:, :, _ROW, _COL] = gathered
    return tiles.transpose(0, 2, 1, 3).reshape(k, n).T.astype(np.int32)


def marlin_scales(scales: np.ndarray, k: int, n: int, group_size: int) -> np.ndarray:
    """One expert's Marlin-permuted scales [groups, N] -> [N, groups] in natural order."""
    perm = _SCALE_PERM if group_size < k else _SCALE_PERM_SINGLE
    natural = np.empty_like(scales.astype(np.float32).reshape(-1, len(perm)))
    natural[:, perm] = scales.astype(np.float32).reshape(-1, len(perm))
    return natural.reshape(scales.shape[0], n).T


def int4_expert_weight(qweights, scales, e, k, n, group_size) -> np.ndarray:
    """Expert e's dequantized weight [N, K] as the Marlin kernel reads it: (nibble - 8) * fp16 scale."""
    nib = marlin_nibbles(qweights[e], k, n)
    s = marlin_scales(scales[e], k, n, group_size)
    return ((nib - 8).astype(np.float32) * np.repeat(s, group_size, axis=1)).astype(np.float16).astype(np.float32)


class Int4MoePlugin(OpRun):
    op_domain = "trt_edgellm"

    def _run(self, router_logits, hidden, gu_q, gu_s, dn_q, dn_s, num_experts=None, top_k=None, hidden_size=None,
             moe_inter_size=None, activation_type=None, quantization_group_size=None, **_):
        if activation_type != 0:
            raise NotImplementedError(f"Int4MoePlugin activation_type {activation_type} (0 = SiLU gating)")
        kept = getattr(self, "_kept", None)
        if kept is None or kept[0] is not gu_q or kept[1] is not dn_q:
            h, i, g = hidden_size, moe_inter_size, quantization_group_size
            gate_up = [int4_expert_weight(gu_q, gu_s, e, h, 2 * i, g) for e in range(num_experts)]
            down = [int4_expert_weight(dn_q, dn_s, e, i, h, g) for e in range(num_experts)]
            kept = self._kept = (gu_q, dn_q, gate_up, down)
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        idx, w = route(router_logits.reshape(flat.shape[0], -1), top_k, renormalize=True)
        return (experts_forward(flat, idx, w, lambda e: kept[2][e], lambda e: kept[3][e]).reshape(shape),)


class Fp16MoePlugin(OpRun):
    op_domain = "trt_edgellm"

    def _run(self, router_logits, hidden, fc1, fc2, num_experts=None, top_k=None, hidden_size=None,
             moe_inter_size=None, activation_type=None, norm_topk_prob=None, **_):
        if activation_type != 2:
            raise NotImplementedError(f"Fp16MoePlugin activation_type {activation_type} (2 = SwiGLU)")
        i = moe_inter_size
        chunks = fc1.astype(np.float32).reshape(num_experts, i // 64, 2, 64, hidden_size)    # [up, gate] per chunk
        gate_up = np.concatenate([chunks[:, :, 1].reshape(num_experts, i, hidden_size),
                                  chunks[:, :, 0].reshape(num_experts, i, hidden_size)], axis=1)
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        idx, w = route(router_logits.reshape(flat.shape[0], -1), top_k, renormalize=bool(norm_topk_prob))
        return (experts_forward(flat, idx, w, lambda e: gate_up[e], lambda e: fc2[e].astype(np.float32))
                .reshape(shape),)


_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def fp4_values(packed: np.ndarray) -> np.ndarray:
    """[..., K/2] bytes -> [..., K] E2M1 values (element 2j in the low nibble, as ModelOpt packs them)."""
    b = np.ascontiguousarray(packed).view(np.uint8)
    return np.stack([_E2M1[b & 15], _E2M1[b >> 4]], -1).reshape(*b.shape[:-1], 2 * b.shape[-1])


def mma_scales(swizzled: np.ndarray, rows: int, blocks: int) -> np.ndarray:
    """CuTeDSL's 6-D block-scale layout [m_tiles, k_tiles, 32, 4, 4] (bytes) -> [rows, blocks] E4M3 values."""
    import ml_dtypes
    m_tiles, k_tiles = swizzled.shape[:2]
    linear = np.ascontiguousarray(swizzled).view(np.uint8).reshape(m_tiles, k_tiles, 32, 4, 4) \
        .transpose(0, 3, 2, 1, 4).reshape(m_tiles * 128, k_tiles * 4)
    return linear[:rows, :blocks].view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def nvfp4_qdq(x: np.ndarray, global_scale: float) -> np.ndarray:
    """Activations through NVFP4 and back, as TRT_FP4DynamicQuantize computes them (edgellm_engine's one copy)."""
    from edgellm_engine import fp4_dynamic_quantize
    g = np.float32(global_scale)
    elements, scales = fp4_dynamic_quantize(x, g)
    blocks = elements.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    return (blocks * (scales.astype(np.float32) * g)[..., None]).reshape(x.shape)


class Nvfp4MoePlugin(OpRun):
    op_domain = "trt_edgellm"

    def _run(self, router_logits, hidden, fc1_q, fc1_s, fc1_alpha, fc2_q, fc2_s, fc2_alpha, input_scale,
             down_scale, bias, num_experts=None, top_k=None, hidden_size=None, moe_inter_size=None,
             activation_type=None, n_group=None, topk_group=None, norm_topk_prob=None, routed_scaling_factor=None,
             routing_mode=None, **_):
        if activation_type not in _NVFP4_ACTIVATIONS:
            raise NotImplementedError(f"Nvfp4MoePlugin activation_type {activation_type}")
        gated, act_fn = _NVFP4_ACTIVATIONS[activation_type]
        h, i = hidden_size, moe_inter_size
        kept = getattr(self, "_kept", None)
        if kept is None or kept[0] is not fc1_q or kept[1] is not fc2_q:
            w1, w2 = [], []
            rows = 2 * i if gated else i
            for e in range(num_experts):
                fc1 = fp4_values(fc1_q[e]) * np.repeat(mma_scales(fc1_s[e], rows, h // 16), 16, axis=1)
                if gated:
                    chunks = fc1.reshape(i // 64, 2, 64, h)                 # [up, gate] per 64 rows
                    fc1 = np.concatenate([chunks[:, 1].reshape(i, h), chunks[:, 0].reshape(i, h)])
                w1.append(fc1)
                w2.append(fp4_values(fc2_q[e]) * np.repeat(mma_scales(fc2_s[e], h, i // 16), 16, axis=1))
            kept = self._kept = (fc1_q, fc2_q, w1, w2)
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1]).astype(np.float16)
        idx, w = route_nvfp4(router_logits.reshape(flat.shape[0], -1), bias, top_k, routing_mode, n_group,
                             topk_group, bool(norm_topk_prob), routed_scaling_factor)
        out = np.zeros(flat.shape, np.float32)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            x = nvfp4_qdq(flat[rows], float(input_scale[e]))
            gu = ((x @ kept[2][e].T) * fc1_alpha[e]).astype(np.float16).astype(np.float32)
            act = (act_fn(gu[:, :i], gu[:, i:]) if gated else act_fn(gu, None)).astype(np.float16)
            a = nvfp4_qdq(act, float(down_scale[e]))
            y = ((a @ kept[3][e].T) * fc2_alpha[e] * w[rows, slot][:, None]).astype(np.float16)
            np.add.at(out, rows, y.astype(np.float32))
        return (out.astype(np.float16).reshape(shape),)


OPS = [Int4MoePlugin, Fp16MoePlugin, Nvfp4MoePlugin]

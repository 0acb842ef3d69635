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


OPS = [Int4MoePlugin, Fp16MoePlugin]

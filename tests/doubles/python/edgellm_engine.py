"""TEST DOUBLE of a TensorRT Edge-LLM engine (TensorRT and its plugins cannot exist in CI).

The llm_build double writes the exporter's ONNX graph, weights included, as the "engine"; this module runs that graph
as Edge-LLM's runtime would drive the engine: token embeddings from embedding.safetensors, RoPE cos/sin from the
runtime config, a paged KV cache, prefill then one token per step, greedy. Standard ONNX ops run in ONNX's reference
evaluator (GEMMs accumulated in fp32, as tensor cores do); Edge-LLM's custom ops run as written here from their
published interfaces (tensorrt_edgellm/models/ops.py, checkpoint/repacking.py of the 0.11 wheel):

    AttentionPlugin                qkv [T, (Hq + 2 Hkv) D] token-major; RoPE (rotate-half) from rope_rotary_cos_sin
                                   [T, D] (cos | sin); K/V written into the paged pool at past_lengths; softmax
                                   attention with attention_scale over the past and the current tokens, causally or,
                                   with tree attention (EAGLE-3 bases), as packed_attention_mask [T, words] allows;
                                   FP8 KV cache with qkv_scales [q, k, v]: K and V stored in E4M3, Q quantized
                                   to E4M3 with its scale (Edge-LLM 0.11 documents this for the prefill query;
                                   the double does it at every step, as ModelOpt's q_bmm quantizer does in the
                                   calibrated model); returns [T, Hq, D]
    TRT_FP4DynamicQuantize, trt     NVFP4 activations: blocks of 16 scaled by E4M3 scales, rounded to E2M1, and
    DequantizeLinear               dequantized with an fp16 scale (Edge-LLM's eager mirror of the ops, models/ops.py)
    Int4GroupwiseGemmPlugin(V2)    W4A16: biased nibbles (value - 8) x scales [K/group, N]; v1: AWQ-swizzled int16,
                                   v2: cuteDSL fragment order (128 x 64 tiles)
    QkvConcatPlugin                concat on the last dimension
    Int4MoePlugin, Fp16MoePlugin   edgellm_moe.py beside this module
    gated_delta_net,               edgellm_recurrent.py beside this module: each sequence's recurrent and conv state
    update_ssm_state,              in a resident slot (state_indices), carried from step to step with its KV pages
    causal_conv1d

So the answer is what a correct engine built from this ONNX computes: the same checkpoint-to-numerics path the
TensorRT-LLM runtime double follows with the independent reader.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from edgellm_moe import OPS as MOE_OPS  # beside this module (the MoE plugins)
from edgellm_recurrent import OPS as RECURRENT_OPS  # beside this module (delta-net, Mamba-2, causal conv1d)
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from pipeline.workstation.onnx_reference import exact_elementwise_ops

PAGE = 128      # tokens per KV page: the pool shape the exporter declares, [2, pages, 128, Hkv, D]


def _fp8(x):
    """E4M3, saturating as the kernels' conversions do (__NV_SATFINITE): a value beyond the calibrated range, which
    a prompt can hold, becomes +-448, where a plain cast to float8_e4m3fn would make it NaN."""
    import ml_dtypes
    return np.clip(x, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)


class AttentionPlugin(OpRun):
    op_domain = "trt_edgellm"

    def _run(self, qkv, past, query_lengths, cos_sin, past_lengths, page_table, *rest, **attrs):
        hq, hkv, d = attrs["num_q_heads"], attrs["num_kv_heads"], attrs["head_size"]
        if attrs.get("supports_bounded_kv_cache"):
            # Gemma 4's sliding layers: the 7th input is swa_kv_cache_mode, read by its length only (1: the pool
            # holds the window, O(W); 0: the whole sequence). The double drives full storage; the bounded pool's
            # ring layout is the C++ runtime's, not part of any published interface this double can follow.
            mode, rest = rest[0], rest[1:]
            if mode.size:
                raise NotImplementedError("bounded (O(W)) sliding-window storage is not part of this double")
        window = attrs.get("sliding_window_size", -1)
        # a KV-shared layer (Gemma 4) carries its query only and reads the donor layer's pool, which the donor's
        # plugin updated earlier in the same step; it never writes it (Engine wires the donor's pool in)
        shared = bool(attrs.get("enable_kv_shared")) and qkv.shape[-1] == hq * d
        tree_mask = rest[0] if attrs.get("enable_tree_attention") else None
        # Qwen3-style q/k RMSNorm per head, before RoPE (qk_norm_post_rope = 0), with the gammas the graph feeds as
        # the plugin's 7th and 8th inputs
        qk_norm = (rest[0].astype(np.float32), rest[1].astype(np.float32)) if attrs.get("enable_qk_norm") else None
        if qk_norm is not None and tree_mask is not None:
            raise NotImplementedError("q/k norm with tree attention is not part of this double")
        if qk_norm is not None and attrs.get("qk_norm_post_rope"):
            raise NotImplementedError("qk_norm_post_rope is not part of this double")
        eps = attrs.get("rms_norm_eps", 1e-6)
        scale = attrs["attention_scale"]
        fp8 = bool(attrs.get("enable_fp8_kv_cache"))
        q_scale, k_scale, v_scale = attrs.get("qkv_scales") or (1.0, 1.0, 1.0)
        present = past.copy()
        out = np.zeros((qkv.shape[0], hq, d), dtype=qkv.dtype)
        start = 0
        for s, (ql, pl) in enumerate(zip(query_lengths.tolist(), past_lengths.tolist(), strict=True)):
            x = qkv[start:start + ql].astype(np.float32)
            q = x[:, :hq * d].reshape(ql, hq, d)
            k = x[:, hq * d:(hq + hkv) * d].reshape(ql, -1, d)     # none where the layer is KV-shared
            v = x[:, (hq + hkv) * d:].reshape(ql, -1, d)
            if qk_norm is not None and not shared:
                q, k = (t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * g for t, g in zip((q, k), qk_norm,
                                                                                          strict=True))
            # the table holds cos | sin of the rotated dimensions: all of each head, or its first part
            # (partial_rotary_factor < 1, Phi-4-mini), rotated as halves of that part (GPT-NeoX style)
            cs = cos_sin[start:start + ql].astype(np.float32)
            r = cs.shape[-1]
            cos, sin = cs[:, None, :r // 2], cs[:, None, r // 2:]

            def rope(t, cos=cos, sin=sin, r=r):
                a, b = t[..., :r // 2], t[..., r // 2:r]
                return np.concatenate([a * cos - b * sin, b * cos + a * sin, t[..., r:]], axis=-1)
            q, k = rope(q), (k if shared else rope(k))
            if fp8:     # the query in E4M3 with its per-tensor scale (1.0 where the checkpoint has none)
                q = _fp8(q / q_scale).astype(np.float32) * q_scale
            if not shared:      # this step's keys and values into their pages
                pos = pl + np.arange(ql)
                present[0, page_table[s, 0, pos // PAGE], pos % PAGE] = _fp8(k / k_scale) if fp8 else k
                present[1, page_table[s, 1, pos // PAGE], pos % PAGE] = _fp8(v / v_scale) if fp8 else v
            total = pl + ql
            seen = np.arange(total)
            keys, vals = (present[kv, page_table[s, kv, seen // PAGE], seen % PAGE].astype(np.float32)
                          for kv in (0, 1))
            if fp8:
                keys, vals = keys * k_scale, vals * v_scale
            keys, vals = np.repeat(keys, hq // hkv, axis=1), np.repeat(vals, hq // hkv, axis=1)
            # heads first, as batched matmuls: numpy's einsum does not reach BLAS for these contractions
            att = np.matmul(q.transpose(1, 0, 2), keys.transpose(1, 2, 0)) * scale
            if tree_mask is None:
                hidden = np.arange(total)[None, :] > (pl + np.arange(ql))[:, None]
                if window > 0:      # a sliding layer sees the last `window` positions, its own included
                    hidden |= np.arange(total)[None, :] <= (pl + np.arange(ql))[:, None] - window
            else:       # bit j of row i: current token i sees current token j; every past token is seen
                rows = tree_mask[start:start + ql].astype(np.uint32)
                bits = (rows[:, np.arange(ql) // 32] >> (np.arange(ql) % 32)) & 1
                hidden = np.concatenate([np.zeros((ql, pl), bool), bits == 0], axis=1)
            att = np.where(hidden[None], -np.inf, att)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            out[start:start + ql] = np.matmul(att, vals.transpose(1, 0, 2)).transpose(1, 0, 2).astype(qkv.dtype)
            start += ql
        return out, present


class MatMul(OpRun):
    def _run(self, a, b):
        return (np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype),)


class Gemm(OpRun):
    def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 (ONNX's attribute names)
        y = alpha * np.matmul((a.T if transA else a).astype(np.float32), (b.T if transB else b).astype(np.float32))
        if c is not None:
            y = y + beta * c.astype(np.float32)
        return (y.astype(a.dtype),)


def _v1_positions(n: int, k: int) -> np.ndarray:
    """Where each nibble of the v1 (AWQ swizzle) buffer comes from: the packer's permutation applied to indices."""
    idx = np.arange(n * k).reshape(n, k)
    pk = idx.reshape(n, k // 32, 4, 4, 2).transpose(0, 1, 3, 2, 4).reshape(n, k // 32, 32)
    pk = pk.reshape(n, k // 32, 4, 4, 2).transpose(0, 1, 2, 4, 3).reshape(n, k)
    return pk.reshape(n // 4, 4, k // 64, 64).transpose(0, 2, 1, 3).reshape(n // 4, k // 64, 64, 4)


def v1_nibbles(qweight: np.ndarray, n: int, k: int) -> np.ndarray:
    words = (np.ascontiguousarray(qweight).view(np.int16).reshape(n // 4, k).astype(np.int32) & 0xFFFF)
    words = words.reshape(n // 4, k // 64, 64)
    nib = np.stack([(words >> (4 * j)) & 0xF for j in range(4)], axis=-1)
    out = np.empty(n * k, np.int32)
    out[_v1_positions(n, k).reshape(-1)] = nib.reshape(-1)
    return out.reshape(n, k)


# (bit shift, upper half of the N pair, K offset) of the eight nibbles of one 32-bit fragment word
_V2_NIBBLES = ((0, False, 0), (4, False, 8), (8, True, 0), (12, True, 8), (16, False, 1), (20, False, 9),
               (24, True, 1), (28, True, 9))


def v2_nibbles(qweight: np.ndarray, n: int, k: int) -> np.ndarray:
    """The cuteDSL fragment order undone: for each 128 x 64 tile, thread t's words (two K halves of 16, two N rows
    64 apart) hold eight nibbles each at (_V2_NIBBLES) offsets. Every (tile, K block, N half, thread, nibble) at once,
    by broadcasting over those six axes; a position no word fills keeps 8 (zero after the bias)."""
    bn, bk, threads = 128, 64, 128
    nnb, nkt = -(-n // bn), -(-k // bk)
    words = np.ascontiguousarray(qweight).view(np.uint32).reshape(nnb * nkt * 8, threads).astype(np.int64)
    shift, hi, koff = (np.array(c).reshape(1, 1, 1, 1, 1, -1) for c in zip(*_V2_NIBBLES, strict=True))
    nb, kt, kbl, p, t = (np.arange(size).reshape([-1 if i == axis else 1 for i in range(6)])
                         for axis, size in enumerate((nnb, nkt, 4, 2, threads)))
    word = words[(nb * nkt + kt) * 8 + kbl * 2 + p, t]
    rows = nb * bn + t // 4 + 64 * p + 32 * hi
    cols = kt * bk + 16 * kbl + 2 * (t % 4) + koff
    b = np.full((nnb * bn, nkt * bk), 8, np.int64)
    full = np.broadcast_shapes(word.shape, rows.shape, cols.shape, shift.shape)
    b[np.broadcast_to(rows, full), np.broadcast_to(cols, full)] = np.broadcast_to((word >> shift) & 0xF, full)
    return b[:n, :k]


class _Int4Gemm(OpRun):
    op_domain = "trt_edgellm"

    def nibbles(self, qweight, n, k):
        raise NotImplementedError

    def _run(self, x, qweight, scales, gemm_n=None, gemm_k=None, group_size=None, **_):
        # The dequantized weight, kept by this node (one engine) for the arrays it was made from: checked by
        # identity, never by address, since a later engine's weights can be allocated where a freed one's were
        # (a class-wide cache keyed by address once served one model's weights to another, now and then).
        kept = getattr(self, "_kept", None)
        if kept is None or kept[0] is not qweight or kept[1] is not scales:
            nib = self.nibbles(qweight, gemm_n, gemm_k)
            w = (nib - 8).astype(np.float32) * np.repeat(scales.astype(np.float32), group_size, axis=0).T
            kept = self._kept = (qweight, scales, w)
        return ((x.astype(np.float32) @ kept[2].T).astype(x.dtype),)


class Int4GroupwiseGemmPlugin(_Int4Gemm):
    def nibbles(self, qweight, n, k):
        return v1_nibbles(qweight, n, k)


class Int4GroupwiseGemmPluginV2(_Int4Gemm):
    def nibbles(self, qweight, n, k):
        return v2_nibbles(qweight, n, k)


class QkvConcatPlugin(OpRun):
    op_domain = "trt_edgellm"

    def _run(self, q, k, v, **_):
        return (np.concatenate([q, k, v], axis=-1),)


def _e2m1(x):
    """E2M1 (NVFP4's element): the nearest of +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, even on a midpoint, saturating."""
    import ml_dtypes
    return np.clip(x, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn)


class TRT_FP4DynamicQuantize(OpRun):     # noqa: N801 (TensorRT's op name)
    """NVFP4 activations (TensorRT's dynamic quantize, as Edge-LLM's eager mirror _nvfp4_act_qdq_eager describes it):
    per block of 16 along the last axis, scale = amax / 6 / global_scale rounded to E4M3 (saturating; 1 for an
    all-zero block), elements x / (scale * global_scale) rounded to E2M1. Returns (elements, block scales)."""
    op_domain = "trt"

    def _run(self, x, global_scale, axis=-1, block_size=16, scale_type=17, **_):
        if axis != -1 or scale_type != onnx.TensorProto.FLOAT8E4M3FN:
            raise NotImplementedError(f"TRT_FP4DynamicQuantize axis={axis} scale_type={scale_type}")
        return fp4_dynamic_quantize(x, np.float32(np.asarray(global_scale, np.float32).reshape(-1)[0]), block_size)


def fp4_dynamic_quantize(x, s2, block_size=16):
    """TRT_FP4DynamicQuantize's numerics (also the MoE plugin's activations): (E2M1 elements, E4M3 block scales)."""
    xb = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    per_block = np.abs(xb).max(-1, keepdims=True) / np.float32(6.0)
    scale = _fp8(per_block / s2).astype(np.float32)
    scale = np.where(per_block == 0, np.float32(1.0), scale)
    # a block whose scale underflows E4M3 to 0 divides by the mirror's floor (1e-20), not by 0: its elements
    # saturate (0 stays 0) and dequantize to 0 against the zero scale, as the engine's do
    elements = _e2m1(xb / np.maximum(scale * s2, np.float32(1e-20))).reshape(x.shape)
    return elements, _fp8(scale[..., 0])


class DequantizeLinear(OpRun):
    """TensorRT's DequantizeLinear (domain trt) as Edge-LLM's NVFP4 graph uses it: per tensor (the E4M3 block scales
    times the fp16 global scale: an fp16 product), or blockwise along the last axis (E2M1 elements times their
    block's fp16 scale)."""
    op_domain = "trt"

    def _run(self, x, scale, axis=None, block_size=None, **_):
        if block_size:
            if axis not in (-1, x.ndim - 1):
                raise NotImplementedError(f"blockwise DequantizeLinear on axis {axis}")
            scale = np.repeat(scale, block_size, axis=-1)
        return ((x.astype(np.float32) * scale.astype(np.float32)).astype(scale.dtype),)


OPS = [AttentionPlugin, MatMul, Gemm, Int4GroupwiseGemmPlugin, Int4GroupwiseGemmPluginV2, QkvConcatPlugin,
       TRT_FP4DynamicQuantize, DequantizeLinear]


def _longrope(cfg: dict) -> tuple[np.ndarray, float]:
    """LongRoPE as Edge-LLM's runtime sets it up (0.5.0's llmEngineRunner / initializeLongRopeCosSin, the source
    this repo can read): one factor set for the whole engine, the short factors when its KV capacity is at most
    original_max_position_embeddings, else the long ones for every position; cos and sin scaled by
    sqrt(1 + ln(max / original) / ln(original)). Returns (the factors to divide the frequencies by, that scale)."""
    rs, original = cfg["rope_scaling"], cfg["original_max_position_embeddings"]
    capacity = cfg["builder_config"]["maxKVCacheCapacity"]
    factors = np.asarray(rs["short_factor"] if capacity <= original else rs["long_factor"], np.float64)
    ratio = cfg["max_position_embeddings"] / original
    return factors, (math.sqrt(1 + math.log(ratio) / math.log(original)) if ratio > 1 else 1.0)


def rope_scale(cfg: dict) -> float:
    """The factor the runtime's cos/sin table carries (1 but for LongRoPE)."""
    rs = cfg.get("rope_scaling") or {}
    return _longrope(cfg)[1] if (rs.get("rope_type") or rs.get("type")) == "longrope" else 1.0


def inv_freq(cfg: dict) -> np.ndarray:
    """The runtime's RoPE frequencies from its config: default, Llama-3 frequency scaling, or LongRoPE."""
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type") or rs.get("type") or "default"
    if kind == "proportional":
        # Gemma 4's full layers (transformers' _compute_proportional_rope_parameters): the table spans the whole
        # head; the first partial_rotary_factor of its frequencies turn (exponents over the whole head), the rest
        # are zero (cos 1, sin 0)
        d = cfg["head_dim"]
        turning = int(rs.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) * d // 2)
        inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, 2 * turning, 2, dtype=np.float64) / d))
        return np.concatenate([inv, np.zeros(d // 2 - turning)]) / rs.get("factor", 1.0)
    d = int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0))
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if kind == "default":
        return inv
    if kind == "longrope":
        return inv / _longrope(cfg)[0]
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling {kind!r} is not part of this double")
    f, lo, hi, om = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > om / lo, inv / f, inv)
    smooth = (om / wavelen - lo) / (hi - lo)
    mid = (wavelen >= om / hi) & (wavelen <= om / lo)
    return np.where(mid, (1 - smooth) * scaled / f + smooth * scaled, scaled)


def mrope_axes(rope_scaling: dict, half: int) -> np.ndarray:
    """Which position axis (0 t, 1 h, 2 w) each of the `half` rotary frequencies takes."""
    section = rope_scaling["mrope_section"]
    axes = np.zeros(half, np.int64)
    if rope_scaling.get("mrope_interleaved"):
        for axis in (1, 2):     # transformers' apply_interleaved_mrope: slice(axis, 3 x section, 3), clipped
            idx = np.arange(axis, section[axis] * 3, 3)
            axes[idx[idx < half]] = axis
    else:
        axes[:] = np.repeat([0, 1, 2], section)[:half]
    return axes


def causal_words(t: int) -> np.ndarray:
    """[t, ceil(t / 32)] int32: bit j % 32 of word j // 32 of row i set where j <= i (each word's 32 bits as the
    kernel reads them, the top bit as the sign)."""
    seen = np.arange(-(-t // 32) * 32)[None, :] <= np.arange(t)[:, None]
    return (seen.reshape(t, -1, 32).astype(np.int64) << np.arange(32)).sum(-1).astype(np.uint32).view(np.int32)


@dataclass
class ImageInputs:
    """What the multimodal runtime hands the language engine for a request with images (edgellm_visual.py)."""
    placeholder: int
    embeds: np.ndarray                  # [image tokens, hidden], in placeholder order
    deepstack: list[np.ndarray]         # Qwen3-VL: per DeepStack input, [image tokens, hidden]
    positions: np.ndarray | None        # Qwen: [3, T] multimodal RoPE positions of the prompt (None: 1-D RoPE)
    offset: int = 0                     # Qwen: what later steps add to their cache position


class Pools(list):
    """One sequence's KV pools, one per layer, and a hybrid model's recurrent states (graph input name -> its slot
    pool of one row), which the runtime keeps beside them from step to step."""
    states: dict[str, np.ndarray]


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    """The graph under ONNX's reference evaluator with Edge-LLM's plugins (this module's, the MoE's, the recurrent
    ones) and whole-array Sigmoid/Erf (the reference's per-element Python took most of a step's time)."""
    return ReferenceEvaluator(model, new_ops=[*OPS, *MOE_OPS, *RECURRENT_OPS, *exact_elementwise_ops()])


class Engine:
    """One engine file of the llm_build double, run as the runtime runs it (one sequence at a time)."""

    def __init__(self, engine_file: Path, config: dict, embedding: np.ndarray, external: dict[str, np.ndarray],
                 ple: np.ndarray | None = None):
        """ple: Gemma 4's per-layer token embeddings, [vocab, layers x width] (ple_embedding.safetensors)."""
        self.model = onnx.load(str(engine_file))
        self.cfg, self.embedding, self.external, self.ple = config, embedding, external, ple
        self.layers = config["num_hidden_layers"]
        _share_donor_pools(self.model, config.get("kv_sharing_donors") or [])
        self.session = evaluator(self.model)
        # a hybrid's recurrent layers: conv_state_i / recurrent_state_i inputs, present_* outputs (one slot here)
        self.state_inputs = {i.name: (onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
                                      [d.dim_value for d in i.type.tensor_type.shape.dim][1:])
                             for i in self.model.graph.input if i.name.startswith(("conv_state_", "recurrent_state_"))}
        self.inv, self.rope_scale = inv_freq(config), rope_scale(config)
        # Gemma 4: a table per attention kind (sliding: the local theta over the head; full: proportional RoPE over
        # the global head), from the config's sliding_rope_config / full_rope_config as the runtime reads them
        self.ropes = {f"rope_rotary_cos_sin_{kind}": inv_freq({**config[f"{kind}_rope_config"], "head_dim": width})
                      for kind, width in (("sliding", config["head_dim"]),
                                          ("full", config.get("global_head_dim") or config["head_dim"]))
                      if f"{kind}_rope_config" in config}
        pools = {i.name: i for i in self.model.graph.input if i.name.startswith("past_key_values_")}
        self.pool_dtype = onnx.helper.tensor_dtype_to_np_dtype(pools["past_key_values_0"].type.tensor_type.elem_type) \
            if pools else np.float16        # a hybrid without attention layers has no KV cache at all
        # each layer's pool: [heads, width] from kv_layer_configs where the layers differ (Gemma 4), else the model's
        # (a hybrid's recurrent layers have none: null entries; its KV pools are numbered over its attention layers)
        self.kv_shapes = [(c["num_kv_heads"], c["head_dim"]) for c in config["kv_layer_configs"] if c] \
            if config.get("kv_layer_configs") else [(config["num_key_value_heads"], config["head_dim"])] * self.layers
        self.outputs = [o.name for o in self.model.graph.output]
        self.deepstack = sum(1 for i in self.model.graph.input if i.name.startswith("deepstack_embeds_"))
        rs = config.get("rope_scaling") or {}
        if rs.get("mrope_section"):     # Qwen-VL: each rotary frequency from one position axis
            self.axes = mrope_axes(rs, len(self.inv))

    def step(self, tokens: list[int], past: int, pools: list[np.ndarray], table: np.ndarray,
             image: ImageInputs | None = None, extra: dict[str, np.ndarray] | None = None,
             embeds: np.ndarray | None = None) -> np.ndarray:
        """Run `tokens` (at positions past..) through the graph; the KV pools are updated; returns the last logits.
        image: a prefill's image features and multimodal positions (edgellm_visual.py); a later step of such a
        request: its RoPE offset. extra: further graph inputs (an MTP draft's hidden states). embeds: the input rows
        themselves, [T, hidden] (a TTS talker's or code predictor's: the runtime builds them; `tokens` then only
        counts them). A graph with a hidden_states output (a speculative base or draft, a TTS talker) leaves it in
        self.hidden."""
        t = len(tokens) if embeds is None else len(embeds)
        pos = np.arange(past, past + t)
        embeds = self.embedding[tokens].astype(np.float16) if embeds is None else embeds.astype(np.float16)
        deepstack = [np.zeros((t, self.embedding.shape[1]), np.float16) for _ in range(self.deepstack)]
        if image is not None and past == 0:     # the prefill: image features at the placeholder positions
            at = np.flatnonzero(np.asarray(tokens) == image.placeholder)
            embeds[at] = image.embeds.astype(np.float16)
            for i, features in enumerate(image.deepstack[:self.deepstack]):
                deepstack[i][at] = features.astype(np.float16)
        if image is not None and image.positions is not None:
            rope = image.positions if past == 0 else np.broadcast_to(pos + image.offset, (3, t))
            angles = np.take_along_axis(rope.T[:, :, None] * self.inv[None, None, :],   # [T, 3, half]
                                        self.axes[None, None, :], axis=1)[:, 0, :]
        else:
            angles = np.outer(pos, self.inv)
        if self.cfg.get("use_rope") is False:      # no positional rotation (Nemotron-H): the identity table
            angles = np.zeros_like(angles)
        feeds = {"inputs_embeds": embeds,
                 "rope_rotary_cos_sin": (np.concatenate([np.cos(angles), np.sin(angles)], -1)
                                         * self.rope_scale).astype(np.float32),
                 "positions": pos.astype(np.int32), "query_start_offsets": np.array([0, t], np.int32),
                 "query_lengths": np.array([t], np.int32), "past_lengths": np.array([past], np.int32),
                 "attention_sequence_lengths": np.array([past + t], np.int32),
                 "state_indices": np.array([0], np.int32),
                 "execution_phase_marker": np.zeros(1 if past == 0 else 0, np.int8),
                 "context_sequence_count_carrier": np.zeros(1 if past == 0 else 0, np.int8),
                 "kv_page_table": table, "logits_indices": np.array([t - 1], np.int32), **self.external,
                 # an EAGLE-3 base decoding one chain (no draft): token i sees tokens 0..i of this step
                 # (bit j % 32 of word j // 32)
                 "packed_attention_mask": causal_words(t),
                 "attention_position_ids": pos.astype(np.int32),
                 "tree_parent_ids": np.arange(-1, t - 1, dtype=np.int32), "tree_depths": np.arange(t, dtype=np.int32),
                 "valid_tree_counts": np.array([t], np.int32)}
        for name, inv in self.ropes.items():
            a = np.outer(pos, inv)
            feeds[name] = np.concatenate([np.cos(a), np.sin(a)], -1).astype(np.float32)
        if self.ple is not None:        # the runtime's gather: layer i's slice of each token's row
            width = self.cfg["ple_hidden_size"]
            rows = self.ple[tokens].astype(np.float16)
            feeds.update({f"ple_token_embeds_{i}": rows[:, i * width:(i + 1) * width] for i in range(self.layers)})
        # full storage for the sliding layers: the same pages as the full layers, swa_kv_cache_mode of length 0
        feeds.update(swa_kv_page_table=table, swa_kv_cache_mode=np.zeros(0, np.int8))
        for i in range(len(self.kv_shapes)):
            feeds[f"past_key_values_{i}"] = pools[i]
        feeds.update(getattr(pools, "states", {}))
        wanted = {i.name for i in self.model.graph.input}
        # a Qwen3-VL language model adds its DeepStack image features to the first layers' hidden states at image
        # positions: a text-only step adds nothing (zeros)
        for i in range(self.deepstack):
            feeds[f"deepstack_embeds_{i}"] = deepstack[i]
        feeds.update(extra or {})
        out = dict(zip(self.outputs, self.session.run(self.outputs, {k: v for k, v in feeds.items() if k in wanted}),
                       strict=True))
        for i in range(len(self.kv_shapes)):
            pools[i] = out[f"present_key_values_{i}"]
        for name in getattr(pools, "states", {}):
            pools.states[name] = out[f"present_{name}"]
        self.hidden = out.get("hidden_states")
        return out["logits"][0]

    def new_pools(self, pages: int) -> Pools:
        """Empty KV pools of `pages` pages, one per attention layer, each of its layer's shape; a hybrid's recurrent
        states zeroed (a new sequence's slot, as the runtime clears it)."""
        pools = Pools(np.zeros((2, pages, PAGE, heads, width), self.pool_dtype) for heads, width in self.kv_shapes)
        pools.states = {name: np.zeros((1, *dims), dtype) for name, (dtype, dims) in self.state_inputs.items()}
        return pools

    def generate(self, ids: list[int], max_new: int, stops: set[int], on_token=None,
                 image: ImageInputs | None = None) -> list[int]:
        pages = -(-(len(ids) + max_new) // PAGE)
        pools = self.new_pools(pages)
        table = np.stack([np.arange(pages), np.arange(pages)])[None].astype(np.int32)
        logits = self.step(ids, 0, pools, table, image)
        out: list[int] = []
        while True:
            nxt = int(np.argmax(logits[:self.cfg["vocab_size"]]))
            out.append(nxt)
            if on_token:
                on_token(len(out))
            if nxt in stops or len(out) >= max_new:
                return out
            logits = self.step([nxt], len(ids) + len(out) - 1, pools, table, image)


def _share_donor_pools(model: onnx.ModelProto, donors: list[int]) -> None:
    """Gemma 4's KV-shared layers read their donor's pool. TensorRT aliases each pool in place (past and present are
    one allocation, ops.py), so a shared layer sees what its donor wrote earlier in the same step; the reference
    evaluator passes values, so the shared layer's plugin is wired to the donor's present pool instead."""
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "AttentionPlugin" and attrs.get("enable_kv_shared"):
            layer = int(node.input[1].rsplit("_", 1)[1])
            node.input[1] = f"present_key_values_{donors[layer]}"


def load_engine(engine_dir: Path, name: str, config_name: str) -> Engine:
    from safetensors.numpy import load_file

    cfg = json.loads((engine_dir / config_name).read_text())
    embedding = load_file(str(engine_dir / "embedding.safetensors"))["embedding"]
    external: dict[str, np.ndarray] = {}
    for entry in cfg.get("external_weight_files", []):      # as the runtime loads them: from the engine directory
        external.update(load_file(str(engine_dir / entry["file"])))
    ple = load_file(str(engine_dir / "ple_embedding.safetensors"))["weight"] if cfg.get("ple_enabled") else None
    return Engine(engine_dir / name, cfg, embedding, external, ple)

"""Edge-LLM 0.11's Gemma4AudioAttentionPlugin (trt_edgellm domain) as its published interface defines it, for ONNX's
reference evaluator: the export's check of Gemma 4's audio tower here and the audio engine double in tests/ run the
graph with it.

The interface (onnx/onnx_custom_schemas.py, models/ops.py gemma4_audio_attention_plugin): q_raw, k_raw, v [B, S, H, D]
FP16 straight from their projections, gamma [D] FP32 (per_dim_scale), rel_key [P, H, D] (relative_k_proj of the
sinusoidal countdown positions), valid [B, S] bool, a shape carrier; attributes chunk_size, left_horizon,
context_size, logit_cap. Queries are scaled by D^-0.5 / ln 2 x softplus(gamma), keys by softplus(1) / ln 2; each chunk
of chunk_size queries is scored against the chunk before it and its own (context_size keys), content plus relative
position (the rel-shift of q . rel_key), soft-capped by logit_cap, masked, softmaxed, mixed into the values.

The mask, which the interface leaves to the kernel: a key must be valid, and within the horizon of its query. Three
readings of the horizon, told apart here on a tiny random tower (tests/workstation/test_gemma4_audio.py):
  "transformers"  0 <= q - k < left_horizon: a frame and the left_horizon - 1 before it, as transformers' Gemma 4
                  attends (sliding_window_mask_function((attention_context_left - 1, attention_context_right))).
                  With it the exported graph computes transformers' tower within FP16's rounding (cosine 0.9999998).
  "inclusive"     0 <= q - k <= left_horizon: Gemma 3n's USM blocks (max_past_horizon), one key more per query
                  (cosine 0.9997 against transformers).
  "stand_in"      validity alone, the whole two-chunk context: 0.11's eager stand-in in models/ops.py, which only its
                  tracing runs (cosine 0.93 to 0.99).
The kernel's source is not in the 0.11 wheel. The check here and the double take the first, the one under which the
deployed graph is the reference the goldens come from; which one the kernel computes, only a board's validation
against those goldens shows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MASKED = -1e4       # the masked logits (after the soft cap, whose values are within +-logit_cap)


def gemma4_audio_attention(q_raw: np.ndarray, k_raw: np.ndarray, v: np.ndarray, gamma: np.ndarray,
                           rel_key: np.ndarray, valid: np.ndarray, chunk_size: int, left_horizon: int,
                           context_size: int, logit_cap: float, mask_kind: str = "transformers") -> np.ndarray:
    b, s, h, d = q_raw.shape
    chunk, ctx = int(chunk_size), int(context_size)
    if ctx != 2 * chunk:
        raise ValueError(f"context_size {ctx} is not two chunks of {chunk}: the plugin's context is its chunk and "
                         "the one before")
    n = -(-s // chunk)
    pad = n * chunk - s
    softplus = np.log1p(np.exp(gamma.astype(np.float64))).astype(np.float32)
    q = q_raw.astype(np.float32) * np.float32(d ** -0.5 / math.log(2.0)) * softplus
    k = k_raw.astype(np.float32) * np.float32(math.log1p(math.e) / math.log(2.0))
    vf = v.astype(np.float32)
    q, k, vf = (np.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (q, k, vf))
    blocks = q.reshape(b, n, chunk, h, d)

    def contexts(t: np.ndarray) -> np.ndarray:      # [B, n, 2 chunk, ...]: the chunk before each and its own
        t = np.pad(t, ((0, 0), (chunk, 0)) + ((0, 0),) * (t.ndim - 2)).reshape(b, n + 1, chunk, *t.shape[2:])
        return np.concatenate([t[:, :-1], t[:, 1:]], axis=2)

    content = np.einsum("bncHd,bnjHd->bHncj", blocks, contexts(k), optimize=True)
    positions = np.einsum("bHqd,Hdp->bHqp", blocks.transpose(0, 3, 1, 2, 4).reshape(b, h, n * chunk, d),
                          rel_key.astype(np.float32).transpose(1, 2, 0), optimize=True)
    p = rel_key.shape[0]
    positions = np.pad(positions.reshape(b, h, n, chunk, p), ((0, 0),) * 4 + ((0, ctx + 1 - p),))
    positions = positions.reshape(b, h, n, chunk * (ctx + 1))[..., :chunk * ctx].reshape(b, h, n, chunk, ctx)
    scores = logit_cap * np.tanh((content + positions) / logit_cap)
    ok = np.pad(valid.astype(bool), ((0, 0), (0, pad)))
    mask = ok.reshape(b, n, chunk)[:, None, :, :, None] & contexts(ok)[:, None, :, None, :]
    distance = chunk + np.arange(chunk)[:, None] - np.arange(ctx)[None, :]     # query - key, in frames
    ahead = ctx - chunk - left_horizon                                          # frames a query sees ahead
    if mask_kind == "transformers":
        mask = mask & (((distance >= 0) & (distance < left_horizon)) | ((distance < 0) & (-distance < ahead)))
    elif mask_kind == "inclusive":
        mask = mask & (distance <= left_horizon) & (distance >= -ahead)
    elif mask_kind != "stand_in":
        raise ValueError(f"mask_kind {mask_kind!r}: one of transformers, inclusive, stand_in")
    scores = np.where(mask, scores, np.float32(MASKED))
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    out = np.einsum("bHncj,bnjHd->bncHd", scores, contexts(vf), optimize=True).reshape(b, n * chunk, h, d)
    return out[:, :s].astype(q_raw.dtype)


def gemma4_audio_attention_op(mask_kind: str = "transformers") -> Any:
    from onnx.reference.op_run import OpRun

    class Gemma4AudioAttentionPlugin(OpRun):
        op_domain = "trt_edgellm"

        def _run(self, q_raw, k_raw, v, gamma, rel_key, valid, _seq_len_carrier, chunk_size=None,
                 left_horizon=None, context_size=None, logit_cap=None):
            return (gemma4_audio_attention(q_raw, k_raw, v, gamma, rel_key, valid, chunk_size, left_horizon,
                                           context_size, logit_cap, mask_kind),)
    return Gemma4AudioAttentionPlugin

"""TEST DOUBLE of TensorRT Edge-LLM's recurrent-layer plugins (TensorRT and its plugins cannot exist in CI), run in
ONNX's reference evaluator beside edgellm_engine.py, as written here from their published interfaces:
cpp/plugins/gatedDeltaNet/gatedDeltaNetPlugin.h (inputs, dtypes, the resident FP32 state pool [rows, hv, k, v], "QK
L2 norm, H/HV head mapping" in the plugin), cpp/plugins/mamba/mambaPlugin.h and causalConv1dPlugin.h, and the
exporter's op signatures (tensorrt_edgellm/models/ops.py of the 0.11 wheel, its qwen3_5 and nemotron_h models feeding
them).

    causal_conv1d    x [T, C] token-major, a depthwise filter [C, 1, K] and bias [C]; each sequence continues from
                     its slot of the rolling conv state [rows, C, K] (its last K inputs, zeros for a new sequence):
                     y[t] = bias + sum_j w[:, j] * x[t - K + 1 + j]; the slot keeps the last K inputs. No activation
                     (the graph applies SiLU after it).
    update_ssm_state Mamba-2's selective state update (mambaPlugin.h): x [T, heads, dim], A [heads] (-exp(A_log)),
                     B, C [T, groups, dstate], D [heads], dt [T, heads] (+ dt_bias, softplus where dt_softplus), each
                     head reading its group (head // (heads / groups)); per token S = S * exp(A dt) + dt B (x) x,
                     y = S.C + D x. The resident state [rows, heads, dim, dstate] is FP16 between steps.
    gated_delta_net  q, k [T, H, K], v [T, HV, V], a, b [T, HV], A_log [HV] (fp32), dt_bias [HV]; q and k L2-normalised
                     (eps 1e-6), q scaled by 1/sqrt(K), value head j reading key head j // (HV / H);
                     g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); per token, on the sequence's FP32
                     state S [HV, K, V]: S *= exp(g); S += k (x) ((v - k.S) * beta); o = q.S. Returns o [T, HV, V]
                     (fp16) and the pool with each sequence's slot updated.

An MTP base (use_mtp = 1, its speculative verification) also returns each token's state after it ([T, ...]: the
ops' *_with_intermediate signatures), from which the runtime restores a slot to the last accepted token.

Each sequence is the tokens query_start_offsets[n]..[n+1] of the step, its slot state_indices[n]; prefill and
decode run the same recurrence (the execution phase picks only a kernel in the plugin).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun

EPS = 1e-6


def _sequences(query_start_offsets, state_indices):
    starts = np.asarray(query_start_offsets).reshape(-1)
    for n, row in enumerate(np.asarray(state_indices).reshape(-1)):
        yield int(starts[n]), int(starts[n + 1]), int(row)


class causal_conv1d(OpRun):     # noqa: N801 (the plugin's op name)
    op_domain = "trt_edgellm"

    def _run(self, x, weight, bias, conv_state, query_lengths, query_start_offsets, state_indices, *_,
             stride=1, padding=None, dilation=1, groups=None, use_mtp=0, **__):
        if stride != 1 or dilation != 1:
            raise NotImplementedError(f"causal_conv1d stride={stride} dilation={dilation}")
        channels, kernel = conv_state.shape[1], conv_state.shape[2]
        w = weight.astype(np.float32).reshape(channels, -1)[:, -kernel:]
        if w.shape[1] != kernel or (padding is not None and padding != kernel - 1) or groups not in (None, channels):
            raise NotImplementedError(f"causal_conv1d filter {weight.shape} padding {padding} groups {groups}")
        y = np.zeros(x.shape, dtype=x.dtype)
        state = conv_state.copy()
        # use_mtp: the state after each token
        after = np.zeros((x.shape[0], channels, kernel), conv_state.dtype) if use_mtp else None
        for s, e, row in _sequences(query_start_offsets, state_indices):
            full = np.concatenate([state[row].astype(np.float32), x[s:e].astype(np.float32).T], axis=1)  # [C, K+L]
            for t in range(e - s):
                window = full[:, t + 1:t + 1 + kernel]          # the K inputs ending at token t
                y[s + t] = ((window * w).sum(1) + bias.astype(np.float32)).astype(x.dtype)
                if after is not None:
                    after[s + t] = window.astype(conv_state.dtype)
            state[row] = full[:, -kernel:].astype(conv_state.dtype)
        return (y, state, after) if use_mtp else (y, state)


class gated_delta_net(OpRun):    # noqa: N801 (the plugin's op name)
    op_domain = "trt_edgellm"

    def _run(self, q, k, v, a, b, a_log, dt_bias, h0, query_lengths, query_start_offsets, state_indices, *_,
             k_dim=None, v_dim=None, use_mtp=0, use_diffusion_state=0, **__):
        if use_diffusion_state:
            raise NotImplementedError("gated_delta_net diffusion phases")
        heads, values = q.shape[1], v.shape[1]
        if values % heads or (k_dim and k_dim != q.shape[2]) or (v_dim and v_dim != v.shape[2]):
            raise NotImplementedError(f"gated_delta_net q {q.shape} v {v.shape} k_dim {k_dim} v_dim {v_dim}")

        def l2(x):
            x = x.astype(np.float32)
            return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(EPS))
        group = values // heads
        qn = np.repeat(l2(q), group, axis=1) / np.float32(np.sqrt(q.shape[2]))     # [T, HV, K]
        kn = np.repeat(l2(k), group, axis=1)
        vf = v.astype(np.float32)
        pre = a.astype(np.float32) + dt_bias.astype(np.float32)
        g = -np.exp(a_log.astype(np.float32)) * np.logaddexp(np.float32(0.0), pre)      # softplus
        beta = 1.0 / (1.0 + np.exp(-b.astype(np.float32)))
        out = np.zeros(v.shape, dtype=v.dtype)
        pool = h0.copy()
        after = np.zeros((v.shape[0], *h0.shape[1:]), h0.dtype) if use_mtp else None
        for s, e, row in _sequences(query_start_offsets, state_indices):
            state = pool[row].astype(np.float32)                 # [HV, K, V]
            for t in range(s, e):
                state *= np.exp(g[t])[:, None, None]
                memory = np.einsum("hk,hkv->hv", kn[t], state)
                delta = (vf[t] - memory) * beta[t][:, None]
                state += kn[t][:, :, None] * delta[:, None, :]
                out[t] = np.einsum("hk,hkv->hv", qn[t], state).astype(v.dtype)
                if after is not None:
                    after[t] = state
            pool[row] = state
        return (out, pool, after) if use_mtp else (out, pool)


class update_ssm_state(OpRun):   # noqa: N801 (the plugin's op name)
    op_domain = "trt_edgellm"

    def _run(self, x, a, b, c, d, dt, dt_bias, state, query_lengths, query_start_offsets, state_indices, *_,
             dt_softplus=1, ngroups=None, chunk_size=0, **__):
        heads, groups = x.shape[1], b.shape[1]
        if heads % groups or (ngroups and ngroups != groups):
            raise NotImplementedError(f"update_ssm_state x {x.shape} B {b.shape} ngroups {ngroups}")
        step = dt.astype(np.float32) + dt_bias.astype(np.float32)
        step = np.logaddexp(np.float32(0.0), step) if dt_softplus else step          # [T, heads]
        bh, ch = (np.repeat(m.astype(np.float32), heads // groups, axis=1) for m in (b, c))    # [T, heads, dstate]
        xf, af, df = x.astype(np.float32), a.astype(np.float32), d.astype(np.float32)
        out = np.zeros(x.shape, dtype=x.dtype)
        pool = state.copy()
        for s, e, row in _sequences(query_start_offsets, state_indices):
            h = pool[row].astype(np.float32)                     # [heads, dim, dstate]
            for t in range(s, e):
                h = h * np.exp(step[t] * af)[:, None, None] + \
                    step[t][:, None, None] * bh[t][:, None, :] * xf[t][:, :, None]
                out[t] = ((h * ch[t][:, None, :]).sum(-1) + df[:, None] * xf[t]).astype(x.dtype)
            pool[row] = h.astype(state.dtype)                    # the resident pool's dtype (FP16) between steps
        return out, pool


OPS = [causal_conv1d, gated_delta_net, update_ssm_state]

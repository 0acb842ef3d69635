"""An independent reader of TensorRT-LLM 0.12 checkpoints: dequantize and run a plain-PyTorch forward pass.

Nothing here comes from ModelOpt or transformers: it reads config.json + rank0.safetensors the way TensorRT-LLM 0.12
interprets them (packing, scales, name mapping, RoPE settings) so that comparing its logits with the fake-quantized
model proves the exported bytes mean what the calibrated model meant.

  W4A16_AWQ            weight int8 (out/2, in), read as weight.T (in, out/2) of packed signed int4, low nibble =
                       even output column; y = (x * prequant) @ (q * scale[o, i // group])^T
  W8A8_SQ_PER_CHANNEL  y = fq_int8(x * prequant, activation_scale) @ (q * weights_scaling_factor[o])^T
  W8A16                fp16 weights, quantized per output channel at load as 0.12's symmetric_quantize does:
                       s = max|w| * float(1/127), q = clamp(round(w / s), -128, 127), y = (x @ q^T) * fp16(s)
  INT8 KV cache        K (after RoPE) and V rounded to int8 with kv_cache_scaling_factor
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from pipeline.workstation.cpu_linear import linear
from pipeline.workstation.trtllm_checkpoint import CONFIG, WEIGHTS


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(out/2, in) int8 as stored -> (out, in) int8 values in [-8, 7]."""
    t = packed.T.contiguous()                      # (in, out/2): what TensorRT-LLM 0.12 reads
    low = (t << 4) >> 4                            # arithmetic shifts sign-extend the low nibble
    high = t >> 4
    both = torch.stack([low, high], dim=-1).reshape(t.shape[0], -1)   # (in, out): even, odd output columns
    return both.T.contiguous()


def _round_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Activations and KV saturate to [-128, 127]."""
    return torch.clamp(torch.round(x / scale), -128, 127) * scale


INV_127 = torch.tensor(1 / 127, dtype=torch.float32)   # 0.12's quant_range_scale: 1.f / 127, a float


def _quantize_w8a16(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TensorRT-LLM 0.12's load-time INT8 weight-only quantization of fp16 rows (symmetric_quantize in
    cutlass_preprocessors.cpp, via weight_only_quantize_dict): per output channel s = max|w| * float(1/127) in fp32,
    q = clamp(round(w / s), -128, 127), and the scale kept in the weights' dtype (fp16) for the GEMM. Returns q in
    place of w and fp16(s) as fp32, applied to the outputs: (x @ q^T) * s16 (one pass less than dequantizing).

    One difference, by choice: C's round() takes exact ties (w / s = k + 1/2) away from zero, torch.round to even.
    The weights this pipeline exports sit on the INT8 grid, |w / s - k| <= 127 * 2^-10 < 0.13, so they have no ties;
    arbitrary fp16 weights have about one in 10,000, each then one level off. Exact C rounding costs three more
    passes over every weight (a 3B model on a CPU: 4.4 s -> 6.3 s for the reader)."""
    # max|w| as max(max w, -min w): exact, and on a CPU 8x faster than the inf-norm, 15x faster than aminmax
    s = torch.maximum(w.amax(1), w.amin(1).neg_()).mul_(INV_127)
    # No clamp to [-128, 127] needed: |w| / s <= max / (max * float(1/127)) = 127 * (1 +- 2e-7), which rounds to 127.
    # An all-zero row: 0 / 0 in TensorRT-LLM clamps to some level times a zero scale; any level gives 0 here too.
    q = w.div_(s.clamp(min=torch.finfo(torch.float32).tiny)[:, None]).round_()
    return q, s.half().float()


ROWS = 512   # output rows dequantized at a time: a block stays in cache (a CPU reads 1B weights ~35% faster)


class Scratch:
    """One fp32 block that every linear dequantizes into. A new 16 MB block per call is fresh memory the kernel
    must fault in page by page: on a CPU, .float() of a block took 3.6x as long as copy_ into this one."""

    def __init__(self, device: str = "cpu"):
        self.buf = torch.empty(0, device=device)

    def block(self, rows: int, cols: int) -> torch.Tensor:
        if self.buf.numel() < rows * cols:
            self.buf = torch.empty(rows * cols, device=self.buf.device)
        return self.buf[:rows * cols].view(rows, cols)


class Linear:
    """One linear as stored; dequantized on each call, by blocks of output rows, so reading a multi-GB checkpoint
    never holds more than one block in fp32."""

    def __init__(self, t: _LazyTensors, name: str, algo: str | None, group: int | None,
                 scratch: Scratch | None = None):
        self.t, self.name, self.algo, self.group = t, name, algo, group
        self.scratch = scratch or Scratch()
        self.bias = t.get(name + ".bias")
        self.pre = t.get(name + ".prequant_scaling_factor")
        sq = algo == "W8A8_SQ_PER_CHANNEL"
        self.act_scale = t[name + ".activation_scaling_factor"].float() if sq else None

    def rows(self, stored: torch.Tensor, scale: torch.Tensor | None, lo: int, hi: int
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Output rows [lo, hi) of the weight in fp32, dequantized in place in the scratch block (valid until the
        next call), and a per-row scale still to apply to the outputs (W8A16) or None."""
        if self.algo == "W4A16_AWQ":
            assert scale is not None and self.group is not None    # W4A16_AWQ always stores both
            q = unpack_int4(stored[lo // 2:hi // 2])                          # packed rows hold row pairs
            w = self.scratch.block(*q.shape).copy_(q)
            s = scale[lo:hi].float()                                          # (rows, in / group)
            w.view(w.shape[0], s.shape[1], self.group).mul_(s[:, :, None])
            return w, None
        w = self.scratch.block(hi - lo, stored.shape[1]).copy_(stored[lo:hi])
        if self.algo == "W8A8_SQ_PER_CHANNEL":
            assert scale is not None
            return w.mul_(scale[lo:hi].float()[:, None]), None
        if self.algo == "W8A16":
            return _quantize_w8a16(w)
        return w, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre is not None:
            x = x * self.pre.float()
        if self.act_scale is not None:
            x = _round_int8(x, self.act_scale)
        stored = self.t[self.name + ".weight"]
        scale = self.t.get(self.name + ".weights_scaling_factor")
        n = stored.shape[0] * (2 if self.algo == "W4A16_AWQ" else 1)
        y = x.new_empty(*x.shape[:-1], n)
        for lo in range(0, n, ROWS):
            w, out_scale = self.rows(stored, scale, lo, min(lo + ROWS, n))
            part = linear(x, w)
            y[..., lo:lo + ROWS] = part if out_scale is None else part.mul_(out_scale)
        return y + self.bias.float() if self.bias is not None else y


def inv_freq(cfg: dict, head: int) -> torch.Tensor:
    base = float(cfg["rotary_base"])
    freq = 1.0 / (base ** (torch.arange(0, head, 2, dtype=torch.float64) / head))
    s = cfg.get("rotary_scaling") or {}
    kind = s.get("type") or s.get("rope_type")
    if kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        scaled = torch.where(wavelen > old / lo, freq / factor, freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        freq = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    elif kind == "linear":
        freq = freq / s["factor"]
    elif kind not in (None, "default"):
        raise NotImplementedError(f"rotary_scaling type {kind!r}")
    return freq.float()


def _rope(x: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(x.shape[-2], dtype=torch.float32, device=x.device)
    ang = torch.outer(pos, freq)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


class _LazyTensors:
    """rank0.safetensors read on demand (memory-mapped): a multi-GB checkpoint is never copied into RAM whole."""

    def __init__(self, path: Path, device: str = "cpu"):
        from safetensors import safe_open
        self._f = safe_open(str(path), "pt", device=device)
        self._keys = set(self._f.keys())

    def __contains__(self, key):
        return key in self._keys

    def __getitem__(self, key):
        return self._f.get_tensor(key)

    def get(self, key, default=None):
        return self._f.get_tensor(key) if key in self._keys else default


class CheckpointModel:
    """A TensorRT-LLM 0.12 checkpoint of the LLaMA or QWen class (Llama, Mistral, Qwen2 families) as a plain
    PyTorch forward pass (fp32 math)."""

    def __init__(self, ckpt_dir: Path, device: str = "cpu"):
        self.cfg = json.loads((Path(ckpt_dir) / CONFIG).read_text())
        self.device = device
        self.t = _LazyTensors(Path(ckpt_dir) / WEIGHTS, device)
        c, q = self.cfg, self.cfg["quantization"]
        self.algo, self.group = q.get("quant_algo"), q.get("group_size")
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head = c.get("head_size") or c["hidden_size"] // self.heads
        self.freq = inv_freq(c, self.head).to(device)
        self.kv_int8 = q.get("kv_cache_quant_algo") == "INT8"
        self.layers = []
        scratch = Scratch(device)
        for i in range(c["num_hidden_layers"]):
            p = f"transformer.layers.{i}."
            self.layers.append({n: Linear(self.t, p + n, self.algo, self.group, scratch) for n in
                                ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")}
                               | {"in": self.t[p + "input_layernorm.weight"],
                                  "post": self.t[p + "post_layernorm.weight"],
                                  "kv": self.t.get(p + "attention.kv_cache_scaling_factor")})
        self.embed = self.t["transformer.vocab_embedding.weight"]
        self.lm_head = Linear(self.t, "lm_head", None, None, scratch)   # fp16 in every 0.12 format here

    def _layer(self, L: dict, h: torch.Tensor) -> torch.Tensor:
        """One decoder layer on residual streams h (B, T, hidden) -> (B, T, hidden): B sequences of the same T
        tokens share one dequantization of each weight."""
        eps = self.cfg["norm_epsilon"]
        B, T, nq, nkv, d = h.shape[0], h.shape[1], self.heads, self.kv_heads, self.head
        mask = torch.full((T, T), float("-inf"), device=self.device).triu(1)
        qkv = L["attention.qkv"](_rmsnorm(h, L["in"], eps))
        q, k, v = qkv.split([nq * d, nkv * d, nkv * d], -1)
        q = _rope(q.view(B, T, nq, d).transpose(1, 2), self.freq)          # (B, heads, T, d)
        k = _rope(k.view(B, T, nkv, d).transpose(1, 2), self.freq)
        v = v.view(B, T, nkv, d).transpose(1, 2)
        if self.kv_int8:
            s = L["kv"].float()
            k, v = _round_int8(k, s), _round_int8(v, s)
        rep = nq // nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + mask, -1) @ v
        h = h + L["attention.dense"](att.transpose(1, 2).reshape(B, T, nq * d))
        x = _rmsnorm(h, L["post"], eps)
        return h + L["mlp.proj"](torch.nn.functional.silu(L["mlp.fc"](x)) * L["mlp.gate"](x))

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(_rmsnorm(h, self.t["transformer.ln_f.weight"], self.cfg["norm_epsilon"]))

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) -> logits (T, vocab) over the padded vocabulary."""
        h = self.embed[ids.to(self.device)].float()[None]
        for L in self.layers:
            h = self._layer(L, h)
        return self._head(h)[0]

    @torch.no_grad()
    def logits_and_layer_errors(self, ids: torch.Tensor, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
                                ) -> tuple[torch.Tensor, list[float]]:
        """logits(ids), and each decoder layer run on the reference model's own input to it (teacher forcing): the
        relative error of what the layer adds to the residual stream, ||reader delta - reference delta|| /
        ||reference delta||. Both streams go through each layer together, so each weight is dequantized once.

        Where the deployed numerics round activations (SmoothQuant's INT8 inputs, an INT8 KV cache), two correct
        implementations (another summation order; x * (127 / amax) in ModelOpt, x / (amax / 127) in TensorRT) round
        a few values near a level boundary differently, and end to end those one-level differences compound over
        the layers (SmolLM2-135M, 30 layers: logit cosine down to 0.996 at some positions with INT8 SQ, to 0.976
        with an INT8 KV cache as well). Layer by layer nothing compounds: an exact export stays near 1e-3,
        while a wrong scale, packing, norm or RoPE setting is off by far more in the layer that holds it."""
        h = self.embed[ids.to(self.device)].float()
        errors = []
        for L, x, y in zip(self.layers, inputs, outputs, strict=True):
            x, y = x.to(self.device).float(), y.to(self.device).float()
            h, forced = self._layer(L, torch.stack([h, x]))
            want = y - x
            errors.append(float((forced - x - want).norm() / want.norm().clamp(min=1e-30)))
        return self._head(h), errors


def agreement(reference: torch.Tensor, candidate: torch.Tensor, tie: float = 1e-3) -> dict:
    """Mean per-position cosine of logits, top-1 agreement, and tie-aware top-1 agreement: a position also agrees
    when the candidate's choice is within `tie` x (the reference's logit range) of the reference's best, i.e. a
    near-tie that fp16 vs fp32 arithmetic may order either way (common in random-weight models)."""
    ref, cand = reference.float(), candidate.float()
    cos = torch.nn.functional.cosine_similarity(ref, cand, dim=-1)
    pick = cand.argmax(-1)
    top1 = (ref.argmax(-1) == pick).float().mean()
    best = ref.max(-1).values
    margin = tie * (best - ref.min(-1).values)
    near = (ref.gather(-1, pick[:, None])[:, 0] >= best - margin).float().mean()
    return {"logit_cosine": round(float(cos.mean()), 6), "logit_cosine_min": round(float(cos.min()), 6),
            "top1_agreement": round(float(top1), 6), "top1_tie_aware": round(float(near), 6),
            "positions": int(ref.shape[0])}

"""Memory plan: what an engine needs at run time (and to build) on a Jetson, component by component.

Jetson memory is unified: engine weights, KV cache, activations, the CUDA context and the runtime all come out of
the same DRAM as the OS. Every component is in bytes; the assumptions are named constants with their reasons.
"""

from __future__ import annotations

import math

from pipeline.contract import BuildLimits, MemoryPlan
from pipeline.formats import KVFormat, WeightFormat
from pipeline.plan.shapes import ModelShape

# CUDA context, TensorRT and the runtime's own libraries, resident next to the engine. TensorRT-LLM 0.12's Python
# runtime also imports torch. Llama-3-8B INT4 on AGX Orin runs in 7.3 GB total with --use_mmap (FACTS.md): its
# weights are 5.7 GB by the count below, leaving ~1.6 GB for overhead, KV and activations at default limits.
# Scratch beyond the activations proper: cuBLAS/cuBLASLt workspace and TensorRT's per-context scratch.
WORKSPACE = 64 * 2**20
TOKENS_PER_BLOCK = 64         # paged KV cache block (trtllm-build 0.12 default --tokens_per_block)
VOCAB_PAD = 64                # ModelOpt pads the vocabulary to a multiple of 64 for TensorRT-LLM AWQ checkpoints


def linear_bytes(linears: list[tuple[str, int, int, float]], fmt: WeightFormat, group_size: int | None,
                 kept: tuple[str, ...] = ()) -> float:
    """Bytes of these linears (ModelShape.linears rows) in this format, AWQ's per-input-channel FP16 pre-quant
    scales included; those named in `kept` (ModelShape.kept_fp16) in FP16."""
    return sum((i * o * 2.0 if name in kept else
                fmt.bytes_for(i, o, group_size) + (i * 2 if fmt.awq else 0)) * n for name, i, o, n in linears)


def weight_bytes(shape: ModelShape, fmt: WeightFormat, group_size: int | None,
                 tokens: int | None = None) -> tuple[int, int, int]:
    """(decoder weights, embedding, lm_head) in bytes for this format. tokens: an MoE model's experts that many
    tokens reach (ModelShape.linears), else all of them."""
    body = linear_bytes(shape.linears(tokens), fmt, group_size, shape.kept_fp16(fmt))
    body += shape.small_params * 2
    vocab = shape.vocab_size if fmt.unquantized else math.ceil(shape.vocab_size / VOCAB_PAD) * VOCAB_PAD
    table = vocab * shape.hidden_size * 2
    # Tied embeddings are still two tensors in the engine (TensorRT-LLM writes lm_head separately; Edge-LLM keeps
    # the embedding outside the ONNX), so both count. Per-layer input embeddings (Gemma 4) are a second table the
    # runtime gathers from outside the engine: in the same DRAM, never read whole by a decode step.
    return int(body + shape.hidden_size * 2), table + shape.per_layer_table_params * 2, table


def kv_bytes(shape: ModelShape, kv: KVFormat, seq: int, batch: int) -> int:
    blocks = math.ceil(seq / TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
    return shape.kv_bytes_per_token(kv.bytes_per_element) * blocks * batch


def activation_bytes(shape: ModelShape, limits: BuildLimits, sm: float = 0.0) -> int:
    """One layer's live tensors for max_num_tokens (TensorRT reuses them across layers) plus fp32 logits, and the
    workspace the parts' kernels take on the target (a hybrid's recurrent prefill: plan/parts/hybrid.py)."""
    per_token = 4 * shape.hidden_size + shape.q_size + 2 * shape.kv_size + 2 * shape.intermediate_size
    logits = limits.max_batch_size * shape.vocab_size * 4 * 2
    return limits.max_num_tokens * per_token * 2 + logits + WORKSPACE + shape.workspace_bytes(limits.max_batch_size,
                                                                                              sm)


def plan_memory(shape: ModelShape, fmt: WeightFormat, group_size: int | None, kv: KVFormat, limits: BuildLimits,
                runtime_overhead: int, usable: int, usable_headless: int, draft: int = 0,
                visual: int = 0, sm: float = 0.0, audio: int = 0) -> MemoryPlan:
    """draft, visual, audio: the bytes of an EAGLE-3 draft engine, a visual and an audio encoder engine beside the
    model's (counted at the recipe's limits, constant while the searches below vary the language model's). sm: the
    target's (a part's kernels may take a workspace on some). A fixed-size state (a hybrid's recurrent layers) is one
    slot per sequence of the batch, whatever max_seq_len."""
    weights, embedding, lm_head = weight_bytes(shape, fmt, group_size)
    overhead = runtime_overhead   # the backend's runtime beside weights, KV cache and activations

    def total_for(seq: int, batch: int) -> int:
        lim = BuildLimits.of(batch, min(limits.max_input_len, seq - 1), seq)
        # the draft is counted at the recipe's limits (a small share next to the base; kept constant here)
        return weights + embedding + lm_head + kv_bytes(shape, kv, seq, batch) + activation_bytes(shape, lim, sm) + \
            shape.recurrent_state_bytes(batch) + overhead + draft + visual + audio

    kv_cache = kv_bytes(shape, kv, limits.max_seq_len, limits.max_batch_size)
    activations = activation_bytes(shape, limits, sm)
    recurrent = shape.recurrent_state_bytes(limits.max_batch_size)
    total = weights + embedding + lm_head + kv_cache + recurrent + activations + overhead + draft + visual + audio

    # Largest max_seq_len at the recipe's batch, and largest batch at the recipe's max_seq_len (0 = not even one).
    lo, hi = 0, shape.max_position_embeddings
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if mid >= 2 and total_for(mid, limits.max_batch_size) <= usable else (lo, mid - 1)
    max_seq = lo
    max_batch = 0
    while max_batch < 256 and total_for(limits.max_seq_len, max_batch + 1) <= usable:
        max_batch += 1

    return MemoryPlan(weights=weights, embedding=embedding, lm_head=lm_head, kv_cache=kv_cache,
                      activations=activations, runtime_overhead=overhead, total=total, usable=usable,
                      usable_headless=usable_headless, fits=total <= usable, fits_headless=total <= usable_headless,
                      margin=usable - total, max_seq_len_that_fits=max_seq, max_batch_that_fits=max_batch,
                      draft=draft, visual=visual, recurrent_state=recurrent, audio=audio)


def decode_bytes_per_token(shape: ModelShape, fmt: WeightFormat, group_size: int | None, kv: KVFormat,
                           context: int, batch: int = 1) -> float:
    """Bytes one decode step reads: every weight except the embedding table (one row) plus one sequence's KV cache
    so far and its recurrent state (read and written back whole: twice); of an MoE model's experts, those the step's
    `batch` tokens reach (the active ones for one)."""
    weights, _, lm_head = weight_bytes(shape, fmt, group_size, batch)
    return weights + lm_head + shape.sequence_read_bytes(kv.bytes_per_element, context)

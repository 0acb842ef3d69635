"""On the device: load a TensorRT-LLM 0.12 engine and run the kit's golden prompts greedily, timing each, through the
same session `serve` uses (pipeline.runtime.trtllm: the executor with in-flight batching), so what is
validated is what is served.

    python3 -m pipeline.device.trtllm_runner --engine-dir engine --goldens goldens.json --out validation.json

Runs with the device's tensorrt_llm (Python 3.10, JetPack 6); nothing from the workstation. Each prompt is one
streamed request: time to first token is submit -> first token, the decode rate (new tokens - 1) / (last token -
first token), both as a client of the server would see them. The paged KV cache is capped at the plan's budget
(--kv-tokens = max_batch_size x max_seq_len): without a cap 0.12 reserves 90% of free GPU memory for it, which on a
Jetson is 90% of the board's unified RAM.

What the runtime actually allocated is read from the runtime itself, never from the cap we asked for: its log line
"[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)." (TensorRT-LLM's KVCacheManager, at INFO:
TLLM_LOG_LEVEL=INFO is set for this process), else its "Number of blocks in KV cache primary pool" and "Number of
tokens per block" lines, and the executor's own iteration statistics (KvCacheStats: max_num_blocks x
tokens_per_block).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from pipeline.contract import PromptResult, Validation

# TensorRT-LLM's KV cache manager, as it logs its allocation (newest wording first)
KV_ALLOCATED = re.compile(r"Allocated ([0-9.]+) GiB for max tokens in paged KV cache \((\d+)\)")
KV_BLOCKS = re.compile(r"Number of blocks in KV cache primary pool: (\d+)")
KV_TOKENS_PER_BLOCK = re.compile(r"Number of tokens per block: (\d+)")
KV_OLD = re.compile(r"Using (\d+) tokens in paged KV cache")


def reported_kv_allocation(log: str, stats: dict | None) -> dict | None:
    """The paged KV cache TensorRT-LLM says it allocated, from its log (and the executor's statistics): tokens, bytes
    where it says them, and which line said so. None: the runtime said nothing about it."""
    m = KV_ALLOCATED.findall(log)
    if m:
        gib, tokens = m[-1]
        return {"tokens": int(tokens), "bytes": int(float(gib) * 2**30), "source": "TensorRT-LLM log: "
                f"[MemUsageChange] Allocated {gib} GiB for max tokens in paged KV cache ({tokens})"}
    blocks, per_block = KV_BLOCKS.findall(log), KV_TOKENS_PER_BLOCK.findall(log)
    if blocks and per_block:
        return {"tokens": int(blocks[-1]) * int(per_block[-1]), "bytes": None,
                "source": f"TensorRT-LLM log: {blocks[-1]} blocks of {per_block[-1]} tokens in the primary pool"}
    if isinstance(stats, dict) and isinstance(stats.get("max_num_blocks"), int) and \
            isinstance(stats.get("tokens_per_block"), int):
        return {"tokens": stats["max_num_blocks"] * stats["tokens_per_block"], "bytes": None,
                "source": "the executor's KvCacheStats (max_num_blocks x tokens_per_block)"}
    old = KV_OLD.findall(log)
    if old:
        return {"tokens": int(old[-1]), "bytes": None, "source": f"TensorRT-LLM log: Using {old[-1]} tokens"}
    return None


def executor_kv_stats(executor) -> dict | None:
    """The executor's latest KV cache statistics."""
    try:
        for it in reversed(list(executor.get_latest_iteration_stats())):
            kv = getattr(it, "kv_cache_stats", None)
            if kv is not None:
                return {k: int(getattr(kv, k)) for k in ("max_num_blocks", "free_num_blocks", "used_num_blocks",
                                                         "tokens_per_block") if hasattr(kv, k)}
    except Exception:       # statistics are a second opinion; the log line is the first
        return None
    return None


def _timed(session, gen) -> tuple[list[int], float, float | None, float]:
    """(ids, ttft, decode tok/s, seconds) of one streamed request."""
    from pipeline.runtime.session import generate_blocking

    stamps: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    ids, _ = generate_blocking(session, gen, on_tokens=lambda toks: stamps.append((time.perf_counter(), len(toks))))
    full = time.perf_counter() - t0
    ttft = stamps[0][0] - t0 if stamps else full
    span = stamps[-1][0] - stamps[0][0] if stamps else 0.0
    rate = (len(ids) - 1) / span if len(ids) > 1 and span > 0 else None
    return ids, ttft, rate, full


def run(engine_dir: Path, goldens: dict, kv_tokens: int) -> Validation:
    from tensorrt_llm.logger import logger

    from pipeline.runtime.session import Generation, Limits, Sampling
    from pipeline.runtime.trtllm import TrtllmSession

    logger.set_level("info")        # the KV cache manager reports its allocation at INFO
    prompts, new = goldens["prompts"], goldens["max_new_tokens"]
    stops = tuple(goldens.get("stop_token_ids") or ([goldens["eos_token_id"]] if goldens.get("eos_token_id")
                                                    is not None else []))
    longest = max(len(p["input_ids"]) for p in prompts)
    session = TrtllmSession(engine_dir, Limits(1, longest, longest + new), kv_tokens)
    try:
        def gen(p: dict, n: int) -> Generation:
            return Generation(tuple(p["input_ids"]), p.get("rendered") or "", n, Sampling(temperature=0.0), stops)
        _timed(session, gen(prompts[0], 2))        # warm-up: first-call allocations are not TTFT
        results = []
        for p in prompts:
            ids, ttft, rate, full = _timed(session, gen(p, new))
            results.append(PromptResult(prompt=p["prompt"], output_ids=ids, ttft_s=round(ttft, 4),
                                        decode_tok_s=round(rate, 2) if rate else None, seconds=round(full, 4)))
        # the driver adds the KV allocation this runtime logged (reported_kv_allocation)
        return Validation(runtime="tensorrt_llm.bindings.executor.Executor (the serve session)",
                          speed_source="streamed request through the serve session: submit to first token, "
                          "first to last token", prompts=results, kv_tokens_requested=kv_tokens,
                          kv_cache_stats=executor_kv_stats(session.executor))
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pipeline.device.trtllm_runner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--goldens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-tokens", type=int, required=True, help="paged KV cache cap: the plan's batch x max_seq_len")
    args = ap.parse_args(argv)
    result = run(Path(args.engine_dir), json.loads(Path(args.goldens).read_text()), args.kv_tokens)
    # created, never written through: the work directory may hold anything under this name
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(result.dumps())
    return 0


if __name__ == "__main__":
    sys.exit(main())

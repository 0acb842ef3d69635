"""On the device: load a TensorRT-LLM 0.12 engine and run the kit's golden prompts greedily, timing each.

    python3 -m pipeline.device.trtllm_runner --engine-dir engine --goldens goldens.json --out validation.json

Runs with the device's tensorrt_llm (Python 3.10, JetPack 6) and torch from that install; nothing from the
workstation. Each prompt runs twice: one new token (time to first token) and the full greedy completion (decode
rate = (new tokens - 1) / (full - first)). `use_mmap` is passed where this ModelRunnerCpp takes it (the Jetson
branch: Llama-3-8B INT4 on AGX Orin in 7.3 GB instead of 12.3 GB, FACTS.md). The paged KV cache is capped at the
plan's budget (--kv-tokens = max_batch_size x max_seq_len): without `max_tokens_in_paged_kv_cache` 0.12 reserves 90%
of free GPU memory for it (runtime/model_runner_cpp.py), which on a Jetson is 90% of the board's unified RAM.

What the runtime actually allocated is read from the runtime itself, never from the cap we asked for: its log line
"[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)." (TensorRT-LLM's KVCacheManager, at INFO:
TLLM_LOG_LEVEL=INFO is set for this process), else its "Number of blocks in KV cache primary pool" and "Number of
tokens per block" lines, and the executor's own iteration statistics (KvCacheStats: max_num_blocks x
tokens_per_block) where this ModelRunnerCpp exposes its executor.
"""

from __future__ import annotations

import argparse
import inspect
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


def executor_kv_stats(runner) -> dict | None:
    """The executor's latest KV cache statistics, where this ModelRunnerCpp keeps its executor (`session`)."""
    stats_of = getattr(getattr(runner, "session", None), "get_latest_iteration_stats", None)
    if stats_of is None:
        return None
    try:
        for it in reversed(list(stats_of())):
            kv = getattr(it, "kv_cache_stats", None)
            if kv is not None:
                return {k: int(getattr(kv, k)) for k in ("max_num_blocks", "free_num_blocks", "used_num_blocks",
                                                         "tokens_per_block") if hasattr(kv, k)}
    except Exception:       # statistics are a second opinion; the log line is the first
        return None
    return None


def load_runner(engine_dir: Path, max_input_len: int, max_output_len: int, kv_tokens: int):
    from tensorrt_llm.logger import logger
    from tensorrt_llm.runtime import ModelRunnerCpp

    logger.set_level("info")        # the KV cache manager reports its allocation at INFO

    kwargs = {"engine_dir": str(engine_dir), "rank": 0, "max_batch_size": 1, "max_input_len": max_input_len,
              "max_output_len": max_output_len, "max_tokens_in_paged_kv_cache": kv_tokens}
    if "use_mmap" in inspect.signature(ModelRunnerCpp.from_dir).parameters:
        kwargs["use_mmap"] = True
    return ModelRunnerCpp.from_dir(**kwargs)


def _generate(runner, ids: list[int], new_tokens: int, eos: int | None) -> list[int]:
    import torch

    out = runner.generate(batch_input_ids=[torch.tensor(ids, dtype=torch.int32)], max_new_tokens=new_tokens,
                          end_id=eos if eos is not None else -1, pad_id=eos if eos is not None else 0,
                          top_k=1, temperature=1.0, output_sequence_lengths=True, return_dict=True)
    length = int(out["sequence_lengths"][0][0])
    return [int(t) for t in out["output_ids"][0][0][len(ids):length]]


def _cut_at_stop(ids: list[int], stops: list[int]) -> list[int]:
    """End where the goldens' generation ended: at the first of the model's stop ids (end_id takes only one;
    transformers stops at any of generation_config's eos ids)."""
    for i, t in enumerate(ids):
        if t in stops:
            return ids[:i + 1]
    return ids


def run(engine_dir: Path, goldens: dict, kv_tokens: int) -> Validation:
    prompts = goldens["prompts"]
    longest = max(len(p["input_ids"]) for p in prompts)
    runner = load_runner(engine_dir, longest, goldens["max_new_tokens"], kv_tokens)
    eos = goldens.get("eos_token_id")
    _generate(runner, prompts[0]["input_ids"], 2, eos)        # warm-up: first-call allocations are not TTFT
    results = []
    for p in prompts:
        t0 = time.perf_counter()
        _generate(runner, p["input_ids"], 1, eos)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = _cut_at_stop(_generate(runner, p["input_ids"], goldens["max_new_tokens"], eos),
                           goldens.get("stop_token_ids") or [])
        full = time.perf_counter() - t0
        rate = (len(ids) - 1) / (full - ttft) if len(ids) > 1 and full > ttft else None
        results.append(PromptResult(prompt=p["prompt"], output_ids=ids, ttft_s=round(ttft, 4),
                                    decode_tok_s=round(rate, 2) if rate else None, seconds=round(full, 4)))
    # the driver adds the KV allocation this runtime logged (reported_kv_allocation)
    return Validation(runtime="tensorrt_llm.ModelRunnerCpp",
                      speed_source="runner wall clock around ModelRunnerCpp.generate", prompts=results,
                      kv_tokens_requested=kv_tokens, kv_cache_stats=executor_kv_stats(runner))


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

"""On the device: load a TensorRT-LLM 0.12 engine and run the kit's golden prompts greedily, timing each.

    python3 -m pipeline.device.trtllm_runner --engine-dir engine --goldens goldens.json --out validation.json

Runs with the device's tensorrt_llm (Python 3.10, JetPack 6) and torch from that install; nothing from the
workstation. Each prompt runs twice: one new token (time to first token) and the full greedy completion (decode
rate = (new tokens - 1) / (full - first)). `use_mmap` is passed where this ModelRunnerCpp takes it (the Jetson
branch: Llama-3-8B INT4 on AGX Orin in 7.3 GB instead of 12.3 GB, FACTS.md). The paged KV cache is capped at the
plan's budget (--kv-tokens = max_batch_size x max_seq_len): without `max_tokens_in_paged_kv_cache` 0.12 reserves 90%
of free GPU memory for it (runtime/model_runner_cpp.py), which on a Jetson is 90% of the board's unified RAM.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path


def load_runner(engine_dir: Path, max_input_len: int, max_output_len: int, kv_tokens: int):
    from tensorrt_llm.runtime import ModelRunnerCpp

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


def run(engine_dir: Path, goldens: dict, kv_tokens: int) -> dict:
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
        results.append({"prompt": p["prompt"], "output_ids": ids, "ttft_s": round(ttft, 4),
                        "decode_tok_s": round(rate, 2) if rate else None, "seconds": round(full, 4)})
    return {"runtime": "tensorrt_llm.ModelRunnerCpp", "prompts": results,
            "kv_cache": {"max_tokens_in_paged_kv_cache": kv_tokens}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pipeline.device.trtllm_runner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--goldens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-tokens", type=int, required=True, help="paged KV cache cap: the plan's batch x max_seq_len")
    args = ap.parse_args(argv)
    result = run(Path(args.engine_dir), json.loads(Path(args.goldens).read_text()), args.kv_tokens)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

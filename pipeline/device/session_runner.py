"""On the device: load the built engine through the session `serve` uses (pipeline/runtime: TensorRT-LLM 0.12's
executor, Edge-LLM 0.11's RequestEngine), run the kit's golden prompts greedily, then load it at concurrency 1, 4
and the plan's max_batch_size, so what is validated and measured is what is served.

    python3 -m pipeline.device.session_runner --kit-dir KIT --engine-dir engine --out validation.json

Runs with the device's runtime (Python 3.10 on JetPack 6); nothing from the workstation. Each golden prompt is one
streamed request: time to first token is submit -> first token, the decode rate (new tokens - 1) / (last token -
first token), both as a client of the server would see them. The load run sends the golden prompts round-robin,
`--load-requests` per level, max_new_tokens each (pipeline/runtime/load.py).

TensorRT-LLM's paged KV cache is capped at the plan's budget (max_batch_size x max_seq_len): without a cap 0.12
reserves 90% of free GPU memory for it, which on a Jetson is 90% of the board's unified RAM. What the runtime actually
allocated is read from the runtime itself by the driver (Session.reported_kv_allocation on this run's log and the
statistics recorded here), never from the cap we asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pipeline import contract
from pipeline.runtime.load import LOAD_REQUESTS, Timing, concurrencies, run_load
from pipeline.runtime.session import Generation, Limits, Sampling, Session, generate_blocking


def timed(session: Session, gen: Generation) -> tuple[list[int], Timing]:
    """(ids, timing) of one streamed request."""
    arrivals: list[tuple[float, int]] = []
    sent = time.perf_counter()
    ids, _ = generate_blocking(session, gen, on_tokens=lambda toks: arrivals.append((time.perf_counter(), len(toks))))
    return ids, Timing(sent, arrivals)


def golden_results(session: Session, goldens: contract.Goldens) -> list[contract.PromptResult]:
    stops = goldens.stop_ids

    def gen(p: contract.GoldenPrompt, n: int) -> Generation:
        return Generation(tuple(p.input_ids), p.rendered or p.prompt, n, Sampling(temperature=0.0), stops)
    timed(session, gen(goldens.prompts[0], 2))          # warm-up: first-call allocations are not TTFT
    results = []
    for p in goldens.prompts:
        t0 = time.perf_counter()
        ids, t = timed(session, gen(p, goldens.max_new_tokens))
        full = time.perf_counter() - t0
        span = t.arrivals[-1][0] - t.arrivals[0][0] if t.arrivals else 0.0
        rate = (len(ids) - 1) / span if len(ids) > 1 and span > 0 else None
        results.append(contract.PromptResult(prompt=p.prompt, output_ids=ids, ttft_s=round(t.ttft or full, 4),
                                             decode_tok_s=round(rate, 2) if rate else None, seconds=round(full, 4)))
    return results


def load_results(session: Session, goldens: contract.Goldens, max_batch_size: int,
                 requests: int) -> list[contract.LoadResult]:
    stops, prompts = goldens.stop_ids, goldens.prompts

    def send(i: int) -> Timing:
        p = prompts[i % len(prompts)]
        return timed(session, Generation(tuple(p.input_ids), p.rendered or p.prompt, goldens.max_new_tokens,
                                         Sampling(temperature=0.0), stops))[1]
    return [run_load(send, c, max(requests, c), max_batch_size) for c in concurrencies(max_batch_size)]


def run(kit_dir: Path, engine_dir: Path, load_requests: int) -> contract.Validation:
    from pipeline.runtime.engines import SESSIONS

    plan = contract.Plan.load(kit_dir / contract.PLAN)
    goldens = contract.Goldens.load(kit_dir / contract.GOLDENS)
    lim = plan.limits
    session_type = SESSIONS[plan.backend or ""]
    session = session_type.open(engine_dir, plan, Limits(lim.max_batch_size, lim.max_input_len, lim.max_seq_len))
    try:
        prompts = golden_results(session, goldens)
        load = load_results(session, goldens, lim.max_batch_size, load_requests) if load_requests else []
        return contract.Validation(
            runtime=f"{session_type.__name__} (the serve session)",
            speed_source="streamed requests through the serve session: submit to first token, first to last token",
            prompts=prompts, kv_tokens_requested=lim.max_batch_size * lim.max_seq_len,
            kv_cache_stats=session.kv_stats(), load_runs=load)
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pipeline.device.session_runner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kit-dir", required=True, help="the verified kit's content (plan.json, goldens.json)")
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load-requests", type=int, default=LOAD_REQUESTS,
                    help=f"requests per concurrency level of the load run (0: no load run; default {LOAD_REQUESTS})")
    args = ap.parse_args(argv)
    result = run(Path(args.kit_dir), Path(args.engine_dir), args.load_requests)
    # created, never written through: the work directory may hold anything under this name
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(result.dumps())
    return 0


if __name__ == "__main__":
    sys.exit(main())

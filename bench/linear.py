"""CPU linears over a few tokens: torch's F.linear (x @ W^T) vs pipeline.workstation.cpu_linear.linear ((W @ x^T)^T).

    .venv/bin/python bench/linear.py            # Llama-3.2-3B's linear shapes, 1..256 tokens, fp32, this CPU

Each shape is timed over ~800 MB of distinct weights (so that, as in a real forward, the weights come from memory, not
the cache), both forms alternating in the same run; prints GFLOPS and the ratio. pipeline/workstation/cpu_linear.py
takes the transposed form up to MAX_ROWS tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (out, in) of Llama-3.2-3B's linears: q/o, fused gate+up halves, down, k/v, an eighth of the 128256-token lm_head
SHAPES = ((3072, 3072), (8192, 3072), (3072, 8192), (1024, 3072), (16032, 3072))


def gflops(fn, weights, x, repeat: int) -> float:
    import torch

    best = float("inf")
    with torch.no_grad():
        for _ in range(repeat):
            t = time.perf_counter()
            for w in weights:
                fn(x, w)
            best = min(best, time.perf_counter() - t)
    return 2 * x.shape[0] * sum(w.numel() for w in weights) / best / 1e9


def main() -> int:
    import torch

    from pipeline.workstation.cpu_linear import MAX_ROWS, linear

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,8,32,64,256", help="comma-separated row counts")
    ap.add_argument("--repeat", type=int, default=3, help="best of N passes over the weights")
    ap.add_argument("--mb", type=int, default=800, help="MB of distinct weights per shape (default 800: more than "
                                                         "any cache, as in a real forward)")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; transposed form used up to {MAX_ROWS} rows")
    print(f"{'tokens':>6} {'out x in':>12} {'F.linear':>9} {'(W@x^T)^T':>10} {'ratio':>6}  GFLOPS")
    for m in map(int, args.tokens.split(",")):
        for out, inp in SHAPES:
            weights = [torch.randn(out, inp) for _ in range(max(1, args.mb * 1_000_000 // (out * inp * 4)))]
            x = torch.randn(m, inp)
            plain = gflops(torch.nn.functional.linear, weights, x, args.repeat)
            ours = gflops(lambda a, w: torch.mm(w, a.T).T.contiguous(), weights, x, args.repeat)
            used = "" if m <= MAX_ROWS else "  (not used: above MAX_ROWS)"
            print(f"{m:>6} {out:>5} x {inp:<5} {plain:>9.1f} {ours:>10.1f} {ours / plain:>6.2f}{used}", flush=True)
            del weights
    # the function itself, end to end, at one shape: the same numbers as F.linear to fp32 rounding
    w, x = torch.randn(8192, 3072), torch.randn(32, 3072)
    with torch.no_grad():
        err = (linear(x, w) - torch.nn.functional.linear(x, w)).abs().max().item()
    print(f"max |linear - F.linear| at 32 x 3072 -> 8192: {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

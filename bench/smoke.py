"""Every benchmark, run at a tiny size, so that a change that breaks one fails CI (tests/test_bench_smoke.py runs
each as a test; this runs them all in a row).

    .venv/bin/python bench/smoke.py

A smoke run checks that each script runs to its verdict without a traceback; its figures at these sizes are noise,
so a FAIL verdict (exit 1) is accepted here and only the full-size runs (see README, Benchmarks) are figures.
A GPU-only script must refuse cleanly (exit 2, "needs a CUDA GPU") on a machine without one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RUNS = {
    "linear.py": ["--tokens", "1,8", "--repeat", "1", "--mb", "4"],
    "noop_rebuild.py": ["--recipes", "2", "--gib-per-recipe", "0.002", "--repeat", "1"],
    "pack.py": ["--gb", "0.02"],
    "registry.py": ["--gb", "0.02", "--repeat", "1"],
    "quantize.py": ["--shape", "tiny", "--samples", "2", "--seq-len", "16"],
    "nvfp4.py": [],
    "serve.py": ["--requests", "3", "--max-tokens", "8", "--ttft-requests", "5"],
    "http_floor.py": ["--requests", "5", "--compute-ms", "1"],
}


def gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in ("__init__.py", "smoke.py"))


def smoke(name: str, env: dict | None = None) -> tuple[bool, str]:
    """Run one benchmark at its tiny size: (it ran to a verdict or refused as it should, its line [+ its output]).
    env: the environment it runs in (default: this one), e.g. recipes and artifacts where the default recipe is
    already built (PIPELINE_RECIPES, PIPELINE_ARTIFACTS), which serve.py would otherwise build first."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(BENCH / name), *RUNS[name]], capture_output=True, text=True,
                       timeout=600, env=env)
    gpu_only_refused = r.returncode == 2 and "needs a CUDA GPU" in r.stderr and not gpu()
    ok = "Traceback" not in r.stderr and (r.returncode in (0, 1) or gpu_only_refused)
    line = f"bench smoke: {name:<18} exit {r.returncode}  {time.perf_counter() - t:5.1f} s  {'ok' if ok else 'BROKEN'}"
    return ok, line if ok else line + "\n" + r.stdout[-3000:] + r.stderr[-3000:]


def main() -> int:
    unknown = sorted(set(scripts()) - set(RUNS))
    if unknown:
        print(f"bench/smoke.py: no smoke run for {', '.join(unknown)}: add one to RUNS", file=sys.stderr)
        return 1
    failed = []
    for name in scripts():
        ok, text = smoke(name)
        print(text, flush=True)
        if not ok:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

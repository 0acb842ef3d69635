"""Load at a fixed concurrency: N clients, each sending its next request as soon as its last one ended, until the
requests are spent; throughput, time to first token and inter-token gaps as the clients saw them. One generator for
the device's run through the serving session (pipeline/device/session_runner.py) and for `python -m pipeline bench
URL` through the HTTP server (pipeline/serve/bench.py), so the report's figures and the bench's mean the same.

Standard library only: it runs on the device's Python 3.10.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.contract import LoadResult

LOAD_REQUESTS = 8       # requests per concurrency level in the device's load run


@dataclass(frozen=True)
class Timing:
    """One request as its client saw it: when it was sent and when each group of new tokens arrived."""
    sent: float
    arrivals: list[tuple[float, int]]       # (time, tokens that arrived then)

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0][0] - self.sent if self.arrivals else None

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.arrivals)

    def gaps(self) -> list[float]:
        """Seconds per token after the first: a group of k tokens arriving at once is k tokens over its gap."""
        out = []
        for (a, _), (b, n) in zip(self.arrivals, self.arrivals[1:], strict=False):
            out += [(b - a) / n] * n
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * q / 100) - 1))]


def run_load(send: Callable[[int], Timing], concurrency: int, requests: int, max_batch_size: int) -> LoadResult:
    """`requests` calls of send(i) from `concurrency` threads; a request that fails raises out of here (a load figure
    over the requests that happened to succeed would flatter the engine)."""
    if concurrency < 1 or requests < 1:
        raise ValueError("concurrency and requests must be >= 1")
    timings: list[Timing] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def client() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                t = send(i)
            except BaseException as exc:    # noqa: BLE001 - re-raised below, in the caller's thread
                with lock:
                    errors.append(exc)
                return
            with lock:
                timings.append(t)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, name=f"load-{c}", daemon=True) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    if len(ttfts) != len(timings):
        raise RuntimeError("a request produced no token")
    gaps = [g for t in timings for g in t.gaps()]
    return LoadResult(concurrency=concurrency, batch=min(concurrency, max_batch_size), requests=requests,
                      seconds=round(wall, 6),
                      req_s=round(requests / wall, 3), tok_s=round(sum(t.tokens for t in timings) / wall, 2),
                      ttft_p50_s=round(percentile(ttfts, 50), 5), ttft_p95_s=round(percentile(ttfts, 95), 5),
                      itl_p50_s=round(percentile(gaps, 50), 6) if gaps else None,
                      itl_p95_s=round(percentile(gaps, 95), 6) if gaps else None)


def concurrencies(max_batch_size: int) -> list[int]:
    """The levels the issue asks for: one client, four, and as many as the engine batches."""
    return sorted({1, 4, max_batch_size})

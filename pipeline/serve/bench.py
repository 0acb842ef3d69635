"""`python -m pipeline bench URL`: load a running OpenAI-compatible server (ours, on a Jetson or the workstation, or
any other) at concurrency 1, 4 and its max_batch_size: requests/s, generated tok/s, TTFT p50/p95 and inter-token
latency p50/p95, as its clients see them. Streams /v1/completions (SSE) with temperature 0 and
stream_options.include_usage, so the token count is the server's own.

Standard library only (http.client): it runs on the device beside the server, with nothing else installed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from urllib.parse import urlsplit

from pipeline import settings
from pipeline.contract import LoadResult
from pipeline.errors import PipelineError
from pipeline.runtime.load import Timing, concurrencies, run_load

PROMPTS = ("The small computer sat on a shelf", "To bake bread you need", "What is the capital of France?",
           "Write a haiku about the sea.", "The train left the station")
MAX_LINE = 1 << 20


class Client:
    """One keep-alive connection (per client thread), as an application keeps one."""

    def __init__(self, url: str, api_key: str | None, timeout: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PipelineError(f"{url}: not an http(s) URL", "pass the server's base URL, e.g. http://127.0.0.1:8000")
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.conn = cls(parts.hostname, parts.port, timeout=timeout)
        self.base = parts.path.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str) -> dict:
        self.conn.request("GET", self.base + path, headers=self.headers)
        r = self.conn.getresponse()
        body = r.read(MAX_LINE)
        if r.status != 200:
            raise PipelineError(f"GET {path}: HTTP {r.status} {body[:200].decode('utf-8', 'replace')}",
                                "check the URL and --api-key")
        return json.loads(body)

    def completion(self, model: str, prompt: str, max_tokens: int) -> Timing:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}})
        sent = time.perf_counter()
        self.conn.request("POST", self.base + "/v1/completions", body=body, headers=self.headers)
        r = self.conn.getresponse()
        if r.status != 200:
            raise PipelineError(f"POST /v1/completions: HTTP {r.status} "
                                f"{r.read(MAX_LINE)[:300].decode('utf-8', 'replace')}", "see the server's log")
        arrivals: list[tuple[float, int]] = []
        usage = None
        while True:
            line = r.readline(MAX_LINE)
            if not line:
                break
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append((time.perf_counter(), 1))
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
        r.read()
        # a token whose text the server held back (an unfinished UTF-8 sequence) arrived with the next one
        if usage and arrivals and usage > len(arrivals):
            t, n = arrivals[-1]
            arrivals[-1] = (t, n + usage - len(arrivals))
        return Timing(sent, arrivals)


def bench(url: str, api_key: str | None, levels: list[int] | None, requests: int, max_tokens: int,
          timeout: float = 600.0) -> tuple[str, int, list[LoadResult]]:
    """(model, its max_batch_size, one LoadResult per concurrency level)."""
    import threading

    card = Client(url, api_key, timeout).get("/v1/models")["data"][0]
    model, max_batch = card["id"], int(card.get("max_batch_size") or 1)
    local = threading.local()

    def send(i: int) -> Timing:
        if not hasattr(local, "client"):
            local.client = Client(url, api_key, timeout)
        return local.client.completion(model, PROMPTS[i % len(PROMPTS)], max_tokens)
    results = []
    for c in levels or concurrencies(max_batch):
        local = threading.local()           # fresh connections per level
        results.append(run_load(send, c, max(requests, c), max_batch))
    return model, max_batch, results


def table(results: list[LoadResult]) -> list[str]:
    def ms(v: float | None) -> str:
        return "       -" if v is None else f"{v * 1000:8.2f}"
    lines = ["clients batch  req/s    tok/s  TTFT p50  TTFT p95  ITL p50  ITL p95 (ms)"]
    lines += [f"{r.concurrency:>7} {r.batch:>5} {r.req_s:6.2f} {r.tok_s:8.1f} {ms(r.ttft_p50_s)}  {ms(r.ttft_p95_s)} "
              f"{ms(r.itl_p50_s)} {ms(r.itl_p95_s)}" for r in results]
    return lines


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="load a running server: requests/s, tok/s, TTFT and inter-token latency",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    b.add_argument("--api-key", default=settings.get("JETSON_PIPELINE_API_KEY"),
                   help="Bearer key (default $JETSON_PIPELINE_API_KEY)")
    b.add_argument("--concurrency", help="comma-separated levels (default: 1, 4 and the server's max_batch_size)")
    b.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    b.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default 64)")
    b.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    b.set_defaults(func=run)


def run(args) -> int:
    try:
        levels = [int(x) for x in args.concurrency.split(",")] if args.concurrency else None
    except ValueError:
        raise PipelineError(f"--concurrency {args.concurrency!r}: not a comma-separated list of numbers",
                            "e.g. --concurrency 1,4,8") from None
    if (levels and min(levels) < 1) or args.requests < 1 or args.max_tokens < 1:
        raise PipelineError("--concurrency, --requests and --max-tokens must be >= 1", "fix the value")
    try:
        model, max_batch, results = bench(args.url, args.api_key, levels, args.requests, args.max_tokens)
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
        raise PipelineError(f"{args.url}: {type(exc).__name__}: {str(exc)[:200]}",
                            "is the server running (python -m pipeline serve ...) and is this its URL?") from None
    print(f"{model} at {args.url} (max_batch_size {max_batch}), {args.requests} requests of {args.max_tokens} "
          "tokens per level:")
    print("\n".join(table(results)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": model, "url": args.url, "max_batch_size": max_batch,
                       "runs": [r.to_dict() for r in results]}, fh, indent=1)
    sys.stdout.flush()
    return 0

"""`python -m pipeline bench URL`: load a running OpenAI-compatible server (ours, on a Jetson or the workstation, or
any other) at concurrency 1, 4 and its max_batch_size: requests/s, generated tok/s, TTFT p50/p95 and inter-token
latency p50/p95, as its clients see them. Streams /v1/completions (SSE) with temperature 0 and
stream_options.include_usage, so the token count is the server's own.

Standard library only (wire.py): it runs on the device beside the server, with nothing else installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from pipeline import settings
from pipeline.contract import LoadResult
from pipeline.errors import PipelineError
from pipeline.runtime.load import Timing, concurrencies, run_load
from pipeline.serve.wire import Connection, bad

PROMPTS = ("The small computer sat on a shelf", "To bake bread you need", "What is the capital of France?",
           "Write a haiku about the sea.", "The train left the station")
MAX_LINE = 1 << 20
MAX_BODY = 1 << 20          # /v1/models and an error body: read at most this much
MAX_CLIENTS = 256           # concurrent connections at most, whatever a server's max_batch_size says
MAX_REQUESTS = 100_000
READ_S = 120.0              # one socket read
DEADLINE_S = 1800.0         # the whole run, by default


class Deadline:
    """The whole run's time limit: past it every client's socket is shut down, which ends any read blocked on it
    (a server that trickles a byte at a time never hands back a timeout of its own)."""

    def __init__(self, seconds: float):
        self.seconds, self.at = seconds, time.monotonic() + seconds
        self.sockets: list[socket.socket] = []
        self.passed = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self.sockets.append(sock)
            if self.passed:
                self._cut()

    def _cut(self) -> None:
        self.passed = True
        with self._lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        if self.passed or time.monotonic() > self.at:
            self.passed = True
            raise PipelineError(f"the benchmark ran past its --timeout of {self.seconds:g} s",
                                "the server is too slow or stalled; allow more with --timeout SECONDS")

    def cancel(self) -> None:
        self._timer.cancel()


class Client:
    """One keep-alive connection (per client thread), as an application keeps one (wire.py: each request written
    in one write, each answer read bounded)."""

    def __init__(self, url: str, api_key: str | None, deadline: Deadline):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PipelineError(f"{url}: not an http(s) URL", "pass the server's base URL, e.g. http://127.0.0.1:8000")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise PipelineError(f"{url}: the port is not a number 0-65535", "e.g. http://127.0.0.1:8000") from None
        for what, value in (("the URL's path", parts.path), ("--api-key", api_key or "")):
            if any(not 32 < ord(c) < 127 for c in value):   # it goes into the request's head as it is
                raise PipelineError(f"{what} holds a space, a control or a non-ASCII character",
                                    "pass it as the server expects it, percent-encoded where it is a URL")
        self.conn = Connection(parts.hostname, port, parts.scheme == "https", READ_S, deadline.add)
        self.deadline = deadline
        self.base = parts.path.rstrip("/")
        host = parts.netloc.rsplit("@", 1)[-1]
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.headers = f"Host: {host}\r\nAccept-Encoding: identity\r\n{auth}".encode("latin-1")

    def _head(self, method: str, path: str, length: int | None) -> bytes:
        body = b"" if length is None else b"Content-Type: application/json\r\nContent-Length: %d\r\n" % length
        return f"{method} {self.base}{path} HTTP/1.1\r\n".encode() + self.headers + body + b"\r\n"

    def get(self, path: str) -> dict:
        r = self.conn.request(self._head("GET", path, None))
        body = r.read(MAX_BODY + 1)
        if r.status != 200:
            raise PipelineError(f"GET {path}: HTTP {r.status} {body[:200].decode('utf-8', 'replace')}",
                                "check the URL and --api-key")
        if len(body) > MAX_BODY:
            raise bad(f"GET {path} answered more than {MAX_BODY} bytes")
        try:
            out = json.loads(body)
        except (ValueError, RecursionError):
            raise bad(f"GET {path} is not JSON") from None
        if not isinstance(out, dict):
            raise bad(f"GET {path} is not a JSON object")
        return out

    def completion(self, model: str, prompt: str, max_tokens: int, image: str | None = None) -> Timing:
        """One streamed request: a completion of `prompt`, or with `image` (a data URL) a chat asking `prompt`
        about it (as the openai client sends an image). A token's time is when its line arrived."""
        fields = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}}
        if image is None:
            path, data = "/v1/completions", json.dumps({**fields, "prompt": prompt})
        else:
            path, data = "/v1/chat/completions", json.dumps({**fields, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": prompt}]}]})
        body = data.encode()
        head = self._head("POST", path, len(body))
        sent = time.perf_counter()
        r = self.conn.request(head, body)
        if r.status != 200:
            raise PipelineError(f"POST {path}: HTTP {r.status} "
                                f"{r.read(MAX_LINE)[:300].decode('utf-8', 'replace')}", "see the server's log")
        arrivals: list[tuple[float, int]] = []
        usage, done = None, False
        for line in r.lines(MAX_LINE):      # to the end of the response: the connection is kept for the next request
            now = time.perf_counter()
            self.deadline.check()
            if line.strip() == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: {"):
                text, count = _chunk(line[6:])
                if text:
                    arrivals.append((now, 1))
                usage = count if count is not None else usage
        self.deadline.check()
        if not done:
            raise PipelineError("a stream ended before its `data: [DONE]`: the answer was cut", "see the server's log")
        if not arrivals:
            raise PipelineError("a request produced no token", "see the server's log")
        # a token whose text the server held back (an unfinished UTF-8 sequence) arrived with the next one
        if usage and usage > len(arrivals):
            t, n = arrivals[-1]
            arrivals[-1] = (t, n + usage - len(arrivals))
        return Timing(sent, arrivals)


def _chunk(raw: bytes) -> tuple[str, int | None]:
    """A stream chunk's text and its usage's completion_tokens (None without usage), or one error saying why not."""
    try:
        chunk = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad("a stream chunk is not JSON") from None
    if not isinstance(chunk, dict):
        raise bad("a stream chunk is not an object")
    choices, usage = chunk.get("choices") or [], chunk.get("usage")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise bad("`choices` is not a list of objects")
    delta = choices[0].get("delta") if choices else None      # a chat chunk's text is its delta's content
    text = (delta.get("content") if isinstance(delta, dict) else None) if delta is not None else \
        choices[0].get("text") if choices else None
    if text is not None and not isinstance(text, str):
        raise bad("a choice's `text` is not a string")
    if usage is None:
        return text or "", None
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 10**9:
        raise bad("`usage.completion_tokens` is not a count")
    return text or "", count


def _max_batch(card: dict) -> int:
    value = card.get("max_batch_size") or 1
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 20:
        raise bad(f"/v1/models says max_batch_size {str(value)[:40]}: not a batch size")
    return value


def bench(url: str, api_key: str | None, levels: list[int] | None, requests: int, max_tokens: int,
          timeout: float = DEADLINE_S, image: str | None = None) -> tuple[str, int, list[LoadResult]]:
    """(model, its max_batch_size, one LoadResult per concurrency level), all within `timeout` seconds. image: a
    data URL every request asks about (a chat), so TTFT holds the image's preprocessing and the ViT."""
    deadline = Deadline(timeout)
    try:
        models = Client(url, api_key, deadline).get("/v1/models").get("data")
        if not isinstance(models, list) or not models or not isinstance(models[0], dict) or \
                not isinstance(models[0].get("id"), str):
            raise bad("/v1/models lists no model")
        card = models[0]
        model, max_batch = card["id"], _max_batch(card)
        local = threading.local()

        def send(i: int) -> Timing:
            if not hasattr(local, "client"):
                local.client = Client(url, api_key, deadline)
            return local.client.completion(model, PROMPTS[i % len(PROMPTS)], max_tokens, image)
        results = []
        for c in levels or concurrencies(min(max_batch, MAX_CLIENTS)):
            local = threading.local()           # fresh connections per level
            results.append(run_load(send, c, max(requests, c), max_batch))
        return model, max_batch, results
    except OSError:
        if deadline.passed:
            deadline.check()
        raise
    finally:
        deadline.cancel()


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
    b.add_argument("--image", metavar="FILE", help="a vision-language model: every request is a chat asking about "
                   "this image (PNG, JPEG or WebP, sent as a data URL), so TTFT holds its preprocessing and the ViT")
    b.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    b.add_argument("--timeout", type=float, default=DEADLINE_S, metavar="SECONDS",
                   help="give up after this long in all (default %(default)g)")
    b.set_defaults(func=run)


def run(args) -> int:
    from pipeline.files import write_atomic

    try:
        levels = [int(x) for x in args.concurrency.split(",")] if args.concurrency else None
    except ValueError:
        raise PipelineError(f"--concurrency {args.concurrency!r}: not a comma-separated list of numbers",
                            "e.g. --concurrency 1,4,8") from None
    if (levels and not all(1 <= c <= MAX_CLIENTS for c in levels)) or not 1 <= args.requests <= MAX_REQUESTS \
            or args.max_tokens < 1 or not 0 < args.timeout < 10**7:
        raise PipelineError(f"--concurrency must be 1..{MAX_CLIENTS}, --requests 1..{MAX_REQUESTS}, --max-tokens >= 1 "
                            "and --timeout > 0", "fix the value")
    out = Path(args.json) if args.json else None
    if out is not None and (out.is_symlink() or (out.exists() and not out.is_file())):
        raise PipelineError(f"--json {out}: a link or not a regular file; the figures are never written through it",
                            "pass a new file name")
    image = _data_url(Path(args.image)) if args.image else None
    try:
        model, max_batch, results = bench(args.url, args.api_key, levels, args.requests, args.max_tokens,
                                          args.timeout, image)
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{args.url}: {type(exc).__name__}: {str(exc)[:200]}",
                            "is the server running (python -m pipeline serve ...) and is this its URL?") from None
    print(f"{model} at {args.url} (max_batch_size {max_batch}), {args.requests} requests of {args.max_tokens} "
          f"tokens per level{f', each with {args.image}' if image else ''}:")
    print("\n".join(table(results)))
    if out is not None:
        write_atomic(out, json.dumps({"model": model, "url": args.url, "max_batch_size": max_batch,
                                      "runs": [r.to_dict() for r in results]}, indent=1))
    sys.stdout.flush()
    return 0


def _data_url(path: Path) -> str:
    """The image file as a data URL, read bounded and checked by its magic bytes (no decoding: the server does)."""
    import base64

    from pipeline.files import read_regular
    from pipeline.images import MAX_IMAGE_BYTES, ImageError, image_format
    try:
        data = read_regular(path, MAX_IMAGE_BYTES, follow=True)
        kind = image_format(data).lower()
    except PipelineError as exc:
        raise PipelineError(f"--image: {exc.message}", "pass a PNG, JPEG or WebP file") from None
    except (OSError, ImageError) as exc:
        raise PipelineError(f"--image {path}: {exc}", "pass a PNG, JPEG or WebP file") from None
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()

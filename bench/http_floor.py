"""The floor under bench/serve.py's TTFT figure on this machine: what a Python HTTP server that does no work of its own
adds to a streamed request's first token, with the engine on other CPUs.

    .venv/bin/python bench/http_floor.py --requests 400

The exchange bench/serve.py times (a POST with a JSON body, a 200 whose SSE line follows once the engine's first
token is ready, read by the same HTTP client, serve/wire.py, pinned the same way) answered by
- uvicorn with a minimal ASGI app (the server's stack: httptools, and uvloop where installed), and
- a bare asyncio protocol over httptools (no ASGI, no task per request beyond the answer's),
each handing the request to an "engine" thread on the CPUs the server's engine process takes, which works (spins)
--compute-ms and hands back; against that engine thread called directly, as bench/serve.py's direct rounds call the
session. Rounds alternate. Neither server parses the request beyond JSON, tokenizes, crosses a process boundary or
detokenizes: what they add over direct is the hops alone (client to event loop, loop to engine thread and back, loop
to client) as this machine's scheduler and caches make them. bench/serve.py's server pays these and its own work, so
its TTFT verdict cannot come out below this floor. Figures only: no verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FRAME = b'data: {"id":"cmpl-0","object":"text_completion","choices":[{"index":0,"text":" the",' \
        b'"finish_reason":null}]}\n\n'
DONE = b"data: [DONE]\n\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class Broken(Exception):
    """A server's answer was not the exchange this measures."""


class Engine:
    """A thread on `cpus` that takes jobs and works each `compute` seconds (spinning: an engine computes, its CPU is
    not idle), then calls the job's callback from its own thread, as a session's emit is called."""

    def __init__(self, cpus: frozenset[int] | None, compute: float):
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.cpus, self.compute = cpus, compute
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        while True:
            done = self.jobs.get()
            end = time.perf_counter() + self.compute
            while time.perf_counter() < end:
                pass
            done()


def serve(kind: str, port: int, engine: Engine) -> None:
    def submit(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """The request to the engine before its 200 goes out, as the server submits first."""
        ready = loop.create_future()
        engine.jobs.put(lambda: loop.call_soon_threadsafe(ready.set_result, None))
        return ready

    if kind == "uvicorn":
        import uvicorn

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            body, more = b"", True
            while more:
                message = await receive()
                body, more = body + message.get("body", b""), message.get("more_body", False)
            json.loads(body)
            ready = submit(asyncio.get_running_loop())
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await ready
            await send({"type": "http.response.body", "body": FRAME, "more_body": True})
            await send({"type": "http.response.body", "body": DONE, "more_body": False})
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools", proxy_headers=False,
                    access_log=False)
        return
    import httptools

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.parser, self.body = transport, httptools.HttpRequestParser(self), bytearray()

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            json.loads(bytes(self.body))
            self.body = bytearray()
            loop = asyncio.get_running_loop()
            loop.create_task(self.answer(submit(loop)))

        async def answer(self, ready: asyncio.Future[None]) -> None:
            self.transport.write(HEAD)
            await ready
            self.transport.write(b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(FRAME), FRAME, len(DONE), DONE))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
        await server.serve_forever()
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per mode (default 400)")
    ap.add_argument("--compute-ms", type=float, default=10.0,
                    help="the engine's work per request (default 10: the tiny model's prefill on the 2-core CI VM)")
    ap.add_argument("--port", type=int, default=18411, help="the first of the two ports the servers take")
    ap.add_argument("--serve", choices=("uvicorn", "bare"), help=argparse.SUPPRESS)     # a server's own process
    args = ap.parse_args()

    from pipeline.graph.reference import torch_threads
    from pipeline.runtime.process import split_cpus
    split = split_cpus(torch_threads())     # (the engine's CPUs, the server's), as bench/serve.py pins them
    if split:
        os.sched_setaffinity(0, split[1])
    engine = Engine(split[0] if split else None, args.compute_ms / 1e3)
    if args.serve:
        try:
            serve(args.serve, args.port, engine)
        except OSError as exc:     # its port taken: the parent finds out by asking it, and says which
            print(f"bench/http_floor.py: the {args.serve} server cannot listen on port {args.port}: {exc}",
                  file=sys.stderr)
            return 2
        return 0

    from bench.serve import interval
    from pipeline.errors import PipelineError
    from pipeline.serve.wire import Connection
    kinds = {"uvicorn": args.port, "bare": args.port + 1}
    servers = [subprocess.Popen([sys.executable, __file__, "--serve", k, "--port", str(p), "--compute-ms",
                                 str(args.compute_ms)]) for k, p in kinds.items()]
    try:
        # each port until it answers; a server that exited fails only where nothing answers on its port (where
        # another program does, the first request says so, naming the port: the one answer however the start races)
        for server, (kind, port) in zip(servers, kinds.items(), strict=True):
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        print(f"bench/http_floor.py: the {kind} server did not come up on port {port} (pass --port)",
                              file=sys.stderr)
                        return 2
                    time.sleep(0.05)
        conns = {k: Connection("127.0.0.1", p, False, 30) for k, p in kinds.items()}
        body = json.dumps({"model": "m", "prompt": "The small computer sat on a shelf", "max_tokens": 2,
                           "stream": True}).encode()
        head = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n" \
               b"content-length: %d\r\n\r\n" % len(body)

        def http(kind: str) -> float:
            sent = time.perf_counter()
            r = conns[kind].request(head, body)
            first = None
            for line in r.lines(1 << 16):
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter()
            if r.status != 200 or first is None:
                raise Broken(f"the {kind} server's port {kinds[kind]} answered HTTP {r.status} without an SSE line "
                             "(another program on that port? pass --port)")
            return first - sent - engine.compute

        def direct() -> float:
            ready = threading.Event()
            stamp: list[float] = []

            def done() -> None:     # on the engine's thread, as a session's callback
                stamp.append(time.perf_counter())
                ready.set()
            sent = time.perf_counter()
            engine.jobs.put(done)
            ready.wait()
            return stamp[0] - sent - engine.compute

        modes: dict[str, Callable[[], float]] = {"direct": direct, "uvicorn": lambda: http("uvicorn"),
                                                 "bare": lambda: http("bare")}
        for _ in range(20):         # warm every path
            for run in modes.values():
                run()
        times: dict[str, list[float]] = {m: [] for m in modes}
        order = list(modes)
        for i in range(args.requests):
            for m in order if i % 2 else reversed(order):
                times[m].append(modes[m]())
        d = statistics.median(times["direct"])
        print(f"first token of a streamed POST, the engine working {args.compute_ms:g} ms on CPUs "
              f"{sorted(split[0]) if split else 'any'}, client and servers on {sorted(split[1]) if split else 'any'} "
              f"(median of {args.requests}, rounds alternating), beyond the engine's work:")
        print(f"  the engine thread called directly   {d * 1e3:6.3f} ms")
        for m, name in (("bare", "a bare asyncio + httptools server"), ("uvicorn", "uvicorn + a minimal ASGI app ")):
            low, high = interval([[t] for t in times["direct"]], [[t] for t in times[m]])
            h = statistics.median(times[m])
            print(f"  {name}   {h * 1e3:6.3f} ms   adds {(h - d) * 1e3:+.3f} ms over direct (95% interval "
                  f"{low * 1e3:+.3f} to {high * 1e3:+.3f})")
        ratio = statistics.median(times["uvicorn"]) / statistics.median(times["bare"])
        print(f"uvicorn / bare: {ratio:.3f} (the ASGI stack's own share of the floor)")
        return 0
    except (Broken, OSError, PipelineError) as exc:
        print(f"bench/http_floor.py: {exc}", file=sys.stderr)
        return 2
    finally:
        for s in servers:
            s.terminate()
            s.wait(10)


if __name__ == "__main__":
    sys.exit(main())

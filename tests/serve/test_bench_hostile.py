"""`python -m pipeline bench URL` against a server that misbehaves (written here, on 127.0.0.1): an endless or
trickling stream ends at --timeout, odd JSON is one clear error, an absurd max_batch_size is refused, a stream cut
before [DONE] fails the run, --json never writes through a link."""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.serving import free_port


def serve(models: dict | bytes, stream: str) -> ThreadingHTTPServer:
    """A server whose /v1/models answers `models` and whose completion stream behaves as `stream` says."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_GET(self):
            body = models if isinstance(models, bytes) else json.dumps(models).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            good = b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
            if stream == "endless":
                while not stop.is_set():
                    self.wfile.write(good)
            elif stream == "trickle":
                for byte in good * 100:
                    if stop.wait(0.5):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
            elif stream == "cut":
                self.wfile.write(good * 3)
            else:
                self.wfile.write(stream.encode() + b"\n\ndata: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    server.handle_error = lambda *_: None       # type: ignore[method-assign]  (the client cut it: expected here)
    server.stop = stop          # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def bench(server, *args) -> tuple[int, str]:
    from pipeline.cli import main
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["bench", f"http://127.0.0.1:{server.server_address[1]}", "--requests", "1", *map(str, args)])
    return rc, err.getvalue()


MODELS = {"data": [{"id": "m", "max_batch_size": 1}]}


@pytest.mark.parametrize("stream", ["endless", "trickle"])
def test_an_endless_or_trickling_stream_ends_at_the_timeout(stream):
    server = serve(MODELS, stream)
    try:
        t = time.monotonic()
        rc, err = bench(server, "--timeout", "2")
        took = time.monotonic() - t
    finally:
        server.stop.set()
        server.shutdown()
    assert rc == 2 and "ran past its --timeout of 2 s" in err and "Traceback" not in err, err
    assert took < 6


@pytest.mark.parametrize("models,stream,message", [
    (MODELS, 'data: {"choices": "x"}', "`choices` is not a list of objects"),
    (MODELS, 'data: {"choices": [{"text": 5}]}', "a choice's `text` is not a string"),
    (MODELS, 'data: {"choices": [], "usage": "lots"}', "`usage.completion_tokens` is not a count"),
    (MODELS, 'data: {"choices": []}', "a request produced no token"),
    (MODELS, "cut", "a stream ended before its `data: [DONE]`"),
    (b'{"data": [{"id": "m", "max_batch_size": 1e400}]}', "", "max_batch_size inf: not a batch size"),
    ({"data": [{"id": "m", "max_batch_size": 10**9}]}, "", "max_batch_size 1000000000: not a batch size"),
    ({"data": "m"}, "", "/v1/models lists no model"),
    (b"[1, 2]", "", "GET /v1/models is not a JSON object"),
])
def test_malformed_answers_are_one_clear_error(models, stream, message):
    server = serve(models, stream)
    try:
        rc, err = bench(server, "--timeout", "20")
    finally:
        server.stop.set()
        server.shutdown()
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.parametrize("args,url_tail,what", [
    (("--api-key", "key\r\nX-Injected: 1"), "", "--api-key"),
    (("--api-key", "clé"), "", "--api-key"),
    ((), "/v1 beta", "the URL's path"),
])
def test_a_key_or_path_that_would_break_the_request_head_is_refused(args, url_tail, what):
    from pipeline.cli import main
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = main(["bench", f"http://127.0.0.1:9{url_tail}", "--requests", "1", *args])
    assert rc == 2 and f"{what} holds a space, a control or a non-ASCII character" in err.getvalue(), err.getvalue()
    assert "Traceback" not in err.getvalue()


def test_json_is_never_written_through_a_link_and_concurrency_is_capped(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (tmp_path / "out.json").symlink_to(target)
    server = serve(MODELS, 'data: {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}')
    try:
        rc, err = bench(server, "--json", tmp_path / "out.json")
        assert rc == 2 and "a link or not a regular file" in err and target.read_text() == "keep"
        rc, err = bench(server, "--concurrency", "100000")
        assert rc == 2 and "--concurrency must be 1..256" in err
        rc, err = bench(server, "--json", tmp_path / "real.json", "--concurrency", "1")
        assert rc == 0, err
        assert json.loads((tmp_path / "real.json").read_text())["model"] == "m"
    finally:
        server.stop.set()
        server.shutdown()


def test_the_http_floor_benchmark_on_a_port_another_program_answers_says_so():
    """bench/http_floor.py's own servers cannot take a port another program holds: the answer it then gets is one
    clear error naming the port, not a traceback or figures of the wrong server."""
    import socket
    import subprocess
    import sys
    from http.server import BaseHTTPRequestHandler
    from pathlib import Path

    def pair_free() -> int:
        """A port whose next one is free too: the benchmark's second server takes port + 1, and another test's
        server there made this test see that server's failure instead of the squatter's answer (a CI flake)."""
        while True:
            port = free_port()
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    squatter = ThreadingHTTPServer(("127.0.0.1", pair_free()), BaseHTTPRequestHandler)     # a POST is its 501
    squatter.daemon_threads = True
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    port = squatter.server_address[1]
    try:
        r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "bench" / "http_floor.py"),
                            "--port", str(port), "--requests", "2", "--compute-ms", "1"],
                           capture_output=True, text=True, timeout=120)
    finally:
        squatter.shutdown()
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"bench/http_floor.py: the uvicorn server's port {port} answered HTTP 501 without an SSE line (another " \
           "program on that port? pass --port)" in r.stderr
    assert "Traceback" not in r.stderr

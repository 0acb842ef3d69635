"""A registry that misbehaves on purpose, on 127.0.0.1: endless or trickling bodies and headers, upload Locations
and redirects to another origin (a second server here that records what it is sent). Each behaviour is chosen per
request path by the test; everything else answers as a minimal registry with basic auth would."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.serving import free_port


class Recorder(ThreadingHTTPServer):
    """The other origin: records each request's method, path and headers, answers 201 (an upload) or a body."""
    daemon_threads = True

    def __init__(self):
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def _record(self) -> None:
                recorder.seen.append((self.command, self.path, dict(self.headers)))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)

            def do_PUT(self):
                self._record()
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                self._record()
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class HostileRegistry(ThreadingHTTPServer):
    """behaviour: {path prefix: mode}. Modes: "endless" (200, `{` forever), "endless-error" (500, `{` forever),
    "trickle" (200, one byte every `trickle_s`), "trickle-header" (the status line, then a header byte every
    `trickle_s`), "foreign-location" (an upload's Location on `other`), "redirect" (a 307 to `other`)."""
    daemon_threads = True

    def __init__(self, behaviour: dict[str, str], other: Recorder | None = None, user: str | None = None,
                 trickle_s: float = 2.0):
        self.behaviour, self.other, self.trickle_s = behaviour, other, trickle_s
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.stopping = threading.Event()
        reg = self
        auth = None if user is None else "Basic " + __import__("base64").b64encode(user.encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def _mode(self) -> str | None:
                return next((m for p, m in reg.behaviour.items() if self.path.startswith(p)), None)

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self) -> None:
                reg.seen.append((self.command, self.path, dict(self.headers)))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                mode = self._mode()
                if auth is not None and self.headers.get("Authorization") != auth:
                    self._send(401, b"{}", {"WWW-Authenticate": 'Basic realm="test"'})
                    return
                if mode in ("endless", "endless-error"):
                    self.send_response(200 if mode == "endless" else 500)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    chunk = b"{" * 65536
                    while not reg.stopping.is_set():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    return
                if mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    while not reg.stopping.wait(reg.trickle_s):
                        self.wfile.write(b"{")
                        self.wfile.flush()
                    return
                if mode == "trickle-header":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    while not reg.stopping.wait(reg.trickle_s):
                        self.wfile.write(b"X")
                        self.wfile.flush()
                    return
                if mode == "redirect" and reg.other is not None:
                    self._send(307, b"", {"Location": reg.other.url + self.path})
                    return
                if self.command == "POST" and "/blobs/uploads/" in self.path:
                    where = (reg.other.url if mode == "foreign-location" and reg.other else "") + "/upload/1"
                    self._send(202, b"", {"Location": where})
                    return
                if self.command in ("GET", "HEAD") and self.path == "/v2/":
                    self._send(200, b"{}")
                    return
                if self.command == "PUT":
                    self._send(201)
                    return
                self._send(404, b'{"errors": [{"code": "NOT_FOUND", "message": "no"}]}')

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = _handle

        super().__init__(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request, client_address) -> None:
        pass        # the client cut the connection: what these tests expect of it

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.stopping.set()
        time.sleep(0.05)
        self.shutdown()
        self.server_close()

"""The HTTP/1.1 client `python -m pipeline bench` measures with (standard library only: it runs on the device beside
the server): one keep-alive connection, each request written whole in one write, each response read with a bound
on every line, header count and body, its body framed by chunked encoding, Content-Length or the connection's end.

Why not http.client: it writes a request's headers and its body in two writes (the server wakes twice) and parses a
response's headers with the email package, and a streamed line passes through several layers of buffered reads. On
the 2-core workstation that client's own work was ~0.25 ms of every first token it timed (traced: 0.19 ms from
calling it to the server's first read, 0.07 ms from the server's write to the token's arrival), which the benchmark
then charged to the server.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator

from pipeline.errors import PipelineError

MAX_HEAD_LINE = 1 << 16     # a status, header or chunk-size line (http.client's _MAXLINE)
MAX_HEADERS = 100           # http.client's _MAXHEADERS
RECV = 1 << 16


class _Closed(Exception):
    """The server closed the connection before a response's status line."""


def bad(what: str) -> PipelineError:
    return PipelineError(f"the server's answer is not OpenAI's: {what}", "is this an OpenAI-compatible server?")


class Response:
    """A response's status and headers (names lower-case); its body through `lines` or `read`, once."""

    def __init__(self, conn: Connection, status: int, headers: dict[str, str], version: bytes):
        self.status, self.headers, self._conn = status, headers, conn
        length = headers.get("content-length")
        self._chunked, self._length = False, None
        if status in (204, 304):        # no body whatever its headers say (RFC 9112 6.3)
            self._length = 0
        elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
            self._chunked = True
        elif length is not None:
            if not length.strip().isdigit():
                raise bad(f"Content-Length {length[:40]!r} is not a length")
            self._length = int(length)
        self._reusable = version == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower() and \
            (self._chunked or self._length is not None)

    def _pieces(self) -> Iterator[bytes]:
        """The body's bytes as they arrive, framing removed; the connection is kept once the body has ended."""
        conn = self._conn
        if self._chunked:
            while True:
                size_line = conn.line(MAX_HEAD_LINE).split(b";", 1)[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise bad(f"a chunk size {size_line[:40]!r} is not hexadecimal") from None
                if size == 0:
                    for _ in range(MAX_HEADERS + 1):       # trailers, up to the empty line
                        if conn.line(MAX_HEAD_LINE) in (b"\r\n", b"\n"):
                            break
                    else:
                        raise bad(f"more than {MAX_HEADERS} trailer lines")
                    break
                while size:
                    piece = conn.some(size)
                    size -= len(piece)
                    yield piece
                if conn.line(MAX_HEAD_LINE).strip():
                    raise bad("a chunk is longer than its size says")
        elif self._length is not None:
            left = self._length
            while left:
                piece = conn.some(left)
                left -= len(piece)
                yield piece
        else:
            while piece := conn.some(RECV, eof_ok=True):
                yield piece
        if self._reusable:
            conn.idle = True

    def lines(self, limit: int) -> Iterator[bytes]:
        """The body's lines (each with its newline; the last may have none), each yielded as soon as it has
        arrived; a line longer than `limit` is an error."""
        held = bytearray()      # grown in place: a line trickled a byte per read is not copied per byte
        for piece in self._pieces():
            held += piece
            if b"\n" in piece:
                *done, held = held.split(b"\n")
                for line in done:
                    if len(line) >= limit:
                        raise bad(f"a stream line longer than {limit} bytes")
                    yield bytes(line) + b"\n"
            if len(held) > limit:
                raise bad(f"a stream line longer than {limit} bytes")
        if held:
            yield bytes(held)

    def read(self, limit: int) -> bytes:
        """The body, or its first `limit` bytes (the rest is left unread and the connection is not reused)."""
        out = bytearray()
        for piece in self._pieces():
            out += piece
            if len(out) >= limit:
                self._conn.close()
                return bytes(out[:limit])
        return bytes(out)


class Connection:
    """One connection to `host`:`port` (TLS where `tls`), opened at the first request and again after a response
    that does not keep it. `timeout`: one read's limit; `on_socket`: called with each new socket (the benchmark's
    deadline shuts them down)."""

    def __init__(self, host: str, port: int, tls: bool, timeout: float,
                 on_socket: Callable[[socket.socket], None] = lambda _s: None):
        self.host, self.port, self.tls, self.timeout, self.on_socket = host, port, tls, timeout, on_socket
        self.sock: socket.socket | None = None
        self.idle = False           # the last response ended and the connection may carry the next
        self._buf = bytearray()

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self.on_socket(sock)
        self._buf.clear()
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.idle = None, False

    def request(self, head: bytes, body: bytes = b"") -> Response:
        """Write `head` (the request line and headers, ending in an empty line) and `body` in one write; the
        response's status and headers. A kept connection the server closed meanwhile (its idle timeout) is opened
        again, once: the request never reached it."""
        for _ in range(2):
            sock, reused = self.sock, self.idle
            if sock is None or not reused:
                self.close()
                sock = self.sock = self._open()
            self.idle = False
            try:
                sock.sendall(head + body)
                return self._response()
            except (ConnectionError, _Closed):
                self.close()
                if not reused:
                    raise PipelineError("the server closed the connection without answering",
                                        "see the server's log") from None
        raise AssertionError("unreachable: a second attempt is on a new connection")

    def _response(self) -> Response:
        while True:
            first = self.line(MAX_HEAD_LINE, eof=_Closed)
            version, _, rest = first.rstrip(b"\r\n").partition(b" ")
            code = rest[:3]
            if not version.startswith(b"HTTP/1.") or not code.isdigit():
                raise bad(f"the status line {first[:60]!r} is not HTTP/1.x")
            headers: dict[str, str] = {}
            for _ in range(MAX_HEADERS + 1):
                line = self.line(MAX_HEAD_LINE)
                if line in (b"\r\n", b"\n"):
                    break
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise bad(f"a header line {line[:60]!r} has no colon")
                headers[name.strip().lower()] = value.strip()
            else:
                raise bad(f"more than {MAX_HEADERS} header lines")
            if not 100 <= int(code) < 200:     # an interim answer (100 Continue) is followed by the real one
                return Response(self, int(code), headers, version)

    def line(self, limit: int, eof: type[Exception] | None = None) -> bytes:
        """The next line, with its newline; one longer than `limit` is an error."""
        buf = self._buf
        start = 0
        while (end := buf.find(b"\n", start)) < 0:
            if len(buf) > limit:
                raise bad(f"a line of the answer's head is longer than {limit} bytes")
            start = len(buf)
            self._fill(eof)
        if end >= limit:
            raise bad(f"a line of the answer's head is longer than {limit} bytes")
        line = bytes(buf[:end + 1])
        del buf[:end + 1]
        return line

    def some(self, most: int, eof_ok: bool = False) -> bytes:
        """Up to `most` bytes: what is buffered, else what the next read brings (b"" at the end, where `eof_ok`)."""
        if not self._buf and not self._fill(None, eof_ok):
            return b""
        piece = bytes(self._buf[:most])
        del self._buf[:most]
        return piece

    def _fill(self, eof: type[Exception] | None, eof_ok: bool = False) -> bool:
        assert self.sock is not None
        data = self.sock.recv(RECV)
        if data:
            self._buf += data
            return True
        self.close()
        if eof_ok:
            return False
        if eof is not None:
            raise eof
        raise PipelineError("the server closed the connection in the middle of an answer: the answer was cut",
                            "see the server's log")

"""wire.py, the benchmark's HTTP/1.1 client, against a scripted server on 127.0.0.1 (raw bytes, so each framing and
each malformed answer is exactly what the test says): chunked, Content-Length and read-to-close bodies, lines split
across chunks and writes, interim answers, keep-alive and its reopening, requests written in one write, and a clear
error for every malformed head or body."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pipeline.errors import PipelineError
from pipeline.serve.wire import MAX_HEADERS, Connection

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n"
BODY = b'{"a": 12}'


class Scripted:
    """Accepts connections; answers each request on them with the next script entry: a list of byte pieces (sent
    with a pause between them), then "close" to close that connection. Records each request's first read and
    whole bytes, and each connection."""

    def __init__(self, script: list[list[bytes | str]]):
        self.script, self.firsts, self.requests, self.connections = list(script), [], [], 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.script:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while self.script:
                first = conn.recv(1 << 16)
                if not first:
                    return
                data = first
                while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
                    data += conn.recv(1 << 16)
                self.firsts.append(first)
                self.requests.append(data)
                for piece in self.script.pop(0):
                    if piece == "close":
                        return
                    try:
                        conn.sendall(piece)
                    except OSError:     # the client stopped reading (an error it found, a limit)
                        return
                    time.sleep(0.01)

    def close(self) -> None:
        self.sock.close()


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.fixture
def scripted():
    servers: list[Scripted] = []

    def make(*script: list[bytes | str]) -> Scripted:
        servers.append(Scripted(list(script)))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def connect(server: Scripted) -> Connection:
    return Connection("127.0.0.1", server.port, False, 5.0)


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"


def test_chunked_lines_are_reassembled_across_chunks_and_writes_and_the_connection_is_kept(scripted):
    # a line split over two chunks, a chunk split over two writes, a chunk extension, a trailer
    server = scripted(
        [CHUNKED, b"7;ext=1\r\ndata: {\r\n", b"9\r\n\"a\": 1}\n\n\r\n", b"e\r\ndata: [DO", b"NE]\n\n\r\n",
         b"0\r\nX-Trailer: t\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"])
    conn = connect(server)
    r = conn.request(HEAD, BODY)
    assert (r.status, r.headers["content-type"]) == (200, "text/event-stream")
    assert list(r.lines(100)) == [b'data: {"a": 1}\n', b"\n", b"data: [DONE]\n", b"\n"]
    r = conn.request(HEAD, BODY)
    assert r.read(100) == b"hello"
    assert server.connections == 1 and len(server.requests) == 2
    # each request reached the server whole in its first read: one write, headers and body together
    assert server.firsts == [HEAD + BODY, HEAD + BODY]


def test_a_body_to_the_connections_end_and_a_kept_connection_the_server_closed(scripted):
    server = scripted(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "close"],     # kept by its headers, then closed
        [b"HTTP/1.0 200 OK\r\n\r\nline one\nline two", "close"],           # no length: the body ends at the close
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"])
    conn = connect(server)
    assert conn.request(HEAD, BODY).read(10) == b"ok"
    time.sleep(0.05)
    r = conn.request(HEAD, BODY)        # the kept connection is found closed: opened again, the request sent again
    assert list(r.lines(100)) == [b"line one\n", b"line two"]
    r = conn.request(HEAD, BODY)        # the read-to-close body did not keep it: a new connection
    assert r.status == 204 and r.read(10) == b""
    assert server.connections == 3 and len(server.requests) == 3


def test_a_204_has_no_body_whatever_its_headers_say_and_keeps_the_connection(scripted):
    server = scripted([b"HTTP/1.1 204 No Content\r\n\r\n"], [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    conn = connect(server)
    r = conn.request(HEAD, BODY)
    assert r.status == 204 and r.read(10) == b""        # no length, no chunks: not read to the connection's end
    assert conn.request(HEAD, BODY).read(10) == b"ok" and server.connections == 1


def test_read_stops_at_its_limit(scripted):
    server = scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"])
    assert connect(server).request(HEAD, BODY).read(4) == b"0123"


@pytest.mark.parametrize("answer,message", [
    ([b"SPDY/3 200 OK\r\n\r\n"], "is not HTTP/1.x"),
    ([b"HTTP/1.1 2x0 OK\r\n\r\n"], "is not HTTP/1.x"),
    ([b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"], "has no colon"),
    ([b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * (MAX_HEADERS + 1) + b"\r\n"], f"more than {MAX_HEADERS} header lines"),
    ([b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n"], "longer than 65536 bytes"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n"], "Content-Length 'ten' is not a length"),
    ([CHUNKED, b"zz\r\nhello\r\n"], "a chunk size b'zz' is not hexadecimal"),
    ([CHUNKED, b"2\r\nhello\r\n"], "a chunk is longer than its size says"),
    ([CHUNKED, b"5\r\nhel", "close"], "the server closed the connection in the middle of an answer"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "close"], "in the middle of an answer"),
    (["close"], "the server closed the connection without answering"),
])
def test_a_malformed_or_cut_answer_is_one_clear_error(scripted, answer, message):
    server = scripted(answer)
    with pytest.raises(PipelineError) as err:
        r = connect(server).request(HEAD, BODY)
        r.read(100)
    assert message in err.value.message


def test_a_line_past_the_limit_is_refused_before_it_ends(scripted):
    server = scripted([CHUNKED, *[b"400\r\n" + b"a" * 1024 + b"\r\n"] * 4])
    with pytest.raises(PipelineError, match="a stream line longer than 2000 bytes"):
        list(connect(server).request(HEAD, BODY).lines(2000))

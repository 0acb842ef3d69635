"""What the server does before a request reaches the application: connection limits, read deadlines, the file limit.

uvicorn closes an idle keep-alive connection, but a connection that sends half a request header and waits is held
forever, and each holds a file descriptor: about a thousand of them take a server under systemd's default of 1024
open files down for every client (h11 and httptools have no header deadline of their own). So uvicorn's httptools
protocol is extended here with what uvicorn's and h11's own limits would be if they had them:

- a **header deadline** from the first byte of a request (or from the connection's start) to the end of its headers,
  and a **header size** cap: a slow or endless header is closed (408 / 431) without reaching the application;
- a **body deadline** from the end of the headers to the end of the body: a body sent one byte at a time is closed;
- a **connection cap** below the process's file limit: when it is reached, the oldest connection that has not yet
  sent a whole request header (or sits idle between requests) is closed to make room (it costs its owner nothing
  but a reconnect), so half-open connections can never lock out a client that sends its request at once; where no
  such connection exists, the new one is closed.

A request whose headers are complete goes to the application, which checks the API key before reading any body.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import PipelineError

FD_RESERVE = 128        # files the process needs besides its connections: engine, tokenizer, logs, the event loop


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0        # seconds from a request's first byte (or the connection) to its last header
    body_timeout: float = 30.0          # seconds from the last header to the body's end
    max_header_bytes: int = 64 * 1024   # a request line and headers together
    max_connections: int = 1024


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (systemd: 1024 soft, 512K hard) and return
    the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(requested: int, file_limit: int) -> int:
    """The connection cap: what was asked, but always below the file limit by FD_RESERVE."""
    room = file_limit - FD_RESERVE
    if room < 16:
        raise PipelineError(f"this process may open only {file_limit} files: too few to serve (the server keeps "
                            f"{FD_RESERVE} for itself)", "raise the limit: ulimit -n 65536, or LimitNOFILE= in the "
                            "systemd unit")
    return max(1, min(requested, room))


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the limits above (a class per server: the registry of connections still
    in their header phase is shared by that server's connections only)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    # connection -> None, oldest first: those with no request under way (no whole header yet, or idle): evictable
    header_phase: dict[Any, None] = {}

    class GuardedHttpTools(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                victim = next(iter(header_phase), None)
                if victim is None:      # every connection is serving a request: this one waits for none
                    transport.close()
                    return
                victim._close()
            self._header_phase()

        def connection_lost(self, exc: Exception | None) -> None:
            self._settle()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self in header_phase:        # still no whole header after these bytes: they were all header
                self._header_bytes += len(data)
                if self._header_bytes > limits.max_header_bytes:
                    self._refuse(431, b"Request Header Fields Too Large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:             # a keep-alive connection's next request: its header deadline
                self._header_phase()

        def on_headers_complete(self) -> None:
            self._settle()
            self._timer = self.loop.call_later(limits.body_timeout, self._refuse, 408, b"Request Timeout")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._settle()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle is not None and self.cycle.keep_alive:
                header_phase[self] = None       # idle between requests (uvicorn's keep-alive timer closes it)

        # ------------------------------------------------------------------------------------------------------
        def _header_phase(self) -> None:
            self._settle()
            header_phase[self] = None
            self._header_bytes = 0
            self._timer = self.loop.call_later(limits.header_timeout, self._refuse, 408, b"Request Timeout")

        def _settle(self) -> None:
            header_phase.pop(self, None)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _close(self) -> None:
            self._settle()
            if not self.transport.is_closing():
                self.transport.close()

        def _refuse(self, status: int, reason: bytes) -> None:
            """An answer (when no response has started) and the connection closed: past a deadline or a size."""
            started = self.cycle is not None and not self.cycle.response_complete and self.cycle.response_started
            self._settle()
            if self.transport.is_closing():
                return
            if not started:
                body = b'{"error":{"message":"' + reason + b'","type":"invalid_request_error","param":null,' \
                    b'"code":"' + reason.lower().replace(b" ", b"_") + b'"}}'
                self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                     b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
            if self.cycle is not None:
                self.cycle.disconnected = True      # the application sees its client gone
                self.cycle.message_event.set()
            self.transport.close()

    return GuardedHttpTools


async def until_disconnect(receive: Callable[[], Any]) -> None:
    """Returns when the client has gone (the request's body was read before: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(work: Awaitable[Any], receive: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, its result) of `work`, or (False, None) where the client left first: then `work` is cancelled (a
    non-streamed answer's engine work is freed as soon as its client is gone)."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
    if not task.done() or task.cancelled():
        await asyncio.gather(task, return_exceptions=True)
        return False, None
    return True, task.result()

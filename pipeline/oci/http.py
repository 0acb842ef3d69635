"""Every HTTP exchange with a registry bounded in size and time, and credentials kept to the registry's own origin.

requests' timeout is per socket read: a registry that sends one byte every few seconds, in a header, a body or a TLS
handshake, holds a client forever, and a body read whole (`stream=False`, what oras-py uses for its own requests)
grows until memory runs out. So here:

- **A watchdog** per store: every socket the store's session opens is registered as it is created; when the current
  deadline passes, the watchdog shuts those sockets down, which ends whatever read or write is blocked on them, and
  the caller gets one `DeadlineExceeded` naming the deadline. Deadlines: each request's headers and small body
  (REQUEST_S), a blob stream's progress (STALL_S without a chunk), and the whole operation (`--timeout`).
- **Bounded bodies**: a body the caller does not stream is read here, at most SMALL_BODY bytes (the probe, errors,
  tokens, upload answers); past that, an error, never a larger buffer.
- **Origins**: `Authorization` goes only to the registry's own scheme, host and port; requests already strips it
  on a redirect to another host or port, and `strip_foreign_credentials` does it for URLs the registry names itself
  (an upload's Location).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

from pipeline.errors import PipelineError

REQUEST_S = 60.0            # one request's headers and small body
STALL_S = 60.0              # a blob stream with no chunk (1 MiB down, 4 MiB up) for this long has stalled
OPERATION_S = 4 * 3600.0    # a whole push, pull or stage-cache step, unless --timeout says otherwise
SMALL_BODY = 2**20          # a body read whole: a registry's JSON error, a token, the /v2/ probe
POLL_S = 0.2


class DeadlineExceeded(PipelineError):
    pass


def _seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0 < seconds < 10**7 else None


def registry_timeout(text: str) -> float:
    """argparse type of --timeout: seconds > 0."""
    import argparse
    seconds = _seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds (> 0)")
    return seconds


def default_timeout() -> float:
    """$JETSON_PIPELINE_REGISTRY_TIMEOUT, else OPERATION_S."""
    from pipeline import settings
    text = settings.get("JETSON_PIPELINE_REGISTRY_TIMEOUT")
    if text is None:
        return OPERATION_S
    seconds = _seconds(text)
    if seconds is None:
        raise PipelineError(f"JETSON_PIPELINE_REGISTRY_TIMEOUT={text[:40]!r}: not a number of seconds (> 0)",
                            "set it to the seconds a push, pull or stage-cache step may take, or unset it")
    return seconds


class Watchdog:
    """Shuts down the registered sockets when the current deadline (or the operation's) passes."""

    def __init__(self, operation_s: float, what: str):
        self.what = what
        self.operation_s = operation_s
        self.operation_deadline = time.monotonic() + operation_s
        self.deadline = self.operation_deadline
        self.label = "the operation"
        self.expired: str | None = None
        self.sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self.sockets.add(sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, args=(weakref.ref(self),), daemon=True,
                                                name="registry-watchdog")
                self._thread.start()

    def window(self, seconds: float, label: str) -> None:
        """From now, `seconds` more (never past the operation's deadline) for `label`."""
        self.check()
        self.deadline, self.label = min(time.monotonic() + seconds, self.operation_deadline), label

    def check(self) -> None:
        """Raise if a deadline passed (called between reads; the watchdog has cut the sockets already)."""
        if self.expired is None and time.monotonic() > self.operation_deadline:
            self.expired = f"the whole operation took longer than {self.operation_s:g} s"
        if self.expired is not None:
            raise self.error()

    def error(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"{self.what}: {self.expired}; gave up",
                                "the registry (or the network to it) is too slow or stalled: check it, or allow more "
                                "time with --timeout SECONDS (JETSON_PIPELINE_REGISTRY_TIMEOUT)")

    @staticmethod
    def _watch(ref: weakref.ref[Watchdog]) -> None:
        while (self := ref()) is not None:
            now = time.monotonic()
            if self.expired is None and now > self.deadline:
                self.expired = f"{self.label} passed its deadline" if self.deadline < self.operation_deadline \
                    else f"the whole operation took longer than {self.operation_s:g} s"
            if self.expired is not None:
                with self._lock:
                    for s in list(self.sockets):
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)
                    self.sockets.clear()
            del self
            time.sleep(POLL_S)


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def strip_foreign_credentials(url: str, own: str, headers: dict[str, str]) -> dict[str, str]:
    """`headers` without credentials unless `url` is on the origin `own` (scheme, host and port)."""
    if origin(url) == origin(own):
        return headers
    return {k: v for k, v in headers.items() if k.lower() not in ("authorization", "proxy-authorization", "cookie")}


def bound_session(session: Any, watch: Watchdog, connect_s: float, read_s: float) -> None:
    """Register every socket `session` opens with `watch`, time every request, and read small bodies bounded."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def watched(base: type) -> type:
        class Watched(base):
            def _new_conn(self) -> socket.socket:
                sock = super()._new_conn()
                watch.add(sock)
                return sock
        return Watched

    pools = {"http": type("WatchedPool", (HTTPConnectionPool,), {"ConnectionCls": watched(HTTPConnection)}),
             "https": type("WatchedPool", (HTTPSConnectionPool,), {"ConnectionCls": watched(HTTPSConnection)})}

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

    for prefix in ("http://", "https://"):
        session.mount(prefix, Adapter(max_retries=0))
    request = session.request

    def bounded(method: str, url: str, **kwargs: Any) -> Any:
        stream = kwargs.pop("stream", False)
        kwargs["timeout"] = (connect_s, read_s)
        watch.window(REQUEST_S, f"{method} {urlsplit(url).path[:80]}")
        try:
            r = request(method, url, stream=True, **kwargs)
            if not stream:
                read_small(r, watch)
        except DeadlineExceeded:
            raise
        except Exception:
            if watch.expired is not None:
                raise watch.error() from None
            raise
        return r

    session.request = bounded


def read_small(r: Any, watch: Watchdog, limit: int = SMALL_BODY) -> bytes:
    """The response's body, at most `limit` bytes (then an error), kept as its content (so .json() works)."""
    data = bytearray()
    try:
        for chunk in r.iter_content(65536):
            data += chunk
            if len(data) > limit:
                r.close()
                raise PipelineError(f"{r.url[:120]}: the registry's answer is larger than {limit} bytes: not a "
                                    "registry's", "check the host and port; do not use this registry")
    except Exception:
        if watch.expired is not None:
            raise watch.error() from None
        raise
    r._content, r._content_consumed = bytes(data), True
    return bytes(data)

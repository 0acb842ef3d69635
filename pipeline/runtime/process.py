"""A session run in a process of its own, as vLLM runs its engine core beside its API server: the server's event
loop and the engine's Python never wait for each other's GIL.

The reference backend is PyTorch driven from Python: every forward call holds the GIL between kernels, and the
server's per-token work (detokenize, frame, write) holds it between forwards, so in one process each token paid for
both in turn (1.12x per token through the server on a 2-core machine). In its own process the engine computes the
next token while the server sends the last one.

    parent  ProcessSession: submit/cancel/guide/stats sent down a pipe; a reader thread emits what comes back
    child   `serve_child`: opens the real session with the picklable opener, relays its events up the other pipe

Messages are pickled into length-prefixed frames on two one-way OS pipes (`Channel`), written and read with one
system call each: multiprocessing's own Connection (a socket pair, a read for the length and another for the body,
Python buffering around both) took 0.61-0.88 ms per round trip beyond the engine's work on the 2-core CI VM where
these frames take 0.41-0.52 ms (interleaved, same run), and every token and every request's first token pays it.
A request and an event travel as flat tuples of their fields (`Wire`), not as dataclasses.

The child ignores Ctrl-C (the parent closes it in order) and ends when the parent does: its pipe reaches EOF. A child
that dies (killed, out of memory) fails the session with its exit code, and every request in flight gets an error.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import signal
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields
from operator import attrgetter
from typing import Any

from pipeline.errors import PipelineError
from pipeline.runtime.session import Constraint, Emit, Event, Generation, Handle, Sampling, Session

ASK_TIMEOUT = 60.0      # a guide() or stats() answer from the child (a schema compiles in milliseconds)
CLOSE_TIMEOUT = 15.0    # the child's own close joins its engine thread for up to 10 s
HEADER = struct.Struct("<Q")    # a frame's length, then its pickle
READ = 1 << 16                  # bytes one read takes at most (a token's event is ~130)


class Wire:
    """A Generation down and an Event up as tuples of their fields, in their declared order (read in C by attrgetter,
    so a field added to either travels without a change here). Why: a dataclass pickles through copyreg's reduce and a
    state dict keyed by field name; on the 2-core CI VM, where every request runs on caches gone cold while the engine
    computed, an event took 85 us to pickle and 33 us to load that way against 34 and 18 us as a tuple, a request
    100 and 53 us; every request's first token pays both."""
    _event = attrgetter(*(f.name for f in fields(Event)))
    _generation = attrgetter(*(f.name for f in fields(Generation)))
    _sampling = attrgetter(*(f.name for f in fields(Sampling)))
    _at = [f.name for f in fields(Generation)].index("sampling")

    @staticmethod
    def event(ev: Event) -> tuple[Any, ...]:
        return Wire._event(ev)

    @staticmethod
    def to_event(values: tuple[Any, ...]) -> Event:
        return Event(*values)

    @staticmethod
    def generation(gen: Generation) -> tuple[Any, ...]:
        values = list(Wire._generation(gen))
        values[Wire._at] = Wire._sampling(gen.sampling)
        return tuple(values)

    @staticmethod
    def to_generation(values: tuple[Any, ...]) -> Generation:
        flat = list(values)
        flat[Wire._at] = Sampling(*flat[Wire._at])
        return Generation(*flat)


class Channel:
    """Length-prefixed pickles, each written with one write (under a lock: many threads send), read by one thread
    with as few reads as the frames allow. Both ends are this program: what comes up the pipe is trusted as much as
    the code that sent it. `receive`, `transmit`: the multiprocessing Connections holding the two descriptors (a
    spawned child gets them through them), closed with the channel."""

    def __init__(self, receive: Any, transmit: Any):
        self._ends = (receive, transmit)
        self._in, self._out = receive.fileno(), transmit.fileno()
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._closed = False

    def send(self, msg: Any) -> None:
        body = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        frame = memoryview(HEADER.pack(len(body)) + body)
        with self._lock:
            if self._closed:    # never a write to a descriptor number the process may have reused since
                raise ValueError("the channel is closed")
            while frame:        # a pipe takes a large frame (an image) in parts, as the reader drains it
                frame = frame[os.write(self._out, frame):]

    def recv(self) -> Any:
        """The next message; EOFError once the other end is closed (its process exited)."""
        buf = self._buf
        while len(buf) < (need := HEADER.size + (HEADER.unpack_from(buf)[0] if len(buf) >= HEADER.size else 0)):
            chunk = os.read(self._in, max(READ, need - len(buf)))
            if not chunk:
                raise EOFError
            buf += chunk
        msg = pickle.loads(buf[HEADER.size:need])
        del buf[:need]
        return msg

    def close(self) -> None:
        """After the reading thread has returned (its next read could find the number reused)."""
        with self._lock:
            self._closed = True
            for end in self._ends:
                end.close()


class ProcessSession(Session):
    """The session `opener` opens, in a spawned process. `opener` must pickle: a module-level function, or a
    functools.partial of one. Blocks until the child's session is loaded; a PipelineError there is raised here."""

    def __init__(self, opener: Callable[[], Session], name: str = "engine", cpus: frozenset[int] | None = None):
        """cpus: the CPUs the child runs on (None: wherever this process may run)."""
        super().__init__()
        ctx = multiprocessing.get_context("spawn")     # never fork a process that runs threads (uvicorn, tokenizers)
        down_r, down_w = ctx.Pipe(duplex=False)
        up_r, up_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=serve_child, args=((down_r, up_w), opener, cpus), name=f"{name}-session",
                                 daemon=True)
        self._proc.start()
        down_r.close()      # the child's ends live in the child only: its exit is our EOF
        up_w.close()
        self._conn = Channel(up_r, down_w)
        self._handles: dict[int, Handle] = {}
        self._asks: dict[int, Future[Any]] = {}
        self._ask_ids = itertools.count(1)
        self._closing = False
        try:
            ready = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            raise RuntimeError(f"the {name} process exited (code {self._proc.exitcode}) before its session "
                               "was loaded") from None
        if ready[0] == "failed":
            self._proc.join(5)
            raise PipelineError(ready[1], ready[2])
        _, self.backend, self.limits, self.applies = ready
        self._reader = threading.Thread(target=self._read, name=f"{name}-session-reader", daemon=True)
        self._reader.start()

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        handle = self._handle(gen, emit)
        self._handles[handle.id] = handle
        try:
            self._conn.send(("submit", handle.id, Wire.generation(gen)))
        except (OSError, ValueError):       # the pipe is gone: the reader is about to fail the session
            self._handles.pop(handle.id, None)
            raise RuntimeError(self.failure or "the engine process is gone") from None
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()
        if self._handles.pop(handle.id, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(("cancel", handle.id))

    def _ask(self, what: str, arg: Any = None) -> Any:
        ask = next(self._ask_ids)
        answer: Future[Any] = Future()
        self._asks[ask] = answer
        try:
            self._conn.send(("ask", ask, what, arg))
        except (OSError, ValueError):
            self._asks.pop(ask, None)
            raise RuntimeError(self.failure or "the engine process is gone") from None
        return answer.result(ASK_TIMEOUT)

    def guide(self, constraint: Constraint) -> Any:
        return self._ask("guide", constraint)

    def stats(self) -> dict[str, float]:
        return {} if self.failure else self._ask("stats")

    def kv_stats(self) -> dict[str, int] | None:
        return None if self.failure else self._ask("kv_stats")

    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "event":
                _, hid, values = msg
                ev = Wire.to_event(values)
                handle = self._handles.get(hid)
                if handle is not None and not handle.cancelled.is_set():
                    if ev.final:
                        self._handles.pop(hid, None)
                    handle.emit(ev)
            elif msg[0] == "failure":       # the engine itself failed: no more requests, /health says so
                self.failure = msg[1]
            else:       # ("answer", ask, value, error): error is (type name, message) or None
                _, ask, value, error = msg
                answer = self._asks.pop(ask, None)
                if answer is not None:
                    answer.set_exception(_raised(error)) if error else answer.set_result(value)
        self._proc.join(1)
        if not self._closing:
            self.failure = f"the {self.backend} engine process exited (code {self._proc.exitcode})"
        for handle in list(self._handles.values()):
            handle.emit(Event([], final=True, error=self.failure or "the session closed"))
        self._handles.clear()
        for answer in list(self._asks.values()):
            answer.set_exception(RuntimeError(self.failure or "the session closed"))
        self._asks.clear()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("close",))
        self._proc.join(CLOSE_TIMEOUT)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._reader.join(5)        # the child is gone: its pipe is at EOF
        if not self._reader.is_alive():
            self._conn.close()


def _raised(error: tuple[str, str]) -> Exception:
    """The child's exception as the caller expects its type (Session.guide: ValueError, NotImplementedError)."""
    kind, message = error
    return {"ValueError": ValueError, "NotImplementedError": NotImplementedError}.get(kind, RuntimeError)(message)


def split_cpus(engine_threads: int) -> tuple[frozenset[int], frozenset[int]] | None:
    """(the engine's CPUs, the server's) for an engine of this many threads: the last ones to the engine, the rest
    to the server; None where no CPU would be left to the server (nothing is pinned then). Pinned apart, a token the
    engine sends wakes the server on the server's own CPU: unpinned, Linux wakes a pipe's reader on the writer's CPU
    (a "sync" wakeup) and the server waited up to one time slice (~2 ms) behind the still-busy engine."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if engine_threads >= len(cpus):
        return None
    return frozenset(cpus[len(cpus) - engine_threads:]), frozenset(cpus[:len(cpus) - engine_threads])


def keep_cpus(cpus: frozenset[int]) -> None:
    """Every thread of this process, and those it starts later, on `cpus`."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):      # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def engine_process(opener: Callable[[], Session], backend: str, threads: int) -> ProcessSession:
    """`opener`'s session in a process of its own on the last `threads` CPUs, this process (the server) kept on the
    others (split_cpus; nothing pinned where none would be left)."""
    split = split_cpus(threads)
    session = ProcessSession(opener, backend, split[0] if split else None)
    if split:
        keep_cpus(split[1])
    return session


def serve_child(ends: tuple[Any, Any], opener: Callable[[], Session], cpus: frozenset[int] | None = None) -> None:
    """The child's whole life: open the session, say ready (or why not), relay requests down and events up.
    ends: the down pipe's reading Connection, the up pipe's writing one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Channel(*ends)
    if cpus:
        os.sched_setaffinity(0, cpus)       # before the session starts its threads: they inherit it
    try:
        session = opener()
    except PipelineError as exc:
        conn.send(("failed", exc.message, exc.hint))
        return
    except Exception as exc:        # noqa: BLE001 - the parent reports it (health, log), never a traceback here
        conn.send(("failed", f"{type(exc).__name__}: {str(exc)[:300]}", "see the server log"))
        return
    handles: dict[int, Handle] = {}

    def send(msg: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError):  # the parent went away: the main loop sees EOF and closes
            conn.send(msg)

    def emitter(hid: int) -> Emit:
        def emit(ev: Event) -> None:
            if ev.final:
                handles.pop(hid, None)
            send(("event", hid, Wire.event(ev)))
        return emit

    send(("ready", session.backend, session.limits, session.applies))
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "submit":
                _, hid, values = msg
                try:
                    handles[hid] = session.submit(Wire.to_generation(values), emitter(hid))
                except Exception as exc:    # noqa: BLE001 - a failed engine refuses: the request gets the error
                    send(("event", hid, Wire.event(Event([], final=True, error=str(exc)[:300]))))
                    if session.failure:
                        send(("failure", session.failure))
            elif msg[0] == "cancel":
                handle = handles.pop(msg[1], None)
                if handle is not None:
                    session.cancel(handle)
            elif msg[0] == "ask":
                _, ask, what, arg = msg
                try:
                    value = session.guide(arg) if what == "guide" else session.stats() if what == "stats" \
                        else session.kv_stats()
                    send(("answer", ask, value, None))
                except Exception as exc:    # noqa: BLE001 - raised again in the parent, by type
                    send(("answer", ask, None, (type(exc).__name__, str(exc)[:300])))
            else:
                break
    finally:
        session.close()

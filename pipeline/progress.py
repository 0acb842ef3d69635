"""Progress for long stages: a tqdm bar on a terminal, sparse plain lines in logs (CI, ssh, doit's captured output).

While a doit stage runs, its stdout and stderr go to the stage's log (pipeline.graph.terminal); `terminal()` is
where the user is looking: the stream our own lines and progress bars are written to.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TextIO

_terminal: TextIO | None = None          # where stderr pointed before a stage's output went to its log
_terminal_out: TextIO | None = None      # where stdout pointed
PLAIN_INTERVAL_S = 30       # a plain (non-terminal) progress line at most this often: CI logs stay short


def terminal() -> TextIO:
    """The user's stderr: errors and progress bars."""
    return _terminal or sys.stderr


def terminal_out() -> TextIO:
    """The user's stdout: one line per finished stage."""
    return _terminal_out or sys.stdout


def set_terminal(err: TextIO | None, out: TextIO | None = None) -> tuple[TextIO | None, TextIO | None]:
    """Make `err`/`out` the user's terminal (None: sys.stderr/sys.stdout again); returns the previous pair."""
    global _terminal, _terminal_out
    previous = (_terminal, _terminal_out)
    _terminal, _terminal_out = err, out
    return previous


class Progress:
    def __init__(self, label: str, unit: str = "it", stream=None):
        self.label, self.unit = label, unit
        self.stream = stream or terminal()
        self._bar = None
        self._last = 0.0
        self._start = time.monotonic()

    def __enter__(self):
        if self.stream.isatty():
            try:
                from tqdm import tqdm
                self._bar = tqdm(desc=self.label, unit=self.unit, file=self.stream, leave=True)
            except ImportError:
                pass
        return self

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        if self._bar is not None:
            if total is not None:
                self._bar.total = total
            self._bar.n = done
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._start >= PLAIN_INTERVAL_S and now - self._last >= PLAIN_INTERVAL_S:
            self._last = now
            of = f"/{total}" if total else ""
            print(f"[{self.label}] {done}{of} {self.unit} {note} ({now - self._start:.0f}s)".rstrip(),
                  file=self.stream, flush=True)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()
        return False


class StepTimer:
    """Wall seconds per named step of a stage, recorded in its manifest so a slow stage says where time went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str):
        import contextlib

        @contextlib.contextmanager
        def step():
            t = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t, 2)
        return step()


@contextlib.contextmanager
def byte_bar(label: str, total: int):
    """A byte progress bar for a command's long copy or check; yields update(done_so_far)."""
    with Progress(label, unit="B") as bar:
        yield lambda done: bar.update(done, total)


class ByteCounter:
    """A progress callback taking increments (bytes just done; negative when a transfer starts over); `total` may
    be set once it is known (a pull learns it from the manifest)."""

    def __init__(self, bar: Progress, total: int = 0):
        self.bar, self.total, self.done = bar, total, 0

    def __call__(self, n: int) -> None:
        self.done += n
        self.bar.update(self.done, self.total or None)


@contextlib.contextmanager
def byte_counter(label: str, total: int = 0):
    with Progress(label, unit="B") as bar:
        yield ByteCounter(bar, total)

"""Running the device's long external programs (builders, runtimes): logged, time-limited, killable as a group.

Standard library only (JetPack 6's Python 3.10, no torch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.device.memwatch import SAMPLE_S, MemoryWatch
from pipeline.errors import PipelineError

PROGRESS_S = 30


def say(msg: str) -> None:
    print(f"[device] {msg}", file=sys.stderr, flush=True)


def run_logged(argv: list[str], cwd: Path, log: Path, timeout: int, env: dict | None = None,
               watch: MemoryWatch | None = None) -> float:
    """Run argv in its own process group with output to `log` (and a line every ~30 s to stderr); on timeout or
    Ctrl-C the whole group is killed. With a `watch`, the board's memory and the process tree's are sampled while
    it runs. Returns seconds; raises PipelineError on failure."""
    if watch is not None:
        watch.start()
    start = time.monotonic()
    said = start
    with open(log, "wb") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=env)
        except FileNotFoundError:
            raise PipelineError(f"{argv[0]} is not on PATH on this device", "install the engine builder of the "
                                "kit's backend (see the README's device setup)") from None
        try:
            while True:
                try:
                    rc = proc.wait(timeout=SAMPLE_S if watch is not None else min(PROGRESS_S, max(1, timeout)))
                    break
                except subprocess.TimeoutExpired:
                    if watch is not None:
                        watch.sample(proc.pid)
                    now = time.monotonic()
                    if now - start > timeout:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        raise PipelineError(f"{argv[0]} ran over its {timeout} s limit; log: {log}",
                                            "raise --build-timeout, or build on a faster same-SM board") from None
                    if now - said >= PROGRESS_S:
                        said = now
                        say(f"{argv[0]} running, {now - start:.0f} s (log: {log})")
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise PipelineError(f"{argv[0]} failed (exit {rc}); log: {log}; last lines: " + " / ".join(tail),
                            "out of memory shows as exit -9 or a reboot: build on a larger same-SM board")
    return round(time.monotonic() - start, 1)

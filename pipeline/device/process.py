"""Running the device's long external programs (builders, runtimes): logged, time-limited, killable as a group, and
never outliving the device command.

Each child runs in its own process group with a death signal (Linux prctl PR_SET_PDEATHSIG: SIGKILL when the device
command dies, kill -9 included) and carries the run's marker in its environment (JETSON_PIPELINE_RUN); SIGTERM and
Ctrl-C of the device command kill the whole group; and a run first kills whatever a previous run in the same work
directory left behind (processes whose environment holds that run's marker: a grandchild the death signal does not
reach). Standard library only (JetPack 6's Python 3.10, no torch).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pipeline.device.memwatch import SAMPLE_S, MemoryWatch
from pipeline.errors import PipelineError
from pipeline.files import create_new, read_regular, remove_entry, replace_file

PROGRESS_S = 30
RUN_MARKER = "JETSON_PIPELINE_RUN"
RUN_FILE = ".device-run"            # in --work: the marker of the run that last used it
PR_SET_PDEATHSIG = 1


def say(msg: str) -> None:
    print(f"[device] {msg}", file=sys.stderr, flush=True)


_RUN_ID: str | None = None


def _die_with_parent() -> None:         # runs in the child between fork and exec
    # not Linux: the process group and the next run's cleanup remain
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def claim_work(work: Path) -> None:
    """This run owns `work`: processes a previous run there left behind (its marker in their environment) are killed,
    and this run's marker is recorded for the next one."""
    global _RUN_ID
    try:
        previous = read_regular(work / RUN_FILE, 64).decode("ascii", "replace").strip()
    except (PipelineError, OSError):
        previous = ""
    if previous:
        for pid in _marked(previous):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                say(f"killed process {pid}, left running by an earlier run in {work}")
    _RUN_ID = uuid.uuid4().hex
    replace_file(work / RUN_FILE, _RUN_ID + "\n")


def _marked(run_id: str) -> list[int]:
    needle = f"{RUN_MARKER}={run_id}".encode() + b"\0"
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read(1 << 20) + b"\0":
                        out.append(int(entry))
            except OSError:
                continue
    return out


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (systemd, a scheduler, `kill`) handled like Ctrl-C: the running child's group is killed."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:          # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_logged(argv: list[str], cwd: Path, log: Path, timeout: int, env: dict | None = None,
               watch: MemoryWatch | None = None) -> float:
    """Run argv in its own process group with output to `log` (and a line every ~30 s to stderr); on timeout or
    Ctrl-C the whole group is killed. With a `watch`, the board's memory and the process tree's are sampled while
    it runs. Returns seconds; raises PipelineError on failure."""
    if watch is not None:
        watch.start()
    start = time.monotonic()
    said = start
    env = dict(env if env is not None else os.environ, **({RUN_MARKER: _RUN_ID} if _RUN_ID else {}))
    remove_entry(log)           # a link or FIFO planted under the log's name: removed, never written through
    with create_new(log) as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=env, preexec_fn=_die_with_parent)
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
                                            "the limit comes from the plan's predicted time with a margin: pass "
                                            "--build-timeout / --validate-timeout to allow more, or find what "
                                            "stalled in the log") from None
                    if now - said >= PROGRESS_S:
                        said = now
                        say(f"{argv[0]} running, {now - start:.0f} s (log: {log})")
        except BaseException:       # Ctrl-C, SIGTERM (terminate_as_interrupt), anything: the group goes with us
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        with open(log, "rb") as fh:         # ours, just written: its last lines say why
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
            tail = fh.read().decode("utf-8", "replace").strip().splitlines()[-5:]
        raise PipelineError(f"{argv[0]} failed (exit {rc}); log: {log}; last lines: " + " / ".join(tail),
                            "out of memory shows as exit -9 or a reboot: build on a larger same-SM board")
    return round(time.monotonic() - start, 1)

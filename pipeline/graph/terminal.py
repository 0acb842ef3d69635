"""What `doit build` shows: one line per stage, progress bars for long loops, one `error:` line per failure.

Stage lines go to stdout, errors and progress bars to stderr. Everything else a stage prints (ModelOpt,
transformers, torch.onnx: warnings, their own progress bars, log lines) goes to the stage's log file,
`artifacts/<recipe>/logs/<stage>.log`, which the error line names when the stage fails. Capturing happens at the
file-descriptor level, so output written by C extensions and child processes lands in the log too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from doit.exceptions import TaskError, TaskFailed
from doit.reporter import ConsoleReporter

from pipeline import progress
from pipeline.errors import PipelineError


class StageStopped(TaskError):
    """A stage stopped with its `error:` line already printed (bad input, a refusal, a full disk): doit counts it an
    error, so `doit build` exits 2 as the command line does; a bug (a traceback in the log) stays a failure, 1."""

    def __init__(self):
        super().__init__("stopped; its error line says why")


class StageReporter(ConsoleReporter):
    """doit's reporter, quiet: stages print their own line; a failed stage has already said why, once."""

    desc = "one line per stage (jetson-trtllm-pipeline)"

    def execute_task(self, task) -> None:
        pass

    def skip_uptodate(self, task) -> None:
        pass

    def skip_ignore(self, task) -> None:
        pass

    def add_failure(self, task, fail) -> None:
        # A stage action that failed returned False after printing its error line; anything else (an action that
        # raised past our wrapper, a bad uptodate check) is reported here as one line.
        if not isinstance(fail, (StageStopped, TaskFailed)):
            first = fail.get_msg().strip().splitlines()
            self.write(f"error: {task.name}: {first[-1] if first else type(fail).__name__}\n")

    def complete_run(self) -> None:
        for msg in self.runtime_errors:
            line = " ".join(msg.split())
            hint = ""
            if "database" in line.lower() or "disk" in line.lower():
                hint = " (hint: free disk space where artifacts/ lives; doit keeps its state in artifacts/.doit.db)"
            self.write(f"error: doit: {line}{hint}\n")


@contextlib.contextmanager
def captured(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `log` while the block runs; our own
    terminal output goes through progress.terminal() to where stderr pointed before."""
    from pipeline.files import create_new, real_dir, remove_entry

    real_dir(log.parent)        # a logs link planted in artifacts/ is replaced, never written through
    remove_entry(log)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    err = os.fdopen(os.dup(saved_err), "w", buffering=1)
    out = os.fdopen(os.dup(saved_out), "w", buffering=1)
    with create_new(log) as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        previous = progress.set_terminal(err, out)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            progress.set_terminal(*previous)
            err.close()
            out.close()


def _disk_full(exc: BaseException) -> bool:
    """ENOSPC, also where a library wraps it in its own error (safetensors: 'I/O error: No space left on device')."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run_stage_action(stage: str, label: str, log: Path, action: Callable[[], object],
                     summary: Callable[[object], str], capture: bool = True) -> int:
    """Run one stage's action and print its line: `stage  label: summary (seconds)`, or one error line with the
    hint and the log. Returns 0, 2 when the stage stopped with an error line (a PipelineError, a full disk), 1 on a
    bug (its traceback is in the log); doit then fails the task without printing anything itself."""
    out, err = progress.terminal_out(), progress.terminal()
    tty = out.isatty()
    if tty:
        out.write(f"{stage:<9}{label} ...")
        out.flush()
    started = time.monotonic()
    line_end = "\r\033[K" if tty else ""
    try:
        with captured(log) if capture else contextlib.nullcontext():
            try:
                result = action()
            except PipelineError:
                raise
            except Exception:
                traceback.print_exc()       # into the log
                raise
    except PipelineError as exc:
        hint = f"\n  hint: {exc.hint}" if exc.hint else ""
        out.write(line_end)
        err.write(f"error: {stage} {label}: {exc.message}{hint}\n  log: {log}\n")
        return 2
    except Exception as exc:
        out.write(line_end)
        if _disk_full(exc):
            from pipeline.files import human_bytes
            where = log.parent.parent.parent     # artifacts/
            try:
                free = human_bytes(shutil.disk_usage(where).free)
            except OSError:
                free = "unknown"
            err.write(f"error: {stage} {label}: the disk is full ({where}: {free} free)\n"
                      f"  hint: free space there (or point PIPELINE_ARTIFACTS at a larger disk) and run the build "
                      f"again: the stage's partial output was removed and it starts over\n  log: {log}\n")
            return 2
        err.write(f"error: {stage} {label} failed: {type(exc).__name__}: {str(exc)[:300]}\n"
                  f"  hint: this is a bug in the pipeline; the traceback is in the log: {log}\n")
        return 1
    seconds = time.monotonic() - started
    try:
        text = summary(result)
    except Exception:       # a summary must never fail a stage that succeeded
        text = "done"
    first, _, rest = text.partition("\n")
    out.write(f"{line_end}{stage:<9}{label}: {first} ({seconds:.1f} s)\n" + (rest + "\n" if rest else ""))
    out.flush()
    return 0

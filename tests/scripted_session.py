"""A Session that follows a script, for the tests of runtime/process.py: what the child does when the session it
wraps answers, refuses, dies or hangs. It is not a double of anything: ProcessSession wraps any Session, and the
reference backend's own run through it is tested on the tiny model (test_runtime_process.py)."""

from __future__ import annotations

import os
import threading
import time

from pipeline.errors import PipelineError
from pipeline.runtime.session import Constraint, Emit, Event, Generation, Handle, Limits, Session


class ScriptedSession(Session):
    """Answers a prompt [n, ...] with the tokens n+1, n+2, ... one event each, every `step` seconds, up to
    max_new_tokens; a prompt starting with -1 kills this process mid-answer (after one token), -2 never answers."""
    backend = "scripted"
    applies = frozenset({"min_p"})

    def __init__(self, step: float = 0.01):
        super().__init__()
        self.limits = Limits(2, 64, 128)
        self.step = step

    def guide(self, constraint: Constraint) -> str:
        if "type" not in constraint.schema:
            raise ValueError("schema: no type")
        return f"grammar of {sorted(constraint.schema)}"

    def stats(self) -> dict[str, float]:
        return {"pid": float(os.getpid())}

    def submit(self, gen: Generation, emit: Emit) -> Handle:
        handle = self._handle(gen, emit)
        threading.Thread(target=self._answer, args=(handle,), daemon=True).start()
        return handle

    def _answer(self, handle: Handle) -> None:
        first = handle.generation.prompt_ids[0]
        if first == -2:
            return
        for i in range(handle.generation.max_new_tokens):
            time.sleep(self.step)
            if handle.cancelled.is_set():
                return
            last = i + 1 == handle.generation.max_new_tokens
            handle.emit(Event([first + i + 1], final=last, reason="length" if last else None))
            if first == -1:
                os._exit(7)

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()

    def close(self) -> None:
        pass


def open_scripted(step: float = 0.01) -> Session:
    return ScriptedSession(step)


def open_refused() -> Session:
    raise PipelineError("tiny: its quantize stage is not built", "run `doit build recipe=tiny` first")
